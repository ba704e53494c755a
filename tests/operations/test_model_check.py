"""The operation model checker passes the real decisions and catches every variant of the zoo by its invariant."""

from __future__ import annotations

import attrs
import pytest

from fencekeeper.kernel import operations as o
from fencekeeper.kernel.machines import OperationState
from fencekeeper.kernel.opsmodel import (
    STANDARD,
    Bounds,
    Invariant,
    OpsProtocol,
    Result,
    World,
    check_state,
    explore,
    initial_world,
    moves,
)

from .zoo import ZOO, Variant

# Depth 10 holds every atomic variant's shortest trace; the submission race is complete at any depth.
# Two workers suffice for every race here (an owner and its replacement, or one of them and the
# canceller); `fencekeeper modelcheck`, which `make test` runs, explores three to depth 11.
EXECUTION = Bounds(workers=2, max_claims=3, max_tick=5, max_depth=10)
# Three clients race one identity (one of them under the resolver's next version); a fourth, whose
# principal was revoked, submits it too.
SUBMISSION = Bounds(workers=0, submitters=4, approval=False, cancel=False, revoked_submitter=True, moved_submitter=True)
# Depth 15 holds a declined call, its recorded answer and a retry's intent and end (14 moves): the
# external variants' traces (`fencekeeper modelcheck` explores three claims to depth 17).
EXTERNAL = Bounds(
    workers=2, approval=False, cancel=False, max_claims=2, max_tick=2, maximum_attempts=2, max_depth=15, external=True
)

# The deadline at tick 1, inside a claim's two-tick lease: an owner decides and commits on both sides of it.
DEADLINE = Bounds(workers=2, approval=False, max_claims=2, max_tick=3, deadline_ticks=1, max_depth=13)
DEADLINE_EXTERNAL = attrs.evolve(DEADLINE, cancel=False, max_depth=16, external=True)
# Fewer Attempts than claims, and a worker that may meet a denial or a failure that is not retryable: depth 15 holds a
# lost reply, its retry's failure and a replacement that finds every Attempt used (14 moves).  As
# `fencekeeper modelcheck` explores it.
LIMITS_EXTERNAL = next(bounds for _, bounds in STANDARD if bounds.denials)
# The row an earlier release left: its approval authorizes nothing now, and its Attempt 1's call is unanswered.
OLDER_APPROVAL = next(bounds for _, bounds in STANDARD if bounds.older_approval)


def _bounds(variant: Variant) -> Bounds:
    if variant.breaks in (Invariant.ONE_OPERATION, Invariant.AUTHORIZED_ANSWER):
        return SUBMISSION
    if variant.name in ("intent-after-the-deadline", "deadline-ends-an-unanswered-call"):
        return DEADLINE_EXTERNAL
    if variant.name == "misbound-approval-ends-an-unanswered-call":
        return OLDER_APPROVAL
    if variant.breaks is Invariant.UNANSWERED_NOT_FAILED:
        return LIMITS_EXTERNAL
    if variant.name == "atomic-commit-after-the-deadline":
        return DEADLINE
    if variant.breaks in (Invariant.NO_BLIND_RESEND, Invariant.UNKNOWN_ONLY_IF_AMBIGUOUS):
        return EXTERNAL
    return EXECUTION


@pytest.fixture(scope="module")
def zoo_results() -> dict[str, Result]:
    return {v.name: explore(_bounds(v), v.protocol) for v in ZOO}


def test_the_real_decisions_hold_every_invariant() -> None:
    for bounds in (EXECUTION, SUBMISSION, EXTERNAL, DEADLINE, DEADLINE_EXTERNAL, LIMITS_EXTERNAL):
        result = explore(bounds)
        assert result.violation is None, result.violation
        assert result.states > 1000
    # A small world: every claim ends the Operation (a due row is never refused), or the canceller does first.
    older = explore(OLDER_APPROVAL)
    assert older.violation is None and older.complete, older


def test_the_submission_race_is_explored_completely() -> None:
    result = explore(STANDARD[0][1])
    assert result.complete and result.violation is None


def test_the_zoo_covers_every_invariant_but_the_tables() -> None:
    assert {v.breaks for v in ZOO} == set(Invariant) - {Invariant.TABLES}


@pytest.mark.parametrize("variant", ZOO, ids=[v.name for v in ZOO])
def test_variant_is_caught_with_its_invariant(variant: Variant, zoo_results: dict[str, Result]) -> None:
    result = zoo_results[variant.name]
    assert result.violation is not None, f"{variant.name}: {variant.description} went unnoticed"
    assert result.violation.invariant is variant.breaks, result.violation


@pytest.mark.parametrize("variant", ZOO, ids=[v.name for v in ZOO])
def test_trace_replays_to_the_violation(variant: Variant, zoo_results: dict[str, Result]) -> None:
    violation = zoo_results[variant.name].violation
    assert violation is not None
    bounds = _bounds(variant)
    world = initial_world(bounds)
    for number, label in enumerate(violation.trace, start=1):
        candidates = [m for m in moves(world, bounds, variant.protocol)[0] if m.label == label]
        assert candidates, f"step {number} {label!r} is not a move of the world it follows"
        move = candidates[0]
        if number == len(violation.trace) and move.broken is not None:
            assert move.broken[0] is variant.breaks
            return
        world = move.world
    found = check_state(world, variant.protocol)
    assert found is not None and found[0] is variant.breaks


def _replay(bounds: Bounds, labels: list[str]) -> World:
    world = initial_world(bounds)
    for label in labels:
        found = [m for m in moves(world, bounds, OpsProtocol())[0] if m.label == label]
        assert found, f"{label!r} is not a move of the world it follows"
        assert found[0].broken is None, found[0].broken
        world = found[0].world
    return world


def _attempt(worker: str, fence: int, answer: str) -> list[str]:
    return [
        f"{worker} decides claim",
        f"{worker} commits claim",
        f"{worker} decides intent (fence {fence})",
        f"{worker} commits intent",
        f"{worker} calls the provider (fence {fence}): {answer}",
    ]


def test_a_declined_call_is_performed_again_and_can_succeed() -> None:
    world = _replay(
        EXTERNAL,
        [
            *_attempt("w1", 1, "declined"),
            "w1 decides declined (fence 1)",
            "w1 commits declined",
            "clock ticks to 1",
            *_attempt("w2", 2, "succeeded"),
            "w2 decides complete (fence 2)",
            "w2 commits complete",
        ],
    )
    assert world.operations[0].state is OperationState.SUCCEEDED
    assert [(fence, answer.value) for fence, answer in world.calls] == [(1, "declined"), (2, "succeeded")]


def test_after_a_lost_reply_the_retry_may_only_end_unknown() -> None:
    world = _replay(
        EXTERNAL,
        [
            *_attempt("w1", 1, "lost_reply"),
            "w1 decides handler error (fence 1)",
            "w1 commits fail",
            "clock ticks to 1",
            "w2 decides claim",
            "w2 commits claim",
            "w2 decides intent (fence 2)",
            "w2 commits intent",
        ],
    )
    labels = [m.label for m in moves(world, EXTERNAL, OpsProtocol())[0]]
    assert "w2 decides outcome unknown (fence 2)" in labels
    assert not [label for label in labels if label.startswith("w2 calls the provider")]
    world = _replay_from(world, ["w2 decides outcome unknown (fence 2)", "w2 commits unknown"])
    assert world.operations[0].outcome is o.TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN


def _replay_from(world: World, labels: list[str]) -> World:
    for label in labels:
        world = next(m.world for m in moves(world, EXTERNAL, OpsProtocol())[0] if m.label == label)
    return world


def test_turning_the_store_guard_off_lets_two_claims_own_one_operation() -> None:
    result = explore(attrs.evolve(EXECUTION, max_depth=8), OpsProtocol(apply_guard=False))
    assert result.violation is not None


def test_an_atomic_success_decided_before_the_deadline_and_committed_after_it_writes_nothing() -> None:
    # The decision is made in time; its guard holds it to the deadline, which has come when it commits.
    world = _replay(DEADLINE, ["w1 decides claim", "w1 commits claim", "w1 decides complete (fence 1)", "clock ticks to 1"])
    labels = [m.label for m in moves(world, DEADLINE, OpsProtocol())[0]]
    assert "w1 commits complete: guard fails, nothing written" in labels
    assert world.operations[0].lease_expires_at is not None and world.now < world.operations[0].lease_expires_at


def test_an_intent_decided_before_the_deadline_and_committed_after_it_writes_nothing() -> None:
    world = _replay(
        DEADLINE_EXTERNAL, ["w1 decides claim", "w1 commits claim", "w1 decides intent (fence 1)", "clock ticks to 1"]
    )
    labels = [m.label for m in moves(world, DEADLINE_EXTERNAL, OpsProtocol())[0]]
    assert "w1 commits intent: guard fails, nothing written" in labels


def test_a_call_begun_before_the_deadline_is_answered_after_it() -> None:
    # Never lose what the provider did: the owner's success past the deadline commits.
    labels = [*_attempt("w1", 1, "succeeded"), "clock ticks to 1", "w1 decides complete (fence 1)", "w1 commits complete"]
    world = _replay(DEADLINE_EXTERNAL, labels)
    assert world.operations[0].state is OperationState.SUCCEEDED and world.now >= world.operations[0].deadline


def test_a_replacement_that_finds_every_attempt_used_ends_an_unanswered_call_unknown() -> None:
    # Attempt 1's reply was lost and its failure retried; attempt 2 was lost with nothing recorded: no Attempt is
    # left to look with, and the outcome is unknown, never max_attempts_exceeded.
    labels = [
        *_attempt("w1", 1, "lost_reply"),
        "w1 decides handler error (fence 1)",
        "w1 commits fail",
        "clock ticks to 1",
        "w1 decides claim",
        "w1 commits claim",
        "clock ticks to 2",
        "clock ticks to 3",
        "w2 decides claim",
        "w2 commits claim",
    ]
    world = _replay(LIMITS_EXTERNAL, labels)
    assert world.operations[0].outcome is o.TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN
    assert world.operations[0].attempt_count == LIMITS_EXTERNAL.maximum_attempts


def test_a_denial_after_an_unanswered_call_ends_unknown_and_without_one_ends_not_authorized() -> None:
    lost = [*_attempt("w1", 1, "lost_reply"), "w1 decides handler error (fence 1)", "w1 commits fail",
            "clock ticks to 1", "w2 decides claim", "w2 commits claim", "w2 decides denial (fence 2)", "w2 commits fail"]
    assert _replay(LIMITS_EXTERNAL, lost).operations[0].outcome is o.TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN
    quiet = ["w1 decides claim", "w1 commits claim", "w1 decides denial (fence 1)", "w1 commits fail"]
    assert _replay(LIMITS_EXTERNAL, quiet).operations[0].outcome is o.TerminalOutcome.NOT_AUTHORIZED
