"""Why the SQLite store's hot path uses the sqlite3 connection directly, not sqlite-utils.

Run: ``python -m bench.sqlite_hot_path``.  One guarded row update, the kind
the store issues on every decision, written both ways inside one
transaction on the same file, several rounds, medians:

- ``sqlite3``: ``conn.execute("UPDATE ... WHERE id = ?")``, what the store does;
- ``sqlite-utils``: ``db[table].update(pk, values)``, the library's way, which
  introspects the table on each call (and could not carry the store's guard
  in its WHERE clause anyway).

sqlite-utils stays where it is good: the store uses it to introspect the
schema when it opens a file.
"""

from __future__ import annotations

import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import sqlite_utils

ROWS = 1_000
UPDATES = 5_000
ROUNDS = 5


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        conn = sqlite3.connect(Path(directory) / "hot.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (id TEXT PRIMARY KEY, n INTEGER NOT NULL, s TEXT)")
        conn.executemany("INSERT INTO t VALUES (?, 0, 'a')", [(f"k{i}",) for i in range(ROWS)])
        db = sqlite_utils.Database(conn)

        def raw() -> None:
            for i in range(UPDATES):
                conn.execute("UPDATE t SET s = ? WHERE id = ?", ("b", f"k{i % ROWS}"))

        def library() -> None:
            for i in range(UPDATES):
                db["t"].update(f"k{i % ROWS}", {"s": "b"})

        medians = {}
        for name, run in (("sqlite3", raw), ("sqlite-utils", library)):
            times = []
            for _ in range(ROUNDS):
                conn.execute("BEGIN")
                started = time.perf_counter()
                run()
                times.append((time.perf_counter() - started) / UPDATES * 1e6)
                conn.execute("COMMIT")
            medians[name] = statistics.median(times)
        conn.close()
    print(f"one row update, median of {ROUNDS} rounds of {UPDATES:,}:")
    for name, micros in medians.items():
        print(f"  {name:<13} {micros:7.1f} us")
    print(f"sqlite-utils / sqlite3: {medians['sqlite-utils'] / medians['sqlite3']:.1f}x")


if __name__ == "__main__":
    main()
