"""Drives any Python store through the store layer of the conformance protocol.

Rules of this module:

- A store is given as a factory: either ``factory(clock)`` (the store suite's
  :data:`~fencekeeper.adapters.testing.StoreFactory`) or ``factory()``,
  whose store then gets the harness's clock assigned to ``store.clock``.
  Every case starts from a fresh store (``reset``); the previous one is
  closed first.
- Time is the runner's: each call carries ``now``, and the harness sets a
  :class:`~fencekeeper.adapters.store.ManualClock` to it before the call,
  so the store's authoritative time is exactly the case's.
- A session is one thread.  Session ``a`` calls the store the factory made;
  any other session calls a second session of the same data: a new
  connection for the shipped SQLite and PostgreSQL stores (whose objects
  share one connection, or a pool, between threads, so two threads of one
  object never reach the database's own locks), the same object otherwise.
- ``hold`` pauses a session's call at one of two points, once, until
  ``release`` lets it go on.  ``commit`` (``"hold": true``) is where the
  store commits (the backend's ``write``), or, for a store that exposes no
  backend, its first clock read: the point at which a guard must still
  hold, so two sessions interleaved there show whether the store checks it
  at commit.  ``clock`` is the call's first read of the store's clock (the
  harness's clock wraps it), the moment the store asks for authoritative
  time: whatever the call read before it, another session may now change,
  so a call that chose its rows before its transaction shows it.
- Results are the JSON of :mod:`.wire`: codes, states and values, never text.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from fencekeeper.adapters.store import ManualClock, StoreError
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.events import Event, EventError
from fencekeeper.kernel.evidence import Evidence
from fencekeeper.kernel.machines import ExecutionState

from . import wire

Json = Any
AnyFactory = Callable[..., Any]

PENDING_AFTER = 0.2
"""Seconds a call of an unheld session may take before it is reported pending (blocked on a lock)."""


HOLD_POINTS = ("commit", "clock")
"""The points a session can be held at (specs/conformance.md, Holds), in the order protocol versions added them."""


class _HoldingClock(ManualClock):
    """The harness's clock: a session held at ``clock`` stops at its first read, as RendezvousClock holds a racer."""

    def __init__(self, harness: StoreHarness) -> None:
        super().__init__()
        self._harness = harness

    def now(self) -> datetime:
        self._harness.checkpoint("clock")
        return super().now()


class _Session:
    def __init__(self, name: str) -> None:
        self.name = name
        self.thread: threading.Thread | None = None
        self.result: Json = None
        self.done = threading.Event()
        self.started = threading.Event()
        """Its thread runs: a call not yet scheduled is not yet blocked on anything."""
        self.reached = threading.Event()
        self.go_on = threading.Event()
        self.hold: str | None = None
        """The point it stops at once (one of HOLD_POINTS), or None."""


class StoreHarness:
    """One store at a time, fresh per case, and the sessions that call it."""

    def __init__(self, factory: AnyFactory) -> None:
        self.factory = factory
        self.store: Any = None
        self.clock = _HoldingClock(self)
        self.sessions: dict[str, _Session] = {}
        self._local = threading.local()
        self._hooked = False
        self._others: dict[str, Any] = {}

    # --- lifetime -----------------------------------------------------------------------

    def reset(self) -> None:
        self.close()
        self.clock = _HoldingClock(self)
        self.sessions = {}
        takes_clock = True
        with contextlib.suppress(TypeError, ValueError):
            takes_clock = len(inspect.signature(self.factory).parameters) >= 1
        self.store = self.factory(self.clock) if takes_clock else self.factory()
        if not takes_clock:
            self.store.clock = self.clock
        self._hooked = self._hook()

    def close(self) -> None:
        for session in self.sessions.values():
            session.go_on.set()
            if session.thread is not None:
                session.thread.join(timeout=10)
        for other in self._others.values():
            if other is not self.store:
                with contextlib.suppress(Exception):
                    other.close()
        self._others = {}
        if self.store is not None:
            with contextlib.suppress(Exception):
                self.store.close()
        self.store = None

    def _store_of(self, session: str) -> Any:
        if session == "a":
            return self.store
        if session not in self._others:
            self._others[session] = _second_session(self.store, self.clock)
        return self._others[session]

    def _hook(self) -> bool:
        """Wrap the store's transactions so a held session stops right before it commits."""
        original = getattr(self.store, "_transaction", None)
        if original is None:
            return False
        harness = self

        @contextlib.contextmanager
        def transaction() -> Iterator[Any]:
            with original() as backend:
                yield _HeldBackend(backend, harness)

        self.store._transaction = transaction
        return True

    def checkpoint(self, point: str) -> None:
        """Called in the calling thread at a hold point; stops there once if its session is held there."""
        session: _Session | None = getattr(self._local, "session", None)
        if session is None or session.hold is None or session.reached.is_set():
            return
        # A store without a backend hook has no commit point to stop at: its first clock read,
        # inside its transaction for a store that reads the time once per transaction, stands in.
        wanted = session.hold if session.hold != "commit" or self._hooked else "clock"
        if point != wanted:
            return
        session.reached.set()
        session.go_on.wait(timeout=30)

    # --- requests -------------------------------------------------------------------------

    def handle(self, message: Json) -> Json:
        control = message.get("control")
        if control == "release":
            session = self.sessions[message["session"]]
            session.go_on.set()
            session.done.wait(timeout=30)
            return session.result if session.done.is_set() else {"outcome": "timeout"}
        if control == "await":
            session = self.sessions[message["session"]]
            session.done.wait(timeout=30)
            return session.result if session.done.is_set() else {"outcome": "timeout"}
        step = message["step"]
        name = step.get("session", "a")
        session = _Session(name)
        if name != "a":
            self._store_of(name)  # opened here, not in the racing thread, so opening is not counted as blocking
        session.hold = hold_point(message.get("hold"))
        self.sessions[name] = session
        if "now" in step:
            self.clock.set(wire.parse_time(step["now"]))

        def run() -> None:
            session.started.set()
            self._local.session = session
            try:
                session.result = self.call(step)
            except Exception as exc:  # a store that raises is reported, not allowed to kill the driver
                session.result = {"outcome": "error", "code": getattr(exc, "code", type(exc).__name__)}
            finally:
                self._local.session = None
                session.done.set()

        session.thread = threading.Thread(target=run, name=f"session-{name}", daemon=True)
        session.thread.start()
        if session.hold:
            while not (session.reached.wait(0.01) or session.done.is_set()):
                pass
            if session.reached.is_set() and not session.done.is_set():
                # Protocol 1.0 answered a commit hold with true; it stays so for runners written then.
                return {"held": True if session.hold == "commit" else session.hold}
            return session.result
        if not self.sessions_held():
            session.done.wait(30)
            return session.result
        # Another session is held: this one may be blocked behind it (a store that serialises
        # writers, whether by a lock up front or on the row) or merely slow.  A call still running
        # a while after its thread first ran is reported blocked; counting from then, not from
        # the request, keeps a busy machine's scheduling delay from passing for a lock.
        session.started.wait(30)
        if session.done.wait(PENDING_AFTER):
            return session.result
        return {"pending": True}

    def sessions_held(self) -> bool:
        return any(s.hold is not None and s.reached.is_set() and not s.go_on.is_set() for s in self.sessions.values())

    def call(self, step: Json) -> Json:
        store = self._store_of(step.get("session", "a"))
        call = step["call"]
        a = step.get("args", {})
        if call == "admit":
            return wire.outcome(store.admit(wire.parse_request("admit", a)))
        if call == "claim_next":
            result = store.claim_next(wire.parse_request("claim", a), business_id=a.get("business_id"))
            return wire.outcome(result)
        if call in ("renew", "record_step", "release"):
            method = getattr(store, call)
            return wire.outcome(method(a["execution_id"], wire.parse_request(call, a)))
        if call in ("finalize", "wake", "cancel"):
            return wire.outcome(getattr(store, call)(wire.parse_request(call, a)))
        if call == "recover":
            return wire.outcome(store.recover(wire.parse_request("recover", a)))
        if call == "quarantine":
            return wire.outcome(store.quarantine(wire.parse_request("recover", a)))
        if call == "expired":
            return {"outcome": "ids", "ids": sorted(store.expired())}
        if call == "execution_ids":
            state = a.get("state")
            ids = store.execution_ids(ExecutionState(state) if state is not None else None)
            return {"outcome": "ids", "ids": sorted(ids)}
        if call in ("history", "evidence"):
            found = store.read(a["execution_id"])
            if found is None:
                return {"outcome": call, call: None}
            if call == "history":
                return {"outcome": "history", "history": [wire.transition(r) for r in found.history]}
            return {"outcome": "evidence", "evidence": [wire.evidence(e) for e in found.evidence]}
        if call == "append_evidence":
            items = tuple(
                Evidence(e["object_id"], e["kind"], e.get("body", {}), e["revision"], e.get("state"))
                for e in a["evidence"]
            )
            return wire.outcome(store.append_evidence(a["execution_id"], wire.parse_credential(a["credential"]), items))
        if call == "due_wakes":
            keys = store.due_wakes(a.get("limit", 100), business_id=a.get("business_id"))
            return {"outcome": "keys", "keys": [wire._key(k) for k in keys]}
        if call == "fire_timer":
            return wire.outcome(store.fire_timer(wire.parse_key(a["key"]), wire.parse_authority(a["authority"])))
        if call == "publish_event":
            try:
                event = Event.build(a["event_id"], a["business_id"], a["event_type"], a["correlation"], a.get("payload"))
            except EventError:
                return {"outcome": "error", "code": "invalid_event"}
            try:
                published = store.publish_event(event, wire.parse_authority(a["authority"]))
            except StoreError as exc:
                return {"outcome": "error", "code": exc.code}
            return {"outcome": "published", "duplicate": published.duplicate, "woken": sorted(published.woken)}
        if call == "read":
            view = store.read(a["execution_id"])
            if view is None:
                return {"outcome": "view", "execution": None, "dispatch": None, "registrations": [],
                        "evidence_revisions": []}
            return {
                "outcome": "view",
                "execution": wire.execution(view.execution),
                "dispatch": wire.dispatch(view.dispatch),
                "registrations": [wire.registration(r) for r in view.registrations],
                "evidence_revisions": [wire.evidence(e) for e in view.evidence_revisions],
            }
        return {"outcome": "error", "code": "unknown_call"}


def hold_point(hold: Any) -> str | None:
    """The hold point a ``store`` request names: ``true`` is ``commit`` (protocol 1.0), absent or false none.

    Raises ValueError for any other value, which the driver answers as unsupported.
    """
    if hold is None or hold is False:
        return None
    if hold is True:
        return "commit"
    if hold in HOLD_POINTS:
        return str(hold)
    raise ValueError(f"unknown hold point {hold!r}")


def _second_session(store: Any, clock: ManualClock) -> Any:
    """Another connection to the same data for the shipped database stores; the store itself otherwise."""
    # Imported here: a third-party store's driver need not load the shipped stores' database modules.
    from fencekeeper.adapters.postgres_store import PostgresStore  # noqa: PLC0415
    from fencekeeper.adapters.sqlite_store import SQLiteStore  # noqa: PLC0415

    if isinstance(store, SQLiteStore):
        return type(store)(store.path, clock=clock)
    if isinstance(store, PostgresStore):
        return type(store)(store.dsn, schema=store.schema, clock=clock, pool_size=1)
    return store


class _HeldBackend:
    """A backend whose writes stop first when its session is held (the commit point).

    Every way a decision is written stops there: ``write``, ``write_last``
    (the transaction's last writes, which a store may send with its COMMIT)
    and ``write_and_view``; and ``keeps_writes``, which the store's loop sets
    on the backend it was given, is the wrapped backend's own.
    """

    def __init__(self, backend: Any, harness: StoreHarness) -> None:
        self._backend = backend
        self._harness = harness

    def write(self, decision: p.Decision, evidence: Any, now: datetime) -> bool:
        self._harness.checkpoint("commit")
        return bool(self._backend.write(decision, evidence, now))

    def write_last(self, decision: p.Decision, evidence: Any, now: datetime) -> bool:
        self._harness.checkpoint("commit")
        return bool(self._backend.write_last(decision, evidence, now))

    def write_and_view(self, decision: p.Decision, evidence: Any, now: datetime, execution_id: str) -> Any:
        self._harness.checkpoint("commit")
        return self._backend.write_and_view(decision, evidence, now, execution_id)

    @property
    def keeps_writes(self) -> bool:
        return bool(self._backend.keeps_writes)

    @keeps_writes.setter
    def keeps_writes(self, keep: bool) -> None:
        self._backend.keeps_writes = keep

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)
