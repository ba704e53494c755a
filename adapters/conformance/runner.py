"""The conformance runner: starts an implementation's driver, sends it the cases, and reports per layer.

Rules of this module (specs/conformance.md):

- The driver is a command; the runner talks to it over its stdin and stdout,
  one JSON document per line each way, and needs nothing else from it.
- A layer the driver does not list in ``hello``, or a case it answers with
  ``unsupported``, is *skipped*: never counted as passed.  A driver that
  skips every case of a layer has not passed that layer.  An answer that
  says ``unsupported`` and answers as well (an ``output``, or ``ok`` to
  ``reset``) is malformed: the case fails, never skipped on the strength
  of one half of it.
- A case passes when every normative part of its expectation equals the
  driver's output (a missing part counts as null).  Store races pass when
  the results equal one of the serial orders the case lists.
- A race names the point its first session is held at (``commit`` unless
  it says ``clock``).  A driver offers the points it lists in ``hello``
  (``holds``; one that lists none is a protocol 1.0 driver, which offers
  ``commit`` only); a race at a point it does not offer is skipped.
- Every request carries ``seq``, its number in the conversation (protocol
  1.2).  A driver that echoes it in its ``hello`` answer is held to it:
  every later answer must carry the number of the request it answers, and
  the first that does not stops the run, naming the case and the line, so
  that no answer is ever scored against another request.  A driver that
  does not echo it (protocol 1.0 and 1.1) is checked where a shift must
  show: a line that arrives before its request is sent, and the answer to
  ``bye``, which after a stray line is an answer meant for an earlier
  request.
- The driver exits when its input closes, after ``bye``.  One that exits
  with a code other than 0 then (or is ended by a signal) is reported as a
  warning, and its report stands: every answer had come and been checked
  as it came, and the report relies on nothing the driver holds after
  them, as it does not for a driver that exits instead of answering
  ``bye``.  The warning is there because the failure is still the
  driver's (a store that could not close, a thread that raised), and
  ignored it hid a crash its author should see.
- A case file is checked whole before the driver starts: a case the runner
  could not judge (no normative part, a script whose steps and results do
  not pair up) is the suite's fault, named, never a pass or a driver's
  breach.
- The report gives each layer's passed, failed and skipped counts and the
  first difference in full: the case id, its input, what was expected and
  what came back.  Any failure makes the exit code 1; a run in which no
  case passed or failed, 3 (``cli_conformance.py``).
"""

from __future__ import annotations

import contextlib
import importlib.resources
import json
import queue
import shlex
import subprocess
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import attrs

from .basis import LAYERS

RESPONSE_TIMEOUT = 30.0

BYE_TIMEOUT = 2.0
"""How long the last request, ``bye``, waits for its courtesy answer."""

MAX_LINE = 16 * 1024 * 1024
"""The longest response line read, in characters: the largest case's answer is a few kilobytes."""

_TOO_LONG = object()

HOLDS_OF_PROTOCOL_1_0 = ("commit",)
"""The hold points of a driver whose ``hello`` lists none: the one protocol 1.0 had."""


PROTOCOL = "1.2"
"""The protocol version this runner speaks (specs/conformance.md, Versions); ``hello`` carries its major number."""


class DriverError(Exception):
    """The driver broke the protocol: it exited, timed out, wrote something that is not JSON, or fell out of step."""


class NoAnswer(DriverError):
    """No line came: the driver exited, closed its output, or stayed silent past the timeout."""


@attrs.define
class LayerReport:
    layer: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    first_failure: dict[str, Any] | None = None
    skip_reason: str | None = None
    version: str | None = None
    """The version of the case file the layer ran: a claim of conformance is a claim against it."""

    @property
    def verdict(self) -> str:
        if self.failed:
            return "failed"
        if self.passed == 0:
            return "skipped"
        return "passed" if self.skipped == 0 else "partial"


def packaged_cases() -> Path:
    """The case files shipped with this fencekeeper (fencekeeper/specs/conformance)."""
    return Path(str(importlib.resources.files("fencekeeper") / "specs" / "conformance"))


class CaseFileError(Exception):
    """A case file that cannot be read, or is not a case file: the suite's fault, not the driver's."""


def load_layer(directory: Path, layer: str) -> dict[str, Any]:
    """The case file of ``layer`` in ``directory``, checked for everything the runner relies on to judge a case."""
    path = directory / f"{layer}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CaseFileError(f"{path}: cannot read the cases: {exc}") from None
    cases = data.get("cases") if isinstance(data, dict) else None
    if not isinstance(cases, list) or not all(
        isinstance(case, dict) and {"id", "input", "expected"} <= case.keys() for case in cases
    ):
        raise CaseFileError(f"{path}: not a case file: 'cases' must be a list of cases with id, input and expected")
    assert isinstance(data, dict)
    # Another layer's file under this name would send its cases to the driver as this layer's.
    if data.get("layer") != layer:
        raise CaseFileError(f"{path}: 'layer' is {data.get('layer')!r}, not {layer!r}: this is not the {layer} case file")
    if not cases:
        raise CaseFileError(f"{path}: 'cases' is empty: a layer without cases could only ever be skipped")
    seen: set[str] = set()
    for index, case in enumerate(cases):
        name = case["id"] if isinstance(case["id"], str) else f"#{index}"
        problem = _case_problem(layer, case, seen)
        if problem:
            raise CaseFileError(f"{path}: case {name}: {problem}")
        seen.add(case["id"])
    return dict(data)


def _case_problem(layer: str, case: dict[str, Any], seen: set[str]) -> str | None:
    """What makes one case impossible to judge, or None: each of these used to pass any answer or crash mid-run."""
    if not isinstance(case["id"], str) or not case["id"]:
        return "'id' must be a non-empty string"
    if case["id"] in seen:
        return "'id' is used twice in this layer"
    if not isinstance(case["input"], dict) or not isinstance(case["expected"], dict):
        return "'input' and 'expected' must be objects"
    normative = case.get("normative")
    # An empty list would compare nothing, so every answer would pass.
    if not isinstance(normative, list) or not normative or not all(isinstance(part, str) for part in normative):
        return "'normative' must be a non-empty list of the expected parts compared"
    if layer != "store":
        return None
    data, expected = case["input"], case["expected"]
    if "steps" in data:
        steps, results = data["steps"], expected.get("results")
        if not isinstance(steps, list) or not steps or not all(isinstance(step, dict) for step in steps):
            return "'input.steps' must be a non-empty list of steps"
        if not isinstance(results, list) or len(results) != len(steps):
            return f"'expected.results' must hold one result for each of the {len(steps)} steps"
        return None
    if not {"setup", "a", "b", "then"} <= data.keys():
        return "'input' must hold 'steps' (a script) or 'setup', 'a', 'b' and 'then' (a race)"
    if not isinstance(data["a"], dict) or not isinstance(data["b"], dict) or not all(
        isinstance(data[part], list) and all(isinstance(step, dict) for step in data[part]) for part in ("setup", "then")
    ):
        return "a race's 'a' and 'b' must be steps, its 'setup' and 'then' lists of steps"
    if not isinstance(data.get("hold", "commit"), str):
        return "'input.hold' must name a hold point"
    orders = expected.get("serial_orders")
    if not isinstance(orders, list) or not orders:
        return "'expected.serial_orders' must list the results of at least one serial order"
    return None


class Driver:
    """The implementation under test, as a child process speaking JSON lines."""

    def __init__(self, command: str, cwd: Path | None = None, response_timeout: float | None = None) -> None:
        self.command = command
        # None: RESPONSE_TIMEOUT as it is when the driver starts, not when this module was imported.
        self.response_timeout = RESPONSE_TIMEOUT if response_timeout is None else response_timeout
        self.process = subprocess.Popen(
            shlex.split(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, encoding="utf-8",
            # Bytes that are not UTF-8 must reach ask() as a breach, not kill the reading thread.
            errors="surrogateescape", cwd=cwd, bufsize=1,
        )
        self._lines: queue.Queue[str | object | None] = queue.Queue()
        self._asked = ""
        """The request the last line read answered, as a person would name it."""
        self.last_line = ""
        """The last line read, as written: what a breach shows its author."""
        assert self.process.stdout is not None
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        # Bounded reads: a driver writing without end must not take the runner's memory with it.
        while line := stream.readline(MAX_LINE + 1):
            if len(line) > MAX_LINE:
                self._lines.put(_TOO_LONG)
                rest = line
                while rest and not rest.endswith("\n"):
                    rest = stream.readline(MAX_LINE + 1)
                continue
            self._lines.put(line)
        self._lines.put(None)

    def ask(self, request: dict[str, Any], timeout: float | None = None) -> Any:
        assert self.process.stdin is not None
        self._refuse_unasked()
        try:
            self.process.stdin.write(json.dumps(request, sort_keys=True) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            # Most often the driver has exited: its code says more than the broken pipe does.
            raise self._stopped(request, f"driver closed its input: {exc}") from None
        try:
            line = self._lines.get(timeout=self.response_timeout if timeout is None else timeout)
        except queue.Empty:
            # The usual cause is an answer left in the driver's output buffer: stdout to a pipe is block-buffered.
            raise NoAnswer(
                f"no response within {self.response_timeout if timeout is None else timeout:g} s to {request.get('op')} "
                "(a driver must write each answer "
                "as one line and flush its standard output before reading the next request)"
            ) from None
        if line is None:
            raise self._stopped(request, f"driver closed its output without answering {request.get('op')}")
        self._asked = _describe(request)
        if line is _TOO_LONG:
            raise DriverError(f"driver wrote a line longer than {MAX_LINE} characters answering {request.get('op')}")
        assert isinstance(line, str)
        self.last_line = line.rstrip("\n")
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            shown = line.encode("utf-8", "surrogateescape")[:200]
            raise DriverError(f"driver wrote a line that is not UTF-8: {shown!r}") from None
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            raise DriverError(f"driver wrote a line that is not JSON: {line[:200]!r}") from None

    def _refuse_unasked(self) -> None:
        """A line already waiting before a request is sent answers nothing asked: every later answer would be shifted."""
        try:
            line = self._lines.get_nowait()
        except queue.Empty:
            return
        if line is None:
            self._lines.put(None)  # the driver's output ended: the next ask reports how it exited
            return
        # Only a line the reader had already queued is caught here; one still on its way is the
        # sequence number's to catch (or bye's, for a driver that does not echo it).
        shown = "a line longer than the limit" if line is _TOO_LONG else repr(str(line).rstrip("\n")[:200])
        raise DriverError(
            f"out of step: the driver wrote a line no request asked for, after its answer to {self._asked}: {shown} "
            "(a second answer to one request, or a diagnostic on standard output instead of standard error)"
        )

    def _stopped(self, request: dict[str, Any], otherwise: str) -> DriverError:
        # A pipe closes a moment before the process is reaped: wait for the code, the clue to what broke.
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return NoAnswer(otherwise)
        return NoAnswer(f"driver exited (code {code}) without answering {request.get('op')}")

    def close(self) -> int | None:
        """Close the driver's input and wait for it to exit: its exit code, or None if it had to be killed."""
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
            return self.process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
            return None


class InProcessDriver:
    """The Python driver for one store factory, answered in this process: no command, same protocol.

    Each request still goes through its JSON text, so what is compared is exactly what a
    subprocess driver would have written.
    """

    def __init__(self, factory: Callable[..., Any], name: str = "in-process") -> None:
        from .driver import KERNEL_LAYERS, answer  # noqa: PLC0415 - the runner needs no driver otherwise
        from .store_driver import StoreHarness  # noqa: PLC0415 - as above

        self._answer = answer
        self._harness = StoreHarness(factory)
        self._layers = (*KERNEL_LAYERS, "store")
        self._name = name

    def ask(self, request: dict[str, Any]) -> Any:
        response = self._answer(json.loads(json.dumps(request)), self._harness, self._layers, self._name)
        self.last_line = json.dumps(response, sort_keys=True)
        return json.loads(self.last_line)

    def close(self) -> int | None:
        self._harness.close()
        return None


AnyDriver = Driver | InProcessDriver


def _describe(request: dict[str, Any]) -> str:
    """A request as a breach names it: the case id, or the store call and its session."""
    if request.get("op") == "case":
        return f"case {request.get('id')}"
    if request.get("op") == "store":
        step = request.get("step")
        if isinstance(step, dict):
            return f"store step {step.get('call')} of session {step.get('session', 'a')}"
        return f"store {request.get('control')} of session {request.get('session')}"
    return str(request.get("op"))


_ABSENT = object()


class _Conversation:
    """Numbers every request and holds the driver to the numbers it echoes: where an answer meets its request.

    A driver shows that it echoes ``seq`` by echoing it in its ``hello`` answer; from then on an
    answer without it, or with another number, stops the run.  A driver that does not echo it is
    still held to a number it does write (specs/conformance.md, Numbered requests).
    """

    def __init__(self, driver: AnyDriver) -> None:
        self.driver = driver
        self.seq = 0
        self.echoes = False

    def ask(self, request: dict[str, Any], timeout: float | None = None) -> Any:
        self.seq += 1
        numbered = {**request, "seq": self.seq}
        if timeout is not None and isinstance(self.driver, Driver):
            response = self.driver.ask(numbered, timeout=timeout)
        else:
            response = self.driver.ask(numbered)
        echoed = response.get("seq", _ABSENT) if isinstance(response, dict) else _ABSENT
        if request.get("op") == "hello":
            self.echoes = echoed is not _ABSENT
        if echoed is _ABSENT and not self.echoes:
            return response
        # JSON true is not a number, though Python's == would take it for 1.
        if type(echoed) is not int or echoed != self.seq:
            got = "no seq" if echoed is _ABSENT else f"seq {json.dumps(echoed)}"
            line = getattr(self.driver, "last_line", None) or json.dumps(response, sort_keys=True)
            raise DriverError(
                f"out of step: the answer to {_describe(request)} (seq {self.seq}) carries {got}: "
                f"{line[:200]!r} (a line no request asked for, or a second answer to an earlier "
                "request); the run stops here, so that no answer is scored against another request"
            )
        return response

    def close(self) -> int | None:
        return self.driver.close()


def _same(expected: Any, got: Any) -> bool:
    """JSON equality: Python's ``==`` takes ``true`` for ``1`` and ``false`` for ``0``, JSON does not."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(expected) is type(got) and expected == got
    if isinstance(expected, dict) and isinstance(got, dict):
        return expected.keys() == got.keys() and all(_same(value, got[key]) for key, value in expected.items())
    if isinstance(expected, list) and isinstance(got, list):
        return len(expected) == len(got) and all(_same(e, g) for e, g in zip(expected, got, strict=True))
    return bool(expected == got)


def differences(case: dict[str, Any], output: Any) -> dict[str, Any]:
    """The normative parts where ``output`` differs from the case's expectation: part -> (expected, got)."""
    expected = case["expected"]
    if not isinstance(output, dict):
        return {"output": {"expected": expected, "got": output}}
    found = {}
    for part in case["normative"]:
        if not _same(expected.get(part), output.get(part)):
            found[part] = {"expected": expected.get(part), "got": output.get(part)}
    return found


def _unsupported(response: Any) -> bool:
    # Exactly JSON true: {"unsupported": 1} or "yes" is a malformed answer, which fails, not a skip.
    return isinstance(response, dict) and response.get("unsupported") is True


def _answers_both(response: Any) -> bool:
    """An answer that says unsupported and answers all the same: which half is meant cannot be told."""
    return _unsupported(response) and ("output" in response or "ok" in response)


_BOTH = 'an output or {"unsupported": true}, not both'


def _run_kernel_layer(driver: _Conversation, layer: str, cases: list[dict[str, Any]], report: LayerReport) -> None:
    for case in cases:
        with _in_case(layer, case):
            response = driver.ask({"op": "case", "layer": layer, "id": case["id"], "input": case["input"]})
        if _answers_both(response):
            _fail(report, case, {"response": {"expected": _BOTH, "got": response}})
            continue
        if _unsupported(response):
            _skip(report, ANSWERED_UNSUPPORTED)
            continue
        if not isinstance(response, dict) or "output" not in response:
            _fail(report, case, {"response": {"expected": "an output", "got": response}})
            continue
        diff = differences(case, response["output"])
        if diff:
            _fail(report, case, diff)
        else:
            report.passed += 1


@contextlib.contextmanager
def _in_case(layer: str, case: dict[str, Any]) -> Iterator[None]:
    """Name the layer and case a protocol breach happened in: the message is all a driver's author gets."""
    try:
        yield
    except DriverError as exc:
        raise DriverError(f"layer {layer}, case {case['id']}: {exc}") from None


ANSWERED_UNSUPPORTED = "the driver answered unsupported"


def _skip(report: LayerReport, reason: str) -> None:
    # Every reason a layer's cases were skipped is shown: a skip never looks like the runner's own doing.
    report.skipped += 1
    reasons = report.skip_reason.split("; ") if report.skip_reason else []
    if reason not in reasons:
        report.skip_reason = "; ".join([*reasons, reason])


def _fail(report: LayerReport, case: dict[str, Any], diff: dict[str, Any]) -> None:
    report.failed += 1
    if report.first_failure is None:
        report.first_failure = {"id": case["id"], "input": case["input"], "differences": diff}


def _store_step(driver: _Conversation, step: dict[str, Any], malformed: list[dict[str, Any]], **extra: Any) -> Any:
    response = driver.ask({"op": "store", "step": step, **extra})
    if _unsupported(response) and not _answers_both(response):
        raise _Unsupported
    return _output(response, f"store step {step.get('call')}", malformed)


def _output(response: Any, what: str, malformed: list[dict[str, Any]]) -> Any:
    """A store answer's output; any other JSON the driver wrote is kept whole, to be reported as it came.

    An answer that is both an output and unsupported is noted in ``malformed`` (the case fails on it) and
    read as its output, so that a race still releases and awaits its sessions before the next case.
    """
    if _answers_both(response):
        malformed.append({what: {"expected": _BOTH, "got": response}})
    return response.get("output") if isinstance(response, dict) else response


class _Unsupported(Exception):
    pass


def _run_store_case(driver: _Conversation, case: dict[str, Any], holds: frozenset[str]) -> dict[str, Any] | None:
    """Differences of one store case, or None when it passes."""
    reset = driver.ask({"op": "reset"})
    if _answers_both(reset):
        return {"reset": {"expected": '{"ok": true} or {"unsupported": true}, not both', "got": reset}}
    if _unsupported(reset):
        raise _Unsupported
    # A store that could not be emptied runs the case on what the last one left: nothing it answers counts.
    if not (isinstance(reset, dict) and reset.get("ok") is True):
        return {"reset": {"expected": {"ok": True}, "got": reset}}
    data = case["input"]
    malformed: list[dict[str, Any]] = []
    if "steps" in data:
        for index, (step, expected) in enumerate(zip(data["steps"], case["expected"]["results"], strict=True)):
            got = _store_step(driver, step, malformed)
            if malformed:
                return malformed[0]
            if not _same(expected, got):
                return {f"results[{index}] ({step['call']})": {"expected": expected, "got": got}}
        return None
    point = data.get("hold", "commit")
    if point not in holds:
        raise _Unsupported
    setup = [_store_step(driver, step, malformed) for step in data["setup"]]
    # A commit hold is sent as protocol 1.0 sent it, so that a 1.0 driver runs those races unchanged.
    a = _store_step(driver, data["a"], malformed, hold=True if point == "commit" else point)
    said = a.get("held") if isinstance(a, dict) else None
    # JSON 1 is not true, though Python's == (and so ``in``) would take it for it.
    held = said is True or (isinstance(said, str) and said == point)
    b = _store_step(driver, data["b"], malformed)
    if held:
        a = _output(driver.ask({"op": "store", "control": "release", "session": "a"}), "store release", malformed)
    if isinstance(b, dict) and b.get("pending") is True:
        b = _output(driver.ask({"op": "store", "control": "await", "session": "b"}), "store await", malformed)
    then = [_store_step(driver, step, malformed) for step in data["then"]]
    if malformed:
        return malformed[0]
    got = {"setup": setup, "a": a, "b": b, "then": then}
    if any(_same(order, got) for order in case["expected"]["serial_orders"]):
        return None
    return {"race": {"expected one of": case["expected"]["serial_orders"], "got": got}}


def _run_store_layer(
    driver: _Conversation, cases: list[dict[str, Any]], report: LayerReport, holds: frozenset[str]
) -> None:
    for case in cases:
        point = case["input"].get("hold", "commit")
        try:
            with _in_case("store", case):
                diff = _run_store_case(driver, case, holds)
        except _Unsupported:
            _skip(report, ANSWERED_UNSUPPORTED if point in holds else f"the driver does not offer the hold point {point!r}")
            continue
        if diff:
            _fail(report, case, diff)
        else:
            report.passed += 1


def run_factory(factory: Callable[..., Any], layers: Iterable[str] = ("store",),
                cases_dir: Path | None = None) -> list[LayerReport]:
    """Run the chosen layers against a Python store factory in this process (see :class:`InProcessDriver`)."""
    return run(InProcessDriver(factory), layers, cases_dir)


def run(command: str | AnyDriver, layers: Iterable[str] = LAYERS, cases_dir: Path | None = None,
        cwd: Path | None = None, response_timeout: float | None = None,
        *, warn: Callable[[str], None] | None = None) -> list[LayerReport]:
    """Run the chosen layers against the driver ``command`` (or a driver object); one report per layer.

    ``response_timeout`` is how long the runner waits for each answer of a driver it starts
    (None: :data:`RESPONSE_TIMEOUT`).  ``warn`` is given each warning about a run whose report stands (a
    driver that failed as it shut down); None: a :class:`RuntimeWarning`.
    """
    directory = cases_dir if cases_dir is not None else packaged_cases()
    # Every case file is read before the driver starts, so that a bad one is never blamed on the driver.
    try:
        documents = {layer: load_layer(directory, layer) for layer in layers}
    except CaseFileError:
        if not isinstance(command, str):
            command.close()
        raise
    driver = _Conversation(Driver(command, cwd, response_timeout) if isinstance(command, str) else command)
    reports = []
    closed = False
    try:
        hello = driver.ask({"op": "hello", "protocol": 1})
        declared, holds = _read_hello(hello)
        not_declared = "the driver does not declare this layer"
        unknown = sorted(declared - set(LAYERS))
        if unknown:
            # Most often a misspelling, which would otherwise show only as every layer skipped.
            not_declared += f"; it declares {', '.join(map(repr, unknown))}, which names no layer of these cases"
        for layer, document in documents.items():
            version = document.get("version")
            report = LayerReport(layer, version=version if isinstance(version, str) else None)
            cases = document["cases"]
            if layer not in declared:
                report.skipped = len(cases)
                report.skip_reason = not_declared
            elif layer == "store":
                _run_store_layer(driver, cases, report, holds)
            else:
                _run_kernel_layer(driver, layer, cases, report)
            reports.append(report)
        _say_bye(driver)
        closed = True
        exited = _exit_problem(driver.close())
        if exited is not None:
            if warn is None:
                warnings.warn(exited, RuntimeWarning, stacklevel=2)
            else:
                warn(exited)
    finally:
        if not closed:
            driver.close()
    return reports


def _exit_problem(code: int | None) -> str | None:
    """The warning for a driver that failed as it shut down, after every answer was in (the module's rules).

    ``code`` None: no process (an in-process driver), or one the runner had to kill because it did not exit
    when its input closed, which says nothing about how it would have ended.
    """
    if code is None or code == 0:
        return None
    how = f"was ended by signal {-code}" if code < 0 else f"exited with code {code}"
    return (
        f"the driver {how} at the end of the run, after every answer had come; the report stands, but the "
        "driver failed as it shut down (its standard error says how)"
    )


def _say_bye(driver: _Conversation) -> None:
    """Ask ``bye``; its answer is where a driver that does not number its answers shows it fell out of step."""
    try:
        answer = driver.ask({"op": "bye"}, timeout=BYE_TIMEOUT)
    except NoAnswer:
        # Every answer is in: a driver that exits at bye, or ignores it, rather than answering it
        # (docs/conformance.md says to exit when input closes) has broken nothing worth the report.
        return
    if isinstance(answer, dict) and answer.get("ok") is True:
        return
    said = f"the answer to bye is {json.dumps(answer, sort_keys=True)[:200]}, not {{\"ok\": true}}"
    if driver.echoes:
        raise DriverError(said)  # its number was right, so it is only a wrong answer, not a shift
    # One line more than was asked for, anywhere in the run, leaves an earlier request's answer here.
    raise DriverError(
        f"out of step: {said}: most likely an answer meant for an earlier request, so the driver wrote a line "
        "no request asked for somewhere before and every answer after it was read as the answer to the request "
        f"before; no result of this run can be trusted.  Echo each request's seq in its answer (protocol {PROTOCOL}) "
        "to have the first such line named"
    )


def _names(hello: dict[str, Any], key: str, default: Iterable[str]) -> frozenset[str]:
    names = hello.get(key, default)
    if not isinstance(names, list | tuple) or not all(isinstance(name, str) for name in names):
        raise DriverError(f"hello: {key!r} must be a list of names, got {names!r}")
    return frozenset(names)


def _read_hello(hello: Any) -> tuple[frozenset[str], frozenset[str]]:
    """The layers and hold points a driver's ``hello`` answer offers; anything else there is a breach."""
    # JSON true is not the major number 1, though Python's == would say so.
    if not isinstance(hello, dict) or type(hello.get("protocol")) is not int or hello["protocol"] != 1:
        raise DriverError(f"driver does not speak protocol 1: {hello!r}")
    return _names(hello, "layers", ()), _names(hello, "holds", HOLDS_OF_PROTOCOL_1_0)


def render(reports: list[LayerReport], implementation: str = "") -> str:
    lines = [f"conformance of {implementation}" if implementation else "conformance"]
    versions = sorted({r.version for r in reports if r.version is not None})
    if versions:
        lines[0] += f", cases {', '.join(versions)}"
    # As wide as the longest layer name, so that every row's columns line up (journal-append is 14).
    width = max(len(layer) for layer in (*LAYERS, *(r.layer for r in reports)))
    for r in reports:
        note = f" ({r.skip_reason})" if r.skip_reason else ""
        lines.append(
            f"  {r.layer:<{width}} {r.verdict:<8} passed {r.passed}, failed {r.failed}, skipped {r.skipped}{note}"
        )
    for r in reports:
        if r.first_failure is not None:
            lines.append(f"first difference in {r.layer}:")
            lines.append(json.dumps(_abbreviated(r.first_failure), indent=2, sort_keys=True))
    return "\n".join(lines)


SHOWN_STRING = 1000
"""The longest string the text report shows whole; ``--json`` shows every one whole."""


def _abbreviated(value: Any) -> Any:
    # A driver that answers with megabytes must not bury the difference it is being shown.
    if isinstance(value, str) and len(value) > SHOWN_STRING:
        return f"{value[:SHOWN_STRING]}... ({len(value)} characters in all)"
    if isinstance(value, dict):
        return {key: _abbreviated(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_abbreviated(item) for item in value]
    return value


def as_json(reports: list[LayerReport]) -> list[dict[str, Any]]:
    return [
        {"layer": r.layer, "verdict": r.verdict, "passed": r.passed, "failed": r.failed, "skipped": r.skipped,
         "skip_reason": r.skip_reason, "first_failure": r.first_failure, "version": r.version}
        for r in reports
    ]
