"""Every answer is scored against the request it answers, or the run stops (specs/conformance.md, Numbered requests).

A driver that writes one line more than it was asked for (a debug print on
standard output, a second answer to one request) shifts every later answer
onto the request after its own: right answers fail, and where neighbouring
cases expect the same answer a wrong one passes.  The runner numbers its
requests (``seq``, protocol 1.2); a driver that echoes the number is
stopped at the first stray line, which the message names with its case and
the number expected.  A driver that does not echo it is still stopped
before any report, at the latest by its answer to ``bye``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters import cli
from fencekeeper.adapters.conformance import runner
from fencekeeper.adapters.conformance.driver import answer
from fencekeeper.adapters.memory import MemoryStore

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "specs" / "conformance"
MISBEHAVING = f"{sys.executable} {Path(__file__).with_name('misbehaving_driver.py')}"


def _machines_case(index: int) -> str:
    return str(json.loads((CASES / "machines.json").read_text(encoding="utf-8"))["cases"][index]["id"])


def _breach(arguments: str) -> str:
    with pytest.raises(runner.DriverError) as caught:
        runner.run(f"{MISBEHAVING} {arguments}", ["machines"], CASES)
    return str(caught.value)


def test_a_stray_line_from_a_driver_that_echoes_seq_is_named_with_its_case_and_number() -> None:
    # Without the numbers, the debug line was scored as case 5's answer (a failure) and every later
    # answer as the answer to the case after its own.
    message = _breach("stray 5 --echo")
    # hello is request 1, so the fifth case is request 6.
    case = _machines_case(4)
    assert message.startswith(f"layer machines, case {case}: out of step: the answer to case {case} (seq 6) carries no seq:")
    assert f'{{"debug": "answering {case}"}}' in message


def test_a_second_answer_from_a_driver_that_echoes_seq_stops_the_run_at_the_next_case() -> None:
    message = _breach("twice 5 --echo")
    assert message.startswith(f"layer machines, case {_machines_case(5)}: out of step:"), message
    # Caught either as a line already waiting before the sixth case was sent, or by its number, 6, where 7 was due.
    assert f"after its answer to case {_machines_case(4)}" in message or "(seq 7) carries seq 6" in message, message


@pytest.mark.parametrize("mode", ["stray", "twice"])
def test_a_driver_that_does_not_echo_seq_gets_no_report_from_a_shifted_run(mode: str) -> None:
    # Such a run was reported, every answer after the stray line scored against the wrong case.
    assert "out of step" in _breach(f"{mode} 5")


@pytest.mark.parametrize("mode", ["stray", "twice"])
def test_the_command_exits_2_and_says_the_answers_fell_out_of_step(
    mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["conformance", "--driver", f"{MISBEHAVING} {mode} 5 --echo", "--layer", "machines"]) == 2
    err = capsys.readouterr().err
    assert "the driver broke the protocol: layer machines, case " in err and "out of step" in err
    assert err.count("\n") == 1 and "Traceback" not in err


class _ShiftedAtBye:
    """A driver that does not echo seq, whose shift shows only at bye: it answers bye with a case's answer."""

    def __init__(self, bye: Any) -> None:
        self.expected = {
            case["id"]: case["expected"]
            for case in json.loads((CASES / "machines.json").read_text(encoding="utf-8"))["cases"]
        }
        self.bye = bye

    def ask(self, request: dict[str, Any]) -> Any:
        if request["op"] == "hello":
            return {"protocol": 1, "layers": ["machines"]}
        if request["op"] == "case":
            return {"output": self.expected[request["id"]]}
        return self.bye

    def close(self) -> None:
        pass


def test_an_answer_to_bye_that_is_not_ok_is_a_shift_the_report_must_not_hide() -> None:
    # Every case "passed": the answers came in the right order here, but a real driver one line ahead
    # leaves exactly this at bye, the last case's answer, and its report was printed and exited 0.
    with pytest.raises(runner.DriverError) as caught:
        runner.run(_ShiftedAtBye({"output": {"illegal": True}}), ["machines"], CASES)
    message = str(caught.value)
    assert message.startswith('out of step: the answer to bye is {"output": {"illegal": true}}, not {"ok": true}')
    assert "Echo each request's seq" in message


def test_a_driver_that_answers_bye_ok_or_not_at_all_keeps_its_report() -> None:
    [machines] = runner.run(_ShiftedAtBye({"ok": True}), ["machines"], CASES)
    assert machines.verdict == "passed"


class _Numbered:
    """Echoes seq as ``echo`` says: a function of the request's number, or a fixed value."""

    def __init__(self, echo: Any) -> None:
        self.echo = echo
        self.inner = runner.InProcessDriver(MemoryStore)

    def ask(self, request: dict[str, Any]) -> Any:
        response = self.inner.ask(request)
        response["seq"] = self.echo(request["seq"]) if callable(self.echo) else self.echo
        return response

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize(
    ("echo", "said"),
    [
        (lambda seq: seq + 1, "the answer to hello (seq 1) carries seq 2"),
        (True, "the answer to hello (seq 1) carries seq true"),
        (str, 'the answer to hello (seq 1) carries seq "1"'),
    ],
)
def test_a_wrong_seq_is_a_breach_from_the_first_answer(echo: Any, said: str) -> None:
    with pytest.raises(runner.DriverError, match="out of step") as caught:
        runner.run(_Numbered(echo), ["machines"], CASES)
    assert said in str(caught.value)


def test_a_driver_that_echoed_seq_in_hello_must_echo_it_in_every_answer() -> None:
    def then_stop(seq: int) -> int | None:
        return seq if seq < 3 else None

    class _Forgets(_Numbered):
        def ask(self, request: dict[str, Any]) -> Any:
            response = super().ask(request)
            if response["seq"] is None:
                del response["seq"]
            return response

    with pytest.raises(runner.DriverError) as caught:
        runner.run(_Forgets(then_stop), ["machines"], CASES)
    assert f"layer machines, case {_machines_case(1)}: out of step: the answer to case {_machines_case(1)} (seq 3) " \
        "carries no seq" in str(caught.value)


def test_a_driver_that_does_not_echo_seq_is_held_to_one_it_writes() -> None:
    # Optional, but checked when present: a 1.1 driver's stray line that happens to carry a number is still caught.
    class _LateNumbers(_Numbered):
        def ask(self, request: dict[str, Any]) -> Any:
            response = super().ask(request)
            if request["op"] == "hello":
                del response["seq"]
            return response

    with pytest.raises(runner.DriverError, match=r"\(seq 2\) carries seq 1"):
        runner.run(_LateNumbers(lambda seq: seq - 1), ["machines"], CASES)


def test_the_python_driver_echoes_every_requests_seq() -> None:
    requests: list[dict[str, Any]] = [
        {"op": "hello", "protocol": 1, "seq": 1},
        {"op": "case", "layer": "machines", "id": "x", "input": {"machine": "execution", "state": "eligible",
                                                                 "event": "claim"}, "seq": 2},
        {"op": "case", "layer": "machines", "id": "y", "input": {}, "seq": 3},
        {"op": "reset", "seq": 4},
        {"op": "bye", "seq": 5},
    ]
    for request in requests:
        assert answer(request, None, ("machines",), "t")["seq"] == request["seq"]
    # A request without one (protocol 1.1's runner) gets no seq back.
    assert "seq" not in answer({"op": "bye"}, None, ("machines",), "t")


def test_the_javascript_driver_echoes_every_requests_seq() -> None:
    node = shutil.which("node")
    if node is None:
        if os.environ.get("FENCEKEEPER_REQUIRE_NODE"):
            pytest.fail("FENCEKEEPER_REQUIRE_NODE is set but node is not on PATH")
        pytest.skip("node is not on PATH: the JavaScript driver cannot run (set FENCEKEEPER_REQUIRE_NODE=1 to fail)")
    lines = [
        {"op": "hello", "protocol": 1, "seq": 1},
        {"op": "case", "layer": "machines", "id": "x",
         "input": {"machine": "execution", "state": "eligible", "event": "claim"}, "seq": 2},
        {"op": "reset", "seq": 3},
        {"op": "bye", "seq": 4},
    ]
    run = subprocess.run(
        [node, "conformance/drivers/js/driver.js"], input="".join(json.dumps(line) + "\n" for line in lines),
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=True,
    )
    assert [json.loads(line)["seq"] for line in run.stdout.splitlines()] == [1, 2, 3, 4]


def test_a_numbered_answer_to_bye_must_still_be_ok() -> None:
    class _ByeRefused(_Numbered):
        def ask(self, request: dict[str, Any]) -> Any:
            response = super().ask(request)
            return {"error": "unknown op", "seq": response["seq"]} if request["op"] == "bye" else response

    with pytest.raises(runner.DriverError) as caught:
        runner.run(_ByeRefused(lambda seq: seq), ["machines"], CASES)
    # Its number was right: a wrong answer, not a shift.
    assert str(caught.value).startswith('the answer to bye is {"error": "unknown op", "seq": ')
    assert "out of step" not in str(caught.value)
