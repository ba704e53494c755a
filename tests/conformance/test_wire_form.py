"""The Python driver reads a case's values as specs/conformance.md, Values, states them, and nothing else.

A second implementation written from the spec alone found that the Python
driver read more than the spec said: a time with a space for ``T`` (through
``datetime.fromisoformat``), and that a case whose request left out a
required member was answered with a ``KeyError`` or a ``TypeError`` instead
of the layer's refusal naming the member.  These tests hold the driver to
the statement: one spelling of a time, integers without a fraction or an
exponent, a missing request member refused where the decision's order of
checks places it, and a member no layer judges named in the driver's error.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters.conformance import wire
from fencekeeper.adapters.conformance.driver import KERNEL_LAYERS, answer, kernel_answer

CASES = Path(__file__).resolve().parents[2] / "specs" / "conformance"


def _cases(layer: str) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads((CASES / f"{layer}.json").read_text(encoding="utf-8"))["cases"]
    return cases


def _written(layer: str, decision: str) -> dict[str, Any]:
    """The input of the first case of ``decision`` whose expected answer writes something."""
    return copy.deepcopy(next(
        c["input"] for c in _cases(layer)
        if c["input"].get("decision") == decision and c["expected"].get("outcome") == "decision"
    ))


def _case(layer: str, data: Any) -> Any:
    """The driver's whole answer to one case request, as the runner receives it."""
    return answer({"op": "case", "layer": layer, "id": "x", "input": data, "seq": 2}, None, KERNEL_LAYERS, "test")


# --- times -------------------------------------------------------------------------------------


def test_the_one_spelling_of_a_time_is_read() -> None:
    assert wire.parse_time("2026-03-01T12:05:00.000001Z") == datetime(2026, 3, 1, 12, 5, 0, 1, tzinfo=UTC)
    # Without an offset or with another, still a time: the kernel refuses it as not UTC, naming the field.
    assert wire.parse_time("2026-03-01T12:05:00.000001") == datetime(2026, 3, 1, 12, 5, 0, 1)
    assert wire.parse_time("2026-03-01T12:05:00.000001+01:00") == datetime(
        2026, 3, 1, 12, 5, 0, 1, tzinfo=timezone(timedelta(hours=1))
    )


@pytest.mark.parametrize(
    "text",
    [
        "2026-03-01 12:05:00.000000Z",  # a space for T: fromisoformat read it as UTC
        "2026-03-01 12:05:00Z",
        "2026-03-01t12:05:00.000000z",
        "2026-03-01T12:05:00.000000+00:00",  # UTC's offset, not its spelling
        "2026-03-01T12:05:00Z",
        "2026-03-01T12:05:00.123Z",
        "2026-03-01T12:05:00.1234567Z",
        "2026-03-01",
        "20260301T120500.000000Z",
        "2026-02-30T12:05:00.000000Z",
        "2026-03-01T12:05:00.00000\u0661Z",  # an Arabic-Indic digit: \\d would take it
    ],
)
def test_any_other_text_is_no_time(text: str) -> None:
    assert wire.parse_time(text) == text


@pytest.mark.parametrize(
    "spelling", ["2026-01-01 00:00:01.654321Z", "2026-01-01T00:00:01.654321+00:00", "2026-01-01T00:00:01Z"]
)
def test_a_case_whose_now_is_spelt_otherwise_is_refused_naming_now(spelling: str) -> None:
    data = _written("operations", "complete")
    data["now"] = spelling
    assert kernel_answer("operations", data) == {"outcome": "refusal", "code": "invalid_request", "field": "now"}


# --- integers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fence", [1.0, 1e300, "1", True])
def test_an_integer_written_with_a_fraction_or_an_exponent_is_no_integer(fence: Any) -> None:
    data = _written("operations", "complete")
    assert data["request"]["credential"]["fence"] == 1
    assert kernel_answer("operations", data)["outcome"] == "decision"
    data["request"]["credential"]["fence"] = fence
    assert kernel_answer("operations", data) == {
        "outcome": "refusal", "code": "invalid_request", "field": "credential.fence"
    }


@pytest.mark.parametrize("duration", [30000001.0, 3.0000001e7])
def test_a_protocol_duration_with_a_fraction_is_no_duration(duration: float) -> None:
    data = _written("protocol", "claim")
    data["request"]["lease_duration"] = duration
    answered = kernel_answer("protocol", data)
    assert (answered["outcome"], answered["code"], answered["field"]) == ("refusal", "invalid_request", "lease_duration")


# --- a required member left out ----------------------------------------------------------------

OPERATIONS_DECISIONS = ("submit", "claim", "heartbeat", "record_intent", "complete", "fail", "outcome_unknown",
                        "decide", "cancel", "expire")
# What "Well-formed requests" lets a request leave out (operations.md); every other member is required.
OPTIONAL = frozenset({"policy", "retention", "requires_approval", "earlier_input_digest", "result", "not_authorized",
                      "effect_not_applied", "detail", "reason"})


def _required_members(decision: str) -> list[tuple[str, ...]]:
    request = _written("operations", decision)["request"]
    found: list[tuple[str, ...]] = []
    for name, value in request.items():
        if name in OPTIONAL:
            continue
        found.append((name,))
        if isinstance(value, dict):
            found += [(name, inner) for inner in value if inner != "reason"]
    return found


@pytest.mark.parametrize(
    ("decision", "path"),
    [(decision, path) for decision in OPERATIONS_DECISIONS for path in _required_members(decision)],
    ids=lambda value: ".".join(value) if isinstance(value, tuple) else value,
)
def test_an_operations_request_member_left_out_is_refused_naming_it(decision: str, path: tuple[str, ...]) -> None:
    data = _written("operations", decision)
    holder = data["request"]
    for step in path[:-1]:
        holder = holder[step]
    del holder[path[-1]]
    assert _case("operations", data) == {
        "output": {"outcome": "refusal", "code": "invalid_request", "field": ".".join(path)}, "seq": 2
    }


@pytest.mark.parametrize("member", ["request", "now"])
def test_an_operations_case_without_its_request_or_now_is_refused_naming_it(member: str) -> None:
    data = _written("operations", "heartbeat")
    del data[member]
    assert kernel_answer("operations", data) == {"outcome": "refusal", "code": "invalid_request", "field": member}


def test_left_out_members_are_named_in_the_order_of_checks() -> None:
    # operation_id comes before identity (operations.md, Well-formed requests): the first malformed one answers.
    data = _written("operations", "submit")
    del data["request"]["identity"]
    data["request"]["operation_id"] = ".bad"
    assert kernel_answer("operations", data)["field"] == "operation_id"


@pytest.mark.parametrize(
    "decision", ["admit", "claim", "renew", "record_step", "release", "finalize", "wake", "cancel"]
)
def test_a_protocol_request_member_left_out_is_refused_naming_it(decision: str) -> None:
    data = _written("protocol", decision)
    for name in ("execution_id", "worker_id", "credential", "authority"):
        if name in data["request"]:
            del data["request"][name]
            answered = kernel_answer("protocol", data)
            assert (answered["outcome"], answered["code"], answered["field"]) == ("refusal", "invalid_request", name)
            return
    raise AssertionError(f"no member to leave out of {decision}")


@pytest.mark.parametrize(
    ("layer", "change", "named"),
    [
        ("machines", lambda d: d.pop("state"), "input.state: missing"),
        ("machines", lambda d: d.update(event=[]), "input.event"),
        ("protocol", lambda d: d.pop("rows"), "input.rows: missing"),
        ("protocol", lambda d: d["rows"]["execution"].pop("state"), "rows.execution.state: missing"),
        ("protocol", lambda d: d["rows"]["dispatch"].update(dispatch_state="gone"), "rows.dispatch.dispatch_state"),
        ("operations", lambda d: d.pop("operation"), "input.operation: missing"),
        ("operations", lambda d: d["operation"].pop("state"), "input.operation.state: missing"),
        ("operations", lambda d: d["operation"]["identity"].pop("tenant"), "input.operation.identity.tenant: missing"),
        ("operations", lambda d: d.update(decision="undo"), "input.decision"),
        ("expressions", lambda d: d.pop("bindings"), "input.bindings: missing"),
        ("definitions", lambda d: d.pop("definition"), "input.definition: missing"),
        ("journal", lambda d: d.update(chain="one line"), "input.chain"),
        ("journal-append", lambda d: d.update(now="2026-03-01 12:00:01.123457Z"), "input.now"),
        ("interpreter", lambda d: d.pop("authority"), "input.authority: missing"),
    ],
)
def test_a_member_no_layer_judges_is_named_in_the_drivers_error(layer: str, change: Any, named: str) -> None:
    # A claim has rows in both layers: a protocol execution and dispatch, an Operation as stored.
    written = layer in ("protocol", "operations")
    data = _written(layer, "claim") if written else copy.deepcopy(_cases(layer)[0]["input"])
    change(data)
    answered = _case(layer, data)
    assert set(answered) == {"error", "seq"}
    assert answered["error"].startswith("malformed case input: "), answered
    assert named in answered["error"]


def test_a_decide_approval_member_without_a_refusal_is_named() -> None:
    data = copy.deepcopy(next(c["input"] for c in _cases("protocol") if c["input"]["decision"] == "decide_approval"))
    del data["request"]["binding"]
    assert _case("protocol", data)["error"] == "malformed case input: request.binding: missing"
    data = copy.deepcopy(next(c["input"] for c in _cases("protocol") if c["input"]["decision"] == "decide_approval"))
    del data["request"]["determination"]  # a member with a refusal of its own (interpreter.md, Approvals)
    assert _case("protocol", data)["output"] == {"outcome": "refusal", "code": "invalid_request",
                                                 "field": "determination"}


# --- a repeated recovery command ---------------------------------------------------------------

# A resume's stored record: its proof is what the resume rested on (specs/protocol.md, Safe-resume proof).
PROVEN = {
    "no_unresolved_command": True, "dependencies_current": True, "continuation_approved": True,
    "continuation": "review", "approved_by": "operator-1",
}


def replayed_resume() -> dict[str, Any]:
    """A repeat of a resume whose stored record carries its proof (no committed case stores one)."""
    data = copy.deepcopy(next(c["input"] for c in _cases("recovery") if c["id"] == "recover/quarantined/replayed"))
    data["rows"]["recovery"].update(kind="resume_safe", proof=PROVEN)
    data["request"].update(kind="resume_safe", next_node_id="review", rationale="settled by hand")
    return data


def test_a_repeated_recovery_command_answers_the_stored_record_proof_included() -> None:
    data = replayed_resume()
    answered = kernel_answer("recovery", data)
    assert (answered["outcome"], answered["code"]) == ("unchanged", "recovery_replayed")
    # Compared by identity alone, answered whole: the durable result as stored (seed 000, Expired-lease
    # quarantine), not a copy without the proof.
    assert answered["record"] == data["rows"]["recovery"]
    assert answered["record"]["proof"] == PROVEN


def test_a_stored_record_without_its_proof_member_is_named_in_the_drivers_error() -> None:
    data = replayed_resume()
    del data["rows"]["recovery"]["proof"]
    assert _case("recovery", data)["error"] == "malformed case input: rows.recovery.proof: missing"
