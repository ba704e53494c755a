"""The journal's rules, one refusal code at a time, on the systematic review of docs/journal.md.

Each test drives a real journal to the point where a rule matters, then
asserts the exact code and that the refused command changed nothing.
"""

from __future__ import annotations

from datetime import timedelta

import attrs
import pytest

from fencekeeper.adapters import journal_fixtures as fixtures
from fencekeeper.kernel import journal as j
from fencekeeper.kernel.canonical import digest_of
from fencekeeper.kernel.common import MAX_RATIONALE
from fencekeeper.kernel.dag import ApprovalRequirement, verify_workflow
from fencekeeper.kernel.journal_codes import JournalCode as C
from fencekeeper.kernel.journal_records import _Recorded
from fencekeeper.kernel.machines import NodeEvent, NodeState

from .examples import (
    RETRACTION,
    REVIEW,
    SIGN_OFF_APPROVALS,
    T0,
    Driver,
    bind,
    fresh,
    invalidate_screening,
    ref,
    review_workflow,
    reviewed,
    stored,
)


def refused(driver: Driver, command: j.Command, code: C) -> j.Refusal:
    before = driver.journal
    outcome = driver.apply(command)
    assert isinstance(outcome, j.Refusal), outcome
    assert outcome.code is code, outcome
    assert driver.journal is before
    return outcome


def searched() -> Driver:
    driver = Driver(fresh())
    driver.work("search", "bot:search", "searcher", (ref("search-results", "search-results"),))
    return driver


# --- starting states and the table ---------------------------------------------------------


def test_roots_start_ready_and_others_pending() -> None:
    journal = fresh()
    assert journal.states["search"] is NodeState.READY
    assert {journal.states[n] for n in ("screen-a", "screen-b", "extraction", "synthesis", "sign-off")} == {
        NodeState.PENDING
    }
    assert journal.head == journal.header.digest
    assert journal.events == ()


def test_the_whole_review_completes_every_node() -> None:
    driver = reviewed(Driver(fresh()))
    assert set(driver.journal.states.values()) == {NodeState.COMPLETED}
    # Ordinals are one-based and contiguous; each event names the one before it.
    previous = driver.journal.header.digest
    for number, event in enumerate(driver.journal.events, start=1):
        assert event.ordinal == number
        assert event.previous == previous
        previous = event.digest
    assert driver.journal.head == previous


def test_a_transition_outside_the_table_is_refused() -> None:
    driver = Driver(fresh())
    command = driver.transition("search", NodeEvent.WORK_COMPLETED, "bot:search", "searcher", attempt=j.AttemptRef("a", 1))
    refused(driver, command, C.INVALID_TRANSITION)


def test_dependencies_need_every_predecessor_completed() -> None:
    driver = Driver(fresh())
    refused(
        driver, driver.transition("screen-a", NodeEvent.DEPENDENCIES_SATISFIED, "bot:search", "scheduler"), C.DEPENDENCY_GAP
    )
    driver = searched()
    driver.work("screen-a", "alice", "screener", (ref("screening", "screening-a"),))
    # screen-b is still only pending: extraction must wait for it.
    refused(
        driver,
        driver.transition("extraction", NodeEvent.DEPENDENCIES_SATISFIED, "bot:search", "scheduler"),
        C.DEPENDENCY_GAP,
    )


def test_unknown_node() -> None:
    driver = Driver(fresh())
    command = attrs.evolve(
        driver.transition("search", NodeEvent.WORK_STARTED, "bot:search", "searcher"), node_id="meta-analysis"
    )
    refused(driver, command, C.UNKNOWN_NODE)


# --- heads, prior states and requests -----------------------------------------------------------


def test_a_stale_writer_is_refused_not_rebased() -> None:
    driver = Driver(fresh())
    stale_head = driver.journal.head
    driver.do("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=j.AttemptRef("s-1", 1))
    command = attrs.evolve(
        driver.transition("search", NodeEvent.WORK_BLOCKED, "bot:search", "searcher", attempt=j.AttemptRef("s-1", 1)),
        expected_head=stale_head,
    )
    refused(driver, command, C.STALE_HEAD)


def test_a_wrong_prior_state_is_refused() -> None:
    driver = Driver(fresh())
    command = attrs.evolve(
        driver.transition("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=j.AttemptRef("s-1", 1)),
        prior_state=NodeState.PENDING,
    )
    refused(driver, command, C.PRIOR_STATE_MISMATCH)


def test_same_request_is_idempotent_and_other_content_conflicts() -> None:
    driver = Driver(fresh())
    command = driver.transition("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=j.AttemptRef("s-1", 1))
    first = driver.apply(command)
    assert isinstance(first, j.Appended)
    # The repeat carries the head it was first sent with: still a repeat, not stale.
    again = driver.apply(command)
    assert isinstance(again, j.Unchanged)
    assert again.journal is driver.journal
    assert len(driver.journal.events) == 1
    # The time is the record's, not the request's: a repeat later is still a repeat.
    assert j.preview(driver.journal, command, T0.replace(year=2027)) == j.Unchanged(
        driver.journal, command.request_id, first.events
    )
    refused(driver, attrs.evolve(command, rationale="different"), C.CONFLICTING_REQUEST)


def test_append_returns_the_same_journal_for_a_repeat() -> None:
    journal = fresh()
    command = j.Transition("r", journal.head, "search", NodeEvent.WORK_STARTED, NodeState.READY, "bot:search", "searcher",
                           attempt=j.AttemptRef("s-1", 1))  # fmt: skip
    once = j.append(journal, command, T0)
    assert isinstance(once, j.Journal)
    assert j.append(once, command, T0) is once


def test_naive_time_and_malformed_fields_are_invalid_requests() -> None:
    driver = Driver(fresh())
    command = driver.transition("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=j.AttemptRef("s-1", 1))
    outcome = j.preview(driver.journal, command, T0.replace(tzinfo=None))
    assert isinstance(outcome, j.Refusal)
    assert outcome.code is C.INVALID_REQUEST
    for bad in (
        attrs.evolve(command, request_id=" spaced"),
        attrs.evolve(command, expected_head="sha256:XYZ"),
        attrs.evolve(command, records=(j.RecordRef("k", "i", "md5:00"),)),
        attrs.evolve(command, event=NodeEvent.WORK_INVALIDATED),
    ):
        refused(driver, bad, C.INVALID_REQUEST)


def test_a_field_not_of_its_type_is_an_invalid_request_never_an_exception_or_an_unreplayable_record() -> None:
    # Before: None or another type raised an AttributeError or a TypeError
    # from the identifier match, and a boolean attempt sequence or a
    # rationale that is no string was appended, as a record replay then
    # refuses (malformed_record).
    driver = Driver(fresh())
    command = driver.transition("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=j.AttemptRef("s-1", 1))
    cases: tuple[tuple[object, str], ...] = (
        (None, "command: "),
        ("transition", "command: "),
        (attrs.evolve(command, request_id=None), "request_id: "),
        (attrs.evolve(command, node_id=7), "node: "),
        (attrs.evolve(command, actor_id=["bot:search"]), "actor: "),
        (attrs.evolve(command, event="work-started"), "event: "),
        (attrs.evolve(command, prior_state="ready"), "prior_state: "),
        (attrs.evolve(command, attempt=("s-1", 1)), "attempt: "),
        (attrs.evolve(command, attempt=j.AttemptRef("s-1", True)), "attempt sequence True"),
        (attrs.evolve(command, records="records"), "records: "),
        (attrs.evolve(command, records=(("k", "i", "d"),)), "records: "),
        (attrs.evolve(command, rationale=None), "rationale: "),
        (attrs.evolve(command, rationale=5), "rationale: "),
    )
    for bad, message in cases:
        refusal = refused(driver, bad, C.INVALID_REQUEST)  # type: ignore[arg-type]
        assert refusal.message.startswith(message), refusal.message
    invalidation = j.Invalidate(
        request_id="inv-1", expected_head=driver.journal.head, source=RETRACTION, policy="retraction",
        nodes=(j.NodeExpectation("search", "ready"),), actor_id="carol", role="lead",  # type: ignore[arg-type]
    )
    assert refused(driver, invalidation, C.INVALID_REQUEST).message.startswith("nodes: prior_state: ")
    # A list where a tuple is declared was always taken, and replays: it still is.
    listed = driver.apply(attrs.evolve(command, records=[ref("search-results", "s")]))
    assert isinstance(listed, j.Appended)
    assert j.replay(*stored(listed.journal), listed.journal.workflow, listed.journal.policy).head == listed.journal.head


def test_a_lone_surrogate_in_free_text_is_an_invalid_request_naming_the_field() -> None:
    # Before: it passed every check, then the request digest could not be
    # encoded (a surrogate has no UTF-8 form), and the refusal was a
    # malformed_record naming a character position, not the field.
    driver = Driver(fresh())
    start = j.AttemptRef("s-1", 1)
    command = driver.transition("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=start)
    refusal = refused(driver, attrs.evolve(command, rationale="retried \ud800"), C.INVALID_REQUEST)
    assert refusal.message == "rationale: contains an unpaired surrogate (U+D800), which is not a character"
    driver.do("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=start)
    failed = driver.transition("search", NodeEvent.WORK_FAILED, "bot:search", "searcher", attempt=start, error="x\udfff")
    assert refused(driver, failed, C.INVALID_REQUEST).message.startswith("error: contains an unpaired surrogate (U+DFFF)")
    invalidation = j.Invalidate(
        request_id="inv-1", expected_head=driver.journal.head, source=RETRACTION, policy="retraction-policy",
        nodes=(j.NodeExpectation("search", NodeState.ACTIVE),), actor_id="carol", role="coordinator", rationale="\udc00",
    )  # fmt: skip
    assert refused(driver, invalidation, C.INVALID_REQUEST).message.startswith("rationale: ")
    # NUL is text a record keeps (escaped in its canonical bytes), and replays.
    kept = driver.apply(attrs.evolve(failed, error="x\x00y", rationale="a\x00b"))
    assert isinstance(kept, j.Appended)
    assert j.replay(*stored(kept.journal), kept.journal.workflow, kept.journal.policy).head == kept.journal.head


def test_free_text_over_the_bound_is_an_invalid_request_naming_the_field() -> None:
    # Before: a rationale or error of any length was appended (ten megabytes
    # went into a record), where every other free text is bounded.
    driver = Driver(fresh())
    start = j.AttemptRef("s-1", 1)
    command = driver.transition("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=start)
    for length in (MAX_RATIONALE + 1, 10_000_000):
        refusal = refused(driver, attrs.evolve(command, rationale="x" * length), C.INVALID_REQUEST)
        assert refusal.message == f"rationale: must be at most {MAX_RATIONALE} characters, got {length}"
    # Characters, not bytes or UTF-16 code units: 2000 of U+1F50D is 8000 bytes and is admitted.
    assert isinstance(driver.apply(attrs.evolve(command, rationale="\U0001f50d" * MAX_RATIONALE)), j.Appended)
    failed = driver.transition("search", NodeEvent.WORK_FAILED, "bot:search", "searcher", attempt=start, error="e")
    refusal = refused(driver, attrs.evolve(failed, error="e" * (MAX_RATIONALE + 1)), C.INVALID_REQUEST)
    assert refusal.message == f"error: must be at most {MAX_RATIONALE} characters, got {MAX_RATIONALE + 1}"
    # A batch's rationale too, whatever it invalidates or binds.
    invalidation = j.Invalidate(
        request_id="inv-1", expected_head=driver.journal.head, source=RETRACTION, policy="retraction-policy",
        nodes=tuple(j.NodeExpectation(n, s) for n, s in driver.journal.states.items()), actor_id="carol",
        role="coordinator", rationale="r" * (MAX_RATIONALE + 1),
    )  # fmt: skip
    assert refused(driver, invalidation, C.INVALID_REQUEST).message.startswith("rationale: must be at most")
    # At the bound, NUL included (a record keeps it escaped), it is appended and replays.
    kept = driver.apply(attrs.evolve(failed, error="e\x00" * (MAX_RATIONALE // 2), rationale="r" * MAX_RATIONALE))
    assert isinstance(kept, j.Appended)
    assert j.replay(*stored(kept.journal), kept.journal.workflow, kept.journal.policy).head == kept.journal.head
    appended = driver.apply(
        attrs.evolve(
            invalidation,
            expected_head=driver.journal.head,
            nodes=tuple(j.NodeExpectation(n, s) for n, s in driver.journal.states.items()),
            rationale="r" * MAX_RATIONALE,
        )
    )
    assert isinstance(appended, j.Appended)
    binding = j.BindSuccessor(
        request_id="bind-1", expected_head=driver.journal.head,
        successor=j.RecordRef(j.SUCCESSOR_KIND, "review-2", fresh("review-2", supersedes="review-1").header.digest),
        nodes=tuple(j.NodeExpectation(n, NodeState.INVALIDATED) for n in driver.journal.workflow.order),
        actor_id="carol", role="coordinator", rationale="b" * (MAX_RATIONALE + 1),
    )  # fmt: skip
    driver.headers["review-2"] = fresh("review-2", supersedes="review-1").header
    assert refused(driver, binding, C.INVALID_REQUEST).message.startswith("rationale: must be at most")


def test_a_chain_stored_with_longer_text_replays_and_its_requests_are_still_repeats() -> None:
    # The bound is an append-time check: replay reads what was appended.
    journal = fixtures.written_before_the_bound().journal
    failure = next(e for e in journal.events if e.event is NodeEvent.WORK_FAILED)
    assert min(len(failure.rationale), len(failure.error or "")) > MAX_RATIONALE
    header, events = stored(journal)
    replayed = j.replay(header, events, journal.workflow, journal.policy)
    assert (replayed.head, dict(replayed.states), dict(replayed.attempts)) == (
        journal.head, dict(journal.states), dict(journal.attempts)
    )
    prefix = j.replay(header, events[:1], journal.workflow, journal.policy)
    assert j.continue_replay(prefix, events[1:]).head == journal.head
    # The failure sent again, as it was first sent, is a repeat; its id with
    # other content a conflict; the same text under a new id is refused.
    again = j.Transition(
        request_id=failure.request_id, expected_head=failure.previous, node_id="search", event=NodeEvent.WORK_FAILED,
        prior_state=NodeState.ACTIVE, actor_id=failure.actor_id, role=failure.role, rationale=failure.rationale,
        attempt=failure.attempt, error=failure.error,
    )  # fmt: skip
    assert j.request_digest(again) == failure.request_digest
    driver = Driver(replayed)
    assert isinstance(driver.apply(again), j.Unchanged)
    refused(driver, attrs.evolve(again, error="index timed out"), C.CONFLICTING_REQUEST)
    new = attrs.evolve(again, request_id="new-1", expected_head=replayed.head, prior_state=NodeState.COMPLETED)
    assert refused(driver, new, C.INVALID_REQUEST).message.startswith("rationale: must be at most")


def test_an_attempt_sequence_too_long_to_print_is_refused_not_raised() -> None:
    # Before: the out-of-range refusal wrote the number with str(), which
    # raises ValueError past 4300 digits: preview raised instead of refusing.
    driver = Driver(fresh())
    command = driver.transition("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=j.AttemptRef("s-1", 1))
    for sequence in (10**5000, -(10**5000)):
        refusal = refused(driver, attrs.evolve(command, attempt=j.AttemptRef("s-1", sequence)), C.INVALID_REQUEST)
        assert refusal.message == "attempt sequence <int too large to show> is out of range", refusal.message[:200]


# --- attempts ------------------------------------------------------------------------------------


def test_attempts_bind_id_and_sequence_and_retries_keep_the_failure() -> None:
    driver = Driver(fresh())
    first = j.AttemptRef("s-1", 1)
    refused(
        driver,
        driver.transition("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=j.AttemptRef("s-1", 2)),
        C.INVALID_ATTEMPT,
    )
    refused(driver, driver.transition("search", NodeEvent.WORK_STARTED, "bot:search", "searcher"), C.INVALID_ATTEMPT)
    driver.do("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=first)
    refused(
        driver,
        driver.transition("search", NodeEvent.WORK_FAILED, "bot:search", "searcher", attempt=j.AttemptRef("s-2", 2), error="x"),
        C.INVALID_ATTEMPT,
    )
    refused(driver, driver.transition("search", NodeEvent.WORK_FAILED, "bot:search", "searcher", attempt=first), C.INVALID_REQUEST)
    driver.do("search", NodeEvent.WORK_FAILED, "bot:search", "searcher", attempt=first, error="index timed out")
    # A retry cannot reuse the failed attempt's id, and is a new attempt #2.
    refused(
        driver,
        driver.transition("search", NodeEvent.RETRY_AUTHORIZED, "bot:search", "searcher", attempt=j.AttemptRef("s-1", 2)),
        C.INVALID_ATTEMPT,
    )
    second = j.AttemptRef("s-2", 2)
    driver.do("search", NodeEvent.RETRY_AUTHORIZED, "bot:search", "searcher", attempt=second)
    refused(
        driver,
        driver.transition("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=j.AttemptRef("s-3", 3)),
        C.INVALID_ATTEMPT,
    )
    driver.do("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=second)
    driver.do("search", NodeEvent.WORK_BLOCKED, "bot:search", "searcher", attempt=second)
    driver.do("search", NodeEvent.BLOCK_CLEARED, "bot:search", "searcher", attempt=second)
    driver.do(
        "search", NodeEvent.WORK_COMPLETED, "bot:search", "searcher", attempt=second,
        records=(ref("search-results", "search-results"),),
    )  # fmt: skip
    history = j.attempt_history(driver.journal, "search")
    assert history == (
        j.Attempt("s-1", 1, j.AttemptStatus.FAILED, "index timed out"),
        j.Attempt("s-2", 2, j.AttemptStatus.COMPLETED),
    )


# --- people, roles and outputs ---------------------------------------------------------------


def test_roles_must_be_granted_by_the_policy_and_admitted_by_the_node() -> None:
    driver = searched()
    driver.do("screen-a", NodeEvent.DEPENDENCIES_SATISFIED, "bot:search", "scheduler")
    attempt = j.AttemptRef("a-1", 1)
    # mallory is nobody; bob is a screener but not an extractor; carol is an extractor but the node wants screeners.
    refused(driver, driver.transition("screen-a", NodeEvent.WORK_STARTED, "mallory", "screener", attempt=attempt), C.FORGED_ROLE)
    refused(driver, driver.transition("screen-a", NodeEvent.WORK_STARTED, "bob", "extractor", attempt=attempt), C.FORGED_ROLE)
    refused(driver, driver.transition("screen-a", NodeEvent.WORK_STARTED, "carol", "extractor", attempt=attempt), C.FORGED_ROLE)


def test_automation_cannot_claim_human_authority() -> None:
    driver = searched()
    driver.do("screen-a", NodeEvent.DEPENDENCIES_SATISFIED, "bot:search", "scheduler")
    # bot:extract holds the screener role, but a human node needs a human.
    refused(
        driver,
        driver.transition("screen-a", NodeEvent.WORK_STARTED, "bot:extract", "screener", attempt=j.AttemptRef("a-1", 1)),
        C.AUTOMATION_CLAIMS_HUMAN,
    )


def test_the_two_screenings_are_done_by_different_people() -> None:
    driver = searched()
    driver.work("screen-a", "alice", "screener", (ref("screening", "screening-a"),))
    driver.do("screen-b", NodeEvent.DEPENDENCIES_SATISFIED, "bot:search", "scheduler")
    outcome = refused(
        driver,
        driver.transition("screen-b", NodeEvent.WORK_STARTED, "alice", "screener", attempt=j.AttemptRef("b-1", 1)),
        C.NOT_INDEPENDENT,
    )
    assert "screen-a" in outcome.message
    driver.do("screen-b", NodeEvent.WORK_STARTED, "bob", "screener", attempt=j.AttemptRef("b-1", 1))
    assert driver.journal.workers == {"search": {"bot:search"}, "screen-a": {"alice"}, "screen-b": {"bob"}}


def test_a_batch_names_some_node_and_none_twice_and_a_completion_each_record_once() -> None:
    # specs/journal.md, section 6, rule 1: shape, before the head or any node is looked at.
    driver = searched()
    stale = "sha256:" + "0" * 64
    for nodes in ((), (j.NodeExpectation("search", NodeState.COMPLETED),) * 2):
        refused(
            driver,
            j.Invalidate(request_id="x", expected_head=stale, source=RETRACTION, policy="retraction-policy",
                         nodes=nodes, actor_id="carol", role="coordinator"),
            C.INVALID_REQUEST,
        )  # fmt: skip
        refused(
            driver,
            j.BindSuccessor(request_id="y", expected_head=stale, successor=j.RecordRef("execution", "review-2", stale),
                            nodes=nodes, actor_id="carol", role="coordinator"),
            C.INVALID_REQUEST,
        )  # fmt: skip
    driver.do("screen-a", NodeEvent.DEPENDENCIES_SATISFIED, "bot:search", "scheduler")
    attempt = j.AttemptRef("a-1", 1)
    driver.do("screen-a", NodeEvent.WORK_STARTED, "alice", "screener", attempt=attempt)
    refused(
        driver,
        attrs.evolve(driver.transition("screen-a", NodeEvent.WORK_COMPLETED, "alice", "screener", attempt=attempt,
                                       records=(ref("screening", "screening-a"),) * 2), expected_head=stale),
        C.INVALID_REQUEST,
    )  # fmt: skip


def test_invalidating_or_binding_is_not_work_independence_limits() -> None:
    # specs/journal.md, section 6, rule 5: independence is checked on transitions only; undoing
    # work is not doing it (section 3), so alice, who screened screen-a, may invalidate screen-b's
    # screening and its descendants under a policy admitting her role, and is not thereby one
    # who has worked on screen-b.
    workflow = review_workflow()
    declared = fixtures.review_policy(workflow)
    recall = j.InvalidationPolicy("screening-recall", ("screener",))
    policy = j.verify_policy(
        attrs.evolve(declared, invalidation_policies=(*declared.invalidation_policies, recall)), workflow
    )
    header = j.create_header("review-1", workflow, policy, created_by="carol", now=T0)
    driver = Driver(j.new_journal(header, workflow, policy))
    driver.work("search", "bot:search", "searcher", (ref("search-results", "search-results"),))
    driver.work("screen-a", "alice", "screener", (ref("screening", "screening-a"),))
    driver.work("screen-b", "bob", "screener", (ref("screening", "screening-b"),))
    journal = driver.journal
    outcome = driver.apply(
        j.Invalidate(
            request_id="recall-b",
            expected_head=journal.head,
            source=ref("recall-notice", "screening-b"),
            policy="screening-recall",
            nodes=(
                j.NodeExpectation("screen-b", NodeState.COMPLETED),
                *(j.NodeExpectation(n, NodeState.PENDING) for n in ("extraction", "synthesis", "sign-off")),
            ),
            actor_id="alice",
            role="screener",
        )
    )
    assert isinstance(outcome, j.Appended), outcome
    assert [e.node_id for e in outcome.events] == ["screen-b", "extraction", "synthesis", "sign-off"]
    assert driver.journal.workers["screen-b"] == {"bob"}
    assert "extraction" not in driver.journal.workers
    chain = fixtures.lines(driver.journal)
    assert j.replay(chain[0], chain[1:], workflow, policy).head == driver.journal.head


def test_hybrid_work_may_be_automated_but_only_a_human_completes_it() -> None:
    driver = searched()
    driver.work("screen-a", "alice", "screener", (ref("screening", "screening-a"),))
    driver.work("screen-b", "bob", "screener", (ref("screening", "screening-b"),))
    driver.do("extraction", NodeEvent.DEPENDENCIES_SATISFIED, "bot:search", "scheduler")
    attempt = j.AttemptRef("x-1", 1)
    driver.do("extraction", NodeEvent.WORK_STARTED, "bot:extract", "extractor", attempt=attempt)
    records = (ref("extraction", "extraction-table"),)
    refused(
        driver,
        driver.transition("extraction", NodeEvent.WORK_COMPLETED, "bot:extract", "extractor", attempt=attempt, records=records),
        C.AUTOMATION_CLAIMS_HUMAN,
    )
    driver.do("extraction", NodeEvent.WORK_COMPLETED, "carol", "extractor", attempt=attempt, records=records)


def test_completion_must_reference_every_declared_output() -> None:
    driver = Driver(fresh())
    attempt = j.AttemptRef("s-1", 1)
    driver.do("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=attempt)
    refused(
        driver,
        driver.transition("search", NodeEvent.WORK_COMPLETED, "bot:search", "searcher", attempt=attempt,
                          records=(ref("search-results", "another-id"),)),
        C.MISSING_DECLARED_OUTPUT,
    )  # fmt: skip


def _at_sign_off() -> tuple[Driver, j.AttemptRef]:
    driver = searched()
    driver.work("screen-a", "alice", "screener", (ref("screening", "screening-a"),))
    driver.work("screen-b", "bob", "screener", (ref("screening", "screening-b"),))
    driver.work("extraction", "carol", "extractor", (ref("extraction", "extraction-table"),))
    driver.work("synthesis", "carol", "synthesist", (ref("synthesis", "report"),))
    driver.do("sign-off", NodeEvent.DEPENDENCIES_SATISFIED, "bot:search", "scheduler")
    attempt = j.AttemptRef("o-1", 1)
    driver.do("sign-off", NodeEvent.WORK_STARTED, "carol", "coordinator", attempt=attempt)
    return driver, attempt


@pytest.mark.parametrize(
    ("approvals", "code"),
    [
        ((), C.INVALID_APPROVAL),  # below the minimum
        (SIGN_OFF_APPROVALS[:1], C.INVALID_APPROVAL),
        ((SIGN_OFF_APPROVALS[0], j.Approval("alice", "reviewer", ref("approval", "alice-again"))),
         C.INVALID_APPROVAL),  # not distinct
        ((SIGN_OFF_APPROVALS[0], j.Approval("bot:extract", "reviewer", ref("approval", "bot"))), C.INVALID_APPROVAL),
        ((SIGN_OFF_APPROVALS[0], j.Approval("carol", "coordinator", ref("approval", "c"))), C.INVALID_APPROVAL),
        ((SIGN_OFF_APPROVALS[0], j.Approval("carol", "reviewer", ref("approval", "c"))), C.FORGED_ROLE),
    ],
    ids=["none", "one", "same-actor-twice", "automation", "missing-required-role", "forged-role"],
)
def test_approval_rules(approvals: tuple[j.Approval, ...], code: C) -> None:
    driver, attempt = _at_sign_off()
    command = driver.transition(
        "sign-off", NodeEvent.WORK_COMPLETED, "carol", "coordinator", attempt=attempt, approvals=approvals
    )
    refused(driver, command, code)


def test_an_approval_counts_once_however_often_it_is_given() -> None:
    # One approval record stands for one decision: two approvers cannot share it.
    driver, attempt = _at_sign_off()
    shared = ref("approval", "one-sign-off")
    approvals = (j.Approval("alice", "reviewer", shared), j.Approval("bob", "reviewer", shared))
    command = driver.transition("sign-off", NodeEvent.WORK_COMPLETED, "carol", "coordinator", attempt=attempt,
                                approvals=approvals)  # fmt: skip
    assert "approval/one-sign-off" in refused(driver, command, C.INVALID_APPROVAL).message

    # Without distinct actors an actor may approve in each of two roles, but
    # an approval in one role given twice is still one approval.
    requirement = ApprovalRequirement(minimum=2, roles=(), distinct_actors=False, human_only=True)
    nodes = tuple(attrs.evolve(n, approval=requirement) if n.node_id == "sign-off" else n for n in REVIEW.nodes)
    workflow = verify_workflow(attrs.evolve(REVIEW, nodes=nodes))
    base = driver.journal.policy.policy
    assignments = tuple(
        attrs.evolve(a, roles=(*a.roles, "coordinator")) if a.actor_id == "alice" else a for a in base.assignments
    )
    policy = j.verify_policy(attrs.evolve(base, workflow_digest=workflow.digest, assignments=assignments), workflow)
    other = Driver(j.new_journal(j.create_header("review-8", workflow, policy, created_by="carol", now=T0),
                                 workflow, policy))  # fmt: skip
    other.work("search", "bot:search", "searcher", (ref("search-results", "search-results"),))
    other.work("screen-a", "alice", "screener", (ref("screening", "screening-a"),))
    other.work("screen-b", "bob", "screener", (ref("screening", "screening-b"),))
    other.work("extraction", "carol", "extractor", (ref("extraction", "extraction-table"),))
    other.work("synthesis", "carol", "synthesist", (ref("synthesis", "report"),))
    other.do("sign-off", NodeEvent.DEPENDENCIES_SATISFIED, "bot:search", "scheduler")
    attempt = j.AttemptRef("o-1", 1)
    other.do("sign-off", NodeEvent.WORK_STARTED, "carol", "coordinator", attempt=attempt)
    twice = (j.Approval("alice", "reviewer", ref("approval", "a-1")), j.Approval("alice", "reviewer", ref("approval", "a-2")))
    command = other.transition("sign-off", NodeEvent.WORK_COMPLETED, "carol", "coordinator", attempt=attempt,
                               approvals=twice)  # fmt: skip
    assert "'alice'" in refused(other, command, C.INVALID_APPROVAL).message
    both_roles = (twice[0], j.Approval("alice", "coordinator", ref("approval", "a-2")))
    appended = other.apply(attrs.evolve(command, approvals=both_roles))
    assert isinstance(appended, j.Appended), appended


def test_approvals_on_a_node_that_is_not_an_approval_node_are_refused() -> None:
    driver = Driver(fresh())
    attempt = j.AttemptRef("s-1", 1)
    driver.do("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=attempt)
    refused(
        driver,
        driver.transition("search", NodeEvent.WORK_COMPLETED, "bot:search", "searcher", attempt=attempt,
                          records=(ref("search-results", "search-results"),), approvals=SIGN_OFF_APPROVALS[:1]),
        C.INVALID_APPROVAL,
    )  # fmt: skip


# --- invalidation and successors ------------------------------------------------------------


def test_invalidation_covers_the_closure_in_topological_order() -> None:
    driver = reviewed(Driver(fresh()))
    appended = invalidate_screening(driver)
    assert [e.node_id for e in appended.events] == ["screen-a", "screen-b", "extraction", "synthesis", "sign-off"]
    assert {e.request_id for e in appended.events} == {"retract-42"}
    assert all(e.invalidation == j.Invalidation(RETRACTION, "retraction-policy") for e in appended.events)
    assert driver.journal.states["search"] is NodeState.COMPLETED
    for node_id in ("screen-a", "screen-b", "extraction", "synthesis", "sign-off"):
        assert driver.journal.states[node_id] is NodeState.INVALIDATED


def test_a_partial_invalidation_batch_is_refused() -> None:
    driver = reviewed(Driver(fresh()))
    journal = driver.journal
    command = j.Invalidate(
        request_id="retract-partial",
        expected_head=journal.head,
        source=RETRACTION,
        policy="retraction-policy",
        nodes=(j.NodeExpectation("screen-a", NodeState.COMPLETED), j.NodeExpectation("extraction", NodeState.COMPLETED)),
        actor_id="carol",
        role="coordinator",
    )
    outcome = refused(driver, command, C.PARTIAL_INVALIDATION)
    assert "synthesis" in outcome.message and "sign-off" in outcome.message


def _invalidation(driver: Driver, **changes: object) -> j.Invalidate:
    journal = driver.journal
    closure = [n for n in journal.workflow.closure(("screen-a", "screen-b")) if journal.states[n] is not NodeState.INVALIDATED]
    command = j.Invalidate(
        request_id="retract",
        expected_head=journal.head,
        source=RETRACTION,
        policy="retraction-policy",
        nodes=tuple(j.NodeExpectation(n, journal.states[n]) for n in closure),
        actor_id="carol",
        role="coordinator",
    )
    return attrs.evolve(command, **changes)  # type: ignore[arg-type]


def test_only_a_declared_policy_and_the_roles_it_admits_may_invalidate() -> None:
    driver = reviewed(Driver(fresh()))
    # The case this rule exists for: the search bot, in its own role, under a policy it made up.
    refused(driver, _invalidation(driver, actor_id="bot:search", role="searcher", policy="anything-at-all"),
            C.UNVERIFIED_AUTHORITY)  # fmt: skip
    refused(driver, _invalidation(driver, policy="anything-at-all"), C.UNVERIFIED_AUTHORITY)
    # A declared policy, in a role it does not admit (though the actor holds it) ...
    refused(driver, _invalidation(driver, actor_id="bot:search", role="searcher"), C.FORGED_ROLE)
    refused(driver, _invalidation(driver, role="synthesist"), C.FORGED_ROLE)
    # ... or in an admitted role the actor does not hold.
    refused(driver, _invalidation(driver, actor_id="alice"), C.FORGED_ROLE)
    # Automation in an admitted role may not undo work humans did ...
    outcome = refused(driver, _invalidation(driver, actor_id="bot:search", role="scheduler", policy="index-withdrawal"),
                      C.AUTOMATION_CLAIMS_HUMAN)  # fmt: skip
    assert "screen-a" in outcome.message
    # ... a human in that role may.
    appended = driver.apply(_invalidation(driver, role="scheduler", policy="index-withdrawal"))
    assert isinstance(appended, j.Appended), appended


def test_automation_may_invalidate_work_no_human_did_or_where_the_policy_says_so() -> None:
    driver = Driver(fresh())
    driver.work("search", "bot:search", "searcher", (ref("search-results", "search-results"),))
    # Nothing downstream of the search has been worked on: the bot may withdraw it all.
    journal = driver.journal
    everything = tuple(j.NodeExpectation(n, journal.states[n]) for n in journal.workflow.order)
    appended = driver.apply(_invalidation(driver, actor_id="bot:search", role="scheduler", policy="index-withdrawal",
                                          nodes=everything))  # fmt: skip
    assert isinstance(appended, j.Appended), appended

    lenient = attrs.evolve(
        driver.journal.policy.policy,
        invalidation_policies=(j.InvalidationPolicy("bot-retraction", ("searcher",), automation_may_invalidate_human_work=True),),
    )
    workflow = driver.journal.workflow
    policy = j.verify_policy(lenient, workflow)
    other = reviewed(Driver(j.new_journal(j.create_header("review-7", workflow, policy, created_by="carol", now=T0),
                                          workflow, policy)))  # fmt: skip
    appended = other.apply(_invalidation(other, actor_id="bot:search", role="searcher", policy="bot-retraction"))
    assert isinstance(appended, j.Appended), appended
    assert driver.journal.policy.digest != policy.digest


def test_invalidation_policies_are_verified_and_keep_an_undeclaring_policy_s_digest() -> None:
    journal = fresh()
    workflow, policy = journal.workflow, journal.policy.policy
    for declared in (
        (j.InvalidationPolicy("p", ()),),
        (j.InvalidationPolicy("p", ("coordinator",)), j.InvalidationPolicy("p", ("scheduler",))),
        (j.InvalidationPolicy("p", ("a role",)),),
        (j.InvalidationPolicy("p", ("coordinator", "coordinator")),),
    ):
        with pytest.raises(j.JournalError) as caught:
            j.verify_policy(attrs.evolve(policy, invalidation_policies=declared), workflow)
        assert caught.value.reason is C.UNVERIFIED_AUTHORITY
    # A policy that declares none is written, and digested, without the member.
    bare = attrs.evolve(policy, invalidation_policies=())
    assert "invalidation_policies" not in bare.to_json()
    assert j.policy_from_json(bare.to_json()) == bare
    assert j.policy_from_json(policy.to_json()) == policy
    # An input file may leave out the flag: automation then may not undo human work.
    value = {**bare.to_json(), "invalidation_policies": [{"policy": "p", "roles": ["coordinator"]}]}
    assert j.policy_from_json(value).invalidation_policies == (j.InvalidationPolicy("p", ("coordinator",)),)
    with pytest.raises(j.JournalError) as caught:
        j.policy_from_json({**value, "invalidation_policies": [{"policy": "p", "roles": [], "automation_may_invalidate_human_work": 1}]})
    assert caught.value.reason is C.MALFORMED_RECORD


def test_invalidated_and_superseded_nodes_never_resume() -> None:
    driver = reviewed(Driver(fresh()))
    invalidate_screening(driver)
    for event in NodeEvent:
        if event in (NodeEvent.WORK_INVALIDATED, NodeEvent.SUCCESSOR_BOUND):
            continue
        refused(
            driver,
            driver.transition("extraction", event, "carol", "extractor", attempt=j.AttemptRef("x-9", 9)),
            C.INVALID_TRANSITION,
        )
    bind(driver, fresh("review-2", supersedes="review-1"))
    assert driver.journal.states["extraction"] is NodeState.SUPERSEDED
    refused(
        driver,
        driver.transition("extraction", NodeEvent.RETRY_AUTHORIZED, "carol", "extractor", attempt=j.AttemptRef("x-9", 2)),
        C.INVALID_TRANSITION,
    )


def test_a_node_still_completed_after_a_successor_binding_may_be_invalidated_and_bound_in_its_turn() -> None:
    # Seed 002: successor-bound supersedes invalidated nodes, and the table
    # has work-invalidated from completed with no condition on a binding
    # elsewhere; a binding ends its nodes, not the execution.  Refusing the
    # invalidation would keep a search found wrong appearing current.
    driver = reviewed(Driver(fresh()))
    invalidate_screening(driver)
    bind(driver, fresh("review-2", supersedes="review-1"))
    downstream = ("screen-a", "screen-b", "extraction", "synthesis", "sign-off")
    assert driver.journal.states["search"] is NodeState.COMPLETED
    search_attempts = driver.journal.attempts["search"]

    def withdrawal(*nodes: tuple[str, NodeState]) -> j.Invalidate:
        return j.Invalidate(
            request_id=f"withdraw-{len(driver.journal.events)}-{len(nodes)}", expected_head=driver.journal.head,
            source=ref("index-withdrawal-notice", "index-1"), policy="index-withdrawal",
            nodes=tuple(j.NodeExpectation(n, s) for n, s in nodes), actor_id="bot:search", role="scheduler",
        )  # fmt: skip

    # What a binding superseded has no event left: it is never invalidated again.
    refused(driver, withdrawal(("extraction", NodeState.SUPERSEDED)), C.INVALID_TRANSITION)
    refused(driver, withdrawal(("search", NodeState.COMPLETED), ("screen-a", NodeState.SUPERSEDED)), C.INVALID_TRANSITION)
    # The search, still completed, is invalidated alone: its descendants are superseded, no longer current.
    appended = driver.apply(withdrawal(("search", NodeState.COMPLETED)))
    assert isinstance(appended, j.Appended)
    assert [(e.node_id, e.event) for e in appended.events] == [("search", NodeEvent.WORK_INVALIDATED)]
    assert driver.journal.states["search"] is NodeState.INVALIDATED
    assert all(driver.journal.states[n] is NodeState.SUPERSEDED for n in downstream)
    assert driver.journal.attempts["search"] == search_attempts
    # A binding must name it, and only it (the superseded nodes are no longer invalidated).
    successor = fresh("review-2", supersedes="review-1").header
    binding = j.BindSuccessor(
        request_id="bind-search", expected_head=driver.journal.head,
        successor=j.RecordRef(j.SUCCESSOR_KIND, "review-2", successor.digest),
        nodes=(j.NodeExpectation("search", NodeState.INVALIDATED), j.NodeExpectation("screen-a", NodeState.INVALIDATED)),
        actor_id="carol", role="coordinator",
    )  # fmt: skip
    refused(driver, binding, C.PRIOR_STATE_MISMATCH)
    bound = driver.apply(attrs.evolve(binding, nodes=binding.nodes[:1]))
    assert isinstance(bound, j.Appended)
    assert [(e.node_id, e.event) for e in bound.events] == [("search", NodeEvent.SUCCESSOR_BOUND)]
    assert set(driver.journal.states.values()) == {NodeState.SUPERSEDED}
    replayed = j.replay(*stored(driver.journal), driver.journal.workflow, driver.journal.policy, headers=driver.headers.get)
    assert (replayed.head, dict(replayed.states)) == (driver.journal.head, dict(driver.journal.states))


def _screening_under_way(how: str) -> Driver:
    """The search done and screen-a's work under way: ``active``, ``blocked``, or a retry ``authorized``."""
    driver = Driver(fresh())
    driver.work("search", "bot:search", "searcher", (ref("search-results", "search-results"),))
    driver.do("screen-a", NodeEvent.DEPENDENCIES_SATISFIED, "bot:search", "scheduler")
    first = j.AttemptRef("screen-a-1", 1)
    driver.do("screen-a", NodeEvent.WORK_STARTED, "alice", "screener", attempt=first)
    if how == "blocked":
        driver.do("screen-a", NodeEvent.WORK_BLOCKED, "alice", "screener", attempt=first)
    elif how == "authorized":
        driver.do("screen-a", NodeEvent.WORK_FAILED, "alice", "screener", attempt=first, error="full text unreadable")
        driver.do("screen-a", NodeEvent.RETRY_AUTHORIZED, "alice", "screener", attempt=j.AttemptRef("screen-a-2", 2))
    return driver


@pytest.mark.parametrize("how", ["active", "blocked", "authorized"])
def test_an_attempt_cut_off_by_invalidation_ends_invalidated_by_that_event(how: str) -> None:
    driver = _screening_under_way(how)
    before = driver.journal.attempts["screen-a"]
    assert before[-1].status.value == how
    appended = invalidate_screening(driver)
    ending = next(e.ordinal for e in appended.events if e.node_id == "screen-a")
    after = driver.journal.attempts["screen-a"]
    # The attempt under way ends, said so and where; every earlier attempt is kept as it was.
    assert after[:-1] == before[:-1]
    assert after[-1] == attrs.evolve(before[-1], status=j.AttemptStatus.INVALIDATED, ended_by=ending)
    if how == "authorized":
        assert after[0] == j.Attempt("screen-a-1", 1, j.AttemptStatus.FAILED, "full text unreadable")
    # Nodes with no attempt get none; the chain's bytes are those of the events alone.
    assert "screen-b" not in driver.journal.attempts
    header, events = stored(driver.journal)
    replayed = j.replay(header, events, driver.journal.workflow, driver.journal.policy)
    assert dict(replayed.attempts) == dict(driver.journal.attempts)
    # Superseding ends nothing more: the invalidation already ended every attempt.
    bind(driver, fresh("review-2", supersedes="review-1"))
    assert driver.journal.attempts["screen-a"] == after


def test_an_attempt_that_had_ended_is_not_rewritten_by_invalidation() -> None:
    driver = reviewed(Driver(fresh()))
    before = dict(driver.journal.attempts)
    invalidate_screening(driver)
    assert dict(driver.journal.attempts) == before
    assert all(a.ended_by is None for history in before.values() for a in history)


def _binding(driver: Driver, **changes: object) -> j.BindSuccessor:
    journal = driver.journal
    successor = fresh("review-2", supersedes="review-1").header
    driver.headers.setdefault("review-2", successor)
    command = j.BindSuccessor(
        request_id="bind",
        expected_head=journal.head,
        successor=j.RecordRef(j.SUCCESSOR_KIND, "review-2", successor.digest),
        nodes=tuple(
            j.NodeExpectation(n, NodeState.INVALIDATED) for n, s in journal.states.items() if s is NodeState.INVALIDATED
        ),
        actor_id="carol",
        role="coordinator",
    )
    return attrs.evolve(command, **changes)  # type: ignore[arg-type]


def test_a_successor_is_bound_only_after_invalidation_and_to_all_of_it() -> None:
    driver = reviewed(Driver(fresh()))
    refused(
        driver, _binding(driver, nodes=(j.NodeExpectation("extraction", NodeState.COMPLETED),)), C.BAD_SUCCESSOR_BINDING
    )
    invalidate_screening(driver)
    good = _binding(driver)
    refused(driver, attrs.evolve(good, nodes=good.nodes[:-1]), C.BAD_SUCCESSOR_BINDING)
    refused(driver, attrs.evolve(good, successor=attrs.evolve(good.successor, ref_id="review-1")), C.BAD_SUCCESSOR_BINDING)
    refused(driver, attrs.evolve(good, successor=attrs.evolve(good.successor, kind="report")), C.BAD_SUCCESSOR_BINDING)
    refused(driver, attrs.evolve(good, actor_id="bot:search", role="scheduler"), C.AUTOMATION_CLAIMS_HUMAN)
    # The successor must exist, under the digest named, declare that it
    # supersedes this execution, and run the same workflow.
    workflow, policy = driver.journal.workflow, driver.journal.policy
    ghost = j.RecordRef(j.SUCCESSOR_KIND, "ghost-9", ref("x", "y").digest)
    assert "no such execution" in refused(driver, attrs.evolve(good, successor=ghost), C.BAD_SUCCESSOR_BINDING).message
    invented = attrs.evolve(good.successor, digest=ref("x", "y").digest)
    refused(driver, attrs.evolve(good, successor=invented), C.BAD_SUCCESSOR_BINDING)
    for header in (
        j.create_header("review-3", workflow, policy, created_by="carol", now=T0),
        j.create_header("review-3", workflow, policy, created_by="carol", now=T0, supersedes="review-9"),
    ):
        driver.headers["review-3"] = header
        unrelated = j.RecordRef(j.SUCCESSOR_KIND, "review-3", header.digest)
        outcome = refused(driver, attrs.evolve(good, successor=unrelated), C.BAD_SUCCESSOR_BINDING)
        assert "supersedes" in outcome.message
    other_workflow = verify_workflow(attrs.evolve(REVIEW, workflow_id="another-review"))
    other_policy = j.verify_policy(attrs.evolve(policy.policy, workflow_digest=other_workflow.digest), other_workflow)
    elsewhere = j.create_header("review-4", other_workflow, other_policy, created_by="carol", now=T0, supersedes="review-1")
    driver.headers["review-4"] = elsewhere
    outcome = refused(
        driver, attrs.evolve(good, successor=j.RecordRef(j.SUCCESSOR_KIND, "review-4", elsewhere.digest)),
        C.BAD_SUCCESSOR_BINDING,
    )  # fmt: skip
    assert "runs workflow" in outcome.message
    # Without a header lookup no binding can be appended ...
    outcome = j.preview(driver.journal, good, T0 + timedelta(days=1))
    assert isinstance(outcome, j.Refusal) and outcome.code is C.BAD_SUCCESSOR_BINDING
    appended = driver.apply(good)
    assert isinstance(appended, j.Appended)
    assert [e.resulting_state for e in appended.events] == [NodeState.SUPERSEDED] * 5
    assert all(e.successor == good.successor for e in appended.events)
    # ... and replay checks the successor's header where a lookup is given.
    header, events = stored(driver.journal)
    workflow, policy = driver.journal.workflow, driver.journal.policy
    assert j.replay(header, events, workflow, policy, headers=driver.headers.get).head == driver.journal.head
    with pytest.raises(j.JournalError) as caught:
        j.replay(header, events, workflow, policy, headers={}.get)
    assert (caught.value.reason, caught.value.ordinal) == (C.BAD_SUCCESSOR_BINDING, appended.events[0].ordinal)
    # A chain replayed alone cannot see its successor: the binding is taken as far as the chain goes.
    assert j.replay(header, events, workflow, policy).head == driver.journal.head


def test_a_successor_header_found_under_another_id_is_not_that_successor() -> None:
    # The lookup is the caller's: a header it returns for "review-2" that is
    # review-3's (which also supersedes review-1) is not review-2's, though
    # its digest is the one the binding names.
    driver = reviewed(Driver(fresh()))
    invalidate_screening(driver)
    workflow, policy = driver.journal.workflow, driver.journal.policy
    review_3 = j.create_header("review-3", workflow, policy, created_by="carol", now=T0, supersedes="review-1")
    driver.headers["review-2"] = review_3
    command = _binding(driver, successor=j.RecordRef(j.SUCCESSOR_KIND, "review-2", review_3.digest))
    assert "review-3" in refused(driver, command, C.BAD_SUCCESSOR_BINDING).message


# --- authority verification ---------------------------------------------------------------------


def test_policy_and_header_must_bind_the_same_workflow_and_a_human() -> None:
    journal = fresh()
    workflow, policy = journal.workflow, journal.policy
    with pytest.raises(j.JournalError) as caught:
        j.verify_policy(attrs.evolve(policy.policy, workflow_digest=ref("a", "b").digest), workflow)
    assert caught.value.reason is C.UNVERIFIED_AUTHORITY
    with pytest.raises(j.JournalError) as caught:
        j.verify_policy(attrs.evolve(policy.policy, approved_by="bot:search"), workflow)
    assert caught.value.reason is C.UNVERIFIED_AUTHORITY
    with pytest.raises(j.JournalError) as caught:
        j.create_header("review-9", workflow, policy, created_by="bot:search", now=T0)
    assert caught.value.reason is C.UNVERIFIED_AUTHORITY
    other = j.verify_policy(attrs.evolve(policy.policy, scope="another-scope"), workflow)
    with pytest.raises(j.JournalError) as caught:
        j.new_journal(journal.header, workflow, other)
    assert caught.value.reason is C.UNVERIFIED_AUTHORITY


# --- replay ---------------------------------------------------------------------------------------


def test_replay_reproduces_states_attempts_and_head() -> None:
    driver = reviewed(Driver(fresh()))
    invalidate_screening(driver)
    bind(driver, fresh("review-2", supersedes="review-1"))
    header, events = stored(driver.journal)
    replayed = j.replay(header, events, driver.journal.workflow, driver.journal.policy)
    assert replayed.head == driver.journal.head
    assert dict(replayed.states) == dict(driver.journal.states)
    assert dict(replayed.attempts) == dict(driver.journal.attempts)
    assert dict(replayed.requests) == dict(driver.journal.requests)
    assert [e.digest for e in replayed.events] == [e.digest for e in driver.journal.events]


def test_replay_refuses_a_chain_recorded_under_a_broken_rule() -> None:
    # A forged chain: every digest recomputed, so only the rule can catch it.
    journal = fresh()
    event = j.Event(
        execution_id=journal.execution_id, ordinal=1, previous=journal.head, request_id="r", request_digest="",
        node_id="search", event=NodeEvent.WORK_STARTED, prior_state=NodeState.READY, resulting_state=NodeState.ACTIVE,
        actor_id="mallory", role="searcher", at="2026-03-01T09:00:01.000000Z", rationale="",
        attempt=j.AttemptRef("s-1", 1), records=(), approvals=(), error=None, invalidation=None, successor=None,
    )  # fmt: skip
    command = j.Transition("r", journal.head, "search", NodeEvent.WORK_STARTED, NodeState.READY, "mallory", "searcher",
                           attempt=j.AttemptRef("s-1", 1))  # fmt: skip
    event = attrs.evolve(event, request_digest=j.request_digest(command))
    event = attrs.evolve(event, digest=digest_of(event.body_json()))
    with pytest.raises(j.JournalError) as caught:
        j.replay(j.encode_header(journal.header), [j.encode_event(event)], journal.workflow, journal.policy)
    assert caught.value.reason is C.FORGED_ROLE
    assert caught.value.ordinal == 1


# --- the persistent history ---------------------------------------------------------------


def test_two_journals_extending_one_share_nothing_they_can_see() -> None:
    base = fresh()
    start = j.Transition("a", base.head, "search", NodeEvent.WORK_STARTED, NodeState.READY, "bot:search", "searcher",
                         attempt=j.AttemptRef("s-1", 1))  # fmt: skip
    other = attrs.evolve(start, request_id="b", attempt=j.AttemptRef("s-9", 1))
    first = j.append(base, start, T0)
    second = j.append(base, other, T0)
    assert isinstance(first, j.Journal) and isinstance(second, j.Journal)
    assert len(base.events) == 0 and dict(base.requests) == {}
    assert [e.request_id for e in first.events] == ["a"] and [e.request_id for e in second.events] == ["b"]
    assert set(first.requests) == {"a"} and set(second.requests) == {"b"}
    assert isinstance(j.preview(first, start, T0), j.Unchanged)
    assert isinstance(j.preview(second, start, T0), j.Refusal)  # "a" is not second's: its head is stale


def test_a_long_history_reads_like_a_tuple() -> None:
    driver = Driver(fresh())
    attempt = j.AttemptRef("s-1", 1)
    driver.do("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=attempt)
    for _ in range(300):
        driver.do("search", NodeEvent.WORK_BLOCKED, "bot:search", "searcher", attempt=attempt)
        driver.do("search", NodeEvent.BLOCK_CLEARED, "bot:search", "searcher", attempt=attempt)
    events = driver.journal.events
    as_tuple = tuple(events)
    assert len(events) == len(as_tuple) == 601
    assert [events[i].ordinal for i in range(601)] == list(range(1, 602))
    assert events[-1] is as_tuple[-1] and events[-601] is as_tuple[0]
    assert events[250:260] == as_tuple[250:260] and events == as_tuple
    with pytest.raises(IndexError):
        events[601]
    assert len(driver.journal.requests) == 601
    recorded = driver.journal.requests.recorded("r-300")
    assert recorded is not None and (recorded.first, recorded.count) == (300, 1)
    assert events[299].request_id == "r-300" and driver.journal.requests["r-300"] == events[299].request_digest


# --- resolving referenced records ---------------------------------------------------------------


def test_with_a_resolver_every_referenced_record_must_resolve() -> None:
    driver = Driver(fresh())
    attempt = j.AttemptRef("s-1", 1)
    driver.do("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=attempt)
    results = ref("search-results", "search-results")
    complete = driver.transition("search", NodeEvent.WORK_COMPLETED, "bot:search", "searcher", attempt=attempt,
                                 records=(results,))  # fmt: skip
    asked: list[j.RecordRef] = []

    def nothing_resolves(record: j.RecordRef) -> bool:
        asked.append(record)
        return False

    outcome = j.preview(driver.journal, complete, T0, nothing_resolves)
    assert isinstance(outcome, j.Refusal) and outcome.code is C.UNRESOLVED_RECORD
    assert asked == [results]
    appended = j.preview(driver.journal, complete, T0, lambda record: record == results)
    assert isinstance(appended, j.Appended)
    header, events = stored(appended.journal)
    workflow, policy = appended.journal.workflow, appended.journal.policy
    assert j.replay(header, events, workflow, policy, lambda record: True).head == appended.journal.head
    with pytest.raises(j.JournalError) as caught:
        j.replay(header, events, workflow, policy, nothing_resolves)
    assert (caught.value.reason, caught.value.ordinal) == (C.UNRESOLVED_RECORD, 2)


@pytest.mark.parametrize("sizes", [[0], [1], [255, 1, 300], [256, 256, 3], [700], [5] * 60 + [513]])
def test_an_event_log_extended_by_runs_is_the_log_extended_one_event_at_a_time(sizes: list[int]) -> None:
    # Events are stood in for by the driver's one event; the log only places them.
    event = reviewed(Driver(fresh())).journal.events[0]
    events = [attrs.evolve(event, ordinal=n) for n in range(1, sum(sizes) + 1)]
    by_runs, one_by_one, start = j.EventLog(), j.EventLog(), 0
    for size in sizes:
        by_runs = by_runs.extended(events[start : start + size])
        start += size
    for item in events:
        one_by_one = one_by_one.extended([item])
    assert list(by_runs) == list(one_by_one) == events
    assert [e.ordinal for e in by_runs] == list(range(1, len(events) + 1))
    assert len(by_runs) == len(events)
    assert all(len(chunk) == 256 for chunk in by_runs._chunks[:-1])
    assert [len(c) for c in by_runs._chunks] == [len(c) for c in one_by_one._chunks]


def test_a_time_before_the_year_1000_is_written_in_the_fixed_width_replay_reads() -> None:
    driver = Driver(fresh())
    command = driver.transition("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=j.AttemptRef("s-1", 1))
    early = T0.replace(year=999)
    outcome = j.preview(driver.journal, command, early)
    assert isinstance(outcome, j.Appended)
    assert outcome.events[0].at == "0999" + j.format_time(T0)[4:]
    header, events = stored(outcome.journal)
    assert j.replay(header, events, outcome.journal.workflow, outcome.journal.policy).head == outcome.journal.head


def test_a_time_is_written_in_utc_whatever_its_zero_offset_and_any_other_time_is_refused() -> None:
    from datetime import UTC, datetime, timezone  # noqa: PLC0415
    from zoneinfo import ZoneInfo  # noqa: PLC0415

    moment = datetime(2026, 3, 4, 5, 6, 7, 89)
    for zero in (UTC, timezone(timedelta(0), "Z"), ZoneInfo("UTC")):
        assert j.format_time(moment.replace(tzinfo=zero)) == "2026-03-04T05:06:07.000089Z"
    driver = Driver(fresh())
    command = driver.transition("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=j.AttemptRef("s-1", 1))
    for other in (None, timezone(timedelta(hours=1)), timezone(timedelta(microseconds=1)), ZoneInfo("Europe/Paris")):
        outcome = j.preview(driver.journal, command, moment.replace(tzinfo=other))
        assert isinstance(outcome, j.Refusal) and outcome.code is C.INVALID_REQUEST, outcome
        assert "must be timezone-aware UTC" in outcome.message
    for not_a_datetime in ("2026-03-04T05:06:07Z", moment.date(), None, 1772600767):
        outcome = j.preview(driver.journal, command, not_a_datetime)  # type: ignore[arg-type]
        assert isinstance(outcome, j.Refusal) and outcome.code is C.INVALID_REQUEST, outcome
        assert f"not {type(not_a_datetime).__name__}" in outcome.message
        with pytest.raises(j.JournalError) as raised:
            j.create_header("review-2", driver.journal.workflow, driver.journal.policy, created_by="carol", now=not_a_datetime)  # type: ignore[arg-type]
        assert raised.value.code == C.INVALID_REQUEST.value


def test_an_appended_outcome_carries_each_events_record_bytes() -> None:
    # Every kind of batch: transitions, an approval, an invalidation closure, a successor binding.
    started = Driver(fresh())
    outcomes = [started.do("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=j.AttemptRef("s-1", 1))]
    driver = reviewed(Driver(fresh()))
    outcomes.append(invalidate_screening(driver))
    outcomes.append(bind(driver, fresh("review-2", supersedes="review-1")))
    journal = driver.journal
    for outcome in outcomes:
        assert len(outcome.records) == len(outcome.events) >= 1
        assert outcome.stored_records() is outcome.records
        assert list(outcome.records) == [j.encode_event(e) for e in outcome.events]
    assert len(outcomes[1].events) == 5
    # Without records (an Appended made by hand), a store still gets the bytes.
    bare = j.Appended(journal, tuple(journal.events[-2:]))
    assert bare.stored_records() == tuple(j.encode_event(e) for e in journal.events[-2:])


@pytest.mark.parametrize("seed", range(20))
def test_a_request_index_extended_in_branches_answers_as_a_dict_would(seed: int) -> None:
    import random  # noqa: PLC0415

    rng = random.Random(seed)
    versions: list[tuple[j.RequestIndex, dict[str, str]]] = [(j.RequestIndex(), {})]
    for step in range(60):
        # Extend any earlier version, not only the newest: the older ones must not see it.
        base, model = versions[rng.randrange(len(versions))]
        entries = {f"req-{rng.randrange(400)}": _recorded(f"d{step}-{n}") for n in range(rng.randrange(0, 6))}
        extended = base.extended(entries)
        expected = {**model, **{k: v.digest for k, v in entries.items()}}
        versions.append((extended, expected))
    for index, model in versions:
        assert dict(index) == model
        assert len(index) == len(model)
        for request_id in (f"req-{n}" for n in range(400)):
            assert index.get(request_id) == model.get(request_id)


def _recorded(digest: str) -> _Recorded:
    return _Recorded(digest, 1, 1)


def test_an_argument_not_of_its_type_is_a_type_error_naming_it() -> None:
    # Before: an AttributeError (or a TypeError of len()) from deep inside.
    journal = fresh()
    header, events = stored(journal)
    workflow, policy = journal.workflow, journal.policy
    command = Driver(journal).transition("search", NodeEvent.WORK_STARTED, "bot:search", "searcher")
    calls = (
        ("journal", lambda: j.preview(None, command, T0)),  # type: ignore[arg-type]
        ("journal", lambda: j.append("journal", command, T0)),  # type: ignore[arg-type]
        ("policy", lambda: j.verify_policy(None, workflow)),  # type: ignore[arg-type]
        ("workflow", lambda: j.verify_policy(policy.policy, None)),  # type: ignore[arg-type]
        ("workflow", lambda: j.create_header("e-9", None, policy, created_by="carol", now=T0)),  # type: ignore[arg-type]
        ("policy", lambda: j.create_header("e-9", workflow, policy.policy, created_by="carol", now=T0)),  # type: ignore[arg-type]
        ("header", lambda: j.new_journal(None, workflow, policy)),  # type: ignore[arg-type]
        ("header", lambda: j.replay(header.decode(), events, workflow, policy)),  # type: ignore[arg-type]
        ("events", lambda: j.replay(header, None, workflow, policy)),  # type: ignore[arg-type]
        ("events", lambda: j.replay(header, b"".join(events), workflow, policy)),
        ("journal", lambda: j.continue_replay(None, events)),  # type: ignore[arg-type]
    )
    for name, call in calls:
        with pytest.raises(TypeError, match=rf"^{name}: must be "):
            call()
    assert j.replay(header, tuple(events), workflow, policy).head == journal.head
