"""Random DAGs, random command sequences: the journal's invariants after every step.

A Hypothesis state machine builds a random workflow (random kinds, random
predecessors), then sends random commands: mostly ones that could be
accepted (the right head and prior state, the current attempt, the declared
outputs, approvals), and some that must not be (stale heads, partial
invalidation batches, repeats, wrong actors).  After every step it checks:

- replay of the stored bytes equals the incremental projection (states,
  attempt history, head, requests);
- no node leaves the table: every event is a row of the node machine, and
  every node of the workflow has exactly one state;
- invalidated and superseded nodes never resume: once a node is invalidated
  its only later event is successor-bound;
- every invalidation covers its whole closure: a node that is invalidated
  or superseded has no descendant that is neither;
- any single-byte change to the stored chain is refused by replay.
"""

from __future__ import annotations

from datetime import timedelta

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fencekeeper.kernel import journal as j
from fencekeeper.kernel.dag import (
    ApprovalRequirement,
    Artifact,
    NodeDefinition,
    NodeKind,
    WorkflowDefinition,
    verify_workflow,
)
from fencekeeper.kernel.journal_codes import JournalCode as C
from fencekeeper.kernel.journal_codes import JournalError
from fencekeeper.kernel.machines import NODE, NodeEvent, NodeState

from .examples import T0, ref

ACTORS = ("h1", "h2", "bot")
HUMANS = ("h1", "h2")
ENDED = (NodeState.INVALIDATED, NodeState.SUPERSEDED)


@st.composite
def workflows(draw: st.DrawFn) -> WorkflowDefinition:
    count = draw(st.integers(1, 6))
    nodes = []
    for index in range(count):
        kind = draw(st.sampled_from(NodeKind))
        predecessors = sorted(draw(st.sets(st.integers(0, index - 1), max_size=2))) if index else []
        nodes.append(
            NodeDefinition(
                node_id=f"n{index}",
                kind=kind,
                predecessors=tuple(f"n{p}" for p in predecessors),
                roles=() if kind is NodeKind.AUTOMATED else ("worker",),
                outputs=() if kind is NodeKind.APPROVAL else (Artifact("out", f"out-{index}"),),
                approval=ApprovalRequirement(draw(st.integers(1, 2)), ("worker",)) if kind is NodeKind.APPROVAL else None,
            )
        )
    return WorkflowDefinition("random", tuple(nodes))


class JournalMachine(RuleBasedStateMachine):
    journal: j.Journal

    @initialize(definition=workflows())
    def start(self, definition: WorkflowDefinition) -> None:
        workflow = verify_workflow(definition)
        policy = j.verify_policy(
            j.AuthorityPolicy(
                policy_id="p",
                scope="s",
                workflow_digest=workflow.digest,
                protocol="proto",
                assignments=(
                    j.Assignment("h1", j.ActorKind.HUMAN, ("worker",)),
                    j.Assignment("h2", j.ActorKind.HUMAN, ("worker",)),
                    j.Assignment("bot", j.ActorKind.AUTOMATION, ("worker",)),
                ),
                approved_by="h1",
                invalidation_policies=(
                    j.InvalidationPolicy("pol", ("worker",)),
                    j.InvalidationPolicy("pol-auto", ("worker",), automation_may_invalidate_human_work=True),
                ),
            ),
            workflow,
        )
        header = j.create_header("x-1", workflow, policy, created_by="h1", now=T0)
        self.journal = j.new_journal(header, workflow, policy)
        # The successor, and a header that is no successor of x-1: what the header lookup finds.
        self.headers = {
            h.execution_id: h
            for h in (
                j.create_header("x-2", workflow, policy, created_by="h1", now=T0, supersedes="x-1"),
                j.create_header("x-3", workflow, policy, created_by="h1", now=T0),
            )
        }
        self.clock = T0
        self.count = 0
        self.heads = [self.journal.head]
        self.last: j.Command | None = None

    # --- helpers -------------------------------------------------------------------------------

    def send(self, command: j.Command) -> j.Outcome:
        self.clock += timedelta(milliseconds=1)
        before = self.journal
        outcome = j.preview(before, command, self.clock, headers=self.headers.get)
        if isinstance(outcome, j.Appended):
            assert outcome.journal.events[: len(before.events)] == before.events
            assert outcome.journal.events[len(before.events) :] == outcome.events
            self.journal = outcome.journal
            self.heads.append(self.journal.head)
            self.last = command
        else:
            # A refusal or a repeat changes nothing.
            assert self.journal is before
        return outcome

    def request(self) -> str:
        self.count += 1
        return f"q-{self.count}"

    # --- rules ---------------------------------------------------------------------------------

    @rule(data=st.data(), event=st.sampled_from(NodeEvent), actor=st.sampled_from(ACTORS))
    def any_transition(self, data: st.DataObject, event: NodeEvent, actor: str) -> None:
        self.transition(data.draw(st.sampled_from(self.journal.workflow.order)), event, actor)

    def _legal(self, data: st.DataObject) -> None:
        # A node and one of the events its state admits (other than the batch
        # events), by a human: most of these are accepted, which is what
        # drives the journal deep into the table.
        journal = self.journal
        movable = [
            (n, e)
            for n in journal.workflow.order
            for e in NODE.events_from(journal.states[n])
            if e not in (NodeEvent.WORK_INVALIDATED, NodeEvent.SUCCESSOR_BOUND)
        ]
        if movable:
            node_id, event = data.draw(st.sampled_from(movable))
            self.transition(node_id, event, data.draw(st.sampled_from(HUMANS)))

    @rule(data=st.data())
    def legal_transition(self, data: st.DataObject) -> None:
        self._legal(data)

    @rule(data=st.data())
    def another_legal_transition(self, data: st.DataObject) -> None:
        self._legal(data)

    def transition(self, node_id: str, event: NodeEvent, actor: str) -> None:
        workflow = self.journal.workflow
        node = workflow.nodes[node_id]
        attempts = self.journal.attempts.get(node_id, ())
        last = attempts[-1] if attempts else None
        if event in (NodeEvent.WORK_STARTED, NodeEvent.RETRY_AUTHORIZED) and not (
            last is not None and last.status is j.AttemptStatus.AUTHORIZED
        ):
            attempt: j.AttemptRef | None = j.AttemptRef(f"{node_id}-a{len(attempts) + 1}", len(attempts) + 1)
        elif last is not None:
            attempt = j.AttemptRef(last.attempt_id, last.sequence)
        else:
            attempt = None
        if event is NodeEvent.DEPENDENCIES_SATISFIED:
            attempt = None
        approvals = ()
        if node.approval is not None and event is NodeEvent.WORK_COMPLETED:
            approvals = tuple(j.Approval(h, "worker", ref("approval", f"{node_id}-{h}")) for h in HUMANS)
        command = j.Transition(
            request_id=self.request(),
            expected_head=self.journal.head,
            node_id=node_id,
            event=event,
            prior_state=self.journal.states[node_id],
            actor_id=actor,
            role="worker",
            attempt=attempt,
            records=tuple(ref(a.kind, a.artifact_id) for a in node.outputs) if event is NodeEvent.WORK_COMPLETED else (),
            approvals=approvals,
            error="failed" if event is NodeEvent.WORK_FAILED else None,
        )
        outcome = self.send(command)
        state = command.prior_state
        if event in (NodeEvent.WORK_INVALIDATED, NodeEvent.SUCCESSOR_BOUND):
            assert isinstance(outcome, j.Refusal) and outcome.code is C.INVALID_REQUEST
        elif not NODE.allows(state, event):
            assert isinstance(outcome, j.Refusal) and outcome.code is C.INVALID_TRANSITION, outcome
        elif isinstance(outcome, j.Appended):
            assert outcome.events[0].resulting_state is NODE.step(state, event)

    @rule(data=st.data(), partial=st.booleans(), policy=st.sampled_from(("pol", "pol-auto", "undeclared")))
    def invalidate(self, data: st.DataObject, partial: bool, policy: str) -> None:
        journal = self.journal
        live = [n for n in journal.workflow.order if journal.states[n] not in ENDED]
        if not live:
            return
        root = data.draw(st.sampled_from(live))
        closure = [n for n in journal.workflow.closure((root,)) if journal.states[n] not in ENDED]
        named = closure
        if partial and len(closure) > 1:
            # Leave out something downstream of the root.
            named = [n for n in closure if n != data.draw(st.sampled_from(closure[1:]))]
        command = j.Invalidate(
            request_id=self.request(),
            expected_head=journal.head,
            source=ref("retraction", f"r{self.count}"),
            policy=policy,
            nodes=tuple(j.NodeExpectation(n, journal.states[n]) for n in data.draw(st.permutations(named))),
            actor_id=data.draw(st.sampled_from(ACTORS)),
            role="worker",
        )
        human_work = any(set(journal.workers.get(n, ())) & set(HUMANS) for n in closure)
        outcome = self.send(command)
        if policy == "undeclared":
            assert isinstance(outcome, j.Refusal) and outcome.code is C.UNVERIFIED_AUTHORITY, outcome
        elif named != closure:
            assert isinstance(outcome, j.Refusal) and outcome.code is C.PARTIAL_INVALIDATION
        elif command.actor_id not in HUMANS and human_work and policy == "pol":
            # Automation may undo work a human did only where the policy says so.
            assert isinstance(outcome, j.Refusal) and outcome.code is C.AUTOMATION_CLAIMS_HUMAN, outcome
        else:
            assert isinstance(outcome, j.Appended), outcome
            assert [e.node_id for e in outcome.events] == closure

    @precondition(lambda self: NodeState.INVALIDATED in self.journal.states.values())
    @rule(actor=st.sampled_from(ACTORS), successor=st.sampled_from(("x-2", "x-3", "x-9", "forged")))
    def bind_successor(self, actor: str, successor: str) -> None:
        journal = self.journal
        invalidated = [n for n in journal.workflow.order if journal.states[n] is NodeState.INVALIDATED]
        # x-2 supersedes x-1; x-3 supersedes nothing; x-9 does not exist; "forged" is x-2 under another digest.
        found = self.headers.get(successor)
        named = (
            j.RecordRef(j.SUCCESSOR_KIND, successor, found.digest)
            if found is not None
            else j.RecordRef(j.SUCCESSOR_KIND, "x-2" if successor == "forged" else successor, ref("h", successor).digest)
        )
        command = j.BindSuccessor(
            request_id=self.request(),
            expected_head=journal.head,
            successor=named,
            nodes=tuple(j.NodeExpectation(n, NodeState.INVALIDATED) for n in invalidated),
            actor_id=actor,
            role="worker",
        )
        outcome = self.send(command)
        if not invalidated:
            assert isinstance(outcome, j.Refusal) and outcome.code is C.INVALID_REQUEST
        elif actor not in HUMANS:
            assert isinstance(outcome, j.Refusal) and outcome.code is C.AUTOMATION_CLAIMS_HUMAN
        elif successor != "x-2":
            assert isinstance(outcome, j.Refusal) and outcome.code is C.BAD_SUCCESSOR_BINDING, outcome
        else:
            assert isinstance(outcome, j.Appended)
            assert {e.node_id for e in outcome.events} == set(invalidated)

    @precondition(lambda self: len(self.heads) > 1)
    @rule(data=st.data())
    def stale_writer(self, data: st.DataObject) -> None:
        old = data.draw(st.sampled_from(self.heads[:-1]))
        node_id = self.journal.workflow.order[0]
        command = j.Transition(
            self.request(), old, node_id, NodeEvent.WORK_STARTED, self.journal.states[node_id], "h1", "worker",
            attempt=j.AttemptRef("stale", 99),
        )  # fmt: skip
        outcome = self.send(command)
        assert isinstance(outcome, j.Refusal) and outcome.code is C.STALE_HEAD

    @precondition(lambda self: self.last is not None)
    @rule()
    def repeat_last_request(self) -> None:
        assert self.last is not None
        outcome = self.send(self.last)
        assert isinstance(outcome, j.Unchanged)

    @precondition(lambda self: self.journal.events)
    @rule(data=st.data())
    def single_byte_change_is_detected(self, data: st.DataObject) -> None:
        header = j.encode_header(self.journal.header)
        records = [header, *(j.encode_event(e) for e in self.journal.events)]
        index = data.draw(st.integers(0, len(records) - 1))
        record = records[index]
        position = data.draw(st.integers(0, len(record) - 1))
        replacement = data.draw(st.integers(0, 255).filter(lambda b: b != record[position]))
        records[index] = record[:position] + bytes([replacement]) + record[position + 1 :]
        try:
            j.replay(records[0], records[1:], self.journal.workflow, self.journal.policy, headers=self.headers.get)
        except JournalError as exc:
            assert exc.ordinal is not None and exc.ordinal <= index
        else:
            raise AssertionError(f"a change of byte {position} of record {index} went unnoticed")

    # --- invariants ------------------------------------------------------------------------------

    @invariant()
    def replay_equals_the_incremental_projection(self) -> None:
        journal = self.journal
        header = j.encode_header(journal.header)
        replayed = j.replay(
            header, [j.encode_event(e) for e in journal.events], journal.workflow, journal.policy, headers=self.headers.get
        )
        assert replayed.head == journal.head
        assert dict(replayed.states) == dict(journal.states)
        assert dict(replayed.attempts) == dict(journal.attempts)
        assert dict(replayed.requests) == dict(journal.requests)

    @invariant()
    def no_node_leaves_the_table(self) -> None:
        journal = self.journal
        assert set(journal.states) == set(journal.workflow.order)
        for event in journal.events:
            assert NODE.allows(event.prior_state, event.event)
            assert NODE.step(event.prior_state, event.event) is event.resulting_state

    @invariant()
    def invalidated_and_superseded_never_resume(self) -> None:
        ended: set[str] = set()
        for event in self.journal.events:
            if event.node_id in ended:
                assert (event.prior_state, event.event) == (NodeState.INVALIDATED, NodeEvent.SUCCESSOR_BOUND)
            if event.resulting_state in ENDED:
                ended.add(event.node_id)

    @invariant()
    def invalidation_covers_the_whole_closure(self) -> None:
        journal = self.journal
        for node_id, state in journal.states.items():
            if state in ENDED:
                assert all(journal.states[d] in ENDED for d in journal.workflow.closure((node_id,)))

    @invariant()
    def every_attempt_says_how_it_ended(self) -> None:
        # Only work that can still go on has an open attempt, and it matches
        # the node: ready with a retry authorized, active, or blocked.
        journal = self.journal
        open_state = {
            j.AttemptStatus.AUTHORIZED: NodeState.READY,
            j.AttemptStatus.ACTIVE: NodeState.ACTIVE,
            j.AttemptStatus.BLOCKED: NodeState.BLOCKED,
        }
        ordinals = {e.ordinal: e for e in journal.events}
        for node_id, history in journal.attempts.items():
            assert all(not a.status.is_open for a in history[:-1])
            last = history[-1]
            if last.status.is_open:
                assert journal.states[node_id] is open_state[last.status]
            elif journal.states[node_id] in (NodeState.ACTIVE, NodeState.BLOCKED):
                raise AssertionError(f"{node_id} is {journal.states[node_id].value} with no open attempt")
            for attempt in history:
                if attempt.status is j.AttemptStatus.INVALIDATED:
                    assert attempt.ended_by is not None
                    ending = ordinals[attempt.ended_by]
                    assert (ending.node_id, ending.event) == (node_id, NodeEvent.WORK_INVALIDATED)
                else:
                    assert attempt.ended_by is None


TestJournalMachine = JournalMachine.TestCase
TestJournalMachine.settings = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
