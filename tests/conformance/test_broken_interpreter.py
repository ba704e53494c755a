"""The ``interpreter`` cases catch interpreters broken on purpose, one rule of specs/interpreter.md each.

Each variant below breaks one rule (the step limit one visit late, an
unknown condition taken as false, a denial let through, an unsettled
Command sent again, a handler's unstorable answer believed, ...) in the
kernel the Python driver answers from; the committed cases, generated from
the correct kernel, are then run through the driver protocol in this
process.  A variant is caught when at least one case fails; the correct
kernel passes every one, and a driver that does not declare the layer has
it skipped, never passed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from fencekeeper.adapters.conformance.interpreter_cases import plan_answer
from fencekeeper.adapters.conformance.runner import LayerReport
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import Definition
from fencekeeper.kernel.expr import Truth
from tests.conformance.kernel_layer import run_kernel_layer

LAYER = "interpreter"


def _run(layers: tuple[str, ...] | None = None) -> LayerReport:
    return run_kernel_layer(LAYER, layers)


def _wrapped(name: str, change: Callable[..., Any]) -> Callable[[pytest.MonkeyPatch], None]:
    """Replace ``interpreter.<name>`` by ``change(original, *args, **kwargs)``."""

    def patch(monkeypatch: pytest.MonkeyPatch) -> None:
        original = getattr(i, name)
        monkeypatch.setattr(i, name, lambda *args, **kwargs: change(original, *args, **kwargs))

    return patch


def _step_limit_late(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(i, "STEP_LIMIT", p.STEP_LIMIT + 1)


def _unknown_is_false(original: Any, *args: Any) -> Truth:
    truth = original(*args)
    return Truth.FALSE if truth == Truth.UNKNOWN else truth


def _granted(original: Any, *args: Any) -> Any:
    node, ctx, attempt, now, _authority = args
    return original(node, ctx, attempt, now, p.Authority(True, ctx.principal_id))


def _unsettled_ignored(original: Any, *args: Any) -> Any:
    return attrs.evolve(original(*args), unsettled=())


def _believed(original: Any, command_id: str, operation: str, result: i.CommandResult) -> i.CommandResult:
    return result


def _fence_dropped(original: Any, *args: Any) -> Any:
    return original(*args[:-1], 0)


def _spelt(value: object) -> str:
    return str(value)


def _end_without_code(original: Any, *args: Any) -> Any:
    return attrs.evolve(original(*args), error_code=None)


def _rejection_follows_next(original: Any, invoke: Any, result: i.CommandResult) -> Any:
    settled = original(invoke, result)
    if result.status == i.CommandStatus.REJECTED and isinstance(settled, i.Step):
        return attrs.evolve(settled, step=attrs.evolve(settled.step, next_node_id=invoke.node.next))
    return settled


class _NoSuccessors:
    """The pinned definition as a visit sees it, every node declaring no continuation."""

    def __init__(self, definition: Definition) -> None:
        self._definition = definition

    def __getattr__(self, name: str) -> Any:
        return getattr(self._definition, name)

    def successors(self, node: Any) -> tuple[str, ...]:
        return ()


def _no_dangling_check(original: Any, *args: Any) -> Any:
    ctx = original(*args)
    return ctx if ctx.definition is None else attrs.evolve(ctx, definition=_NoSuccessors(ctx.definition))


VARIANTS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "step-limit-one-visit-late": _step_limit_late,
    "unknown-condition-is-false": _wrapped("evaluate", _unknown_is_false),
    "approval-denial-let-through": _wrapped("_request_approval", _granted),
    "unsettled-command-sent-again": _wrapped("context_from_evidence", _unsettled_ignored),
    "unstorable-result-believed": _wrapped("_storable", _believed),
    "fence-not-on-the-command": _wrapped("_local_command", _fence_dropped),
    "correlation-by-its-spelling": lambda monkeypatch: monkeypatch.setattr(i, "correlation_value", _spelt),
    "failed-end-without-its-code": _wrapped("_end", _end_without_code),
    "rejection-follows-next": _wrapped("settle", _rejection_follows_next),
    "dangling-continuation-not-checked": _wrapped("context_from_evidence", _no_dangling_check),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_cases_catch_the_broken_interpreter(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    VARIANTS[name](monkeypatch)
    report = _run()
    assert report.passed + report.failed > 0, "no interpreter case ran"
    assert report.failed, f"{name} passed all {report.passed} interpreter cases"


def test_the_kernel_passes_every_case() -> None:
    report = _run()
    assert (report.failed, report.skipped) == (0, 0), json.dumps(report.first_failure)
    assert report.passed > 0


def test_a_driver_that_does_not_declare_the_layer_has_it_skipped() -> None:
    report = _run(layers=("machines", "journal-append"))
    assert report.verdict == "skipped"
    assert (report.passed, report.failed) == (0, 0)
    assert report.skipped > 0


def test_a_malformed_view_is_refused_naming_its_field_and_plans_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # The refusal comes before the kernel is asked: no plan is made from a view no worker holds.
    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("planned from a malformed view")

    monkeypatch.setattr(i, "plan_visit", never)
    answer = plan_answer({"execution": None, "definition": None, "evidence": [], "now": "2026-03-01T12:00:00.000001Z",
                          "lease": {"worker_id": "w-1", "fence": 1}, "authority": None, "result": None})
    assert answer == {"plan": "refused", "code": "invalid_view", "field": "execution"}
