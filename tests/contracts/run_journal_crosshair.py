"""Check the execution journal's PEP 316 contracts with CrossHair, in a run of their own.

Run from the repository root as ``python -m tests.contracts.run_journal_crosshair``
(``make contracts`` runs it after ``run_crosshair``).  The modules are
``run_crosshair.OWN_RUN`` (``kernel/dag.py``: the invalidation closure;
``kernel/journal.py``: the chain-link rule); the main run leaves them out,
so that each run has its own wall-clock budget and neither can make the
other time out.  The rules are the main run's (``run_crosshair._problems``):
a counterexample, an error, or a contract CrossHair does not report on
fails the run.  Their arguments are strings, integers and tuples of them,
which CrossHair makes on its own: no plugin is needed.
"""

from __future__ import annotations

from collections.abc import Sequence

from tests.contracts.run_crosshair import PER_CONDITION_TIMEOUT, _problems, check, contract_modules

# Wall time, as in run_crosshair.py: 6 contracts at 4 s of CPU each, on a machine shared with the
# model checker and the other contracts; it took 61 s on a busy one.
OVERALL_TIMEOUT = 360.0


def main(argv: Sequence[str] | None = None) -> int:
    del argv
    modules = contract_modules(own_run=True)
    contracts = [c for cs in modules.values() for c in cs]
    if not contracts:
        print("crosshair (journal): error: no contracts found in the journal's modules")
        return 1
    report = check(sorted(modules), timeout=OVERALL_TIMEOUT)
    problems = _problems(report, contracts)
    for problem in problems:
        print(f"crosshair (journal): error: {problem}")
    confirmed = sum((c.path, c.line) in report.confirmed for c in contracts)
    unconfirmed = sum((c.path, c.line) in report.unconfirmed for c in contracts)
    print(
        f"crosshair (journal): {'FAILED' if problems else 'ok'}: {len(contracts)} contracts in {len(modules)} modules: "
        f"{confirmed} confirmed over all paths, {unconfirmed} not refuted within {PER_CONDITION_TIMEOUT:g}s CPU each; "
        f"{len(problems)} problems ({report.seconds:.1f}s)"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
