"""Pruning: windows per kind, nothing unended, identities for their whole window, batched, resumable; and
nothing but pruning can delete (the triggers), on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from fencekeeper.adapters.operations.base import TransactionalOperationStore
from fencekeeper.adapters.operations.sql import SqlTx
from fencekeeper.adapters.operations.sqlite import SQLiteOperationStore
from fencekeeper.adapters.outbox import OutboxExporter
from fencekeeper.adapters.retention import PruneReport, RetentionWindows, prune
from fencekeeper.adapters.store import ManualClock, StoreError
from fencekeeper.adapters.testing.operations_suite import ALICE, LEASE, TENANT, World
from tests.outbox.conftest import rows
from tests.outbox.test_exporter import Recording, make_operations

WINDOWS = RetentionWindows(
    operations=timedelta(days=3), results=timedelta(hours=1), identities=timedelta(0),
    history=timedelta(hours=2), outbox=timedelta(hours=1),
)  # fmt: skip


def removed(report: PruneReport) -> tuple[int, ...]:
    return (report.results_expired, report.identities, report.transitions, report.attempts, report.operations,
            report.outbox)  # fmt: skip


def counts(store: TransactionalOperationStore, op_id: str) -> tuple[object, ...]:
    return (
        rows(store, "SELECT count(*) FROM operations WHERE operation_id = ?", (op_id,))[0][0],
        rows(store, "SELECT count(*) FROM operation_identities WHERE operation_id = ?", (op_id,))[0][0],
        rows(store, "SELECT count(*) FROM operation_attempts WHERE operation_id = ?", (op_id,))[0][0],
        rows(store, "SELECT count(*) FROM operation_transitions WHERE operation_id = ?", (op_id,))[0][0],
    )


def test_each_kind_goes_after_its_own_window_and_unended_work_stays(
    world: World, store: TransactionalOperationStore, clock: ManualClock
) -> None:
    [ended] = make_operations(world, 1)
    waiting = world.transfer("k-waiting", 1)  # admitted, never claimed
    running = world.transfer("k-running", 1)
    assert store.claim_next(TENANT, "w-2", LEASE) is not None  # claims one of them; both stay unended
    OutboxExporter(store, Recording()).run(until_idle=True)
    [(exported,)] = rows(store, "SELECT count(*) FROM outbox WHERE exported_at IS NOT NULL")
    unended = {waiting: counts(store, waiting), running: counts(store, running)}

    clock.advance(timedelta(minutes=30))
    assert removed(prune(store, WINDOWS)) == (0, 0, 0, 0, 0, 0), "everything is inside its window"

    clock.advance(timedelta(minutes=45))
    report = prune(store, WINDOWS)
    # SQLite keeps its newest outbox row, so that the next message's seq is past every one delivered.
    kept = 1 if isinstance(store, SQLiteOperationStore) else 0
    assert (report.results_expired, report.outbox, report.transitions) == (1, exported - kept, 0)
    [(result, expired)] = rows(store, "SELECT result, result_expired_at FROM operations WHERE operation_id = ?", (ended,))
    assert result is None and expired is not None
    assert counts(store, ended) == (1, 1, 1, 3), "the result body goes first; metadata and history stay"
    assert world.service.get(ended) is not None

    clock.advance(timedelta(hours=1))
    assert prune(store, WINDOWS).transitions == 3
    assert counts(store, ended) == (1, 1, 1, 0)

    clock.advance(timedelta(days=2))  # past the identity's own window (a day), inside the operations window
    report = prune(store, WINDOWS)
    assert (report.identities, report.operations) == (1, 0)
    assert counts(store, ended) == (1, 0, 1, 0)

    clock.advance(timedelta(days=1))
    report = prune(store, WINDOWS)
    assert (report.operations, report.attempts) == (1, 1)
    assert counts(store, ended) == (0, 0, 0, 0)
    assert {op: counts(store, op) for op in unended} == unended, "unended work is never touched"
    assert rows(store, "SELECT count(*) FROM outbox WHERE exported_at IS NULL") == [(0,)]


def test_an_identity_is_kept_for_its_whole_promised_window(
    world: World, store: TransactionalOperationStore, clock: ManualClock
) -> None:
    [op] = make_operations(world, 1)
    short = RetentionWindows(operations=timedelta(0), results=timedelta(0), history=timedelta(0), outbox=timedelta(0))
    clock.advance(timedelta(hours=23))  # inside the submission's one-day window
    report = prune(store, short)
    assert (report.identities, report.operations) == (0, 0)
    assert counts(store, op)[:2] == (1, 1)
    # The same submission is still the same Operation.
    again = world.service.submit(tenant=TENANT, principal=ALICE, action="transfer",
                                 input={"from": "acc-1", "to": "acc-2", "amount": 1}, client_key="k0")  # fmt: skip
    assert again.operation_id == op and not again.created
    clock.advance(timedelta(hours=2))
    report = prune(store, short)
    assert (report.identities, report.operations) == (1, 1)


def test_batches_are_bounded_and_a_stopped_prune_resumes(
    world: World, store: TransactionalOperationStore, clock: ManualClock
) -> None:
    make_operations(world, 7)
    clock.advance(timedelta(days=40))
    first = prune(store, WINDOWS, batch_size=4, max_batches=1)
    assert not first.finished and first.batches == 1
    assert sum(removed(first)) == 4, "one full batch of result bodies"
    total = first
    for _ in range(20):
        report = prune(store, WINDOWS, batch_size=4, max_batches=2)
        total = total + report
        if report.finished:
            break
        assert 0 < sum(removed(report)) <= 2 * 4 + 4 * 2, "at most two batches (an Operation's own takes its attempts)"
    assert report.finished
    assert (total.results_expired, total.identities, total.operations, total.attempts) == (7, 7, 7, 7)
    assert rows(store, "SELECT count(*) FROM operations") == [(0,)]
    assert removed(prune(store, WINDOWS)) == (0, 0, 0, 0, 0, 0)


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
@pytest.mark.parametrize(("pause", "duty", "time_limit"), [(3600.0, 0.25, 30.0), (0.0, 1e-300, None)])
def test_a_rest_between_batches_stays_within_the_time_limit_and_what_sleep_takes(
    world: World,
    store: TransactionalOperationStore,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    *,
    pause: float,
    duty: float,
    time_limit: float | None,
) -> None:
    """A rest past time_limit only delayed the report (no batch starts after it); a tiny duty asked
    time.sleep for more than it takes, and the prune ended in an OverflowError after its first batch."""
    make_operations(world, 3)
    clock.advance(timedelta(days=40))
    rests: list[float] = []
    monkeypatch.setattr("fencekeeper.adapters.retention.time.sleep", rests.append)
    report = prune(store, WINDOWS, batch_size=1, pause=pause, duty=duty, time_limit=time_limit)
    assert rests, "full batches were followed by a rest"
    assert max(rests) <= (time_limit if time_limit is not None else 86_400 * 366 * 100)
    assert report.results_expired >= 1


def test_a_prune_that_removed_everything_within_its_batches_says_it_finished(
    world: World, store: TransactionalOperationStore, clock: ManualClock
) -> None:
    """max_batches spent by the batch that emptied the last kind with work: finished, not "run it again"."""
    make_operations(world, 1)
    clock.advance(timedelta(days=40))
    # One batch each: the result, the identity, the history, the Operation; the outbox was never exported.
    report = prune(store, WINDOWS, max_batches=4)
    assert removed(report)[:5] == (1, 1, 3, 1, 1)
    assert report.finished, "nothing is left to prune"
    assert removed(prune(store, WINDOWS)) == (0, 0, 0, 0, 0, 0)
    # And with work left after the budget, it still says so, and removes nothing past the budget.
    make_operations(world, 2)
    clock.advance(timedelta(days=40))
    stopped = prune(store, WINDOWS, max_batches=1)
    assert (stopped.finished, stopped.results_expired, stopped.identities) == (False, 2, 0)


def test_windows_are_checked() -> None:
    with pytest.raises(StoreError, match=r"results: .* longer than operations"):
        RetentionWindows(operations=timedelta(days=1), results=timedelta(days=2))
    with pytest.raises(StoreError, match="outbox: must be a duration"):
        RetentionWindows(outbox=timedelta(seconds=-1))


HISTORY = ("operations", "operation_identities", "operation_attempts", "operation_transitions", "outbox")


def test_nothing_but_pruning_deletes_history(world: World, store: TransactionalOperationStore, clock: ManualClock) -> None:
    make_operations(world, 1)
    OutboxExporter(store, Recording()).run(until_idle=True)
    before = {table: rows(store, f"SELECT count(*) FROM {table}") for table in HISTORY}
    for table in HISTORY:
        with pytest.raises(Exception, match=r"pruning|append-only"):
            rows(store, f"DELETE FROM {table}")
    assert {table: rows(store, f"SELECT count(*) FROM {table}") for table in HISTORY} == before
    with pytest.raises(Exception, match="append-only"):
        rows(store, "UPDATE operation_transitions SET reason = 'rewritten'")


def test_even_in_pruning_mode_unended_work_and_unexported_rows_cannot_be_deleted(
    world: World, store: TransactionalOperationStore
) -> None:
    op = world.transfer("k1", 1)  # admitted: not ended, outbox row not exported
    for sql in (
        "DELETE FROM operation_transitions WHERE operation_id = ?",
        "DELETE FROM operation_identities WHERE operation_id = ?",
        "DELETE FROM outbox WHERE subject_id = ?",
        "DELETE FROM operations WHERE operation_id = ?",
    ):
        with pytest.raises(Exception, match=r"pruning|pruned|ended|exported"), store._transaction() as tx:
            assert isinstance(tx, SqlTx)
            tx.enter_pruning()
            tx.run(sql, (op,))
    assert counts(store, op) == (1, 1, 0, 1)
    assert rows(store, "SELECT count(*) FROM outbox WHERE subject_id = ?", (op,)) == [(1,)]


@pytest.mark.parametrize("store", ["postgresql"], indirect=True)
@pytest.mark.parametrize("entry", ["prune", "prune_identities"])
def test_an_identity_moved_to_a_new_operation_while_a_prune_waits_for_it_is_kept(
    world: World, store: TransactionalOperationStore, clock: ManualClock, *, pg_dsn: str, pg_schema: str, entry: str
) -> None:
    import psycopg  # noqa: PLC0415 - PostgreSQL only

    [ended] = make_operations(world, 1)
    fresh = world.transfer("k-fresh", 1)  # not ended
    clock.advance(timedelta(days=2))  # past the ended one's promised window: its identity may go, or move
    key = rows(store, "SELECT client_key FROM operation_identities WHERE operation_id = ?", (ended,))[0][0]
    outcome: dict[str, object] = {}

    def pruning() -> None:
        try:
            if entry == "prune":
                outcome["report"] = prune(store, RetentionWindows(identities=timedelta(0)))
            else:
                outcome["report"] = store.prune_identities()
        except Exception as exc:
            outcome["error"] = exc

    # A resubmission after the window moves the identity to a new Operation, as the store's write does,
    # and commits while the prune's DELETE waits for that row.
    with psycopg.connect(pg_dsn, options=f"-c search_path={pg_schema}") as conn:
        conn.execute(
            "UPDATE operation_identities SET operation_id = %s, retain_until = %s WHERE client_key = %s",
            (fresh, clock.now() + timedelta(days=1), key),
        )
        thread = threading.Thread(target=pruning)
        thread.start()
        with psycopg.connect(pg_dsn, autocommit=True) as watch:
            deadline = time.monotonic() + 20
            waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'DELETE %'"
            while time.monotonic() < deadline and watch.execute(waiting).fetchone() != (1,):
                time.sleep(0.02)
        conn.commit()
    thread.join(timeout=30)
    assert "error" not in outcome, outcome.get("error")
    assert rows(store, "SELECT operation_id FROM operation_identities WHERE client_key = ?", (key,)) == [(fresh,)]


@pytest.mark.parametrize("store", ["postgresql"], indirect=True)
def test_a_result_another_prune_expired_while_this_one_waited_is_not_expired_again(
    world: World, store: TransactionalOperationStore, clock: ManualClock, *, pg_dsn: str, pg_schema: str
) -> None:
    """Two prunes at once pick the same results; the one that waited must not expire them a second time.

    PostgreSQL rechecks only the UPDATE's own conditions on a row another
    transaction changed while it waited.  Without ``result IS NOT NULL``
    among them, the second prune set ``result_expired_at`` again, to its
    own later time, and counted the results as expired by it too (two
    prunes over 1,500 Operations reported 2,050 results expired).
    """
    import psycopg  # noqa: PLC0415 - PostgreSQL only

    ended = make_operations(world, 3)
    clock.advance(timedelta(hours=2))
    first = clock.now() - timedelta(minutes=1)  # when the other prune expired them: earlier than this one's time
    outcome: dict[str, object] = {}

    def pruning() -> None:
        try:
            outcome["report"] = prune(store, RetentionWindows(results=timedelta(0)))
        except Exception as exc:
            outcome["error"] = exc

    with psycopg.connect(pg_dsn, options=f"-c search_path={pg_schema}") as conn:
        conn.execute("UPDATE operations SET result = NULL, result_expired_at = %s WHERE outcome IS NOT NULL", (first,))
        thread = threading.Thread(target=pruning)
        thread.start()
        with psycopg.connect(pg_dsn, autocommit=True) as watch:
            deadline = time.monotonic() + 20
            waiting = (
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE 'UPDATE operations SET result = NULL%'"
            )
            while time.monotonic() < deadline and watch.execute(waiting).fetchone() != (1,):
                time.sleep(0.02)
        conn.commit()
    thread.join(timeout=30)
    assert "error" not in outcome, outcome.get("error")
    report = outcome["report"]
    assert isinstance(report, PruneReport)
    assert report.results_expired == 0, "expired by the other prune, not by this one"
    expired = rows(store, "SELECT operation_id, result_expired_at FROM operations WHERE outcome IS NOT NULL")
    assert {str(op) for op, _ in expired} == set(ended)
    assert {at for _, at in expired} == {first}, "the time the result expired is kept"


def test_a_message_after_a_prune_takes_a_seq_past_every_one_delivered(
    world: World, store: TransactionalOperationStore, clock: ManualClock
) -> None:
    """seq only grows, pruning or not: a consumer keeping each subject's last seq never reads a new message as old.

    SQLite numbers a new row one past the largest seq the table holds; when a
    prune removed every exported row, the next message took seq 1 again, and
    a subject's next message came with a smaller seq than its last one.
    """
    [op] = make_operations(world, 1)
    sink = Recording()
    OutboxExporter(store, sink).run(until_idle=True)
    delivered = max(m.seq for m in sink.sent)
    clock.advance(timedelta(hours=2))
    prune(store, RetentionWindows(outbox=timedelta(0), history=timedelta(days=1), results=timedelta(days=1)))
    assert rows(store, "SELECT count(*) FROM outbox WHERE exported_at IS NULL") == [(0,)]
    world.transfer("k-next", 1)
    later = Recording()
    OutboxExporter(store, later).run(until_idle=True)
    assert later.sent and min(m.seq for m in later.sent) > delivered
    assert op not in {m.subject_id for m in later.sent}


def test_a_message_after_a_prune_is_never_taken_for_one_already_delivered(
    world: World, store: TransactionalOperationStore, clock: ManualClock
) -> None:
    # A consumer deduplicates on message_id and may keep the last seq it saw: a pruned row's seq or id given
    # to a new message would read as a redelivery, or as older than what it has, and be dropped.
    make_operations(world, 3)
    sink = Recording()
    OutboxExporter(store, sink).run(until_idle=True)
    delivered = {m.message_id for m in sink.sent}
    last_seq = max(m.seq for m in sink.sent)
    clock.advance(timedelta(days=40))
    everything = RetentionWindows(
        operations=timedelta(0), results=timedelta(0), identities=timedelta(0), history=timedelta(0),
        outbox=timedelta(0),
    )  # fmt: skip
    while not prune(store, everything).finished:
        pass
    assert rows(store, "SELECT count(*) FROM outbox WHERE seq < ?", (last_seq,)) == [(0,)], "the delivered rows went"
    # The same client keys again: their identities were pruned, so these are new Operations.
    new = make_operations(world, 3)
    sink.sent.clear()
    OutboxExporter(store, sink).run(until_idle=True)
    assert {m.subject_id for m in sink.sent} == set(new)
    assert min(m.seq for m in sink.sent) > last_seq, "seq only grows, pruning or not"
    assert not delivered & {m.message_id for m in sink.sent}, "no new message carries a delivered one's id"
    assert len({m.message_id for m in sink.sent}) == len(sink.sent), "each delivered once"
