"""The ``journal-append`` layer: appending one command to a journal (specs/journal.md, section 6) through the driver protocol.

Rules of this module:

- The workflow and policy are the fixture pack's (``specs/journal/fixtures``),
  as in the ``journal`` layer; each case's chain is built by the kernel
  from an empty journal with the pack's own scripts
  (``journal_fixtures``), and given as its lines, header first.
- The command is in the JSON form ``fencekeeper journal append`` reads
  (``journal_codec.command_from_json``), always with its
  ``expected_head``.  ``resolves`` is null for an append without a record
  resolver, else the records (kind, id, digest) the resolver finds.
- The expectation is the kernel's ``preview`` of that input: a refusal
  code, an idempotent repeat (the head unchanged), or the digests of the
  records appended, which pin their canonical bytes.
- Each refusal code of section 6 has a case, and each order of two checks
  the section states has one whose command fails both: the first check's
  code is expected.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import attrs

from fencekeeper.kernel import journal as j
from fencekeeper.kernel.canonical import Json
from fencekeeper.kernel.common import MAX_RATIONALE
from fencekeeper.kernel.dag import verify_workflow, workflow_from_json
from fencekeeper.kernel.journal_codec import command_from_json
from fencekeeper.kernel.journal_codes import JournalError
from fencekeeper.kernel.machines import NodeEvent, NodeState

from .. import journal_fixtures as fx
from . import wire
from .journal_cases import pack

Case = dict[str, Any]

__all__ = ["append_answer", "command_json", "journal_append_cases"]


def command_json(command: j.Command) -> dict[str, Json]:
    """A command in the JSON form ``command_from_json`` reads, every field written out."""
    common: dict[str, Json] = {
        "request": command.request_id,
        "expected_head": command.expected_head,
        "actor": command.actor_id,
        "role": command.role,
        "rationale": command.rationale,
    }
    if isinstance(command, j.Transition):
        return {
            "command": "transition",
            **common,
            "node": command.node_id,
            "event": command.event.value,
            "prior_state": command.prior_state.value,
            "attempt": None if command.attempt is None else {"id": command.attempt.attempt_id, "sequence": command.attempt.sequence},
            "records": [r.to_json() for r in command.records],
            "approvals": [{"actor": a.actor_id, "role": a.role, "record": a.record.to_json()} for a in command.approvals],
            "error": command.error,
        }
    nodes: list[Json] = [{"node": n.node_id, "prior_state": n.prior_state.value} for n in command.nodes]
    if isinstance(command, j.Invalidate):
        return {"command": "invalidate", **common, "source": command.source.to_json(), "policy": command.policy, "nodes": nodes}
    return {"command": "bind-successor", **common, "successor": command.successor.to_json(), "nodes": nodes}


def _time(text: object) -> datetime:
    """The append's time, in the one spelling the suite writes times in (specs/conformance.md, Values).

    The layer has no refusal of its own for it (an append is given its time, never asked for one), so
    another spelling is the case's input broken, named as such.
    """
    moment = wire.parse_time(text)
    if not isinstance(moment, datetime) or moment.tzinfo is None or moment.utcoffset() != timedelta(0):
        raise wire.WireError(f"input.now: must be a UTC time written as 2026-03-01T12:00:00.123457Z, got {text!r}")
    return moment


def append_answer(data: dict[str, Any]) -> dict[str, Any]:
    """The kernel's answer to one ``journal-append`` case, in the layer's output form."""
    workflow = verify_workflow(workflow_from_json(data["workflow"]))
    policy = j.verify_policy(j.policy_from_json(data["policy"]), workflow)
    known = {h.execution_id: h for h in (j.decode_header(line.encode("utf-8")) for line in data["headers"])}
    lines = [line.encode("utf-8") for line in data["chain"]]
    journal = j.replay(lines[0], lines[1:], workflow, policy, headers=known.get)
    resolver = None
    if data["resolves"] is not None:
        found = {(r["kind"], r["id"], r["digest"]) for r in data["resolves"]}

        def resolver(record: j.RecordRef) -> bool:
            return (record.kind, record.ref_id, record.digest) in found

    try:
        command = command_from_json(data["command"])
    except JournalError as exc:
        return {"outcome": "refused", "code": exc.code}
    outcome = j.preview(journal, command, _time(data["now"]), resolver, headers=known.get)
    if isinstance(outcome, j.Refusal):
        return {"outcome": "refused", "code": outcome.code.value}
    if isinstance(outcome, j.Unchanged):
        return {"outcome": "unchanged", "head": journal.head}
    return {"outcome": "appended", "head": outcome.journal.head, "records": [e.digest for e in outcome.events]}


_NORMATIVE = {"refused": ["outcome", "code"], "unchanged": ["outcome", "head"], "appended": ["outcome", "head", "records"]}


class _Cases:
    def __init__(self) -> None:
        directory = pack()
        self.workflow = _load(directory / "workflow.json")
        self.policy = _load(directory / "policy.json")
        self.cases: list[Case] = []

    def add(
        self,
        name: str,
        script: fx.Script,
        command: j.Command | dict[str, Json],
        *,
        resolves: list[j.RecordRef] | None = None,
        headers: tuple[j.Header, ...] = (),
        expect: str,
    ) -> None:
        lines = [line.decode("utf-8") for line in fx.lines(script.journal)]
        # One second after the chain's last event, at odd microseconds (as basis.T0 is).
        now = script.clock + timedelta(seconds=1, microseconds=123457)
        data = {
            "workflow": self.workflow,
            "policy": self.policy,
            "headers": [j.encode_header(h).decode("utf-8").rstrip("\n") for h in headers],
            "chain": lines,
            "command": command if isinstance(command, dict) else command_json(command),
            "now": now.isoformat(timespec="microseconds").replace("+00:00", "Z"),
            "resolves": None if resolves is None else [r.to_json() for r in resolves],
        }
        expected = append_answer(data)
        found = expected.get("code") or expected["outcome"]
        # The case says what it is for; a kernel that answers otherwise is a fault of the case, found here.
        if found != expect:
            raise AssertionError(f"append/{name}: expected {expect}, the kernel answers {expected}")
        self.cases.append(
            {"id": f"append/{name}", "input": data, "expected": expected, "normative": _NORMATIVE[expected["outcome"]]}
        )


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _until(step: Callable[[fx.Script], None]) -> fx.Script:
    script = fx.new("review-1")
    step(script)
    return script


def _search_done(script: fx.Script) -> None:
    attempt = j.AttemptRef("search-1", 1)
    script.do("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=attempt)
    script.do("search", NodeEvent.WORK_COMPLETED, "bot:search", "searcher", attempt=attempt,
              records=(fx.ref("search-results", "search-results"),))  # fmt: skip


def _screen_a_done(script: fx.Script) -> None:
    _search_done(script)
    script.work("screen-a", "alice", "screener", (fx.ref("screening", "screening-a"),))


def _at_sign_off(script: fx.Script) -> None:
    """Everything done up to the sign-off's start by carol."""
    _screen_a_done(script)
    script.work("screen-b", "bob", "screener", (fx.ref("screening", "screening-b"),))
    script.work("extraction", "carol", "extractor", (fx.ref("extraction", "extraction-table"),))
    script.work("synthesis", "carol", "synthesist", (fx.ref("synthesis", "report"),))
    script.do("sign-off", NodeEvent.DEPENDENCIES_SATISFIED, "bot:search", "scheduler")
    script.do("sign-off", NodeEvent.WORK_STARTED, "carol", "coordinator", attempt=j.AttemptRef("sign-off-1", 1))


def journal_append_cases() -> list[Case]:
    """The layer's cases, in their committed order."""
    c = _Cases()
    S, E = NodeState, NodeEvent

    # --- valid appends, one of each command kind and event family ----------------------------
    empty = fx.new("review-1")
    start = empty.transition("search", E.WORK_STARTED, "bot:search", "searcher", attempt=j.AttemptRef("search-1", 1))
    c.add("valid/work-started", empty, start, expect="appended")
    started = fx.new("review-1")
    started.send(start)
    started.count = empty.count  # its request ids go on from the command it was sent
    failed = started.transition("search", E.WORK_FAILED, "bot:search", "searcher",
                                attempt=j.AttemptRef("search-1", 1), error="index timed out")  # fmt: skip
    c.add("valid/work-failed", started, failed, expect="appended")
    at_bound = started.transition("search", E.WORK_FAILED, "bot:search", "searcher",
                                  attempt=j.AttemptRef("search-1", 1), error="e" * MAX_RATIONALE,
                                  rationale="r" * MAX_RATIONALE)  # fmt: skip
    c.add("valid/free-text-at-the-bound", started, at_bound, expect="appended")
    searched = _until(_search_done)
    ready = searched.transition("screen-a", E.DEPENDENCIES_SATISFIED, "bot:search", "scheduler")
    c.add("valid/dependencies-satisfied", searched, ready, expect="appended")
    screened = _until(_screen_a_done)
    signing = _until(_at_sign_off)
    attempt = j.AttemptRef("sign-off-1", 1)

    def sign_off(approvals: tuple[j.Approval, ...]) -> j.Transition:
        return signing.transition("sign-off", E.WORK_COMPLETED, "carol", "coordinator", attempt=attempt, approvals=approvals)

    c.add("valid/sign-off-with-approvals", signing, sign_off(fx.SIGN_OFF), expect="appended")
    records = [a.record for a in fx.SIGN_OFF]
    c.add("valid/records-resolve", signing, sign_off(fx.SIGN_OFF), resolves=records, expect="appended")
    reviewed = fx.review(fx.new("review-1"))
    c.add("valid/invalidate", reviewed, fx.invalidation(reviewed), expect="appended")
    invalidated = fx.review(fx.new("review-1"))
    invalidated.send(fx.invalidation(invalidated))
    second = fx.successor_journal().journal
    invalidated.headers[second.execution_id] = second.header
    bind = fx.binding(invalidated, second)
    c.add("valid/bind-successor", invalidated, bind, headers=(second.header,), expect="appended")

    # --- the request id: repeats and conflicts (rule 2) -------------------------------------
    c.add("repeat/same-command", started, start, expect="unchanged")
    other = attrs.evolve(start, rationale="started again")
    c.add("conflicting-request", started, other, expect="conflicting_request")
    # The bound applies to a new request only: a recorded one with long text is a conflict, not a shape fault.
    c.add("order/repeat-before-bound", started, attrs.evolve(start, rationale="r" * (MAX_RATIONALE + 1)),
          expect="conflicting_request")  # fmt: skip
    # Shape comes first, even for a recorded request id.
    c.add("order/shape-before-repeat", started, attrs.evolve(start, actor_id="bot search"), expect="invalid_request")

    # --- shape (rule 1) and the bound (rule 2): invalid_request ----------------------------
    def shape(name: str, command: j.Command, script: fx.Script = empty) -> None:
        c.add(f"invalid-request/{name}", script, command, expect="invalid_request")

    shape("actor-not-an-identifier", attrs.evolve(start, actor_id="bot search"))
    shape("expected-head-not-a-digest", attrs.evolve(start, expected_head="sha256:abc"))
    shape("attempt-sequence-zero", attrs.evolve(start, attempt=j.AttemptRef("search-1", 0)))
    shape("lone-surrogate-in-rationale", attrs.evolve(start, rationale="half \ud800 a character"))
    shape("record-twice", attrs.evolve(start, records=(fx.ref("search-results", "x"), fx.ref("search-results", "x"))))
    shape("transition-event-work-invalidated", attrs.evolve(start, event=E.WORK_INVALIDATED, attempt=None))
    shape("invalidate-no-nodes", attrs.evolve(fx.invalidation(reviewed), nodes=()), reviewed)
    first_node = fx.invalidation(reviewed).nodes[0]
    shape("invalidate-node-twice", attrs.evolve(fx.invalidation(reviewed), nodes=(first_node, first_node)), reviewed)
    shape("rationale-past-the-bound", attrs.evolve(start, rationale="r" * (MAX_RATIONALE + 1)))
    shape("error-past-the-bound", attrs.evolve(failed, error="e" * (MAX_RATIONALE + 1)), started)
    shape("work-failed-without-error", attrs.evolve(failed, error=None), started)
    shape("error-on-work-started", attrs.evolve(start, error="nothing failed"))

    # --- the command's JSON form: the codec's codes -------------------------------------------
    c.add("json/unknown-field", empty, {**command_json(start), "colour": "red"}, expect="unknown_field")
    without = command_json(start)
    del without["actor"]
    c.add("json/missing-field", empty, without, expect="missing_field")
    c.add("json/not-a-node-event", empty, {**command_json(start), "event": "work-teleported"}, expect="malformed_record")
    # Cases 4.3.0: what section 6, "The JSON form of a command", says beyond the three codes.  The members a
    # form may leave out are filled in with exactly the values valid/dependencies-satisfied writes out, so the
    # record appended, and its digest, are that case's.
    optional = ("rationale", "attempt", "records", "approvals", "error")
    c.add("json/omitted-members", searched, {k: v for k, v in command_json(ready).items() if k not in optional},
          expect="appended")  # fmt: skip
    c.add("json/no-command", empty, {k: v for k, v in command_json(start).items() if k != "command"},
          expect="malformed_record")  # fmt: skip
    misspelt = {"kind": "search-results", "id": "x", "digest": "sha256:abc"}
    c.add("json/reference-digest-misspelt", empty, {**command_json(start), "records": [misspelt]},
          expect="malformed_record")  # fmt: skip
    c.add("json/attempt-sequence-negative", empty, {**command_json(start), "attempt": {"id": "search-1", "sequence": -1}},
          expect="malformed_record")  # fmt: skip
    # The form is read whole before rule 1 (an actor that is no identifier is invalid_request alone), and its
    # values in the order the section gives: approvals before event.
    c.add("json/order/form-before-shape", empty, {**command_json(start), "actor": "bot search", "event": "work-teleported"},
          expect="malformed_record")  # fmt: skip
    weighed: list[Json] = [{"actor": a.actor_id, "role": a.role, "record": a.record.to_json(), "weight": 2} for a in fx.SIGN_OFF]
    c.add("json/order/approvals-before-event", signing,
          {**command_json(sign_off(fx.SIGN_OFF)), "approvals": weighed, "event": "work-teleported"},
          expect="unknown_field")  # fmt: skip

    # --- the head and the resolver (rule 3) ----------------------------------------------------
    stale = attrs.evolve(ready, expected_head=started.journal.head, request_id="late-r1")
    c.add("stale-head", searched, stale, expect="stale_head")
    c.add("order/stale-head-before-unknown-node", searched, attrs.evolve(stale, node_id="appraisal"), expect="stale_head")
    unresolved = sign_off(fx.SIGN_OFF)
    c.add("unresolved-record", signing, unresolved, resolves=records[:1], expect="unresolved_record")
    c.add("order/stale-head-before-unresolved", signing,
          attrs.evolve(unresolved, expected_head=searched.journal.head), resolves=[], expect="stale_head")  # fmt: skip
    c.add("order/unresolved-before-unknown-node", signing, attrs.evolve(unresolved, node_id="appraisal"),
          resolves=[], expect="unresolved_record")  # fmt: skip
    c.add("order/repeat-before-unresolved", started, start, resolves=[fx.ref("search-results", "x")], expect="unchanged")
    completed = started.transition("search", E.WORK_COMPLETED, "bot:search", "searcher",
                                   attempt=j.AttemptRef("search-1", 1), records=(fx.ref("search-results", "search-results"),))  # fmt: skip
    c.add("unresolved-record/records", started, completed, resolves=[], expect="unresolved_record")

    # --- the node, its state and the table (rule 4) ----------------------------------------
    c.add("unknown-node", empty, attrs.evolve(start, node_id="appraisal"), expect="unknown_node")
    c.add("prior-state-mismatch", empty, attrs.evolve(start, prior_state=S.ACTIVE), expect="prior_state_mismatch")
    c.add("order/unknown-node-before-prior-state", empty, attrs.evolve(start, node_id="appraisal", prior_state=S.ACTIVE),
          expect="unknown_node")  # fmt: skip
    c.add("invalid-transition", empty, attrs.evolve(start, event=E.WORK_COMPLETED), expect="invalid_transition")
    c.add("order/prior-state-before-invalid-transition", empty,
          attrs.evolve(start, event=E.WORK_COMPLETED, prior_state=S.COMPLETED), expect="prior_state_mismatch")  # fmt: skip
    c.add("order/invalid-transition-before-forged-role", empty,
          attrs.evolve(start, event=E.WORK_COMPLETED, actor_id="mallory"), expect="invalid_transition")  # fmt: skip

    # --- authority (rule 5) ------------------------------------------------------------------
    c.add("forged-role/no-assignment", empty, attrs.evolve(start, actor_id="mallory"), expect="forged_role")
    c.add("forged-role/role-not-assigned", empty, attrs.evolve(start, actor_id="alice"), expect="forged_role")
    c.add("forged-role/node-does-not-admit", empty, attrs.evolve(start, role="scheduler"), expect="forged_role")
    screen_b = screened.transition("screen-b", E.DEPENDENCIES_SATISFIED, "bot:search", "scheduler")
    screening = _until(_screen_a_done)
    screening.send(screen_b)
    screening.count = screened.count
    start_b = screening.transition("screen-b", E.WORK_STARTED, "bob", "screener", attempt=j.AttemptRef("screen-b-1", 1))
    c.add("valid/human-work-started", screening, start_b, expect="appended")
    c.add("automation-claims-human", screening, attrs.evolve(start_b, actor_id="bot:extract"), expect="automation_claims_human")
    c.add("order/forged-role-before-automation", screening, attrs.evolve(start_b, actor_id="bot:search"),
          expect="forged_role")  # fmt: skip
    c.add("not-independent", screening, attrs.evolve(start_b, actor_id="alice"), expect="not_independent")

    # --- the event's own rules (rule 6) --------------------------------------------------------
    early = started.transition("screen-a", E.DEPENDENCIES_SATISFIED, "bot:search", "scheduler")
    c.add("dependency-gap", started, early, expect="dependency_gap")
    c.add("invalid-attempt/dependencies-satisfied-binds-one", searched, attrs.evolve(ready, attempt=j.AttemptRef("screen-a-1", 1)),
          expect="invalid_attempt")  # fmt: skip
    c.add("invalid-attempt/first-numbered-2", empty, attrs.evolve(start, attempt=j.AttemptRef("search-1", 2)), expect="invalid_attempt")
    c.add("invalid-attempt/not-the-current", started, attrs.evolve(failed, attempt=j.AttemptRef("search-9", 1)),
          expect="invalid_attempt")  # fmt: skip
    c.add("missing-declared-output", started, attrs.evolve(completed, records=()), expect="missing_declared_output")
    c.add("invalid-approval/not-an-approval-node", started, attrs.evolve(completed, approvals=fx.SIGN_OFF[:1]),
          expect="invalid_approval")  # fmt: skip
    c.add("invalid-approval/too-few", signing, sign_off(fx.SIGN_OFF[:1]), expect="invalid_approval")
    c.add("invalid-approval/same-actor-twice", signing,
          sign_off((fx.SIGN_OFF[0], j.Approval("alice", "reviewer", fx.ref("approval", "alice-again")))),
          expect="invalid_approval")  # fmt: skip
    c.add("invalid-approval/automation", signing,
          sign_off((fx.SIGN_OFF[0], j.Approval("bot:extract", "reviewer", fx.ref("approval", "bot")))),
          expect="invalid_approval")  # fmt: skip
    c.add("forged-role/approval", signing,
          sign_off((fx.SIGN_OFF[0], j.Approval("carol", "reviewer", fx.ref("approval", "carol")))), expect="forged_role")  # fmt: skip
    c.add("order/approval-role-before-forged-approval", signing,
          sign_off((j.Approval("alice", "screener", fx.ref("approval", "a")), j.Approval("carol", "reviewer", fx.ref("approval", "c")))),
          expect="invalid_approval")  # fmt: skip

    # --- invalidation ------------------------------------------------------------------------
    retraction = fx.invalidation(reviewed)
    c.add("unverified-authority/unknown-invalidation-policy", reviewed, attrs.evolve(retraction, policy="whim"),
          expect="unverified_authority")  # fmt: skip
    c.add("forged-role/invalidation-role", reviewed, attrs.evolve(retraction, actor_id="alice", role="reviewer"),
          expect="forged_role")  # fmt: skip
    c.add("partial-invalidation", reviewed, attrs.evolve(retraction, nodes=retraction.nodes[:-1]), expect="partial_invalidation")
    c.add("automation-claims-human/invalidation", reviewed,
          attrs.evolve(retraction, actor_id="bot:search", role="scheduler", policy="index-withdrawal"),
          expect="automation_claims_human")  # fmt: skip
    c.add("order/prior-state-before-invalidation-policy", reviewed,
          attrs.evolve(retraction, policy="whim", nodes=(j.NodeExpectation("screen-a", S.ACTIVE), *retraction.nodes[1:])),
          expect="prior_state_mismatch")  # fmt: skip

    # --- successor binding -----------------------------------------------------------------
    def bound(name: str, command: j.BindSuccessor, expect: str, headers: tuple[j.Header, ...] = (second.header,)) -> None:
        c.add(name, invalidated, command, headers=headers, expect=expect)

    bound("bad-successor-binding/not-an-execution", attrs.evolve(bind, successor=attrs.evolve(bind.successor, kind="report")),
          "bad_successor_binding")
    bound("bad-successor-binding/itself", attrs.evolve(bind, successor=j.RecordRef(j.SUCCESSOR_KIND, "review-1",
          invalidated.journal.header.digest)), "bad_successor_binding")  # fmt: skip
    bound("bad-successor-binding/no-header", bind, "bad_successor_binding", headers=())
    bound("bad-successor-binding/not-every-invalidated-node", attrs.evolve(bind, nodes=bind.nodes[:-1]), "bad_successor_binding")
    bound("automation-claims-human/successor", attrs.evolve(bind, actor_id="bot:search", role="scheduler"),
          "automation_claims_human")
    bound("order/successor-kind-before-unknown-node",
          attrs.evolve(bind, successor=attrs.evolve(bind.successor, kind="report"),
                       nodes=(j.NodeExpectation("appraisal", S.INVALIDATED), *bind.nodes)), "bad_successor_binding")  # fmt: skip
    return c.cases
