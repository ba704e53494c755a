"""The store suite catches every store broken on purpose, and passes the correct ones.

Each variant in tests/conformance/broken has one realistic bug.  It is run
through the public route (``pytest --pyargs
fencekeeper.adapters.testing.run_suite --fencekeeper-store ...``, see
runner.py), limited to the tests of its group so that the whole check
stays well under a minute: the race tests for a concurrency bug, the
port and time tests for a port or time bug, the stateful test under the
``ci`` budget for a bug only a sequence shows (Hypothesis derandomized: the
same run every time).  A variant is caught when at least one of them
fails.  The correct stores run the whole suite through the same route (the
stateful test under the ``quick`` budget) and every test must pass, so no
selected test fails for a reason a correct store shares; the SQLite and
PostgreSQL stores run the whole suite in tests/stores and tests/postgres.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .broken import CORRECT, DESCRIPTIONS, GROUPS, VARIANTS
from .runner import run_suite

PORT_AND_TIME = "due or timer or event or evidence or take_an or microsecond or comparisons or quarantine or recovery"
SELECTIONS = {
    "concurrency": "two_ or racing",
    "port": PORT_AND_TIME,
    "time": PORT_AND_TIME,
    "stateful": "stateful",
}
"""The tests each group's variants run (pytest -k expressions)."""


def test_there_are_enough_variants_in_every_group() -> None:
    assert len(VARIANTS) >= 20
    assert set(GROUPS.values()) == set(SELECTIONS)
    for group in SELECTIONS:
        assert sum(1 for g in GROUPS.values() if g == group) >= 3, group
    assert all(DESCRIPTIONS[name] for name in VARIANTS), "every variant says in one line what is broken"


@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_suite_catches_the_broken_store(name: str, tmp_path: Path) -> None:
    group = GROUPS[name]
    # The stateful group runs under the ci budget: derandomized, each is caught within seconds.
    budget = "ci" if group == "stateful" else "default"
    run = run_suite(VARIANTS[name], tmp_path, suite_budget=budget, select=SELECTIONS[group])
    assert run.passed + len(run.failed) > 0, f"no test of group {group} ran"
    assert run.failed, (
        f"{name} ({DESCRIPTIONS[name]}) passed every {group} test of the suite ({run.passed}): the suite does not "
        "see this bug"
    )


@pytest.mark.parametrize("name", ["memory", "memory-reworded-history"])
def test_a_correct_store_passes_the_whole_suite(name: str, tmp_path: Path) -> None:
    run = run_suite(CORRECT[name], tmp_path, suite_budget="quick", stop_at_first=False)
    assert run.failed == (), f"{name} ({DESCRIPTIONS[name]}) failed {run.failed}:\n{run.first_failure}"
    assert run.passed >= 130, f"only {run.passed} tests passed: the suite did not run in full"


def test_a_bad_factory_option_is_one_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = pytest.main(
        ["--pyargs", "fencekeeper.adapters.testing.run_suite", "--fencekeeper-store", "no_such_module:make", "-qq",
         "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "t")]
    )
    assert code == pytest.ExitCode.USAGE_ERROR
    assert "--fencekeeper-store no_such_module:make" in capsys.readouterr().err
    code = pytest.main(
        ["--pyargs", "fencekeeper.adapters.testing.run_suite", "--fencekeeper-budget", "lots", "-qq",
         "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "u")]
    )
    assert code == pytest.ExitCode.USAGE_ERROR
    assert "--fencekeeper-budget: 'lots' is not a budget" in capsys.readouterr().err
