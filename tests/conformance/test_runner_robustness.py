"""The runner against drivers that break the way real ones do: it reports, it never hangs or crashes.

Each driver is ``misbehaving_driver.py``, which answers every case right and
misbehaves once.  The runner's message is all its author gets, so it must
name the layer and the case, and the command must exit 2 with one line,
never a traceback (docs/conformance.md, Running the runner).
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters import cli
from fencekeeper.adapters.conformance import runner
from fencekeeper.adapters.conformance.basis import LAYERS
from fencekeeper.adapters.memory import MemoryStore

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "specs" / "conformance"
MISBEHAVING = f"{sys.executable} {Path(__file__).with_name('misbehaving_driver.py')}"


def _machines_case(index: int) -> str:
    cases = json.loads((CASES / "machines.json").read_text(encoding="utf-8"))["cases"]
    return str(cases[index]["id"])


def _fifth_machines_case() -> str:
    return _machines_case(4)


def _first_machines_case() -> str:
    return _machines_case(0)


def _breach(mode: str) -> str:
    with pytest.raises(runner.DriverError) as caught:
        runner.run(f"{MISBEHAVING} {mode}", ["machines"], CASES)
    return str(caught.value)


@pytest.mark.parametrize("mode", ["crash", "garbage"])
def test_a_breach_names_the_layer_and_the_case(mode: str) -> None:
    assert f"layer machines, case {_fifth_machines_case()}:" in _breach(mode)


@pytest.mark.parametrize(("mode", "code"), [("crash", 3), ("exit0", 0)])
def test_a_driver_that_exits_is_reported_with_its_exit_code(mode: str, code: int) -> None:
    assert f"driver exited (code {code}) without answering case" in _breach(mode)


def test_output_that_is_not_utf8_is_a_breach_not_a_thirty_second_wait() -> None:
    # It used to kill the thread reading the driver (a traceback on stderr), then time out.
    started = time.monotonic()
    message = _breach("bytes")
    assert "not UTF-8" in message and f"case {_fifth_machines_case()}" in message
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    ("hello", "said"),
    [
        ({"protocol": True, "layers": ["machines"]}, "does not speak protocol 1"),
        ({"protocol": 2, "layers": ["machines"]}, "does not speak protocol 1"),
        ({"protocol": 1, "layers": 5}, "'layers' must be a list of names"),
        ({"protocol": 1, "layers": ["machines"], "holds": "clock"}, "'holds' must be a list of names"),
    ],
)
def test_a_hello_that_is_not_protocol_1_is_one_clear_breach(hello: dict[str, object], said: str) -> None:
    # layers 5 was a TypeError (an internal error, exit 1); protocol true passed for 1; holds "clock" offered nothing.
    assert said in _breach(shlex.quote("hello=" + json.dumps(hello)))


def test_the_command_exits_2_on_a_malformed_hello(capsys: pytest.CaptureFixture[str]) -> None:
    hello = shlex.quote("hello=" + json.dumps({"protocol": 1, "layers": 5}))
    assert cli.main(["conformance", "--driver", f"{MISBEHAVING} {hello}", "--layer", "machines"]) == 2
    assert "the driver broke the protocol: hello: 'layers'" in capsys.readouterr().err


def _numbers_for_bools(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, dict):
        return {key: _numbers_for_bools(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_numbers_for_bools(item) for item in value]
    return value


class _Answers:
    """Answers every case of ``machines`` and every step of the store scripts with what ``shape`` makes of the expectation.

    ``step`` makes a store step's answer of its expected result; ``holds`` is what the driver says it holds.
    """

    def __init__(
        self,
        shape: Any,
        reset: Any = None,
        *,
        step: Any = lambda result: {"output": result},
        holds: tuple[str, ...] = ("commit", "clock"),
    ) -> None:
        self.shape = shape
        self.step = step
        self.holds = list(holds)
        self.reset = {"ok": True} if reset is None else reset
        self.results = iter(
            result
            for case in json.loads((CASES / "store.json").read_text(encoding="utf-8"))["cases"]
            if "steps" in case["input"]
            for result in case["expected"]["results"]
        )
        self.expected = {
            case["id"]: case["expected"]
            for case in json.loads((CASES / "machines.json").read_text(encoding="utf-8"))["cases"]
        }

    def ask(self, request: dict[str, Any]) -> Any:
        if request["op"] == "hello":
            return {"protocol": 1, "layers": ["machines", "store"], "holds": self.holds}
        if request["op"] == "case":
            return self.shape(self.expected[request["id"]])
        if request["op"] == "reset":
            return self.reset
        if request["op"] == "store":
            return self.step(next(self.results))
        return {"ok": True}

    def close(self) -> None:
        pass


def _bools_as_numbers() -> _Answers:
    """Answers every case with its expectation, but writes 1 for true and 0 for false (a JSON writer's bug)."""
    return _Answers(
        lambda expected: {"output": _numbers_for_bools(expected)},
        step=lambda result: {"output": _numbers_for_bools(result)},
        holds=(),
    )


def test_a_number_is_never_taken_for_a_bool() -> None:
    machines, store = runner.run(_bools_as_numbers(), ["machines", "store"], CASES)
    illegal = sum(1 for expected in _bools_as_numbers().expected.values() if expected.get("illegal") is True)
    assert (machines.failed, machines.passed) == (illegal, machines.passed)
    assert machines.first_failure is not None
    assert machines.first_failure["differences"]["illegal"] == {"expected": True, "got": 1}
    # Store scripts whose results hold a bool (a publish's duplicate flag, a race's held) fail too.
    assert store.failed > 0


class _GarbledControls:
    """Holds every race as asked, then answers release and await with JSON that is not an object."""

    def ask(self, request: dict[str, Any]) -> Any:
        if request["op"] == "hello":
            return {"protocol": 1, "layers": ["store"]}
        if request["op"] == "reset":
            return {"ok": True}
        if request.get("control"):
            return ["released"]
        if request["op"] == "store":
            return {"output": {"held": True} if request.get("hold") else {"pending": True}}
        return {"ok": True}

    def close(self) -> None:
        pass


def test_a_garbled_race_control_answer_fails_the_race_without_a_traceback(tmp_path: Path) -> None:
    # It was an AttributeError out of the runner (an internal error) at the first race.
    document = json.loads((CASES / "store.json").read_text(encoding="utf-8"))
    document["cases"] = [case for case in document["cases"] if case["id"].startswith("race/")]
    (tmp_path / "store.json").write_text(json.dumps(document), encoding="utf-8")
    [store] = runner.run(_GarbledControls(), ["store"], tmp_path)
    assert (store.failed, store.passed) == (len(document["cases"]) - store.skipped, 0)
    assert store.first_failure is not None and store.first_failure["id"].startswith("race/")
    got = store.first_failure["differences"]["race"]["got"]
    assert (got["a"], got["b"]) == (["released"], ["released"])


@pytest.mark.parametrize("text", ['{"cases": [', '{"version": "9.0.0"}'])
def test_a_bad_case_file_is_named_and_never_blamed_on_the_driver(
    text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Cut short, it was "--driver ...: cannot start"; without cases, an internal error (KeyError, exit 1).
    (tmp_path / "machines.json").write_text(text, encoding="utf-8")
    assert cli.main(["conformance", "--driver", f"{MISBEHAVING} none", "--layer", "machines",
                     "--cases", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'machines.json'}:" in err and "--driver" not in err


def test_a_line_past_the_limit_is_a_breach_naming_the_case(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runner, "MAX_LINE", 10_000)
    message = _breach("huge")
    assert f"case {_fifth_machines_case()}: driver wrote a line longer than 10000 characters" in message


def test_a_driver_that_never_flushes_is_told_so(monkeypatch: pytest.MonkeyPatch) -> None:
    # The commonest first bug of a driver: its answers wait in a block buffer, and the runner saw only silence.
    monkeypatch.setattr(runner, "RESPONSE_TIMEOUT", 1.0)
    assert "no response within 1 s to hello (a driver must write each answer as one line and flush" in _breach(
        "unflushed"
    )


def test_generate_with_json_prints_one_json_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # It printed one path a line whatever --json said, which a JSON reader of stdout cannot take.
    assert cli.main(["conformance", "--generate", str(tmp_path), "--json"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written == [str(tmp_path / f"{layer}.json") for layer in runner.LAYERS]


def test_a_driver_gone_before_reading_a_request_is_reported_with_its_exit_code() -> None:
    # It was "driver stopped reading its input: [Errno 32] Broken pipe", whatever the driver had done.
    assert f"case {_first_machines_case()}: driver exited (code 4) without answering case" in _breach("closein")


def test_the_text_report_abbreviates_a_huge_answer_and_json_keeps_it_whole() -> None:
    [machines] = runner.run(f"{MISBEHAVING} huge", ["machines"], CASES)
    assert machines.first_failure is not None and machines.first_failure["id"] == _fifth_machines_case()
    text = runner.render([machines])
    assert len(text) < 5_000 and "... (100000 characters in all)" in text
    shown = runner.as_json([machines])[0]["first_failure"]["differences"]["target"]["got"]
    assert shown == "x" * 100_000


@pytest.mark.parametrize("mode", ["nobye", "ignorebye"])
def test_a_driver_that_does_not_answer_bye_keeps_its_report(mode: str) -> None:
    # Every case was answered; the breach at bye used to throw the whole report away (exit 2), after 30 s
    # for a driver that ignores what it does not know.
    started = time.monotonic()
    warned: list[str] = []
    [machines] = runner.run(f"{MISBEHAVING} {mode}", ["machines"], CASES, warn=warned.append)
    assert machines.verdict == "passed" and machines.passed > 0
    assert time.monotonic() - started < 15
    # nobye exits 1 at bye: the report stands, and the failed exit is told.
    assert warned == (["the driver exited with code 1 at the end of the run, after every answer had come; "
                       "the report stands, but the driver failed as it shut down (its standard error says how)"]
                      if mode == "nobye" else [])


def test_a_driver_that_fails_after_answering_bye_is_warned_of_and_its_report_stands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Its exit code was ignored: a driver that crashed as it shut down looked exactly like a clean one.
    warned: list[str] = []
    [machines] = runner.run(f"{MISBEHAVING} byecrash", ["machines"], CASES, warn=warned.append)
    assert machines.verdict == "passed" and machines.passed > 0
    assert len(warned) == 1 and warned[0].startswith("the driver exited with code 5 at the end of the run")
    # Without a warn callback, a RuntimeWarning; a clean exit warns of nothing.
    with pytest.warns(RuntimeWarning, match="exited with code 5"):
        runner.run(f"{MISBEHAVING} byecrash", ["machines"], CASES)
    clean: list[str] = []
    runner.run(f"{MISBEHAVING} none", ["machines"], CASES, warn=clean.append)
    assert clean == []
    # The command: the report, exit 0 (every case passed), and one warning line on stderr.
    code = cli.main(["conformance", "--driver", f"{MISBEHAVING} byecrash", "--layer", "machines", "--cases", str(CASES)])
    captured = capsys.readouterr()
    assert code == 0, captured
    assert "machines       passed" in captured.out
    assert captured.err.splitlines() == [f"fencekeeper: warning: {warned[0]}"]


def test_a_skip_the_driver_asked_for_says_so() -> None:
    # A layer answered unsupported case by case showed "skipped 481" with no reason at all.
    hello = shlex.quote("hello=" + json.dumps({"protocol": 1, "layers": ["machines", "store"], "holds": ["commit"]}))
    machines, store = runner.run(f"{MISBEHAVING} {hello}", ["machines", "store"], CASES)
    assert machines.skip_reason is None
    assert store.verdict == "skipped"
    assert store.skip_reason == "the driver answered unsupported; the driver does not offer the hold point 'clock'"


def test_the_report_names_the_case_version_it_ran() -> None:
    # A report from an old copy of the cases (--cases) looked exactly like one from these.
    version = json.loads((CASES / "machines.json").read_text(encoding="utf-8"))["version"]
    reports = runner.run(f"{MISBEHAVING} none", ["machines"], CASES)
    assert runner.render(reports, "drv").splitlines()[0] == f"conformance of drv, cases {version}"
    assert runner.as_json(reports)[0]["version"] == version


def test_timeout_sets_how_long_the_runner_waits_for_each_answer(capsys: pytest.CaptureFixture[str]) -> None:
    # A slow store's driver may need more than 30 s; a quick CI gate may want less.
    started = time.monotonic()
    code = cli.main(["conformance", "--driver", f"{MISBEHAVING} silent", "--layer", "machines", "--timeout", "0.5"])
    assert code == 2
    assert "no response within 0.5 s to " in capsys.readouterr().err
    assert time.monotonic() - started < 20


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "3601"])
def test_a_timeout_out_of_bounds_is_one_error_before_the_driver_starts(
    value: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    code = cli.main(["conformance", "--driver", f"touch {marker}", "--timeout", value])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--timeout: must be more than 0 and at most 3600 seconds" in err, err
    assert not marker.exists()


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        # A capability list with a misspelt layer: every layer chosen is skipped.
        (shlex.quote("hello=" + json.dumps({"protocol": 1, "layers": ["machine"]})),
         "the driver does not declare this layer; it declares 'machine', which names no layer of these cases"),
        # A driver that declares the layer but answers every case unsupported.
        ("unsupported 1", "the driver answered unsupported"),
    ],
)
def test_a_run_where_every_case_is_skipped_exits_3(
    arguments: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # It exited 0, and a CI job running a driver that supports nothing reported success.
    assert cli.main(["conformance", "--driver", f"{MISBEHAVING} {arguments}", "--layer", "machines"]) == 3
    captured = capsys.readouterr()
    assert "machines       skipped  passed 0, failed 0" in captured.out
    (line,) = captured.err.splitlines()
    assert line == f"fencekeeper: error: no case ran: every case of machines was skipped ({reason})"


def test_a_run_where_one_case_ran_is_not_empty(capsys: pytest.CaptureFixture[str]) -> None:
    # Everything but the first case answered unsupported: partial, and nothing failed.
    assert cli.main(["conformance", "--driver", f"{MISBEHAVING} unsupported 2", "--layer", "machines"]) == 0
    assert "machines       partial  passed 1, failed 0" in capsys.readouterr().out


def _scripts_only(tmp_path: Path) -> Path:
    document = json.loads((CASES / "store.json").read_text(encoding="utf-8"))
    document["cases"] = [case for case in document["cases"] if "steps" in case["input"]]
    (tmp_path / "store.json").write_text(json.dumps(document), encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("said", [1, "yes", {"why": "x"}])
def test_unsupported_that_is_not_true_is_a_malformed_answer_not_a_skip(said: object) -> None:
    # {"unsupported": 1} was taken for true: the case was skipped, whatever the driver meant.
    [machines] = runner.run(_Answers(lambda _: {"unsupported": said}), ["machines"], CASES)
    assert (machines.verdict, machines.skipped, machines.passed) == ("failed", 0, 0)
    assert machines.first_failure is not None
    assert machines.first_failure["differences"]["response"]["got"] == {"unsupported": said}


@pytest.mark.parametrize("reset", [{"error": "cannot drop the schema"}, {"ok": False}, ["ok"]])
def test_a_store_case_whose_reset_failed_fails(reset: object, tmp_path: Path) -> None:
    # A reset answered with an error was ignored: the case ran on whatever the last one left, and passed.
    answers = _Answers(lambda expected: {"output": expected}, reset=reset)
    [store] = runner.run(answers, ["store"], _scripts_only(tmp_path))
    assert (store.verdict, store.passed) == ("failed", 0)
    assert store.first_failure is not None
    assert store.first_failure["differences"] == {"reset": {"expected": {"ok": True}, "got": reset}}


class _HeldAsOne:
    """Runs a step it is asked to hold at once, to its end, and answers held 1 (a JSON writer's true)."""

    def __init__(self) -> None:
        self.inner = runner.InProcessDriver(MemoryStore)
        self.released = 0

    def ask(self, request: dict[str, Any]) -> Any:
        if request.get("control") == "release":
            self.released += 1
        if request.get("hold") is True:
            response = self.inner.ask({key: value for key, value in request.items() if key != "hold"})
            return {"output": {"held": 1}, "seq": response["seq"]}
        return self.inner.ask(request)

    def close(self) -> None:
        self.inner.close()


def test_held_1_is_not_held_true(tmp_path: Path) -> None:
    # 1 in (True, "commit") is true in Python: the race was released and could pass on a malformed answer.
    document = json.loads((CASES / "store.json").read_text(encoding="utf-8"))
    document["cases"] = [case for case in document["cases"] if case["id"] == "race/claim_races_claim"]
    assert len(document["cases"]) == 1
    (tmp_path / "store.json").write_text(json.dumps(document), encoding="utf-8")
    driver = _HeldAsOne()
    [store] = runner.run(driver, ["store"], tmp_path)
    assert (store.verdict, driver.released) == ("failed", 0)


def _machines_document() -> dict[str, Any]:
    return dict(json.loads((CASES / "machines.json").read_text(encoding="utf-8")))


def _store_document() -> dict[str, Any]:
    return dict(json.loads((CASES / "store.json").read_text(encoding="utf-8")))


def _broken(document: dict[str, Any], change: Any) -> dict[str, Any]:
    change(document)
    return document


def _first_script(document: dict[str, Any]) -> dict[str, Any]:
    return next(case for case in document["cases"] if "steps" in case["input"])


def _first_race(document: dict[str, Any]) -> dict[str, Any]:
    return next(case for case in document["cases"] if "setup" in case["input"])


@pytest.mark.parametrize(
    ("layer", "document", "said"),
    [
        # Every answer passed a case that compares nothing.
        ("machines", lambda: _broken(_machines_document(), lambda d: d["cases"][0].update(normative=[])),
         "case execution/eligible/claim: 'normative' must be a non-empty list"),
        # KeyError out of the runner, exit 1, blamed on nobody.
        ("machines", lambda: _broken(_machines_document(), lambda d: d["cases"][0].pop("normative")),
         "case execution/eligible/claim: 'normative' must be a non-empty list"),
        # Another layer's cases, sent to the driver as machines cases.
        ("machines", lambda: _broken(_store_document(), lambda d: None), "'layer' is 'store', not 'machines'"),
        ("machines", lambda: _broken(_machines_document(), lambda d: d.update(cases=[])), "'cases' is empty"),
        ("machines", lambda: _broken(_machines_document(), lambda d: d["cases"][1].update(id=d["cases"][0]["id"])),
         "'id' is used twice"),
        # A ValueError from zip mid-run, reported as "--driver ...: cannot start".
        ("store", lambda: _broken(_store_document(), lambda d: _first_script(d)["expected"]["results"].pop()),
         "'expected.results' must hold one result for each of the"),
        ("store", lambda: _broken(_store_document(), lambda d: _first_race(d)["expected"].update(serial_orders=[])),
         "'expected.serial_orders' must list"),
        ("store", lambda: _broken(_store_document(), lambda d: _first_race(d)["input"].pop("then")),
         "'input' must hold 'steps' (a script) or 'setup', 'a', 'b' and 'then' (a race)"),
    ],
)
def test_a_case_the_runner_could_not_judge_is_a_case_file_error(
    layer: str, document: Any, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / f"{layer}.json").write_text(json.dumps(document()), encoding="utf-8")
    assert cli.main(["conformance", "--driver", f"{MISBEHAVING} none", "--layer", layer, "--cases", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"fencekeeper: error: {tmp_path / f'{layer}.json'}: ") and said in line, line


@pytest.mark.parametrize(
    "answer",
    [{"output": "EXPECTED", "unsupported": True}, {"unsupported": True, "output": None}],
    ids=["output-and-unsupported", "null-output-and-unsupported"],
)
def test_a_case_answered_both_output_and_unsupported_fails_naming_the_case(answer: dict[str, Any]) -> None:
    # It was skipped: half of a malformed answer was taken at its word.
    [machines] = runner.run(
        _Answers(lambda expected: {**answer, "output": expected} if answer["output"] == "EXPECTED" else answer),
        ["machines"], CASES,
    )
    assert (machines.verdict, machines.skipped, machines.passed) == ("failed", 0, 0)
    assert machines.first_failure is not None and machines.first_failure["id"] == _first_machines_case()
    difference = machines.first_failure["differences"]["response"]
    assert difference["expected"] == 'an output or {"unsupported": true}, not both'
    assert difference["got"]["unsupported"] is True and "output" in difference["got"]


class _BothOnStore(_Answers):
    """Answers every store step with its expected output and unsupported as well."""

    def ask(self, request: dict[str, Any]) -> Any:
        response = super().ask(request)
        return {**response, "unsupported": True} if request["op"] == "store" else response


def test_a_store_step_answered_both_output_and_unsupported_fails_the_case(tmp_path: Path) -> None:
    [store] = runner.run(_BothOnStore(lambda expected: {"output": expected}), ["store"], _scripts_only(tmp_path))
    assert (store.verdict, store.skipped, store.passed) == ("failed", 0, 0)
    assert store.failed == len(json.loads((tmp_path / "store.json").read_text(encoding="utf-8"))["cases"])
    assert store.first_failure is not None
    [(what, difference)] = store.first_failure["differences"].items()
    assert what.startswith("store step ") and difference["expected"] == 'an output or {"unsupported": true}, not both'
    # A reset answered both ways fails the case as well.
    answers = _Answers(lambda expected: {"output": expected}, reset={"ok": True, "unsupported": True})
    [store] = runner.run(answers, ["store"], _scripts_only(tmp_path))
    assert (store.verdict, store.skipped, store.passed) == ("failed", 0, 0)
    assert store.first_failure is not None and set(store.first_failure["differences"]) == {"reset"}


def test_every_row_of_the_report_lines_up_whatever_its_layer_is_called() -> None:
    reports = [runner.LayerReport(layer, passed=3, version="1.0.0") for layer in LAYERS]
    rows = runner.render(reports).splitlines()[1:]
    assert len(rows) == len(LAYERS)
    # The verdict starts at one column on every row, the longest name's (journal-append) included.
    assert len({row.index(" passed ") for row in rows}) == 1
    assert all(row[2:].split(" ", 1)[0] in LAYERS for row in rows)
