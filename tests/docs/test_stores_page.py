"""docs/stores.md's tables of migrations are the stores' migrations, by number and name, in order.

A migration added to ``sqlite_store.MIGRATIONS`` or ``postgres_store.MIGRATIONS``
fails here until the page says what it adds.  The Store port the page
tabulates is ``fencekeeper.adapters.store.Store``: every method it names in
its first column that is not marked as the transaction loop's is a method
of the port.
"""

from __future__ import annotations

import re
from pathlib import Path

from fencekeeper.adapters import postgres_store, sqlite_store
from fencekeeper.adapters.store import Store, TransactionalStore

PAGE = Path(__file__).resolve().parents[2] / "docs" / "stores.md"


def _rows(header: str) -> list[tuple[int, str]]:
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(header)
    rows = []
    for line in text[start:].splitlines()[2:]:
        cells = line.strip().split("|")
        if len(cells) < 4:
            break
        rows.append((int(cells[1].strip()), cells[2].strip().strip("`")))
    return rows


def test_the_sqlite_migrations_table_is_the_sqlite_stores() -> None:
    shown = _rows("| version | name | what it adds |")
    assert shown == [(number, name) for number, name, _ in sqlite_store.MIGRATIONS]


def test_the_postgresql_migrations_table_is_the_postgresql_stores() -> None:
    shown = _rows("| migration | name | what it does |")
    assert shown == [(number, name) for number, name, _ in postgres_store.MIGRATIONS]


def test_the_port_table_names_methods_of_the_port_or_of_the_loop() -> None:
    text = PAGE.read_text(encoding="utf-8")
    table = text[text.index("| method | what it asks |") : text.index("\n\n", text.index("| method | what it asks |"))]
    for line in table.splitlines()[2:]:
        first = line.split(" | ")[0]
        names = re.findall(r"`([a-z_]+)[`(]", first)
        assert names, line
        owner = TransactionalStore if "`TransactionalStore`, not the port" in first else Store
        for name in names:
            assert callable(getattr(owner, name, None)), f"{name} is not a method of {owner.__name__}"
            if owner is TransactionalStore:
                assert not hasattr(Store, name), f"{name} is in the port: drop the mark"
