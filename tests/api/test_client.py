"""The Python front door: ``fencekeeper.connect`` and the client it returns.

What is proved here: a workflow runs end to end through the client alone
(definitions from a file, TOML and JSON text and a mapping; approvals;
Events; cancellation; quarantine, settlement, resume and fail); every kernel
refusal raises ``Refused`` with the kernel's code, or comes back as the
kernel's value with ``raise_on_refusal=False``, and leaves the database
byte-for-byte as it was; bad input raises ``RequestError`` naming the
parameter and writes nothing; authority and the handler are the ones plugged
in, and nothing else is asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import subprocess
import sys
import threading
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest

import fencekeeper
from fencekeeper import ExecutionState, RefusalCode, RequestCode
from fencekeeper.adapters import examples, service
from fencekeeper.adapters.client import Client, DecisionStatus
from fencekeeper.adapters.ports import WORKFLOW_RUN, GrantTable
from fencekeeper.adapters.postgres_store import PostgresStore
from fencekeeper.adapters.store import ExecutionView, ManualClock
from fencekeeper.kernel import protocol as p

WORKFLOWS = Path(__file__).resolve().parents[2] / "adapters" / "workflows"
PURCHASE = WORKFLOWS / "purchase_approval.toml"
REFUND = WORKFLOWS / "refund_needs_reconciliation.toml"
PAYMENT = WORKFLOWS / "payment_with_timeout.toml"
ORDER = {"amount": 2500, "order_id": "o-1", "order_revision": 1}


def dump(path: Path) -> list[str]:
    """Every row of the database, as SQL: equal dumps mean nothing was written."""
    with sqlite3.connect(path) as conn:
        return list(conn.iterdump())


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "shop.db"


@pytest.fixture
def client(db: Path) -> Iterator[Client]:
    policy = examples.grants("default", "user:operator", "user:manager", "user:cfo")
    with fencekeeper.connect(str(db), policy=policy, handler=examples.handler()) as opened:
        yield opened


# --- the surface ------------------------------------------------------------------------


def test_version_and_every_public_name() -> None:
    import importlib.metadata  # noqa: PLC0415

    assert fencekeeper.__version__ == importlib.metadata.version("fencekeeper")
    for name in fencekeeper.__all__:
        value = getattr(fencekeeper, name)
        if name != "__version__" and not isinstance(value, type(ExecutionState | None)):
            assert (getattr(value, "__doc__", None) or "").strip(), f"fencekeeper.{name} has no docstring"
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = fencekeeper.nothing_here  # type: ignore[attr-defined]


def test_the_kernel_is_reached_from_a_bare_import_and_loads_alone() -> None:
    """docs/python.md names ``fencekeeper.kernel``: it is there after ``import fencekeeper``, without the adapters."""
    script = (
        "import sys, fencekeeper\n"
        "assert fencekeeper.kernel.protocol.RefusalCode.NOT_AUTHORIZED.value == 'not_authorized'\n"
        "assert 'fencekeeper.adapters' not in sys.modules\n"
        "assert fencekeeper.adapters.__name__ == 'fencekeeper.adapters'\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


def test_policy_and_handler_must_be_given(db: Path) -> None:
    with pytest.raises(TypeError, match="policy"):
        fencekeeper.connect(str(db), handler=None)  # type: ignore[call-arg]
    with pytest.raises(fencekeeper.RequestError) as caught:
        fencekeeper.connect(str(db), policy=object(), handler=None)  # type: ignore[arg-type]
    assert caught.value.field == "policy"
    assert not db.exists()  # refused before the store was opened
    with pytest.raises(fencekeeper.RequestError) as caught:
        fencekeeper.connect(str(db), policy=examples.grants("default"), handler=object())  # type: ignore[arg-type]
    assert (caught.value.code, caught.value.field) == (RequestCode.INVALID_ARGUMENT, "handler")
    assert not db.exists()
    with pytest.raises(fencekeeper.RequestError) as caught:
        asyncio.run(fencekeeper.connect_async(str(db), policy=examples.grants("default"), handler=object()))  # type: ignore[arg-type]
    assert caught.value.field == "handler"
    assert not db.exists()


@pytest.mark.parametrize(
    "clock",
    [
        "now",
        ManualClock(datetime(2026, 1, 1)),  # naive
        ManualClock(datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=2)))),
    ],
    ids=["not-a-clock", "naive", "not-utc"],
)
def test_a_clock_that_is_not_an_aware_utc_clock_is_refused_before_anything_is_opened(db: Path, clock: object) -> None:
    for url in (str(db), ":memory:"):
        with pytest.raises(fencekeeper.RequestError) as caught:
            fencekeeper.connect(url, policy=examples.grants("default"), handler=None, clock=clock)  # type: ignore[arg-type]
        assert (caught.value.code, caught.value.field) == (RequestCode.INVALID_ARGUMENT, "clock")
    assert not db.exists()


@pytest.mark.parametrize(
    ("url", "schema", "field"),
    [
        ("", None, "url"),
        ("mysql://db/x", None, "url"),
        ("sqlite:///", None, "url"),
        ("postgresql://[bad", None, "url"),
        ("postgresql://postgres@127.0.0.1:1/test?schema=a&schema=b", None, "url"),
        ("postgresql://postgres@127.0.0.1:1/test?schema=Not-A-Schema", None, "url"),
        ("postgresql://postgres@127.0.0.1:1/test?schema=a", "b", "schema"),
        ("postgresql://postgres@127.0.0.1:1/test", "Not-A-Schema", "schema"),
        ("shop.db", "s1", "schema"),
    ],
)
def test_a_url_or_schema_that_names_no_store_is_a_request_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, schema: str | None, field: str
) -> None:
    # Port 1 answers nothing: these must be refused before any connection is tried, as what was typed.
    monkeypatch.chdir(tmp_path)
    policy = examples.grants("default")
    with pytest.raises(fencekeeper.RequestError) as caught:
        fencekeeper.connect(url, policy=policy, handler=None, schema=schema)
    assert (caught.value.code, caught.value.field) == (RequestCode.INVALID_ARGUMENT, field)
    assert "--db" not in str(caught.value) and "--schema" not in str(caught.value)
    with pytest.raises(fencekeeper.RequestError) as caught:
        asyncio.run(fencekeeper.connect_async(url, policy=policy, handler=None, schema=schema))
    assert (caught.value.code, caught.value.field) == (RequestCode.INVALID_ARGUMENT, field)
    assert list(tmp_path.iterdir()) == []


def test_a_sqlite_path_may_be_a_path_object(tmp_path: Path) -> None:
    # Refused before as "must be a string", though a pathlib.Path is how Python code holds a file's name.
    policy = examples.grants("default", "user:operator")
    with fencekeeper.connect(tmp_path / "shop.db", policy=policy, handler=None) as client:
        client.run(PURCHASE, ORDER, execution_id="po-1")

    async def awaited() -> ExecutionState:
        async with await fencekeeper.connect_async(tmp_path / "shop.db", policy=policy, handler=None) as aclient:
            return (await aclient.get("po-1")).state

    assert asyncio.run(awaited()) is ExecutionState.ELIGIBLE
    with pytest.raises(fencekeeper.RequestError) as caught:
        fencekeeper.connect(b"shop.db", policy=policy, handler=None)  # type: ignore[arg-type]
    assert caught.value.field == "url"


@pytest.mark.parametrize("url", ["shop.db", ":memory:"])
def test_every_call_after_close_is_a_store_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.chdir(tmp_path)
    client = fencekeeper.connect(url, policy=examples.grants("default", "user:operator"), handler=examples.handler())
    client.run(PURCHASE, ORDER, execution_id="po-1")
    client.close()
    client.close()  # a second close does nothing
    calls = {
        "get": lambda: client.get("po-1"),
        "list": client.list,
        "run": lambda: client.run(PURCHASE, ORDER),
        "run_until_idle": client.run_until_idle,
        "start_workers": lambda: client.start_workers(1),
    }
    for name, call in calls.items():
        with pytest.raises(fencekeeper.StoreFailure) as caught:
            call()
        assert caught.value.code is fencekeeper.StoreCode.STORE_UNAVAILABLE, name
        assert "closed" in str(caught.value), name


@pytest.mark.parametrize("pool_size", [0, -1, "4", True])
def test_a_bad_pool_size_is_a_request_error_not_an_unavailable_store(pg_dsn: str, pool_size: object) -> None:
    policy = examples.grants("default", "user:operator")
    with pytest.raises(fencekeeper.RequestError) as caught:
        fencekeeper.connect(pg_dsn, policy=policy, handler=None, pool_size=pool_size)  # type: ignore[arg-type]
    assert (caught.value.code, caught.value.field) == (RequestCode.INVALID_ARGUMENT, "pool_size")
    with pytest.raises(fencekeeper.RequestError) as caught:
        asyncio.run(fencekeeper.connect_async(pg_dsn, policy=policy, handler=None, pool_size=pool_size))  # type: ignore[arg-type]
    assert caught.value.field == "pool_size"


def test_a_schema_to_migrate_says_how_to_from_python(pg_dsn: str, pg_schema: str) -> None:
    # The store words it for the command line; a Python caller is told of migrate=True as well.
    policy = examples.grants("default", "user:operator")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DELETE FROM {pg_schema}.schema_migrations WHERE version > 1")  # type: ignore[arg-type]
    for schema, code in (("fk_never_migrated", "schema_missing"), (pg_schema, "schema_outdated")):
        with pytest.raises(fencekeeper.StoreFailure) as caught:
            fencekeeper.connect(pg_dsn, policy=policy, handler=None, schema=schema)
        assert caught.value.code.value == code
        assert str(caught.value).count("migrate=True") == 1, str(caught.value)
        assert "fencekeeper migrate" in str(caught.value)
        with pytest.raises(fencekeeper.StoreFailure) as caught:
            asyncio.run(fencekeeper.connect_async(pg_dsn, policy=policy, handler=None, schema=schema))
        assert "migrate=True" in str(caught.value), str(caught.value)


@pytest.mark.parametrize("migrate", ["yes", "no", 1, 0, None])
def test_a_migrate_that_is_not_a_bool_is_a_request_error_before_anything_is_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg_dsn: str, migrate: object
) -> None:
    monkeypatch.chdir(tmp_path)
    policy = examples.grants("default", "user:operator")
    schema = f"fk_migrate_{uuid.uuid4().hex[:12]}"
    try:
        for url, named in (("shop.db", None), (pg_dsn, schema)):
            with pytest.raises(fencekeeper.RequestError) as caught:
                fencekeeper.connect(url, policy=policy, handler=None, schema=named, migrate=migrate)  # type: ignore[arg-type]
            assert (caught.value.code, caught.value.field) == (RequestCode.INVALID_ARGUMENT, "migrate")
            opening = fencekeeper.connect_async(url, policy=policy, handler=None, schema=named, migrate=migrate)  # type: ignore[arg-type]
            with pytest.raises(fencekeeper.RequestError) as caught:
                asyncio.run(opening)
            assert caught.value.field == "migrate"
        assert list(tmp_path.iterdir()) == []
        with psycopg.connect(pg_dsn) as conn:
            found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
        assert found is None
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]


# --- running a workflow -----------------------------------------------------------------


def test_purchase_approval_end_to_end(client: Client) -> None:
    admitted = client.run(PURCHASE, ORDER, execution_id="po-1")
    assert (admitted.state, admitted.current_node_id) == (ExecutionState.ELIGIBLE, "check_amount")
    report = client.run_until_idle(lease=5)
    assert report.claimed == ["po-1"] and report.finished["waiting"] == 1
    request = client.approval("po-1")
    assert request is not None and set(request.reviewers) == {"user:manager", "user:cfo"}
    decided = client.approve("po-1", reviewer="user:manager", decision_id="d-1")
    assert decided.status is DecisionStatus.ACCEPTED
    assert decided.execution is not None and decided.execution.current_node_id == "place_order"
    # The same decision again is a success that says so; a contradicting one is kept, without effect.
    assert client.approve("po-1", reviewer="user:manager", decision_id="d-1").status is DecisionStatus.ALREADY_DECIDED
    assert client.reject("po-1", reviewer="user:cfo").status is DecisionStatus.RECORDED_CONFLICTING
    client.run_until_idle(lease=5)
    assert client.get("po-1").state is ExecutionState.SUCCEEDED
    view = client.inspect("po-1")
    assert [r.to_state for r in view.history][-1] is ExecutionState.SUCCEEDED
    assert [x.execution_id for x in client.list(ExecutionState.SUCCEEDED)] == ["po-1"]
    assert client.list("waiting") == []


@pytest.mark.parametrize("form", ["path", "toml", "json", "mapping", "registered id"])
def test_every_definition_form(client: Client, form: str) -> None:
    text = PURCHASE.read_text(encoding="utf-8")
    mapping = tomllib.loads(text)
    source: fencekeeper.DefinitionSource = {
        "path": PURCHASE,
        "toml": text,
        "json": json.dumps(mapping),
        "mapping": mapping,
        "registered id": "purchase-approval",
    }[form]
    if form == "registered id":
        assert client.register(PURCHASE) == fencekeeper.Registered("purchase-approval", 1, True)
    execution = client.run(source, {**ORDER, "amount": 10})
    assert execution.definition_id == "purchase-approval"
    assert client.register(mapping).new is False  # the identical revision: idempotent


def test_an_event_wakes_its_waiter(client: Client) -> None:
    client.run(PAYMENT, {"order_id": "o-7", "amount": 40}, execution_id="pay-1")
    client.run_until_idle(lease=5)
    assert client.get("pay-1").state is ExecutionState.WAITING
    assert client.publish("payment.received", {"order_id": "o-8"}, {"paid": 40}).woken == ()
    published = client.publish("payment.received", {"order_id": "o-7"}, {"paid": 40}, event_id="ev-1")
    assert published.woken == ("pay-1",) and not published.duplicate
    again = client.publish("payment.received", {"order_id": "o-7"}, {"paid": 40}, event_id="ev-1")
    assert again.duplicate and again.woken == ()
    assert client.get("pay-1").state is ExecutionState.ELIGIBLE
    client.run_until_idle(lease=5)
    assert client.get("pay-1").state is ExecutionState.SUCCEEDED


def test_a_cancellation_reason_of_the_longest_length_is_kept(client: Client) -> None:
    client.run(PURCHASE, ORDER, execution_id="po-1")
    assert client.cancel("po-1", reason="é" * 2000).state is ExecutionState.CANCELLED


def test_cancel_and_its_refusal_as_a_value(client: Client, db: Path) -> None:
    client.run(PURCHASE, ORDER, execution_id="po-1")
    cancelled = client.cancel("po-1", reason="customer withdrew")
    assert cancelled.state is ExecutionState.CANCELLED
    before = dump(db)
    refusal = client.cancel("po-1", raise_on_refusal=False)
    assert isinstance(refusal, p.Refusal) and refusal.code is RefusalCode.ILLEGAL_TRANSITION
    with pytest.raises(fencekeeper.Refused) as caught:
        client.cancel("po-1")
    assert caught.value.code is RefusalCode.ILLEGAL_TRANSITION
    assert caught.value.refusal == refusal and caught.value.execution_id == "po-1"
    assert dump(db) == before


# --- refusals write nothing -------------------------------------------------------------


def test_a_reviewer_outside_the_scope_is_refused_and_nothing_changes(client: Client, db: Path) -> None:
    client.run(PURCHASE, ORDER, execution_id="po-1")
    client.run_until_idle(lease=5)
    before = dump(db)
    with pytest.raises(fencekeeper.Refused) as caught:
        client.approve("po-1")  # user:operator requested it, and is no reviewer
    assert caught.value.code is RefusalCode.NOT_AUTHORIZED
    assert isinstance(caught.value, fencekeeper.FencekeeperError)
    value = client.decide("po-1", "approved", raise_on_refusal=False)
    assert isinstance(value, p.Refusal) and value.code is RefusalCode.NOT_AUTHORIZED
    assert dump(db) == before


class Counting:
    """A deployment's policy, as docs/python.md shows one: grants, and a record of every question."""

    def __init__(self, grants: GrantTable) -> None:
        self.grants = grants
        self.asked: list[tuple[str, str, str]] = []

    def check(self, principal_id: str, business_id: str, operation: str, targets: Sequence[tuple[str, int]] = ()) -> p.Authority:
        self.asked.append((principal_id, business_id, operation))
        return self.grants.check(principal_id, business_id, operation, targets)


def test_the_plugged_in_policy_decides_and_a_denial_writes_nothing(db: Path) -> None:
    table = GrantTable()
    table.grant("user:clerk", "acme", "definition_register")
    policy = Counting(table)
    with fencekeeper.connect(str(db), policy=policy, handler=None, business="acme", principal="user:clerk") as client:
        before = dump(db)
        refusal = client.run(PURCHASE, ORDER, raise_on_refusal=False)
        assert isinstance(refusal, p.Refusal) and refusal.code is RefusalCode.NOT_AUTHORIZED
        # Admission would be refused, so the definition was not registered either.
        assert dump(db) == before
        assert ("user:clerk", "acme", WORKFLOW_RUN) in policy.asked
        table.grant("user:clerk", "acme", WORKFLOW_RUN)
        assert client.run(PURCHASE, ORDER).business_id == "acme"
        with pytest.raises(fencekeeper.RequestError) as caught:
            client.run_until_idle()
        assert caught.value.code is RequestCode.NO_HANDLER and caught.value.field == "handler"


class Broken:
    """A policy that answers a plain True, or raises, from the ``fails_from``-th question of ``operation`` on."""

    def __init__(self, operation: str, answer: str, fails_from: int = 1) -> None:
        self.grants = examples.grants("default", "user:operator", "user:manager", "user:cfo")
        self.operation, self.answer, self.fails_from, self.asked = operation, answer, fails_from, 0

    def check(self, principal_id: str, business_id: str, operation: str, targets: Sequence[tuple[str, int]] = ()) -> p.Authority:
        if operation == self.operation:
            self.asked += 1
            if self.asked >= self.fails_from:
                if self.answer == "raise":
                    raise RuntimeError("the directory is down")
                return True  # type: ignore[return-value]
        return self.grants.check(principal_id, business_id, operation, targets)


@pytest.mark.parametrize(
    ("operation", "call"),
    [
        (WORKFLOW_RUN, lambda client: client.run(PURCHASE, ORDER)),
        ("event_publish", lambda client: client.publish("payment.received", {"order_id": "o-1"})),
        ("workflow_cancel", lambda client: client.cancel("po-0")),
    ],
    ids=["run", "publish", "cancel"],
)
def test_a_policy_answering_something_but_an_authority_is_a_type_error_naming_it_and_writes_nothing(
    db: Path, operation: str, call: Callable[[Client], object]
) -> None:
    # It was an AttributeError ('bool' object has no attribute 'granted') from deep inside the request.
    with fencekeeper.connect(str(db), policy=Broken(operation, "true"), handler=None) as client:
        if operation != WORKFLOW_RUN:
            client.run(PURCHASE, ORDER, execution_id="po-0")
        before = dump(db)
        with pytest.raises(TypeError) as caught:
            call(client)
    assert str(caught.value) == f"Broken.check returned True (bool) for {operation!r}, not an Authority"
    assert dump(db) == before


def _stalled_on_dispatch(url: str, answer: str, fails_from: int) -> tuple[BaseException, ExecutionView]:
    policy = Broken("workflow_dispatch", answer, fails_from)
    with fencekeeper.connect(url, policy=policy, handler=examples.handler()) as client:
        client.run(PURCHASE, {**ORDER, "amount": 50}, execution_id="po-1")
        with pytest.raises(Exception) as caught:
            client.run_until_idle(lease=30)
        return caught.value, client.inspect("po-1")


@pytest.mark.parametrize("answer", ["true", "raise"])
@pytest.mark.parametrize(("fails_from", "node"), [(1, "check_amount"), (2, "place_order"), (3, "done")])
def test_a_policy_that_fails_mid_visit_leaves_the_execution_eligible_with_what_was_committed(
    db: Path, answer: str, fails_from: int, node: str
) -> None:
    # The worker raised with the lease still held, the execution running until the lease expired (and then
    # quarantined); a True answer was even a step refused in silence.  Planned inside the transaction of the
    # step before it, a failing visit also rolled that step back: place_order's Command result included.
    error, view = _stalled_on_dispatch(str(db), answer, fails_from)
    if answer == "true":
        assert isinstance(error, TypeError) and "Broken.check returned True (bool)" in str(error)
    else:
        assert isinstance(error, RuntimeError) and str(error) == "the directory is down"
    assert (view.execution.state, view.execution.current_node_id) == (ExecutionState.ELIGIBLE, node)
    assert view.dispatch.lease_token is None


def test_a_policy_that_fails_mid_visit_on_postgresql(pg_dsn: str, pg_schema: str) -> None:
    error, view = _stalled_on_dispatch(f"{pg_dsn}?schema={pg_schema}", "true", 3)
    assert isinstance(error, TypeError)
    assert (view.execution.state, view.execution.current_node_id) == (ExecutionState.ELIGIBLE, "done")
    assert view.dispatch.lease_token is None


# --- bad input names the field and writes nothing ----------------------------------------

BAD: list[tuple[str, dict[str, object], RequestCode, str]] = [
    ("run", {"definition": PURCHASE, "input": {"amount": "lots"}}, RequestCode.INVALID_INPUT, "input"),
    ("run", {"definition": PURCHASE, "input": [1]}, RequestCode.INVALID_ARGUMENT, "input"),
    ("run", {"definition": PURCHASE, "input": ORDER, "execution_id": "no spaces"}, RequestCode.INVALID_IDENTIFIER, "execution_id"),
    ("run", {"definition": "id = 'x'\nrevision = 1", "input": {}}, RequestCode.INVALID_DEFINITION, "definition"),
    ("run", {"definition": "missing.toml", "input": {}}, RequestCode.DEFINITION_NOT_FOUND, "definition"),
    ("run", {"definition": Path("/nonexistent/x.toml"), "input": {}}, RequestCode.INVALID_DEFINITION, "definition"),
    ("run", {"definition": 42, "input": {}}, RequestCode.INVALID_ARGUMENT, "definition"),
    ("run", {"definition": PURCHASE, "input": ORDER, "principal": ""}, RequestCode.INVALID_IDENTIFIER, "principal"),
    ("get", {"execution_id": "nobody"}, RequestCode.EXECUTION_NOT_FOUND, "execution_id"),
    ("cancel", {"execution_id": "nobody"}, RequestCode.EXECUTION_NOT_FOUND, "execution_id"),
    ("cancel", {"execution_id": "po-0", "reason": "a\ud800"}, RequestCode.INVALID_ARGUMENT, "reason"),
    ("cancel", {"execution_id": "po-0", "reason": "a\x00b"}, RequestCode.INVALID_ARGUMENT, "reason"),
    # As long as a review decision's rationale may be (kernel.recovery.MAX_RATIONALE), and no longer.
    ("cancel", {"execution_id": "po-0", "reason": "é" * 2001}, RequestCode.INVALID_ARGUMENT, "reason"),
    # Every reason a person gives is bounded alike, and refused as the caller's argument whatever state the
    # execution is in (po-0 has no approval request and is not in review).
    ("decide", {"execution_id": "po-0", "determination": "approved", "rationale": "é" * 2001}, RequestCode.INVALID_ARGUMENT, "rationale"),
    ("decide", {"execution_id": "po-0", "determination": "approved", "rationale": "a\x00b"}, RequestCode.INVALID_ARGUMENT, "rationale"),
    ("fail", {"execution_id": "po-0", "rationale": "é" * 2001}, RequestCode.INVALID_ARGUMENT, "rationale"),
    ("resume", {"execution_id": "po-0", "at_node": "check_amount", "rationale": "é" * 2001}, RequestCode.INVALID_ARGUMENT, "rationale"),
    ("wait", {"execution_id": "po-0", "timeout": float("nan")}, RequestCode.INVALID_ARGUMENT, "timeout"),
    ("wait", {"execution_id": "po-0", "poll": float("nan")}, RequestCode.INVALID_ARGUMENT, "poll"),
    ("publish", {"event_type": "payment.settled", "correlation": "pay-1"}, RequestCode.INVALID_ARGUMENT, "correlation"),
    # An Event's refusal names the parameter at fault, not the Event as a whole.
    ("publish", {"event_type": "", "correlation": {"a": "b"}}, RequestCode.INVALID_EVENT, "event_type"),
    # Every waiter declares at least one predicate (seed 000, Node Semantics, wait_for_event): this matches nobody.
    ("publish", {"event_type": "payment.received", "correlation": {}}, RequestCode.INVALID_EVENT, "correlation"),
    ("publish", {"event_type": "paid", "correlation": {"a": "b"}, "payload": {"x": float("nan")}}, RequestCode.INVALID_EVENT, "payload"),
    ("publish", {"event_type": "paid", "correlation": {"a": "b"}, "payload": {"at": timedelta(1)}}, RequestCode.INVALID_EVENT, "payload"),
    ("publish", {"event_type": "paid", "correlation": {"a": "b"}, "payload": {1: "one"}}, RequestCode.INVALID_EVENT, "payload"),
    ("publish", {"event_type": "paid", "correlation": {"a": "b"}, "payload": {"blob": "x" * 65_536}}, RequestCode.INVALID_EVENT, "payload"),
    ("list", {"state": "sleeping"}, RequestCode.INVALID_ARGUMENT, "state"),
    ("start_workers", {"concurrency": 0}, RequestCode.WORKER_SETTING, "concurrency"),
    ("run_until_idle", {"lease": 0.1}, RequestCode.WORKER_SETTING, "lease"),
    ("run_until_idle", {"lease": float("nan")}, RequestCode.WORKER_SETTING, "lease"),
    ("run_until_idle", {"lease": float("inf")}, RequestCode.WORKER_SETTING, "lease"),
    ("start_workers", {"lease": 1e300}, RequestCode.WORKER_SETTING, "lease"),
    # Long enough that every claim's expiry is past the last datetime: the worker claimed nothing, silently.
    ("run_until_idle", {"lease": 10**12}, RequestCode.WORKER_SETTING, "lease"),
    ("start_workers", {"lease": timedelta(days=366)}, RequestCode.WORKER_SETTING, "lease"),
]


@pytest.mark.parametrize(
    ("method", "arguments", "expected"),
    [(m, a, (c, f)) for m, a, c, f in BAD],
    ids=[f"{m}-{f}-{c.value}" for m, _, c, f in BAD],
)
def test_bad_input_names_the_field_and_writes_nothing(
    client: Client, db: Path, method: str, arguments: dict[str, object], expected: tuple[RequestCode, str]
) -> None:
    code, field = expected
    client.run(PURCHASE, ORDER, execution_id="po-0")
    before = dump(db)
    with pytest.raises(fencekeeper.RequestError) as caught:
        getattr(client, method)(**arguments)
    assert (caught.value.code, caught.value.field) == (code, field), caught.value
    assert str(caught.value).startswith(f"{field}: ")
    assert isinstance(caught.value, ValueError)
    assert dump(db) == before


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda store, policy: service.run(
            store, policy, business_id="default", principal_id="user:operator", definition_id="purchase-approval",
            input=ORDER, revision="1",
        ), "revision"),
        (lambda store, policy: service.run(
            store, policy, business_id="default", principal_id="user:operator", definition_id="purchase-approval",
            input=ORDER, revision=0,
        ), "revision"),
        (lambda store, policy: service.register(
            store, tomllib.loads(PURCHASE.read_text()), "default", "user:operator", policy
        ), "definition"),
    ],
    ids=["run-revision-text", "run-revision-zero", "register-mapping"],
)
def test_the_service_layer_names_a_bad_argument_and_writes_nothing(
    client: Client, db: Path, call: Callable[..., object], field: str
) -> None:
    # A TypeError from inside the store's definition lookup, and an AttributeError deep in registration.
    client.run(PURCHASE, ORDER, execution_id="po-0")
    before = dump(db)
    with pytest.raises(service.OperationError) as caught:
        call(client.store, client.policy)
    assert caught.value.code == "invalid_argument" and caught.value.message.startswith(f"{field}: ")
    assert dump(db) == before


def test_republishing_an_event_whose_payload_holds_a_tuple_is_a_duplicate(client: Client, db: Path) -> None:
    first = client.publish("payment.received", {"order_id": "o-1"}, {"lines": (1, 2)}, event_id="ev-1")
    assert not first.duplicate
    before = dump(db)
    again = client.publish("payment.received", {"order_id": "o-1"}, {"lines": (1, 2)}, event_id="ev-1")
    assert again.duplicate
    assert dump(db) == before


def test_decisions_check_their_arguments_first(client: Client, db: Path) -> None:
    client.run(PURCHASE, ORDER, execution_id="po-1")
    client.run_until_idle(lease=5)
    before = dump(db)
    with pytest.raises(fencekeeper.RequestError) as caught:
        client.decide("po-1", "maybe", reviewer="user:manager")  # type: ignore[arg-type]
    assert caught.value.field == "determination"
    with pytest.raises(fencekeeper.RequestError) as caught:
        client.decide("po-1", "approved", reviewer="user manager")
    assert caught.value.field == "reviewer"
    with pytest.raises(fencekeeper.RequestError) as caught:
        client.resume("po-1", at_node="place_order", rationale=" ")
    assert caught.value.field == "rationale"
    assert dump(db) == before


def test_an_id_already_taken_is_refused_before_anything_is_registered(client: Client, db: Path) -> None:
    client.run(PURCHASE, ORDER, execution_id="po-1")
    before = dump(db)
    changed = PURCHASE.read_text(encoding="utf-8").replace('id = "purchase-approval"', 'id = "other"')
    with pytest.raises(fencekeeper.Refused) as caught:
        client.run(changed, ORDER, execution_id="po-1")
    assert caught.value.code is RefusalCode.ALREADY_EXISTS
    assert dump(db) == before


def test_a_revision_registered_with_other_content_is_a_conflict(client: Client, db: Path) -> None:
    client.register(PURCHASE)
    before = dump(db)
    changed = PURCHASE.read_text(encoding="utf-8").replace("input.amount >= 1000", "input.amount >= 10")
    with pytest.raises(fencekeeper.RequestError) as caught:
        client.register(changed)
    assert (caught.value.code, caught.value.field) == (RequestCode.DEFINITION_CONFLICT, "definition")
    assert dump(db) == before


# --- recovery: quarantine, review, settle, resume, fail ----------------------------------


def test_settle_then_resume_is_two_decisions(client: Client) -> None:
    client.run(REFUND, {"amount": 5, "payment_id": "p-1"}, execution_id="rf-1")
    client.run_until_idle(lease=5)
    review = client.review("rf-1")
    assert review.execution.state is ExecutionState.RECONCILIATION_REQUIRED
    assert [c.operation for c in review.unresolved] == ["payment.refund"] and review.permitted == ()
    with pytest.raises(fencekeeper.Refused) as caught:
        client.resume("rf-1", at_node="refunded", rationale="the provider says so")
    assert caught.value.code is RefusalCode.UNSAFE_RESUME
    settled = client.settle("rf-1")
    assert settled.result is not None and settled.result.status is fencekeeper.CommandStatus.SUCCEEDED
    assert client.get("rf-1").state is ExecutionState.RECONCILIATION_REQUIRED  # settling does not resume
    assert client.review("rf-1").permitted == ("refunded",)
    resumed = client.resume("rf-1", at_node="refunded", rationale="the provider applied the refund")
    assert (resumed.state, resumed.current_node_id) == (ExecutionState.ELIGIBLE, "refunded")
    client.run_until_idle(lease=5)
    assert client.get("rf-1").state is ExecutionState.SUCCEEDED
    refused = client.settle("rf-1", raise_on_refusal=False)
    assert isinstance(refused, p.Refusal) and refused.code is RefusalCode.NOT_IN_RECONCILIATION


class Unanswering:
    """A handler whose execute either raises or answers something that is not a CommandResult."""

    def __init__(self, answer: object) -> None:
        self.answer = answer

    def execute(self, command: fencekeeper.Command) -> fencekeeper.CommandResult:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer  # type: ignore[return-value]

    def reconcile(self, command: fencekeeper.Command) -> fencekeeper.CommandResult:
        return self.answer  # type: ignore[return-value]


@pytest.mark.parametrize("answer", [RuntimeError("order service down"), "done", None], ids=["raises", "str", "none"])
def test_a_handler_answer_that_is_no_command_result_leaves_the_command_unknown(db: Path, answer: object) -> None:
    """As a handler that raises: the Command may have been applied, so the execution goes to review, unleased."""
    policy = examples.grants("default", "user:operator")
    with fencekeeper.connect(str(db), policy=policy, handler=Unanswering(answer)) as client:
        client.run(PURCHASE, {**ORDER, "amount": 10}, execution_id="po-1")
        assert client.run_until_idle(lease=5).finished == {"reconciliation_required": 1}
        assert client.review("po-1").execution.state is ExecutionState.RECONCILIATION_REQUIRED
        if isinstance(answer, Exception):
            return  # what a raising reconcile does is the caller's to see
        before = dump(db)
        with pytest.raises(fencekeeper.Refused) as caught:
            client.settle("po-1")
        assert caught.value.code is RefusalCode.NO_UNRESOLVED_COMMAND
        assert f"handler returned {type(answer).__name__}, not a CommandResult" in str(caught.value)
        assert dump(db) == before


def test_quarantine_an_expired_lease_then_fail(db: Path) -> None:
    clock = ManualClock()
    policy = examples.grants("default", "user:operator")
    with fencekeeper.connect(str(db), policy=policy, handler=examples.handler(), clock=clock) as client:
        client.run(PURCHASE, ORDER, execution_id="po-1")
        worker = client.worker("w-1", lease=timedelta(seconds=5))
        claimed = client.store.claim_next(p.ClaimRequest("w-1", "t" * 32, worker.lease))
        assert isinstance(claimed, p.Decision)
        assert client.quarantine_expired().outcomes == {}  # not expired yet
        clock.advance(timedelta(seconds=6))
        sweep = client.quarantine_expired()
        assert sweep.quarantined == ["po-1"] and not sweep.problems
        assert client.get("po-1").state is ExecutionState.RECONCILIATION_REQUIRED
        failed = client.fail("po-1", rationale="the order was withdrawn meanwhile")
        assert failed.state is ExecutionState.FAILED
        # Failed is terminal: the execution is no longer in review.
        with pytest.raises(fencekeeper.Refused) as caught:
            client.fail("po-1", rationale="again")
        assert caught.value.code is RefusalCode.NOT_IN_RECONCILIATION


# --- workers in-process -------------------------------------------------------------------


def test_workers_started_in_process_run_everything_and_stop(client: Client) -> None:
    for n in range(6):
        client.run(PURCHASE, {**ORDER, "amount": 100 + n, "order_id": f"o-{n}"}, execution_id=f"po-{n}")
    with client.start_workers(2, lease=5, poll=0.05) as pool:
        assert pool.wait_until_idle(timeout=30)
    assert not pool.running and pool.errors == []
    assert sorted(pool.report.claimed) == [f"po-{n}" for n in range(6)]
    assert pool.report.finished["succeeded"] == 6
    assert [x.state for x in client.list()] == [ExecutionState.SUCCEEDED] * 6


def test_wait_returns_when_the_workers_are_done_and_times_out_otherwise(client: Client) -> None:
    client.run(PURCHASE, ORDER, execution_id="po-1")
    with pytest.raises(TimeoutError, match=r"po-1 is still eligible after 0\.2 s"):
        client.wait("po-1", timeout=0.2, poll=0.05)
    with client.start_workers(1, lease=5, poll=0.05):
        waiting = client.wait("po-1", until={"waiting"}, timeout=30)
        assert waiting.state is ExecutionState.WAITING
        client.approve("po-1", reviewer="user:manager")
        done = client.wait("po-1", timeout=30)
    assert done.state is ExecutionState.SUCCEEDED
    for bad in ({"until": "waiting"}, {"until": ["sleeping"]}, {"timeout": -1}, {"poll": 0}):
        with pytest.raises(fencekeeper.RequestError) as caught:
            client.wait("po-1", **bad)  # type: ignore[arg-type]
        assert caught.value.field == next(iter(bad))


def idle(pool: fencekeeper.WorkerPool) -> None:
    """Wait until the pool's first pass found nothing: from now on it sleeps, for 60 s unless woken."""
    deadline = time.monotonic() + 10
    while pool.passes < 1:
        assert time.monotonic() < deadline, "the pool made no pass"
        time.sleep(0.01)
    assert pool.report.claimed == []


def test_work_made_by_the_client_wakes_its_idle_workers_at_once(client: Client) -> None:
    # The workers poll every 60 s: only the wake-up can make this finish within the wait below.
    with client.start_workers(1, lease=5, poll=60) as pool:
        idle(pool)
        client.run(PURCHASE, ORDER, execution_id="po-1")
        assert client.wait("po-1", until={"waiting"}, timeout=10).state is ExecutionState.WAITING
        client.approve("po-1", reviewer="user:manager")
        assert client.wait("po-1", timeout=10).state is ExecutionState.SUCCEEDED


TWO_COMMANDS = """
id = "two-steps"
revision = 1
start = "first"
inputs = ["order_id"]

[[nodes]]
id = "first"
kind = "local_command"
revision = 1
operation = "order.first"
targets = [{ id = { from = "input.order_id" }, revision = 1 }]
next = "second"
on_failure = "failed"

[[nodes]]
id = "second"
kind = "local_command"
revision = 1
operation = "order.second"
targets = [{ id = { from = "input.order_id" }, revision = 1 }]
next = "done"
on_failure = "failed"

[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"

[[nodes]]
id = "failed"
kind = "end"
revision = 1
outcome = "failed"
error_code = "order_failed"
"""


class Gate:
    """A handler whose first Command waits at a gate, so that a stop arrives mid-visit."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.go = threading.Event()
        self.executed: list[str] = []

    def execute(self, command: fencekeeper.Command) -> fencekeeper.CommandResult:
        self.executed.append(command.operation)
        if command.operation == "order.first":
            self.inside.set()
            assert self.go.wait(10)
        return fencekeeper.CommandResult(fencekeeper.CommandStatus.SUCCEEDED, None, "done")

    def reconcile(self, command: fencekeeper.Command) -> fencekeeper.CommandResult:
        return fencekeeper.CommandResult(fencekeeper.CommandStatus.UNKNOWN, None, "not asked")


def test_a_stopping_pool_hands_back_the_lease_after_the_visit_it_is_in(db: Path) -> None:
    gate = Gate()
    policy = examples.grants("default", "user:operator")
    with fencekeeper.connect(str(db), policy=policy, handler=gate) as client:
        client.run(TWO_COMMANDS, {"order_id": "o-1"}, execution_id="x-1")
        pool = client.start_workers(1, lease=30, poll=0.05)
        assert gate.inside.wait(10)
        stopping = threading.Thread(target=pool.stop)
        stopping.start()
        gate.go.set()  # the visit in progress commits; then the lease is handed back
        stopping.join(10)
        assert not pool.running
        assert pool.released == ["x-1"] and pool.errors == []
        execution = client.get("x-1")
        assert (execution.state, execution.current_node_id, execution.step_count) == (
            ExecutionState.ELIGIBLE, "second", 1
        )
        assert gate.executed == ["order.first"]
        # Another worker continues at once, without waiting for a lease to expire.
        client.run_until_idle(lease=5)
        assert client.get("x-1").state is ExecutionState.SUCCEEDED
        assert gate.executed == ["order.first", "order.second"]


def test_closing_the_client_stops_its_running_pool_after_the_visit_it_is_in(db: Path) -> None:
    # Closed under a running pool, the store refused the step that records the Command's result:
    # the Command was applied, its result lost, and the execution left running until an operator
    # reconciled it.  close() stops the pool first, as pool.stop() does.
    gate = Gate()
    policy = examples.grants("default", "user:operator")
    client = fencekeeper.connect(str(db), policy=policy, handler=gate)
    client.run(TWO_COMMANDS, {"order_id": "o-1"}, execution_id="x-1")
    pool = client.start_workers(1, lease=30, poll=0.05)
    assert gate.inside.wait(10)
    closing = threading.Thread(target=client.close)
    closing.start()
    gate.go.set()
    closing.join(10)
    assert not closing.is_alive() and not pool.running
    assert pool.errors == [] and not pool.report.refused and pool.released == ["x-1"]
    with fencekeeper.connect(str(db), policy=policy, handler=gate) as again:
        execution = again.get("x-1")
        assert (execution.state, execution.current_node_id, execution.step_count) == (
            ExecutionState.ELIGIBLE, "second", 1
        )
        again.run_until_idle(lease=5)
        assert again.get("x-1").state is ExecutionState.SUCCEEDED
    assert gate.executed == ["order.first", "order.second"]


def test_a_handler_that_closes_its_own_client_does_not_wait_for_itself(db: Path) -> None:
    policy = examples.grants("default", "user:operator")
    closed = threading.Event()
    clients: list[Client] = []

    class Closing:
        def execute(self, command: fencekeeper.Command) -> fencekeeper.CommandResult:
            clients[0].close()
            closed.set()
            return fencekeeper.CommandResult(fencekeeper.CommandStatus.SUCCEEDED, None, "done")

        def reconcile(self, command: fencekeeper.Command) -> fencekeeper.CommandResult:
            return fencekeeper.CommandResult(fencekeeper.CommandStatus.UNKNOWN, None, "not asked")

    clients.append(fencekeeper.connect(str(db), policy=policy, handler=Closing()))
    clients[0].run(TWO_COMMANDS, {"order_id": "o-1"}, execution_id="x-1")
    pool = clients[0].start_workers(1, lease=30, poll=0.05)
    assert closed.wait(10)
    pool.stop()
    assert not pool.running


def test_a_stop_that_lands_as_a_command_is_issued_waits_for_the_command_s_result(db: Path) -> None:
    # The claim's transaction also commits the first Command's intent (a composed transaction), and the
    # stop lands inside it, after the worker chose to compose (the policy is asked while the next visit
    # is planned).  The claim is then reported with a Command issued: the lease must not be handed back
    # before the handler has run and its result is committed, or the Command would run under no lease,
    # its result be refused, and the execution need reconciliation.
    grants = examples.grants("default", "user:operator")
    stop_once: list[fencekeeper.WorkerPool] = []
    registered = threading.Event()
    handler = Gate()
    handler.go.set()

    class StopsInside:
        def check(
            self, principal_id: str, business_id: str, operation: str, targets: Sequence[tuple[str, int]] = ()
        ) -> fencekeeper.Authority:
            if operation == "order.first" and threading.current_thread() is not threading.main_thread():
                # The pool's worker can get here before start_workers has returned the pool to stop.
                assert registered.wait(10)
                if stop_once:
                    stop_once.pop()._stop.set()
            return grants.check(principal_id, business_id, operation, targets)

    with fencekeeper.connect(str(db), policy=StopsInside(), handler=handler) as client:
        client.run(TWO_COMMANDS, {"order_id": "o-1"}, execution_id="x-1")
        pool = client.start_workers(1, lease=30, poll=0.05)
        stop_once.append(pool)
        registered.set()
        deadline = time.monotonic() + 10
        while pool.running and time.monotonic() < deadline:
            time.sleep(0.01)  # the stop comes from inside the worker's own transaction
        pool.stop()
        assert not stop_once, "the stop never landed"
        assert not pool.running and pool.errors == []
        assert not pool.report.refused, pool.report.refused
        assert handler.executed == ["order.first"]
        # The first Command's result committed under the lease, and then the lease was handed back.
        assert pool.released == ["x-1"]
        execution = client.get("x-1")
        assert (execution.state, execution.current_node_id, execution.step_count) == (
            ExecutionState.ELIGIBLE, "second", 1
        )
        client.run_until_idle(lease=5)
        assert client.get("x-1").state is ExecutionState.SUCCEEDED
        assert handler.executed == ["order.first", "order.second"]


class Interrupted:
    """A handler whose first Command is interrupted (Ctrl-C, a signal handler's sys.exit) while it runs."""

    def __init__(self, interruption: type[BaseException]) -> None:
        self.interruption: type[BaseException] | None = interruption
        self.executed: list[str] = []

    def execute(self, command: fencekeeper.Command) -> fencekeeper.CommandResult:
        self.executed.append(command.operation)
        if self.interruption is not None:
            interruption, self.interruption = self.interruption, None
            raise interruption()
        return fencekeeper.CommandResult(fencekeeper.CommandStatus.SUCCEEDED, None, "done")

    def reconcile(self, command: fencekeeper.Command) -> fencekeeper.CommandResult:
        return fencekeeper.CommandResult(fencekeeper.CommandStatus.SUCCEEDED, None, "it was done")


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_a_run_until_idle_interrupted_in_a_command_records_it_unknown_then_raises(
    request: pytest.FixtureRequest, db: Path, store: str, interruption: type[BaseException]
) -> None:
    # Raised at once, the interruption left the execution running under the lease until it expired
    # and a quarantine sweep sent it to review.  Its Command may have been applied, as a handler's
    # that raised: recorded unknown first, the execution is in review at once, never resent.
    url = str(db) if store == "sqlite" else f"{request.getfixturevalue('pg_dsn')}?schema={request.getfixturevalue('pg_schema')}"
    handler = Interrupted(interruption)
    with fencekeeper.connect(url, policy=examples.grants("default", "user:operator"), handler=handler) as client:
        client.run(TWO_COMMANDS, {"order_id": "o-1"}, execution_id="x-1")
        with pytest.raises(interruption):
            client.run_until_idle(lease=30)
        interrupted = client.inspect("x-1")
        assert (interrupted.execution.state, interrupted.execution.current_node_id) == (
            ExecutionState.RECONCILIATION_REQUIRED, "first"
        )
        assert interrupted.dispatch is not None and interrupted.dispatch.lease_token is None
        assert interrupted.dispatch.last_error_code == "command_unknown"
        client.run_until_idle(lease=30)
        assert handler.executed == ["order.first"]
        # The operator's settlement asks what became of it, and the execution goes on from there.
        client.settle("x-1")
        client.resume("x-1", at_node="second", rationale="order.first is settled as applied")
        client.run_until_idle(lease=30)
        assert client.get("x-1").state is ExecutionState.SUCCEEDED
        assert handler.executed == ["order.first", "order.second"]


def test_a_full_pass_that_is_stopped_claims_nothing_after_the_visit_it_is_in(db: Path) -> None:
    # run_until_idle's passes claim every eligible execution in one pass; stopped (the asyncio
    # client's cancellation, or its close), the lease is handed back after the visit, and the pass
    # must then end: the next claim would take the execution just handed back, and so on, for ever.
    gate = Gate()
    stop = threading.Event()
    policy = examples.grants("default", "user:operator")
    with fencekeeper.connect(str(db), policy=policy, handler=gate) as client:
        client.run(TWO_COMMANDS, {"order_id": "o-1"}, execution_id="x-1")
        client.run(TWO_COMMANDS, {"order_id": "o-2"}, execution_id="x-2")
        reports: list[fencekeeper.PassReport] = []
        passes = threading.Thread(
            target=lambda: reports.append(client._run_until_idle(None, 30, 1000, stop)), daemon=True
        )
        passes.start()
        assert gate.inside.wait(10)
        stop.set()
        gate.go.set()
        passes.join(10)
        assert not passes.is_alive(), "the stopped pass went on claiming"
        assert [r.claimed for r in reports] == [["x-1"]]
        assert gate.executed == ["order.first"]
        first, second = client.get("x-1"), client.get("x-2")
        assert (first.state, first.current_node_id) == (ExecutionState.ELIGIBLE, "second")
        assert (second.state, second.step_count) == (ExecutionState.ELIGIBLE, 0)


# --- PostgreSQL ---------------------------------------------------------------------------------


def test_the_same_client_on_postgresql(pg_dsn: str, pg_schema: str) -> None:
    policy = examples.grants("default", "user:operator", "user:manager")
    url = f"{pg_dsn}?schema={pg_schema}"
    with fencekeeper.connect(url, policy=policy, handler=examples.handler()) as client:
        client.run(PURCHASE, ORDER, execution_id="po-1")
        client.run_until_idle(lease=5)
        with pytest.raises(fencekeeper.Refused):
            client.approve("po-1")
        client.approve("po-1", reviewer="user:manager")
        client.run_until_idle(lease=5)
        assert client.get("po-1").state is ExecutionState.SUCCEEDED


def test_the_in_memory_store_for_trying_things() -> None:
    policy = examples.grants("default", "user:operator")
    with fencekeeper.connect(":memory:", policy=policy, handler=examples.handler()) as client:
        client.run(PURCHASE, {**ORDER, "amount": 10}, execution_id="po-1")
        client.run_until_idle(lease=5)
        assert client.get("po-1").state is ExecutionState.SUCCEEDED
    with pytest.raises(fencekeeper.RequestError) as caught:
        fencekeeper.connect(":memory:", policy=policy, handler=None, schema="x")
    assert caught.value.field == "schema"


def test_on_postgresql_another_process_wakes_idle_workers(pg_dsn: str, pg_schema: str) -> None:
    policy = examples.grants("default", "user:operator")
    url = f"{pg_dsn}?schema={pg_schema}"
    with (
        fencekeeper.connect(url, policy=policy, handler=examples.handler()) as workers,
        fencekeeper.connect(url, policy=policy, handler=None) as elsewhere,
        workers.start_workers(1, lease=5, poll=60) as pool,
    ):
        idle(pool)
        # Admitted through another client (another connection, as another process would): only NOTIFY wakes the pool.
        elsewhere.run(PURCHASE, {**ORDER, "amount": 10}, execution_id="po-1")
        assert elsewhere.wait("po-1", timeout=10).state is ExecutionState.SUCCEEDED


def end_sessions(pg_dsn: str, application_name: str) -> int:
    """What a server restart does to a client's connections: every one of them ended by the server."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        ended = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
            (application_name,),
        ).fetchone()
    assert ended is not None
    return int(ended[0])


def test_after_the_server_ends_every_connection_one_call_fails_and_the_next_works(pg_dsn: str, pg_schema: str) -> None:
    # The pool hands its idle connections out unchecked: each dead one failed a call of its own, so a
    # restart cost as many failed calls in a row as the pool held connections.
    name = f"fk-{uuid.uuid4().hex[:8]}"
    url = f"{pg_dsn}?schema={pg_schema}&application_name={name}"
    policy = examples.grants("default", "user:operator")
    with fencekeeper.connect(url, policy=policy, handler=None, pool_size=4) as client:
        client.run(PURCHASE, ORDER, execution_id="po-1")
        store = client.store
        assert isinstance(store, PostgresStore)
        with contextlib.ExitStack() as held:
            # Four at once, as calls from four threads take them: the pool holds four connections after.
            for _ in range(4):
                held.enter_context(store._pooled())
        assert end_sessions(pg_dsn, name) == 4
        with pytest.raises(fencekeeper.StoreFailure) as lost:
            client.get("po-1")
        assert lost.value.code is fencekeeper.StoreCode.STORE_UNAVAILABLE
        assert client.get("po-1").state is ExecutionState.ELIGIBLE
        assert [x.execution_id for x in client.list()] == ["po-1"]


def test_an_unreachable_store_is_a_store_failure(tmp_path: Path) -> None:
    with pytest.raises(fencekeeper.StoreFailure) as caught:
        fencekeeper.connect(
            "postgresql://nobody@127.0.0.1:1/none", policy=examples.grants("default"), handler=None
        )
    assert caught.value.code is fencekeeper.StoreCode.STORE_UNAVAILABLE
    (tmp_path / "notes.txt").write_text("not a database\n" * 100, encoding="utf-8")
    with pytest.raises(fencekeeper.StoreFailure) as caught:
        fencekeeper.connect(str(tmp_path / "notes.txt"), policy=examples.grants("default"), handler=None)
    assert caught.value.code is fencekeeper.StoreCode.NOT_A_DATABASE


@pytest.mark.parametrize("migrate", [False, True])
def test_an_unreachable_server_is_worded_alike_by_connect_and_connect_async(migrate: bool) -> None:
    # connect's message began with the command line's "--db: ", connect_async's did not: a Python caller passed url.
    url = "postgresql://nobody@127.0.0.1:1/none"
    policy = examples.grants("default")
    with pytest.raises(fencekeeper.StoreFailure) as blocking:
        fencekeeper.connect(url, policy=policy, handler=None, migrate=migrate)
    with pytest.raises(fencekeeper.StoreFailure) as native:
        asyncio.run(fencekeeper.connect_async(url, policy=policy, handler=None, migrate=migrate))
    for caught in (blocking, native):
        assert caught.value.code is fencekeeper.StoreCode.STORE_UNAVAILABLE
        assert caught.value.message.startswith(
            "cannot connect to PostgreSQL (user=nobody dbname=none host=127.0.0.1 port=1): "
        ), caught.value
    assert str(blocking.value) == str(native.value)


def test_a_refused_value_of_any_length_is_quoted_by_its_start(client: Client, db: Path) -> None:
    """A 100,000-character id or state is named by its first 132 characters (kernel.common.shown), not echoed."""
    huge = "a" * 100_000
    client.register(PURCHASE)
    before = dump(db)
    for call in (
        lambda: client.get(huge),
        lambda: client.run("purchase-approval", ORDER, execution_id=huge),
        lambda: client.list(huge),
    ):
        with pytest.raises(fencekeeper.RequestError) as caught:
            call()
        assert len(str(caught.value)) < 300, str(caught.value)[:500]
        assert "'" + "a" * 70 in str(caught.value)
    assert dump(db) == before
