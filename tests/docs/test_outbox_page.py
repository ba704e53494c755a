"""docs/outbox.md's Python, run as a reader would paste it: a sink of one's own, then a prune.

The page's sink names a Kafka producer and a PostgreSQL server; here the
producer is a recording stand-in, ``open_operation_store`` opens a SQLite
file instead, and the exporter stops once idle rather than run until
stopped.  Everything else is the page's code, and what it delivers and
removes is checked.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters.operations import connect
from fencekeeper.adapters.operations.sqlite import SQLiteOperationStore
from fencekeeper.adapters.outbox import OutboxExporter
from fencekeeper.adapters.store import ManualClock
from fencekeeper.adapters.testing.operations_suite import World, open_accounts
from tests.outbox.test_exporter import make_operations

PAGE = Path(__file__).resolve().parents[2] / "docs" / "outbox.md"


class Producer:
    """What the page's KafkaSink calls on a confluent-kafka producer: produce and flush."""

    def __init__(self) -> None:
        self.produced: list[dict[str, Any]] = []
        self.flushes = 0

    def produce(self, topic: str, *, key: str, value: str, headers: dict[str, str]) -> None:
        self.produced.append({"topic": topic, "key": key, "value": value, "headers": headers})

    def flush(self, timeout: float) -> int:
        self.flushes += 1
        return 0  # messages still waiting: none


def test_the_pages_sink_and_prune_run_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sink_block, prune_block = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.DOTALL)
    path = tmp_path / "ops.db"
    old = SQLiteOperationStore(path, ManualClock())  # 2026-01-01: long ended by now, for the page's windows
    open_accounts(old, {"acc-1": 100, "acc-2": 0})
    ids = make_operations(World(old, ManualClock()), 2)
    old.close()
    store = SQLiteOperationStore(path)
    opened: list[str] = []
    monkeypatch.setattr(connect, "open_operation_store", lambda url: opened.append(url) or store)
    monkeypatch.setattr(OutboxExporter, "run", functools.partialmethod(OutboxExporter.run, until_idle=True))
    producer = Producer()
    namespace: dict[str, Any] = {"producer": producer}
    try:
        exec(compile(sink_block, str(PAGE), "exec"), namespace)  # the page's own code, as a reader runs it
        assert opened == ["postgresql://fk@db/prod"]
        assert producer.produced and producer.flushes >= 1
        assert {m["key"] for m in producer.produced} == set(ids)
        assert all(m["topic"] == "fk-events" and m["headers"]["message_id"].startswith(m["key"] + "/")
                   for m in producer.produced)  # fmt: skip

        exec(compile(prune_block, str(PAGE), "exec"), namespace | {"store": store})
        operations, transitions, outbox, executions, finished = capsys.readouterr().out.split()
        # Both Operations ended long ago, their identities' windows are over: their rows and history go.
        # Their outbox rows were exported just now, inside the seven days the page keeps them.
        assert (operations, outbox, executions, finished) == ("2", "0", "0", "True")
        assert int(transitions) > 0
    finally:
        store.close()
