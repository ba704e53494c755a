"""The systematic review of docs/journal.md, built in code, and helpers to drive a journal.

search -> two independent human screenings -> extraction -> synthesis -> sign-off
(an approval node needing two distinct human reviewers).
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from fencekeeper.adapters import journal_fixtures as fixtures
from fencekeeper.kernel import journal as j
from fencekeeper.kernel.dag import VerifiedWorkflow, verify_workflow
from fencekeeper.kernel.machines import NodeEvent, NodeState

T0 = fixtures.T0
REVIEW = fixtures.REVIEW


def review_workflow() -> VerifiedWorkflow:
    return verify_workflow(REVIEW)


def review_policy(workflow: VerifiedWorkflow) -> j.VerifiedPolicy:
    return j.verify_policy(fixtures.review_policy(workflow), workflow)


def fresh(execution_id: str = "review-1", supersedes: str | None = None) -> j.Journal:
    workflow = review_workflow()
    policy = review_policy(workflow)
    header = j.create_header(execution_id, workflow, policy, created_by="carol", now=T0, supersedes=supersedes)
    return j.new_journal(header, workflow, policy)


def sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def ref(kind: str, ref_id: str) -> j.RecordRef:
    return j.RecordRef(kind, ref_id, sha(f"{kind}/{ref_id}"))


class Driver:
    """Appends commands to a journal, one second apart, failing loudly on a refusal."""

    def __init__(self, journal: j.Journal) -> None:
        self.journal = journal
        self.clock = T0
        self.requests = 0
        self.headers: dict[str, j.Header] = {}
        """The executions a successor binding may name, by id (the kernel's header lookup)."""

    def now(self) -> datetime:
        self.clock += timedelta(seconds=1)
        return self.clock

    def request_id(self) -> str:
        self.requests += 1
        return f"r-{self.requests}"

    def transition(self, node_id: str, event: NodeEvent, actor: str, role: str, **fields: object) -> j.Transition:
        return j.Transition(
            request_id=self.request_id(),
            expected_head=self.journal.head,
            node_id=node_id,
            event=event,
            prior_state=self.journal.states[node_id],
            actor_id=actor,
            role=role,
            **fields,  # type: ignore[arg-type]
        )

    def apply(self, command: j.Command) -> j.Outcome:
        outcome = j.preview(self.journal, command, self.now(), headers=self.headers.get)
        if isinstance(outcome, j.Appended):
            self.journal = outcome.journal
        return outcome

    def do(self, node_id: str, event: NodeEvent, actor: str, role: str, **fields: object) -> j.Appended:
        outcome = self.apply(self.transition(node_id, event, actor, role, **fields))
        assert isinstance(outcome, j.Appended), outcome
        return outcome

    def work(self, node_id: str, actor: str, role: str, records: tuple[j.RecordRef, ...], attempt: str = "") -> None:
        """Start and complete ``node_id`` (its dependencies first, if it is pending)."""
        if self.journal.states[node_id] is NodeState.PENDING:
            self.do(node_id, NodeEvent.DEPENDENCIES_SATISFIED, "bot:search", "scheduler")
        sequence = len(self.journal.attempts.get(node_id, ())) + 1
        attempt_ref = j.AttemptRef(attempt or f"{node_id}-{sequence}", sequence)
        self.do(node_id, NodeEvent.WORK_STARTED, actor, role, attempt=attempt_ref)
        self.do(node_id, NodeEvent.WORK_COMPLETED, actor, role, attempt=attempt_ref, records=records)


SIGN_OFF_APPROVALS = (
    j.Approval("alice", "reviewer", ref("approval", "alice-sign-off")),
    j.Approval("bob", "reviewer", ref("approval", "bob-sign-off")),
)


def reviewed(driver: Driver) -> Driver:
    """Run the whole review to its sign-off."""
    driver.work("search", "bot:search", "searcher", (ref("search-results", "search-results"),))
    driver.work("screen-a", "alice", "screener", (ref("screening", "screening-a"),))
    driver.work("screen-b", "bob", "screener", (ref("screening", "screening-b"),))
    driver.work("extraction", "carol", "extractor", (ref("extraction", "extraction-table"),))
    driver.work("synthesis", "carol", "synthesist", (ref("synthesis", "report"),))
    driver.do("sign-off", NodeEvent.DEPENDENCIES_SATISFIED, "bot:search", "scheduler")
    attempt = j.AttemptRef("sign-off-1", 1)
    driver.do("sign-off", NodeEvent.WORK_STARTED, "carol", "coordinator", attempt=attempt)
    driver.do(
        "sign-off", NodeEvent.WORK_COMPLETED, "carol", "coordinator", attempt=attempt, approvals=SIGN_OFF_APPROVALS
    )
    return driver


RETRACTION = ref("retraction-notice", "doi-10.1000-retracted-42")


def invalidate_screening(driver: Driver, request_id: str = "retract-42") -> j.Appended:
    journal = driver.journal
    nodes = tuple(
        j.NodeExpectation(n, journal.states[n]) for n in ("screen-a", "screen-b", "extraction", "synthesis", "sign-off")
    )
    outcome = driver.apply(
        j.Invalidate(
            request_id=request_id,
            expected_head=journal.head,
            source=RETRACTION,
            policy="retraction-policy",
            nodes=nodes,
            actor_id="carol",
            role="coordinator",
            rationale="a source included by both screenings was retracted",
        )
    )
    assert isinstance(outcome, j.Appended), outcome
    return outcome


def bind(driver: Driver, successor: j.Journal) -> j.Appended:
    journal = driver.journal
    driver.headers[successor.execution_id] = successor.header
    invalidated = tuple(
        j.NodeExpectation(n, NodeState.INVALIDATED) for n, s in journal.states.items() if s is NodeState.INVALIDATED
    )
    outcome = driver.apply(
        j.BindSuccessor(
            request_id="bind-successor",
            expected_head=journal.head,
            successor=j.RecordRef(j.SUCCESSOR_KIND, successor.execution_id, successor.header.digest),
            nodes=invalidated,
            actor_id="carol",
            role="coordinator",
            rationale="review-2 takes over from the screening onwards",
        )
    )
    assert isinstance(outcome, j.Appended), outcome
    return outcome


def stored(journal: j.Journal) -> tuple[bytes, list[bytes]]:
    return j.encode_header(journal.header), [j.encode_event(e) for e in journal.events]
