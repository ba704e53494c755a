"""The asyncio client: the same answers and exceptions as the synchronous one.

On SQLite every call runs in a thread; on PostgreSQL the calls run on the
event loop itself, on psycopg's AsyncConnection, with the synchronous
store's decisions and SQL (adapters/bridge.py, adapters/postgres_async.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

import fencekeeper
from fencekeeper.adapters import bridge, examples
from fencekeeper.adapters.ports import GrantTable
from fencekeeper.adapters.postgres_async import AsyncPostgresStore
from fencekeeper.adapters.worker import Worker
from fencekeeper.kernel import protocol as p

WORKFLOWS = Path(__file__).resolve().parents[2] / "adapters" / "workflows"
PURCHASE = WORKFLOWS / "purchase_approval.toml"
REFUND = WORKFLOWS / "refund_needs_reconciliation.toml"


class Recording:
    """Grants everything in ``default``, and remembers which thread asked."""

    def __init__(self) -> None:
        self.grants: GrantTable = examples.grants("default", "user:operator", "user:manager")
        self.threads: set[int] = set()

    def check(self, principal_id: str, business_id: str, operation: str, targets: Sequence[tuple[str, int]] = ()) -> p.Authority:
        self.threads.add(threading.get_ident())
        return self.grants.check(principal_id, business_id, operation, targets)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store for each of the two ways the asyncio client works: in threads (SQLite), native (PostgreSQL)."""
    if request.param == "sqlite":
        return str(tmp_path / "a.db")
    dsn = request.getfixturevalue("pg_dsn")
    return f"{dsn}?schema={request.getfixturevalue('pg_schema')}"


def test_a_workflow_through_the_async_client(url: str) -> None:
    policy = Recording()
    native = url.startswith("postgresql://")

    async def scenario() -> int:
        loop_thread = threading.get_ident()
        async with await fencekeeper.connect_async(url, policy=policy, handler=examples.handler()) as client:
            assert client.native is native
            # Many admissions at once: each in its own thread (SQLite) or task on the loop (PostgreSQL).
            admitted = await asyncio.gather(
                *(
                    client.run(PURCHASE, {"amount": 10 * n, "order_id": f"o-{n}", "order_revision": 1}, execution_id=f"po-{n}")
                    for n in range(1, 9)
                )
            )
            assert sorted(x.execution_id for x in admitted) == [f"po-{n}" for n in range(1, 9)]
            big = await client.run(PURCHASE, {"amount": 5000, "order_id": "o-big", "order_revision": 1})
            report = await client.run_until_idle(lease=5)
            assert report.finished["succeeded"] == 8 and report.finished["waiting"] == 1
            # A refusal raises the same typed exception, or comes back as the kernel's value.
            with pytest.raises(fencekeeper.Refused) as caught:
                await client.approve(big.execution_id)
            assert caught.value.code is fencekeeper.RefusalCode.NOT_AUTHORIZED
            value = await client.decide(big.execution_id, "approved", raise_on_refusal=False)
            assert isinstance(value, p.Refusal) and value.code is fencekeeper.RefusalCode.NOT_AUTHORIZED
            with pytest.raises(fencekeeper.RequestError) as bad:
                await client.get("no such id")
            assert bad.value.field == "execution_id"
            decided = await client.approve(big.execution_id, reviewer="user:manager")
            assert decided.status is fencekeeper.DecisionStatus.ACCEPTED
            await client.run_until_idle(lease=5)
            states = {x.state for x in await client.list()}
            assert states == {fencekeeper.ExecutionState.SUCCEEDED}
            # Recovery, awaited: the refund's reply is lost, settled by asking, then resumed.
            refund = await client.run(REFUND, {"amount": 5, "payment_id": "p-1"})
            await client.run_until_idle(lease=5)
            assert (await client.review(refund.execution_id)).unresolved
            await client.settle(refund.execution_id)
            resumed = await client.resume(refund.execution_id, at_node="refunded", rationale="applied, says the provider")
            assert resumed.current_node_id == "refunded"
            assert (await client.inspect(refund.execution_id)).execution.state is fencekeeper.ExecutionState.ELIGIBLE
        return loop_thread

    loop_thread = asyncio.run(scenario())
    if native:
        # Every call the client made itself asked on the loop's thread; only the
        # passes and the settlement, which run the CommandHandler, ran in threads.
        assert loop_thread in policy.threads
    else:
        # Every authority question was asked off the event loop's thread.
        assert policy.threads and loop_thread not in policy.threads


def test_workers_started_from_asyncio(url: str) -> None:
    async def scenario() -> fencekeeper.PassReport:
        client = await fencekeeper.connect_async(
            url, policy=examples.grants("default", "user:operator"), handler=examples.handler()
        )
        for n in range(4):
            await client.run(PURCHASE, {"amount": n, "order_id": f"o-{n}", "order_revision": 1})
        late = await client.run(PURCHASE, {"amount": 1, "order_id": "o-late", "order_revision": 1})
        with pytest.raises(TimeoutError):
            await client.wait(late.execution_id, timeout=0.1, poll=0.02)
        pool = client.start_workers(2, lease=5, poll=0.05)
        # Waiting sleeps on the loop: another coroutine keeps running meanwhile.
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        finished = await client.wait(late.execution_id, timeout=30)
        ticker.cancel()
        assert finished.state is fencekeeper.ExecutionState.SUCCEEDED and ticks > 0
        assert await asyncio.to_thread(pool.wait_until_idle, 30)
        await asyncio.to_thread(pool.stop)
        await client.close()
        return pool.report

    report = asyncio.run(scenario())
    assert report.finished["succeeded"] == 5 and len(report.claimed) == 5


# --- PostgreSQL: native, on the loop -----------------------------------------------------------


def _rows(dsn: str, schema: str) -> dict[str, list[str]]:
    """Every row of every table of the schema, as text: what "the database is unchanged" compares."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s AND table_type = 'BASE TABLE'",
                (schema,),
            )
        ]
        return {
            table: sorted(repr(row) for row in conn.execute(f'SELECT * FROM "{schema}"."{table}"'))  # type: ignore[call-overload]
            for table in tables
        }


class NoThreads:
    """Fails the test on any attempt to start a thread or hand work to an executor."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.attempts: list[str] = []

        def refuse(what: str) -> Any:
            def refused(*args: Any, **kwargs: Any) -> Any:
                self.attempts.append(what)
                raise AssertionError(f"{what} called on the native path")

            return refused

        monkeypatch.setattr(threading.Thread, "start", refuse("Thread.start"))
        monkeypatch.setattr(asyncio, "to_thread", refuse("asyncio.to_thread"))
        monkeypatch.setattr(asyncio.BaseEventLoop, "run_in_executor", refuse("run_in_executor"))


def test_postgresql_calls_run_on_the_loop_without_threads(
    pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{pg_dsn}?schema={pg_schema}"
    policy = Recording()

    async def scenario() -> int:
        loop_thread = threading.get_ident()
        client = await fencekeeper.connect_async(url, policy=policy, handler=examples.handler(), pool_size=4)
        assert isinstance(client.sync.store, AsyncPostgresStore)
        # One execution waiting for approval: the passes run the handler, in a thread, before the guard.
        big = await client.run(PURCHASE, {"amount": 5000, "order_id": "o-big", "order_revision": 1})
        await client.run_until_idle(lease=5)
        policy.threads.clear()
        guard = NoThreads(monkeypatch)
        started = await asyncio.gather(
            *(
                client.run(PURCHASE, {"amount": n, "order_id": f"o-{n}", "order_revision": 1}, execution_id=f"po-{n}")
                for n in range(24)
            )
        )
        assert sorted(x.execution_id for x in started) == sorted(f"po-{n}" for n in range(24))
        # Reads, an Event, cancels and a decision, all at once on the one loop.
        listed, view, published, decided, *cancelled = await asyncio.gather(
            client.list(fencekeeper.ExecutionState.ELIGIBLE),
            client.inspect("po-3"),
            client.publish("payment.settled", {"order_id": "o-1"}, {"ok": True}, event_id="evt-1"),
            client.approve(big.execution_id, reviewer="user:manager"),
            *(client.cancel(f"po-{n}", reason="not needed") for n in range(12)),
        )
        assert len(listed) == 24 and view.execution.execution_id == "po-3"
        assert published.event_id == "evt-1" and not published.duplicate
        assert decided.status is fencekeeper.DecisionStatus.ACCEPTED
        assert decided.execution is not None and decided.execution.state is fencekeeper.ExecutionState.ELIGIBLE
        assert {x.state for x in cancelled} == {fencekeeper.ExecutionState.CANCELLED}
        assert len(await client.list(fencekeeper.ExecutionState.CANCELLED)) == 12
        # The calls waited on the server at the same time: the pool had to open more connections,
        # and they are psycopg's asynchronous ones.
        pool = client.sync.store._async_pool
        assert pool.get_stats()["pool_size"] > 1
        async with pool.connection() as conn:
            assert isinstance(conn, psycopg.AsyncConnection)
        # Used from plain synchronous code, where nothing would await its I/O, it refuses.
        with pytest.raises(RuntimeError, match="outside its event loop"):
            client.sync.store.execution_ids()
        assert guard.attempts == []
        monkeypatch.undo()
        await client.close()
        return loop_thread

    loop_thread = asyncio.run(scenario())
    # Every authority question of those calls was asked on the loop's own thread.
    assert policy.threads == {loop_thread}


def test_a_refusal_on_the_native_path_leaves_the_database_as_it_was(pg_dsn: str, pg_schema: str) -> None:
    url = f"{pg_dsn}?schema={pg_schema}"

    async def scenario() -> None:
        async with await fencekeeper.connect_async(url, policy=Recording(), handler=None) as client:
            first = await client.run(PURCHASE, {"amount": 5, "order_id": "o-1", "order_revision": 1}, execution_id="po-1")
            await client.cancel(first.execution_id, reason="changed my mind")
            before = _rows(pg_dsn, pg_schema)
            # The kernel's refusals: a terminal execution cannot be cancelled, nor admitted again
            # under its id with other input; the policy's: a reviewer without the grant.
            with pytest.raises(fencekeeper.Refused) as again:
                await client.cancel(first.execution_id, reason="twice", principal="user:manager")
            assert again.value.code is not fencekeeper.RefusalCode.NOT_AUTHORIZED
            refused = await client.run(
                PURCHASE, {"amount": 6, "order_id": "o-1", "order_revision": 1}, execution_id="po-1",
                raise_on_refusal=False,
            )
            assert isinstance(refused, p.Refusal)
            with pytest.raises(fencekeeper.Refused) as denied:
                await client.cancel(first.execution_id, principal="user:nobody")
            assert denied.value.code is fencekeeper.RefusalCode.NOT_AUTHORIZED
            assert _rows(pg_dsn, pg_schema) == before

    asyncio.run(scenario())


def test_after_the_server_ends_every_connection_one_native_call_fails_and_the_next_works(
    pg_dsn: str, pg_schema: str
) -> None:
    """A server restart ends every pooled connection: one call fails as store_unavailable, the next one works."""
    name = f"fk-{uuid.uuid4().hex[:8]}"
    url = f"{pg_dsn}?schema={pg_schema}&application_name={name}"

    def hold_four(store: AsyncPostgresStore) -> None:
        with contextlib.ExitStack() as held:
            for _ in range(4):
                held.enter_context(store._pooled())

    async def scenario() -> None:
        async with await fencekeeper.connect_async(url, policy=Recording(), handler=None, pool_size=4) as client:
            await client.run(PURCHASE, {"amount": 5, "order_id": "o-1", "order_revision": 1}, execution_id="po-1")
            store = client.sync.store
            assert isinstance(store, AsyncPostgresStore)
            await bridge.run_sync(hold_four, store)
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                ended = conn.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
                    (name,),
                ).fetchone()
            assert ended == (4,)
            with pytest.raises(fencekeeper.StoreFailure) as lost:
                await client.get("po-1")
            assert lost.value.code is fencekeeper.StoreCode.STORE_UNAVAILABLE
            assert (await client.get("po-1")).state is fencekeeper.ExecutionState.ELIGIBLE
            assert [x.execution_id for x in await client.list()] == ["po-1"]

    asyncio.run(scenario())


def test_cancelling_a_native_call_rolls_its_transaction_back(pg_dsn: str, pg_schema: str) -> None:
    url = f"{pg_dsn}?schema={pg_schema}"

    async def scenario() -> None:
        async with await fencekeeper.connect_async(url, policy=Recording(), handler=None, pool_size=2) as client:
            started = await client.run(PURCHASE, {"amount": 5, "order_id": "o-1", "order_revision": 1})
            before = _rows(pg_dsn, pg_schema)
            # Another session holds the execution's row: the cancellation waits on the server for it.
            with psycopg.connect(pg_dsn) as holder:
                holder.execute(
                    f'SELECT 1 FROM "{pg_schema}".objects WHERE object_id = %s FOR UPDATE',  # type: ignore[arg-type]
                    (started.execution_id,),
                )
                task = asyncio.create_task(client.cancel(started.execution_id, reason="no longer needed"))
                await asyncio.sleep(0.3)
                assert not task.done()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                holder.rollback()
            assert _rows(pg_dsn, pg_schema) == before
            # The pool reset or replaced the connection that was cut short: the client goes on.
            assert (await client.get(started.execution_id)).state is fencekeeper.ExecutionState.ELIGIBLE
            again = await asyncio.gather(*(client.get(started.execution_id) for _ in range(4)))
            assert {x.state for x in again} == {fencekeeper.ExecutionState.ELIGIBLE}
            cancelled = await client.cancel(started.execution_id, reason="now")
            assert cancelled.state is fencekeeper.ExecutionState.CANCELLED

    asyncio.run(scenario())


def test_a_worker_pass_on_the_asyncio_store_reads_through_its_own_pool(
    pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """due_wakes and read_for_visit, the worker's reads outside a transaction block, go through the async pool too.

    The asyncio store has no synchronous pool: a read that reached for one would fail, not fall back.
    """
    url = f"{pg_dsn}?schema={pg_schema}"
    policy = Recording()

    async def scenario() -> None:
        async with await fencekeeper.connect_async(url, policy=policy, handler=examples.handler()) as client:
            store = client.sync.store
            assert isinstance(store, AsyncPostgresStore)
            started = await client.run(PURCHASE, {"amount": 50, "order_id": "o-1", "order_revision": 1}, execution_id="po-1")
            guard = NoThreads(monkeypatch)
            assert await bridge.run_sync(store.due_wakes) == []
            visit = await bridge.run_sync(store.read_for_visit, started.execution_id)
            assert visit is not None and visit.execution.execution_id == "po-1"
            assert await bridge.run_sync(store.read_for_visit, "po-absent") is None
            # The worker's own path: a pass looks for due timers, then claims and drives the execution.
            worker = Worker(store, "w-async", policy, examples.handler())
            report = await bridge.run_sync(worker.run_pass)
            assert report.claimed == ["po-1"], report
            assert guard.attempts == []
            monkeypatch.undo()
            assert (await client.get("po-1")).state is not fencekeeper.ExecutionState.ELIGIBLE

    asyncio.run(scenario())


# --- closing ------------------------------------------------------------------------------------


def test_every_call_after_close_is_a_store_failure(url: str) -> None:
    """The calls that run the CommandHandler too: none opens a store again (PostgreSQL) or trips an assertion."""

    async def scenario() -> None:
        client = await fencekeeper.connect_async(url, policy=Recording(), handler=examples.handler())
        started = await client.run(PURCHASE, {"amount": 5, "order_id": "o-1", "order_revision": 1})
        await client.close()
        await client.close()  # a second close does nothing
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "get": lambda: client.get(started.execution_id),
            "run": lambda: client.run(PURCHASE, {"amount": 6, "order_id": "o-2", "order_revision": 1}),
            "run_until_idle": lambda: client.run_until_idle(lease=5),
            "settle": lambda: client.settle(started.execution_id),
        }
        for name, call in calls.items():
            with pytest.raises(fencekeeper.StoreFailure) as caught:
                async with asyncio.timeout(30):
                    await call()
            assert caught.value.code is fencekeeper.StoreCode.STORE_UNAVAILABLE, name
            assert "closed" in str(caught.value), name
        with pytest.raises(fencekeeper.StoreFailure) as refused:
            client.start_workers(1)
        assert refused.value.code is fencekeeper.StoreCode.STORE_UNAVAILABLE
        assert client._workers is None or client._workers is client.sync

    asyncio.run(scenario())


def test_a_close_while_the_workers_store_opens_closes_it(pg_dsn: str, pg_schema: str) -> None:
    """close() meets the workers' own store being opened in a thread: the store opened is closed, not left open."""
    url = f"{pg_dsn}?schema={pg_schema}"
    opening, release = threading.Event(), threading.Event()
    opened: list[fencekeeper.Client] = []

    async def scenario() -> None:
        client = await fencekeeper.connect_async(url, policy=Recording(), handler=examples.handler())
        open_workers = client._open_workers
        assert open_workers is not None

        def slow_open() -> fencekeeper.Client:
            opening.set()
            assert release.wait(30)
            opened.append(open_workers())
            return opened[-1]

        client._open_workers = slow_open
        passes = asyncio.create_task(client.run_until_idle(lease=5))
        async with asyncio.timeout(30):
            assert await asyncio.to_thread(opening.wait, 30)
            closing = asyncio.create_task(client.close())
            await asyncio.sleep(0)  # close() has begun while the workers' store is still opening
            release.set()
            await closing
            outcome = (await asyncio.gather(passes, return_exceptions=True))[0]
        assert isinstance(outcome, (fencekeeper.StoreFailure, fencekeeper.PassReport)), outcome
        with pytest.raises(fencekeeper.StoreFailure):
            await client.run_until_idle(lease=5)

    asyncio.run(scenario())
    assert [c._closed for c in opened] == [True]


# --- asyncio objects where synchronous ones are expected ------------------------------------------


class AsyncPolicy:
    async def check(self, principal_id: str, business_id: str, operation: str, targets: Sequence[tuple[str, int]] = ()) -> p.Authority:
        return p.Authority(True, principal_id, "granted")


class AsyncHandler:
    async def execute(self, command: fencekeeper.Command) -> fencekeeper.CommandResult:
        return fencekeeper.CommandResult(fencekeeper.CommandStatus.SUCCEEDED, None, "done")

    def reconcile(self, command: fencekeeper.Command) -> fencekeeper.CommandResult:
        return fencekeeper.CommandResult(fencekeeper.CommandStatus.UNKNOWN, None, "no record")


class AsyncReconcile(AsyncHandler):
    def execute(self, command: fencekeeper.Command) -> fencekeeper.CommandResult:  # type: ignore[override]
        return fencekeeper.CommandResult(fencekeeper.CommandStatus.SUCCEEDED, None, "done")

    async def reconcile(self, command: fencekeeper.Command) -> fencekeeper.CommandResult:  # type: ignore[override]
        return fencekeeper.CommandResult(fencekeeper.CommandStatus.UNKNOWN, None, "no record")


@pytest.mark.parametrize(
    ("policy", "handler", "field", "named"),
    [
        (AsyncPolicy(), None, "policy", "check"),
        (examples.grants("default"), AsyncHandler(), "handler", "execute"),
        (examples.grants("default"), AsyncReconcile(), "handler", "reconcile"),
    ],
)
def test_an_async_policy_or_handler_is_refused_when_connecting(
    tmp_path: Path, policy: Any, handler: Any, field: str, named: str
) -> None:
    """Called as synchronous code, an ``async def`` answers a coroutine: refused before anything is opened.

    Accepted, an async handler's every Command was taken as unknown (every
    execution went to reconciliation), and an async policy failed every call
    on an AttributeError.
    """
    db = tmp_path / "a.db"
    with pytest.raises(fencekeeper.RequestError) as caught:
        fencekeeper.connect(str(db), policy=policy, handler=handler)
    assert (caught.value.code, caught.value.field) == (fencekeeper.RequestCode.INVALID_ARGUMENT, field)
    assert f"{named} is a coroutine function" in str(caught.value)
    with pytest.raises(fencekeeper.RequestError) as caught:
        asyncio.run(fencekeeper.connect_async(str(db), policy=policy, handler=handler))
    assert (caught.value.code, caught.value.field) == (fencekeeper.RequestCode.INVALID_ARGUMENT, field)
    assert list(tmp_path.iterdir()) == []


# --- cancelled ----------------------------------------------------------------------------------


def test_connect_async_cancelled_while_its_pool_opens_leaves_no_pool_open(
    pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``asyncio.timeout`` around connect_async, expiring while the first connection is made: nothing stays open."""
    from fencekeeper.adapters import postgres_async  # noqa: PLC0415

    pools: list[Any] = []

    async def scenario() -> None:
        opening = asyncio.Event()

        class SlowToOpen(postgres_async.AsyncConnectionPool):  # type: ignore[type-arg]
            """Opens (its tasks start, its first connection is made), then waits as for a slow server."""

            async def open(self, wait: bool = False, timeout: float = 30.0) -> None:
                pools.append(self)
                await super().open(wait=False)
                opening.set()
                await asyncio.Event().wait()

        monkeypatch.setattr(postgres_async, "AsyncConnectionPool", SlowToOpen)
        connecting = asyncio.create_task(
            fencekeeper.connect_async(f"{pg_dsn}?schema={pg_schema}", policy=Recording(), handler=None)
        )
        async with asyncio.timeout(30):
            await opening.wait()
            connecting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await connecting
        try:
            assert [pool.closed for pool in pools] == [True]
        finally:
            for pool in pools:
                await pool.close()

    asyncio.run(scenario())


# --- event loops --------------------------------------------------------------------------------


def test_a_native_client_refuses_an_event_loop_other_than_its_own(pg_dsn: str, pg_schema: str) -> None:
    """Its connections, their locks and its pool's tasks are its loop's: another loop gets one clear error."""
    url = f"{pg_dsn}?schema={pg_schema}"
    own = asyncio.new_event_loop()
    thread = threading.Thread(target=own.run_forever, daemon=True)
    thread.start()

    def on_own(coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, own).result(timeout=30)

    try:
        client = on_own(fencekeeper.connect_async(url, policy=Recording(), handler=None))
        started = on_own(client.run(PURCHASE, {"amount": 5, "order_id": "o-1", "order_revision": 1}))

        async def elsewhere() -> None:
            async with asyncio.timeout(30):
                with pytest.raises(RuntimeError, match="belong to the event loop that opened it"):
                    await client.get(started.execution_id)
                with pytest.raises(RuntimeError, match="belong to the event loop that opened it"):
                    await client.close()

        asyncio.run(elsewhere())
        # Nothing was closed or changed by the refusals: the client goes on, and closes, on its own loop.
        assert on_own(client.get(started.execution_id)).state is fencekeeper.ExecutionState.ELIGIBLE
        on_own(client.close())
        with pytest.raises(fencekeeper.StoreFailure):
            on_own(client.get(started.execution_id))
    finally:
        own.call_soon_threadsafe(own.stop)
        thread.join(30)
        own.close()


class Blocking:
    """The example handler, whose first Command waits for the test to let it go (a slow order system)."""

    def __init__(self) -> None:
        self.inner = examples.handler()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def execute(self, command: fencekeeper.Command) -> fencekeeper.CommandResult:
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            assert self.release.wait(30)
        return self.inner.execute(command)

    def reconcile(self, command: fencekeeper.Command) -> fencekeeper.CommandResult:
        return self.inner.reconcile(command)


async def _admit_three(client: fencekeeper.AsyncClient) -> None:
    for n in range(3):
        await client.run(PURCHASE, {"amount": n, "order_id": f"o-{n}", "order_revision": 1}, execution_id=f"po-{n}")


async def _finish_all(url: str) -> dict[str, int]:
    """Another client's passes finish everything: no lease was left held, no Command left unsettled."""
    async with await fencekeeper.connect_async(url, policy=Recording(), handler=examples.handler()) as other:
        await other.run_until_idle(lease=5)
        states: dict[str, int] = {}
        for execution in await other.list():
            states[execution.state.value] = states.get(execution.state.value, 0) + 1
        return states


def test_a_cancelled_run_until_idle_stops_after_its_visit_and_hands_its_lease_back(url: str) -> None:
    """``asyncio.timeout`` around run_until_idle expires while a Command runs: the passes stop there.

    The CancelledError comes once the thread has stopped: the visit's result
    is committed, its lease handed back, and nothing else is claimed.
    """
    handler = Blocking()

    async def scenario() -> None:
        client = await fencekeeper.connect_async(url, policy=Recording(), handler=handler)
        await _admit_three(client)
        passes = asyncio.create_task(client.run_until_idle(lease=30))
        async with asyncio.timeout(30):
            assert await asyncio.to_thread(handler.entered.wait, 30)
            passes.cancel()
            # The thread is inside the handler: the cancellation waits for it.
            done, _ = await asyncio.wait([passes], timeout=0.2)
            assert not done
            handler.release.set()
            with pytest.raises(asyncio.CancelledError):
                await passes
            states = {x.execution_id: x.state for x in await client.list()}
        assert handler.calls == 1
        assert fencekeeper.ExecutionState.RUNNING not in states.values(), states
        await client.close()

    asyncio.run(scenario())
    assert asyncio.run(_finish_all(url)) == {"succeeded": 3}


def test_close_during_run_until_idle_waits_for_its_visit(url: str) -> None:
    """close() asks the passes to stop and waits for the visit, instead of closing the store under it."""
    handler = Blocking()

    async def scenario() -> fencekeeper.PassReport:
        client = await fencekeeper.connect_async(url, policy=Recording(), handler=handler)
        await _admit_three(client)
        passes = asyncio.create_task(client.run_until_idle(lease=30))
        async with asyncio.timeout(30):
            assert await asyncio.to_thread(handler.entered.wait, 30)
            closing = asyncio.create_task(client.close())
            done, _ = await asyncio.wait([closing], timeout=0.2)
            assert not done
            # While close() waits, nothing new starts on the store it is about to close.
            with pytest.raises(fencekeeper.StoreFailure) as refused:
                await client.run_until_idle(lease=30)
            assert refused.value.code is fencekeeper.StoreCode.STORE_UNAVAILABLE
            handler.release.set()
            await closing
            return await passes

    report = asyncio.run(scenario())
    assert handler.calls == 1 and len(report.claimed) == 1
    assert asyncio.run(_finish_all(url)) == {"succeeded": 3}


def test_close_with_a_pool_still_running_stops_it_after_its_visit(url: str) -> None:
    """A pool of start_workers left running at close(): it is stopped as pool.stop() stops it, not closed under."""
    handler = Blocking()

    async def scenario() -> fencekeeper.WorkerPool:
        client = await fencekeeper.connect_async(url, policy=Recording(), handler=handler)
        await _admit_three(client)
        pool = client.start_workers(1, lease=30, poll=0.05)
        async with asyncio.timeout(30):
            assert await asyncio.to_thread(handler.entered.wait, 30)
            closing = asyncio.create_task(client.close())
            done, _ = await asyncio.wait([closing], timeout=0.2)
            assert not done
            handler.release.set()
            await closing
        return pool

    pool = asyncio.run(scenario())
    assert not pool.running and pool.errors == [] and not pool.report.refused
    assert handler.calls == 1
    assert asyncio.run(_finish_all(url)) == {"succeeded": 3}


def test_a_second_cancellation_does_not_wait_but_close_still_does(url: str) -> None:
    """A Command that never returns must not hold the task: cancelled again, it goes; close() still waits."""
    handler = Blocking()

    async def scenario() -> None:
        client = await fencekeeper.connect_async(url, policy=Recording(), handler=handler)
        await _admit_three(client)
        passes = asyncio.create_task(client.run_until_idle(lease=30))
        async with asyncio.timeout(30):
            assert await asyncio.to_thread(handler.entered.wait, 30)
            passes.cancel()
            done, _ = await asyncio.wait([passes], timeout=0.2)
            assert not done
            passes.cancel()
            with pytest.raises(asyncio.CancelledError):
                await passes
            # The thread is still inside the handler: close() waits for it, and its lease is handed back.
            closing = asyncio.create_task(client.close())
            done, _ = await asyncio.wait([closing], timeout=0.2)
            assert not done
            handler.release.set()
            await closing
        assert handler.calls == 1

    asyncio.run(scenario())
    assert asyncio.run(_finish_all(url)) == {"succeeded": 3}


# --- context variables ----------------------------------------------------------------------------

REQUEST: contextvars.ContextVar[str | None] = contextvars.ContextVar("request", default=None)
SET_INSIDE: contextvars.ContextVar[str | None] = contextvars.ContextVar("set_inside", default=None)


class ReadsTheRequest(Recording):
    """A policy that reads the caller's context (a request's identity), as an asyncio service's often does."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[str, str | None]] = []

    def check(self, principal_id: str, business_id: str, operation: str, targets: Sequence[tuple[str, int]] = ()) -> p.Authority:
        self.requests.append((operation, REQUEST.get()))
        SET_INSIDE.set(operation)  # stays inside the call, as in a thread
        return super().check(principal_id, business_id, operation, targets)


def test_the_policy_sees_the_caller_s_context_variables(url: str) -> None:
    """On both paths: a copy of the awaiting task's context, as asyncio.to_thread gives a thread."""
    policy = ReadsTheRequest()

    async def scenario() -> None:
        async with await fencekeeper.connect_async(url, policy=policy, handler=None) as client:
            REQUEST.set("req-1")
            started = await client.run(PURCHASE, {"amount": 5, "order_id": "o-1", "order_revision": 1})
            REQUEST.set("req-2")
            await client.cancel(started.execution_id, reason="not needed")
            assert SET_INSIDE.get() is None

    asyncio.run(scenario())
    assert {request for _, request in policy.requests} == {"req-1", "req-2"}, policy.requests
    assert ("workflow_cancel", "req-2") in policy.requests


def test_a_close_that_is_cancelled_while_it_waits_still_closes(url: str) -> None:
    """close() cancelled (a TaskGroup's sibling failed) while it waits for a visit: the stores are closed all the same."""
    handler = Blocking()

    async def scenario() -> fencekeeper.AsyncClient:
        client = await fencekeeper.connect_async(url, policy=Recording(), handler=handler)
        closed = threading.Event()
        close_sync = client.sync.close

        def closing_sync() -> None:
            close_sync()
            closed.set()

        client.sync.close = closing_sync  # type: ignore[method-assign]
        await _admit_three(client)
        passes = asyncio.create_task(client.run_until_idle(lease=30))
        async with asyncio.timeout(30):
            assert await asyncio.to_thread(handler.entered.wait, 30)
            closing = asyncio.create_task(client.close())
            done, _ = await asyncio.wait([closing], timeout=0.2)
            assert not done
            closing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await closing
            handler.release.set()
            await passes
            # The close goes on by itself, with no second close() to finish it.
            assert await asyncio.to_thread(closed.wait, 10)
        return client

    client = asyncio.run(scenario())
    assert client.sync._closed and (client._workers is None or client._workers._closed)
    assert asyncio.run(_finish_all(url)) == {"succeeded": 3}
