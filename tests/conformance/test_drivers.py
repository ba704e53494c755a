"""The runner against real drivers: the Python kernel and stores, the JavaScript implementation, and wrong ones.

Each test starts a driver as a subprocess through the runner, exactly as a
third-party implementation would be run (specs/conformance.md).  The
correct drivers must pass every layer they declare; a wrong one must be
reported failed, and an undeclared or unsupported layer skipped, never
passed; a store without isolation must fail the store layer's races.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters import cli
from fencekeeper.adapters.conformance import runner
from fencekeeper.adapters.conformance.driver import kernel_answer
from fencekeeper.adapters.memory import MemoryStore

from .test_wire_form import PROVEN, replayed_resume
from .unlocked_store import UnlockedMemoryStore

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "specs" / "conformance"
DRIVER = f"{sys.executable} -m fencekeeper.adapters.conformance.driver"
KERNEL_LAYERS = ("machines", "protocol", "recovery", "expressions", "definitions", "operations", "journal", "interpreter")


def _verdicts(reports: list[runner.LayerReport]) -> dict[str, str]:
    return {r.layer: r.verdict for r in reports}


def _run(command: str, layers: tuple[str, ...]) -> list[runner.LayerReport]:
    return runner.run(command, layers, CASES, cwd=ROOT)


def test_the_kernel_and_the_memory_store_pass_every_layer() -> None:
    reports = _run(f"{DRIVER} --store memory", (*KERNEL_LAYERS, "store"))
    assert _verdicts(reports) == dict.fromkeys((*KERNEL_LAYERS, "store"), "passed"), runner.render(reports)
    assert all(r.skipped == 0 and r.passed > 0 for r in reports)


def test_the_sqlite_store_passes_the_store_layer() -> None:
    reports = _run(f"{DRIVER} --store sqlite", ("store",))
    assert _verdicts(reports) == {"store": "passed"}, runner.render(reports)


def test_the_postgres_store_passes_the_store_layer(pg_dsn: str) -> None:
    reports = _run(f"{DRIVER} --store postgres --dsn {pg_dsn}", ("store",))
    assert _verdicts(reports) == {"store": "passed"}, runner.render(reports)


def test_a_store_without_isolation_fails_the_races() -> None:
    reports = _run(f"{DRIVER} --factory tests.conformance.unlocked_store:UnlockedMemoryStore", ("store",))
    [store] = reports
    assert store.verdict == "failed"
    assert store.first_failure is not None and store.first_failure["id"].startswith("race/")
    # Only the races can see it, and every one of them does; every sequential script still passes.
    ids = [c["id"] for c in json.loads((CASES / "store.json").read_text(encoding="utf-8"))["cases"]]
    races = sum(i.startswith("race/") for i in ids)
    assert (store.failed, store.passed) == (races, len(ids) - races)


def test_the_javascript_implementation_passes_its_layers() -> None:
    node = shutil.which("node")
    if node is None:
        if os.environ.get("FENCEKEEPER_REQUIRE_NODE"):
            pytest.fail("FENCEKEEPER_REQUIRE_NODE is set but node is not on PATH")
        pytest.skip("node is not on PATH: the JavaScript driver cannot run (set FENCEKEEPER_REQUIRE_NODE=1 to fail)")
    reports = _run(f"{node} conformance/drivers/js/driver.js", (*KERNEL_LAYERS, "journal-append", "store"))
    assert _verdicts(reports) == {
        "machines": "passed", "protocol": "passed", "recovery": "passed", "expressions": "passed",
        "definitions": "passed", "interpreter": "passed", "journal": "passed", "journal-append": "passed",
        "operations": "passed", "store": "passed",
    }, runner.render(reports)
    # Every case of a declared layer answered, none left unsupported: each is written from the spec whole.
    declared = [r for r in reports if r.verdict == "passed"]
    assert all(r.skipped == 0 and r.failed == 0 and r.passed > 0 for r in declared), runner.render(reports)
    # Every case of these layers among them: none was answered unsupported.
    # The store's races among them: both hold points are offered, so none of its races is skipped.
    for layer in ("operations", "recovery", "definitions", "store"):
        report = next(r for r in reports if r.layer == layer)
        cases = json.loads((CASES / f"{layer}.json").read_text(encoding="utf-8"))["cases"]
        assert (report.passed, report.failed, report.skipped) == (len(cases), 0, 0), layer


def _node_answers(asked: list[tuple[str, Any]]) -> list[Any]:
    """The JavaScript driver's outputs to cases no committed file holds, one (layer, input) each."""
    node = shutil.which("node")
    if node is None:
        if os.environ.get("FENCEKEEPER_REQUIRE_NODE"):
            pytest.fail("FENCEKEEPER_REQUIRE_NODE is set but node is not on PATH")
        pytest.skip("node is not on PATH: the JavaScript driver cannot run (set FENCEKEEPER_REQUIRE_NODE=1 to fail)")
    lines = "".join(json.dumps({"op": "case", "layer": layer, "id": "x", "input": data, "seq": n}) + "\n"
                    for n, (layer, data) in enumerate(asked))
    done = subprocess.run([node, "conformance/drivers/js/driver.js"], cwd=ROOT, input=lines,
                          capture_output=True, text=True, timeout=30, check=True)
    return [json.loads(line)["output"] for line in done.stdout.splitlines()]


def test_the_javascript_implementation_answers_a_repeated_recovery_with_its_stored_proof() -> None:
    # No committed case stores a record with a proof, so the spec's statement (specs/conformance.md,
    # `recovery`: the record as stored, its proof included) is asked of the driver directly.
    data = replayed_resume()
    [answered] = _node_answers([("recovery", data)])
    assert (answered["outcome"], answered["code"]) == ("unchanged", "recovery_replayed")
    assert answered["record"] == data["rows"]["recovery"] and answered["record"]["proof"] == PROVEN


def _first_input(layer: str, decision: str | None = None) -> dict[str, Any]:
    cases = json.loads((CASES / f"{layer}.json").read_text(encoding="utf-8"))["cases"]
    data: dict[str, Any] = next(c["input"] for c in cases if decision is None or c["input"].get("decision") == decision)
    return data


def _changed(data: dict[str, Any], path: tuple[str, ...], value: object) -> dict[str, Any]:
    changed: dict[str, Any] = json.loads(json.dumps(data))
    inner = changed
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] = value
    return changed


def test_the_javascript_layers_read_a_value_alike_and_as_the_kernel_does() -> None:
    # Each layer once read these values with its own copy of the rule, and some copies differed from
    # the spec: a time before 1970 written with a negative fraction, a year 0 read as a time, a
    # reviewer's rationale without its bound of 2000 characters (specs/interpreter.md, Approvals).
    asked: list[tuple[str, Any]] = [
        ("protocol", _changed(_first_input("protocol", "admit"), ("now",), "1969-12-31T23:59:59.500001Z")),
        ("protocol", _changed(_first_input("protocol", "admit"), ("now",), "0000-01-01T00:00:00.000000Z")),
        ("operations", _changed(_first_input("operations", "submit"), ("now",), "0000-01-01T00:00:00.000000Z")),
        ("interpreter", _changed(_first_input("interpreter"), ("now",), "0000-01-01T00:00:00.000000Z")),
        ("protocol", _changed(_first_input("protocol", "decide_approval"), ("request", "rationale"), "x" * 2001)),
        ("protocol", _changed(_first_input("protocol", "decide_approval"), ("request", "rationale"),
                              "\U0001f600" * 2000)),
    ]
    answered = _node_answers(asked)
    # Part by part as the JavaScript driver answers them (the kernel's answer has parts no case of
    # these decisions holds normative, a protocol decision's `recovery` among them).
    for (layer, data), got in zip(asked, answered, strict=True):
        kernel = kernel_answer(layer, data)
        assert {part: kernel.get(part) for part in got} == got, (layer, data)
    # What the kernel answers, so that the comparison above is not of two answers alike but wrong.
    assert answered[0]["dispatch"]["eligible_at"] == "1969-12-31T23:59:59.500001Z"
    assert [a["field"] for a in answered[1:3]] == ["now", "now"]
    assert answered[3] == {"plan": "refused", "code": "invalid_view", "field": "now"}
    # The bound counts code points: 2000 characters beyond U+FFFF are 4000 UTF-16 units, and within it.
    assert (answered[4]["field"], answered[5]["outcome"]) == ("rationale", "accepted")


def test_a_wrong_driver_is_reported_failed_and_skipped_never_passed() -> None:
    reports = _run(f"{sys.executable} -m tests.conformance.wrong_driver", ("machines", "protocol", "expressions"))
    verdicts = _verdicts(reports)
    assert verdicts == {"machines": "failed", "protocol": "skipped", "expressions": "skipped"}, runner.render(reports)
    machines = reports[0]
    assert machines.failed == 1 and machines.first_failure is not None
    assert machines.first_failure["id"] == "execution/eligible/claim"
    assert machines.first_failure["differences"]["target"] == {"expected": "running", "got": "waiting"}
    assert reports[1].passed == 0 and reports[1].skipped == reports[1].failed + reports[1].skipped > 0


def test_the_command_exits_1_on_a_failure_and_prints_the_first_difference(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    code = cli.main(["conformance", "--driver", f"{sys.executable} -m tests.conformance.wrong_driver",
                     "--layer", "machines", "--layer", "expressions", "--cases", str(CASES)])
    out = capsys.readouterr().out
    assert code == 1
    assert f"machines       failed   passed {_machines_cases() - 1}, failed 1, skipped 0" in out
    assert "expressions    skipped" in out and "does not declare" in out
    assert '"id": "execution/eligible/claim"' in out


def test_the_command_exits_0_when_everything_chosen_passes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    assert cli.main(["conformance", "--driver", DRIVER, "--layer", "machines"]) == 0
    assert f"machines       passed   passed {_machines_cases()}," in capsys.readouterr().out


def _machines_cases() -> int:
    """How many cases the committed machines layer holds (it grows with the tables)."""
    return len(json.loads((CASES / "machines.json").read_text(encoding="utf-8"))["cases"])


def test_a_factory_runs_in_process_through_the_same_protocol() -> None:
    assert _verdicts(runner.run_factory(MemoryStore, cases_dir=CASES)) == {"store": "passed"}
    # A factory that takes no clock gets store.clock set, as the broken variants are written.
    def no_clock() -> UnlockedMemoryStore:
        return UnlockedMemoryStore()

    [report] = runner.run_factory(no_clock, cases_dir=CASES)
    assert report.verdict == "failed" and report.first_failure is not None
    assert report.first_failure["id"].startswith("race/")


def test_the_javascript_store_offers_both_hold_points_and_refuses_an_unknown_one() -> None:
    node = shutil.which("node")
    if node is None:
        if os.environ.get("FENCEKEEPER_REQUIRE_NODE"):
            pytest.fail("FENCEKEEPER_REQUIRE_NODE is set but node is not on PATH")
        pytest.skip("node is not on PATH: the JavaScript driver cannot run (set FENCEKEEPER_REQUIRE_NODE=1 to fail)")
    step = {"session": "a", "call": "expired", "now": "2026-03-01T12:00:00.123457Z", "args": {}}
    asked = [{"op": "hello", "protocol": 1}, {"op": "reset"}, {"op": "store", "step": step, "hold": "after-commit"},
             {"op": "store", "step": step}]
    lines = "".join(json.dumps({**request, "seq": n}) + "\n" for n, request in enumerate(asked, 1))
    done = subprocess.run([node, "conformance/drivers/js/driver.js"], cwd=ROOT, input=lines,
                          capture_output=True, text=True, timeout=30, check=True)
    hello, reset, unknown, plain = (json.loads(line) for line in done.stdout.splitlines())
    assert hello["holds"] == ["commit", "clock"] and "store" in hello["layers"]
    assert reset == {"ok": True, "seq": 2}
    assert unknown == {"unsupported": True, "seq": 3}
    assert plain == {"output": {"outcome": "ids", "ids": []}, "seq": 4}


def test_the_javascript_implementation_needs_nothing_but_node_and_the_specs() -> None:
    # No package to install and no Python to borrow from: only node's own modules and its own files
    # (crypto for the SHA-256 of a long attempt identity, specs/interpreter.md, Step attempts, and of the
    # journal's records, specs/journal.md, section 1).
    sources = sorted((ROOT / "conformance" / "drivers" / "js").glob("*.js"))
    assert len(sources) >= 4
    for source in sources:
        text = source.read_text(encoding="utf-8")
        required = set(re.findall(r"require\(\"([^\"]+)\"\)", text))
        allowed = {"fs", "path", "readline", "crypto", "./machines", "./protocol", "./expr", "./approvals",
                   "./interpreter", "./journal", "./operations", "./definitions", "./recovery", "./values", "./store"}
        assert required <= allowed, (source.name, required)
        assert "kernel/" not in text and ".py" not in text, source.name


class _Protocol10Driver(runner.InProcessDriver):
    """The Python driver as a protocol 1.0 driver would answer: no ``holds`` in hello; it records every hold asked."""

    def __init__(self) -> None:
        super().__init__(MemoryStore, name="protocol-1.0")
        self.holds_asked: list[object] = []

    def ask(self, request: dict[str, object]) -> object:
        if request.get("op") == "store" and "hold" in request:
            self.holds_asked.append(request["hold"])
        response = super().ask(request)
        if request.get("op") == "hello":
            response.pop("holds")
        return response


def test_a_driver_without_the_clock_hold_gets_those_races_skipped_never_passed() -> None:
    driver = _Protocol10Driver()
    [store] = runner.run(driver, ("store",), CASES)
    ids = [c["id"] for c in json.loads((CASES / "store.json").read_text(encoding="utf-8"))["cases"]]
    at_clock = sum(i.startswith("race/at_clock/") for i in ids)
    assert at_clock >= 2
    assert (store.verdict, store.failed, store.skipped, store.passed) == ("partial", 0, at_clock, len(ids) - at_clock)
    assert store.skip_reason is not None and "'clock'" in store.skip_reason
    # Its commit races were asked exactly as protocol 1.0 asks them, and no clock hold reached it.
    assert driver.holds_asked and set(driver.holds_asked) == {True}


def test_a_hold_point_the_driver_does_not_know_is_unsupported() -> None:
    driver = runner.InProcessDriver(MemoryStore)
    try:
        assert driver.ask({"op": "hello", "protocol": 1})["holds"] == ["commit", "clock"]
        assert driver.ask({"op": "reset"}) == {"ok": True}
        step = {"session": "a", "call": "expired", "now": "2026-03-01T12:00:00.123457Z", "args": {}}
        assert driver.ask({"op": "store", "step": step, "hold": "after-commit"}) == {"unsupported": True}
        assert driver.ask({"op": "store", "step": step}) == {"output": {"outcome": "ids", "ids": []}}
    finally:
        driver.close()


def test_a_dsn_naming_a_schema_is_one_clear_error_before_anything_is_made() -> None:
    # The driver makes a fresh schema of its own for the run and drops it; a ?schema= (the form
    # every --db takes) cannot be honoured, and must not end in a traceback from libpq.
    import subprocess  # noqa: PLC0415 - only this test starts the driver by hand

    run = subprocess.run(
        [sys.executable, "-m", "fencekeeper.adapters.conformance.driver", "--store", "postgres",
         "--dsn", "postgresql://nobody@127.0.0.1:1/none?schema=mine"],
        input="", capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert "--dsn" in line and "schema" in line, line
