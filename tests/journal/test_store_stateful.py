"""The SQLite journal store against the bare kernel, command by command (Hypothesis).

Two writers (two store objects on one file) send random commands for the
systematic review, built from what each writer last saw, so that some are
stale; after every step the stored bytes must be exactly the kernel's
encoding of the journal the kernel alone reaches by applying the commands
the store accepted, in the order it accepted them, and a restart (a new
store object) must load the same journal.
"""

from __future__ import annotations

import tempfile
from datetime import timedelta
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from fencekeeper.adapters import journal_fixtures as fx
from fencekeeper.adapters.journal_store import SQLiteJournalStore
from fencekeeper.adapters.store import ManualClock
from fencekeeper.kernel import journal as j
from fencekeeper.kernel.journal_codes import JournalCode as C
from fencekeeper.kernel.machines import NODE, NodeEvent, NodeState

ACTORS = ("alice", "bob", "carol", "bot:search", "bot:extract")
WORKERS = {
    "search": ("bot:search", "searcher"),
    "screen-a": ("alice", "screener"),
    "screen-b": ("bob", "screener"),
    "extraction": ("carol", "extractor"),
    "synthesis": ("carol", "synthesist"),
    "sign-off": ("carol", "coordinator"),
}
ROLES = {"alice": "screener", "bob": "screener", "carol": "extractor", "bot:search": "searcher", "bot:extract": "extractor"}


class StoreAgainstKernel(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="fencekeeper-journal-stateful-"))
        self.path = self.directory / "journal.db"
        self.clock = ManualClock(fx.T0)
        self.stores = [SQLiteJournalStore(self.path, clock=self.clock) for _ in range(2)]
        self.model = fx.new("review-1").journal
        self.stores[0].create(self.model)
        self.seen = [self.model, self.model]  # what each writer last saw
        self.count = 0

    def teardown(self) -> None:
        for store in getattr(self, "stores", ()):
            store.close()

    @rule(writer=st.integers(0, 1), data=st.data(), anyone=st.booleans())
    def send(self, writer: int, data: st.DataObject, anyone: bool) -> None:
        seen = self.seen[writer]
        # Mostly a move the writer's view admits, by the node's own worker, so
        # that the review advances; sometimes anyone, to be refused.
        movable = [
            (n, e)
            for n in seen.workflow.order
            for e in NODE.events_from(seen.states[n])
            if e not in (NodeEvent.WORK_INVALIDATED, NodeEvent.SUCCESSOR_BOUND)
            and (e is not NodeEvent.DEPENDENCIES_SATISFIED
                 or all(seen.states[p] is NodeState.COMPLETED for p in seen.workflow.nodes[n].predecessors))
        ]  # fmt: skip
        if not movable:
            return
        node_id, event = data.draw(st.sampled_from(movable))
        state = seen.states[node_id]
        actor, role = WORKERS[node_id]
        if event is NodeEvent.DEPENDENCIES_SATISFIED:
            actor, role = "bot:search", "scheduler"
        if anyone:
            actor = data.draw(st.sampled_from(ACTORS))
            role = ROLES[actor]
        attempts = seen.attempts.get(node_id, ())
        sequence = len(attempts) + (event in (NodeEvent.WORK_STARTED, NodeEvent.RETRY_AUTHORIZED)
                                    and not (attempts and attempts[-1].status is j.AttemptStatus.AUTHORIZED))  # fmt: skip
        attempt = None if event is NodeEvent.DEPENDENCIES_SATISFIED else j.AttemptRef(f"{node_id}-{sequence}", sequence)
        node = seen.workflow.nodes[node_id]
        self.count += 1
        command = j.Transition(
            request_id=f"q-{self.count}",
            expected_head=seen.head,
            node_id=node_id,
            event=event,
            prior_state=state,
            actor_id=actor,
            role=role,
            attempt=attempt,
            records=tuple(fx.ref(a.kind, a.artifact_id) for a in node.outputs) if event is NodeEvent.WORK_COMPLETED else (),
            approvals=fx.SIGN_OFF if node.approval is not None and event is NodeEvent.WORK_COMPLETED else (),
            error="failed" if event is NodeEvent.WORK_FAILED else None,
        )  # fmt: skip
        self.clock.advance(timedelta(seconds=1))
        expected = j.preview(self.model, command, self.clock.now())
        outcome = self.stores[writer].append("review-1", command)
        if isinstance(expected, j.Appended):
            assert isinstance(outcome, j.Appended), outcome
            assert [j.encode_event(e) for e in outcome.events] == [j.encode_event(e) for e in expected.events]
            self.model = expected.journal
        else:
            # Whatever the kernel says against the stored journal, the store says too.
            assert type(outcome) is type(expected), (outcome, expected)
            if isinstance(expected, j.Refusal):
                assert isinstance(outcome, j.Refusal) and outcome.code is expected.code, (outcome, expected)
                if seen.head != self.model.head:
                    assert outcome.code is C.STALE_HEAD
        self.seen[writer] = self.model if isinstance(outcome, j.Appended) else self.seen[writer]

    @rule(writer=st.integers(0, 1))
    def catch_up(self, writer: int) -> None:
        self.seen[writer] = self.model

    @rule(writer=st.integers(0, 1))
    def restart(self, writer: int) -> None:
        self.stores[writer].close()
        self.stores[writer] = SQLiteJournalStore(self.path, clock=self.clock)

    @invariant()
    def stored_bytes_are_the_kernels(self) -> None:
        chain = self.stores[0].stored("review-1")
        assert chain is not None
        assert chain.header == j.encode_header(self.model.header)
        assert list(chain.events) == [j.encode_event(e) for e in self.model.events]
        assert (chain.head, chain.length) == (self.model.head, len(self.model.events))


TestStoreAgainstKernel = StoreAgainstKernel.TestCase
TestStoreAgainstKernel.settings = settings(
    max_examples=15,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
