"""A worker refuses settings that cannot work: a lease too short to commit anything, too many threads.

What these tests prove:

- ``fencekeeper worker --lease`` below ``MIN_LEASE`` (1 s), not a number, or
  not finite, and ``--concurrency`` outside 1..``MAX_CONCURRENCY`` (64) or not
  a whole number, exit 2 with one error line naming the flag, before the
  store is opened: nothing is written, not even the database file;
- the bounds are inclusive: ``--lease 1 --concurrency 64`` runs;
- the Python API refuses the same: ``Worker(lease=...)`` below the minimum,
  at construction and on assignment, and ``check_concurrency`` outside its
  bounds, with ``WorkerSettingError`` naming the setting.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from fencekeeper.adapters import examples
from fencekeeper.adapters.memory import MemoryStore
from fencekeeper.adapters.worker import (
    MAX_CONCURRENCY,
    MIN_LEASE,
    Worker,
    WorkerSettingError,
    check_concurrency,
    check_lease,
)

from .runner import EXAMPLES, assert_one_error_line, fencekeeper, ok


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--lease", "0.001", "below the minimum of 1 s"),
        ("--lease", "0.999", "below the minimum of 1 s"),
        ("--lease", "-5", "below the minimum of 1 s"),
        ("--lease", "soon", "not a number of seconds"),
        ("--lease", "nan", "must be a finite number of seconds, got 'nan'"),
        ("--lease", "inf", "must be a finite number of seconds, got 'inf'"),
        ("--lease", "31708800", "must be under a year"),
        ("--id", "bad id", "malformed identifier 'bad id' ("),
        ("--id", "w" * 128, "is too long to name workers"),
        ("--concurrency", "0", "between 1 and 64"),
        ("--concurrency", "65", "between 1 and 64"),
        ("--concurrency", "100000", "between 1 and 64"),
        ("--concurrency", "two", "not a whole number"),
    ],
)
def test_worker_settings_out_of_bounds_are_one_line_naming_the_flag(
    tmp_path: Path, flag: str, value: str, says: str
) -> None:
    db = tmp_path / "shop.db"
    result = fencekeeper("worker", "--db", db, "--until-idle", flag, value, cwd=tmp_path)
    line = assert_one_error_line(result, 2)
    assert line.startswith(f"fencekeeper: error: {flag}: ") and says in line, line
    assert not db.exists(), "a refused worker must not open (or create) the store"


def test_the_bounds_themselves_are_accepted(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    ok(
        "run", EXAMPLES / "purchase_approval.toml", "--db", db,
        "--input", '{"amount": 10, "order_id": "o-1", "order_revision": 1}', cwd=tmp_path,
    )
    ok("worker", "--db", db, "--until-idle", "--lease", "1", "--concurrency", str(MAX_CONCURRENCY), cwd=tmp_path)
    listed = ok("list", "--db", db, cwd=tmp_path).stdout
    assert "eligible" not in listed and "running" not in listed, listed


def test_the_python_api_refuses_a_lease_below_the_minimum() -> None:
    store = MemoryStore()
    policy, handler = examples.grants("b-1"), examples.handler()
    with pytest.raises(WorkerSettingError) as caught:
        Worker(store, "w-1", policy, handler, lease=timedelta(milliseconds=1))
    assert caught.value.field == "lease" and "below the minimum" in str(caught.value)
    worker = Worker(store, "w-1", policy, handler, lease=MIN_LEASE)
    with pytest.raises(WorkerSettingError):
        worker.lease = MIN_LEASE - timedelta(microseconds=1)
    assert worker.lease == MIN_LEASE
    assert check_lease(timedelta(seconds=30)) == timedelta(seconds=30)


@pytest.mark.parametrize("value", [0, -1, MAX_CONCURRENCY + 1, True])
def test_the_python_api_bounds_concurrency(value: int) -> None:
    with pytest.raises(WorkerSettingError) as caught:
        check_concurrency(value)
    assert caught.value.field == "concurrency"


def test_the_python_api_accepts_concurrency_within_bounds() -> None:
    assert [check_concurrency(n) for n in (1, MAX_CONCURRENCY)] == [1, MAX_CONCURRENCY]
