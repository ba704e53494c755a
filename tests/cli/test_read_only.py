"""Commands that only read work on a read-only SQLite store, and leave nothing beside it.

``list`` and ``inspect`` only read, so a store on a read-only file,
directory or mount (a backup, a copy under investigation) is read, not
refused; ``check`` reports that such a store cannot run, without creating
``-wal``/``-shm`` files beside it; a command that writes is refused with one
line saying the store is read-only.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.runner import EXAMPLES, assert_one_error_line, data, fencekeeper
from tests.stores.test_sqlite_files import file_state, read_only

PURCHASE = EXAMPLES / "purchase_approval.toml"


def test_list_and_inspect_read_a_read_only_store(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    db = directory / "shop.db"
    data("run", PURCHASE, "--db", db, "--input", '{"amount": 5, "order_id": "o-1", "order_revision": 1}',
         "--id", "po-1", cwd=tmp_path)  # fmt: skip
    for paths in ((db,), (db, directory)):
        with read_only(*paths):
            before = file_state(db)
            listed = data("list", "--db", db, cwd=tmp_path)
            assert [item["execution_id"] for item in listed] == ["po-1"]
            shown = data("inspect", "po-1", "--db", db, cwd=tmp_path)
            assert shown["execution"]["execution_id"] == "po-1"
            assert fencekeeper("inspect", "po-1", "--db", db, cwd=tmp_path).returncode == 0
            report = fencekeeper("check", "--db", db, "--json", cwd=tmp_path)
            assert report.returncode == 1
            problems = json.loads(report.stdout)["problems"]
            assert problems and all("read-only" in problem for problem in problems), problems
            refused = fencekeeper("cancel", "po-1", "--db", db, cwd=tmp_path)
            assert "read-only" in assert_one_error_line(refused, 1)
            assert file_state(db) == before, "a command left files beside a read-only store"
