"""The ``journal-append`` cases catch kernels whose append is broken on purpose.

Each variant below changes one rule of specs/journal.md, section 6 (a check
dropped, two checks swapped, the time written to the millisecond) in the
kernel the Python driver answers from; the committed cases, generated from
the correct kernel, are then run through the driver protocol in this
process.  A variant is caught when at least one case fails; the correct
kernel passes every one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from fencekeeper.adapters.conformance.runner import LayerReport
from fencekeeper.kernel import journal as kj
from fencekeeper.kernel.journal_codes import JournalCode, JournalError
from tests.conformance.kernel_layer import run_kernel_layer

LAYER = "journal-append"


def _run(layers: tuple[str, ...] | None = None) -> LayerReport:
    return run_kernel_layer(LAYER, layers)


def _head_before_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    original = kj._apply

    def apply(builder: Any, command: Any, at: str, digest: str | None = None) -> bool:
        if command.expected_head != builder.head:
            raise JournalError(JournalCode.STALE_HEAD, "the head first")
        return original(builder, command, at, digest)

    monkeypatch.setattr(kj, "_apply", apply)


def _bound_before_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    original = kj._apply

    def apply(builder: Any, command: Any, at: str, digest: str | None = None) -> bool:
        if builder.stored is None:
            kj._check_bounds(command)
        return original(builder, command, at, digest)

    monkeypatch.setattr(kj, "_apply", apply)


def _automation_as_human(monkeypatch: pytest.MonkeyPatch) -> None:
    original = kj._authorize

    def authorize(*args: Any, **kwargs: Any) -> None:
        original(*args, **{**kwargs, "human": False})

    monkeypatch.setattr(kj, "_authorize", authorize)


def _resolver_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    original = kj.preview

    def preview(journal: Any, command: Any, now: datetime, resolve: Any = None, *, headers: Any = None) -> Any:
        return original(journal, command, now, None, headers=headers)

    monkeypatch.setattr(kj, "preview", preview)


def _milliseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    original = kj.format_time
    monkeypatch.setattr(kj, "format_time", lambda now: original(now.replace(microsecond=now.microsecond // 1000 * 1000)))


def _dropped(name: str) -> Callable[[pytest.MonkeyPatch], None]:
    def patch(monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(kj, name, lambda *args, **kwargs: None)

    return patch


VARIANTS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "no-free-text-bound": _dropped("_check_bounds"),
    "no-independence": _dropped("_check_independence"),
    "no-approval-checks": _dropped("_check_approvals"),
    "no-successor-header-check": _dropped("_check_successor_header"),
    "stale-head-before-repeat": _head_before_repeat,
    "bound-before-repeat": _bound_before_repeat,
    "automation-as-human": _automation_as_human,
    "resolver-ignored": _resolver_ignored,
    "time-to-the-millisecond": _milliseconds,
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_cases_catch_the_broken_append(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    VARIANTS[name](monkeypatch)
    report = _run()
    assert report.passed + report.failed > 0, "no journal-append case ran"
    assert report.failed, f"{name} passed all {report.passed} journal-append cases"


def test_the_kernel_passes_every_case() -> None:
    report = _run()
    assert (report.failed, report.skipped) == (0, 0), json.dumps(report.first_failure)
    assert report.passed > 0


def test_a_driver_that_does_not_declare_the_layer_has_it_skipped() -> None:
    report = _run(layers=("machines", "journal"))
    assert report.verdict == "skipped"
    assert (report.passed, report.failed) == (0, 0)
    assert report.skipped > 0
