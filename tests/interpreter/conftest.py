"""A world to run workflows in: one store (memory, SQLite or PostgreSQL), a clock, grants, a handler, workers."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.memory import MemoryStore
from fencekeeper.adapters.ports import GrantTable, ScriptedHandler, unknown
from fencekeeper.adapters.postgres_store import PostgresStore
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import ExecutionView, ManualClock, TransactionalStore
from fencekeeper.adapters.worker import PassReport, Worker
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import Definition, parse_definition

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
BUSINESS = "acme"
RUNNER = "user:alice"
MANAGER = "user:manager"
OPS = "user:ops"


def example(name: str) -> Definition:
    path = EXAMPLES / f"{name}.toml"
    return parse_definition(path.read_text(), path.name)


@attrs.define
class World:
    store: TransactionalStore
    clock: ManualClock
    policy: GrantTable
    handler: ScriptedHandler
    lease: timedelta = timedelta(seconds=30)

    def worker(self, worker_id: str = "w-1") -> Worker:
        return Worker(self.store, worker_id, self.policy, self.handler, lease=self.lease)

    def run_pass(self, worker_id: str = "w-1") -> PassReport:
        return self.worker(worker_id).run_pass()

    def register(self, definition: Definition) -> None:
        service.register(self.store, definition, BUSINESS, RUNNER, self.policy)

    def admit(self, definition_id: str, execution_id: str, **data: Any) -> p.Decision:
        outcome = service.run(
            self.store,
            self.policy,
            business_id=BUSINESS,
            principal_id=RUNNER,
            definition_id=definition_id,
            input=data,
            execution_id=execution_id,
        )
        assert isinstance(outcome, p.Decision), outcome
        return outcome

    def view(self, execution_id: str) -> ExecutionView:
        found = self.store.read(execution_id)
        assert found is not None, execution_id
        return found

    def publish(self, event_type: str, correlation: Mapping[str, object], payload: Mapping[str, Any] | None = None,
                event_id: str | None = None, business_id: str = BUSINESS) -> service.PublishResult:
        return service.publish(
            self.store, self.policy, business_id=business_id, principal_id=RUNNER, event_type=event_type,
            correlation=correlation, payload=payload, event_id=event_id,
        )


StoreMaker = Callable[[ManualClock], TransactionalStore]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreMaker]:
    made: list[TransactionalStore] = []

    def make(clock: ManualClock) -> TransactionalStore:
        store: TransactionalStore
        if request.param == "memory":
            store = MemoryStore(clock)
        elif request.param == "sqlite":
            store = SQLiteStore(tmp_path / f"w{len(made)}.db", clock)
        else:
            dsn = request.getfixturevalue("pg_dsn")
            schema = request.getfixturevalue("pg_schema")
            store = PostgresStore(dsn, schema=schema, clock=clock, pool_size=2)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


@pytest.fixture
def world(make_store: StoreMaker) -> World:
    clock = ManualClock()
    store = make_store(clock)
    policy = examples.grants(BUSINESS, RUNNER, MANAGER, OPS)
    return World(store, clock, policy, scripted_handler())


def scripted_handler() -> ScriptedHandler:
    """The example operations as scripts a test can replace one by one: a refund's reply is lost, and
    asking afterwards finds it applied."""
    return ScriptedHandler(
        {
            "order.place": examples.EFFECTS["order.place"],
            "order.ship": examples.EFFECTS["order.ship"],
            "order.cancel": examples.EFFECTS["order.cancel"],
            "payment.refund": unknown("the payment provider did not answer in time"),
        },
        settled={"payment.refund": examples.EFFECTS["payment.refund"]},
    )
