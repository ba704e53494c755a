"""The CrossHair runner is not a no-op: it reports false contracts and silent analysis.

A runner that always exits 0 would make ``make contracts`` worthless, so this
proves, on tiny modules and on the kernel itself, that:

- a false ``post:`` condition comes back as a counterexample and fails the run,
  while a true one in the same module is confirmed;
- the kernel's machine contracts are only checkable through the runner's
  plugin (without it CrossHair cannot build a ``Machine`` and fails), and
  with it they are confirmed over every path;
- a contract CrossHair never reports on, or a finite one it cannot confirm,
  counts as a problem rather than a pass.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.contracts import run_crosshair
from tests.contracts.run_crosshair import EXHAUSTIVE, Contract, Report, check, contract_modules, write_plugin

_MODULE = textwrap.dedent(
    '''
    def double(x: int) -> int:
        """
        post: __return__ == x + x
        """
        return 2 * x


    def clamp(x: int) -> int:
        """
        post: __return__ < 100
        """
        return x if x < 1000 else 0
    '''
)


def _line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), start=1) if needle in line)


def test_a_false_contract_fails_the_run(tmp_path: Path) -> None:
    module = tmp_path / "contracted.py"
    module.write_text(_MODULE, encoding="utf-8")
    report = check([str(module)], per_condition_timeout=3, cwd=tmp_path)
    assert not report.ok
    assert report.returncode == 1
    false_line = _line_of(_MODULE, "__return__ < 100")
    true_line = _line_of(_MODULE, "__return__ == x + x")
    path = str(module.resolve())
    assert report.refuted == {(path, false_line)}
    assert len(report.errors) == 1 and f"contracted.py:{false_line}: error:" in report.errors[0]
    assert "clamp(" in report.errors[0]
    assert (path, true_line) in report.confirmed
    contracts = run_crosshair.contracts_in(module, "contracted")
    assert [(c.line, c.function) for c in contracts] == [(true_line, "contracted.double"), (false_line, "contracted.clamp")]


def test_machine_contracts_need_the_plugin_and_are_confirmed_with_it(tmp_path: Path) -> None:
    target = "fencekeeper.kernel.machines.Machine.allows"
    without = check([target], per_condition_timeout=3)
    assert not without.ok
    assert not without.confirmed
    # Confirmation needs the search to finish: give it room on a loaded machine.
    with_plugin = check([target], per_condition_timeout=15, plugins=[write_plugin(tmp_path)])
    assert with_plugin.ok, with_plugin.errors
    (contract,) = [c for c in contract_modules()["fencekeeper.kernel.machines"] if c.function == target]
    assert with_plugin.confirmed == {(contract.path, contract.line)}


def test_silence_and_partial_analysis_are_problems() -> None:
    finite = Contract("/k.py", 10, next(iter(EXHAUSTIVE)))
    open_ended = Contract("/k.py", 20, "fencekeeper.kernel.spec._quote")
    quiet = Report(returncode=0, seconds=0.0)
    assert len(run_crosshair._problems(quiet, [finite, open_ended])) == 2
    partial = Report(returncode=0, seconds=0.0, unconfirmed={("/k.py", 10), ("/k.py", 20)})
    (problem,) = run_crosshair._problems(partial, [finite, open_ended])
    assert "not confirmed over all paths" in problem
    full = Report(returncode=0, seconds=0.0, confirmed={("/k.py", 10)}, unconfirmed={("/k.py", 20)})
    assert run_crosshair._problems(full, [finite, open_ended]) == []
    # The finite contracts' own, longer run decides whether they were proved:
    # confirmed there is enough, and unconfirmed there is a problem even if
    # the module-wide run happened to finish them.
    proved = Report(returncode=0, seconds=0.0, confirmed={("/k.py", 10)})
    assert run_crosshair._problems(partial, [finite, open_ended], proved) == []
    unproved = Report(returncode=0, seconds=0.0, unconfirmed={("/k.py", 10)})
    (problem,) = run_crosshair._problems(full, [finite, open_ended], unproved)
    assert "not confirmed over all paths" in problem


def test_the_kernel_contracts_are_discovered() -> None:
    modules = contract_modules()
    functions = {c.function for cs in modules.values() for c in cs}
    # The exhaustive list must name functions that really carry contracts,
    # or its guard would silently cover nothing.
    assert functions >= EXHAUSTIVE
    assert {"fencekeeper.kernel.machines.Machine.step", "fencekeeper.kernel.spec._quote"} <= functions
