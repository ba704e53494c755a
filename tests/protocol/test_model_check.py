"""The model checker itself: deterministic, complete within its bounds, honest about cuts, and runnable.

The bug zoo (test_bug_zoo.py) shows the checker finds bugs; these tests
show the rest of its contract: the same bounds explore the same states, a
depth cut is reported as incomplete, state invariants are checked on hand
made broken worlds, composed transactions reach exactly the worlds of the
uncomposed protocol (INV-COMPOSED-REFINES), and ``fencekeeper modelcheck``
prints what it explored and fails on bad options.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import attrs
import pytest

from fencekeeper.adapters.cli import _bounds_text
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import DispatchState, ExecutionState
from fencekeeper.kernel.modelcheck import (
    COMPOSED,
    STANDARD,
    Bounds,
    Holding,
    Invariant,
    Protocol,
    World,
    _Action,
    check_refinement,
    check_state,
    check_write,
    explore,
    initial_world,
    moves,
    reachable,
)

SMALL = Bounds(workers=2, executions=1, claims_per_execution=2, max_tick=2)
# Time enough for the timer wake (due at tick 3) and a replacement lease.
WALK = attrs.evolve(SMALL, max_tick=3)
# Small and complete, with two steps so that a step composes with the next one: one holder, leases of
# one tick so that the holder's lease expires, is quarantined, resumed and claimed again by another
# worker while the first still tries to write (a zombie); and one claim but time for the timer wake.
REFINE = (
    Bounds(workers=2, executions=1, claims_per_execution=2, steps_per_execution=2, lease_ticks=1, max_tick=1),
    Bounds(workers=2, executions=1, claims_per_execution=1, steps_per_execution=2, max_tick=3),
    # Two executions, so that a finalize composes with a claim of the other one (its clock stopped, to stay
    # small: `fencekeeper modelcheck` proves it with leases that expire, modelcheck.COMPOSED).
    Bounds(workers=2, executions=2, claims_per_execution=1, steps_per_execution=1, lease_ticks=1, max_tick=0),
)
NEXT = REFINE[2]
FENCEKEEPER = str(Path(sys.executable).with_name("fencekeeper"))


def test_exploration_is_deterministic_and_complete() -> None:
    first, second = explore(SMALL), explore(SMALL)
    assert first == second
    assert first.violation is None
    assert first.complete
    assert first.states > 1_000


def test_a_depth_cut_is_reported_as_incomplete() -> None:
    result = explore(attrs.evolve(SMALL, max_depth=3))
    assert not result.complete
    assert result.depth == 3
    assert result.states < explore(attrs.evolve(SMALL, max_depth=4)).states


def test_every_reachable_move_kind_occurs() -> None:
    # Guards against a checker that explores many states but never reaches the
    # interesting ones: every decision must commit somewhere in the small world.
    labels: set[str] = set()
    world = initial_world(WALK)
    frontier = [world]
    seen = {world}
    cache: dict[tuple[object, ...], list[object]] = {}
    while frontier:
        world = frontier.pop()
        for move in moves(world, WALK, Protocol(), cache)[0]:  # type: ignore[arg-type]
            labels.add(move.label)
            if move.world not in seen:
                seen.add(move.world)
                frontier.append(move.world)
    for needle in (
        "claims",
        "renews",
        "records a step",
        "releases",
        "finalize e1 -> waiting",
        "finalize e1 -> succeeded",
        "finalize e1 -> failed",
        "finalize e1 -> suspended",
        "finalize e1 -> reconciliation_required",
        "commits wake",
        "timer commits wake",
        "commits cancel",
        "quarantine",
        "fail e1",
        "resume_safe e1",
        "reconcile_command",
        "guard fails, nothing written",
    ):
        assert any(needle in label for label in labels), f"no committed move {needle!r}"
    assert not any("-> cancelled" in label for label in labels), "the sixth target must never commit"


@pytest.mark.parametrize(
    ("breakage", "invariant"),
    [
        ("dispatch_claimed_while_eligible", Invariant.AGREE),
        ("lease_without_claim", Invariant.LEASE_IFF_CLAIMED),
        ("steps_disagree", Invariant.STEP_LIMIT),
        ("waiting_without_registration", Invariant.WAITING_REGISTERED),
        ("two_live_leases", Invariant.ONE_LIVE_LEASE),
    ],
)
def test_state_invariants_see_broken_worlds(breakage: str, invariant: Invariant) -> None:
    world = initial_world(SMALL)
    execution, dispatch = world.executions[0], world.dispatches[0]
    at = world.now
    if breakage == "dispatch_claimed_while_eligible":
        dispatch = attrs.evolve(dispatch, dispatch_state=DispatchState.CLAIMED)
    elif breakage == "lease_without_claim":
        dispatch = attrs.evolve(dispatch, lease_token="t", leased_by="w1", lease_expires_at=at)
    elif breakage == "steps_disagree":
        execution = attrs.evolve(execution, step_count=1)
    elif breakage == "waiting_without_registration":
        execution = attrs.evolve(execution, state=ExecutionState.WAITING)
        dispatch = attrs.evolve(dispatch, dispatch_state=DispatchState.WAITING)
    else:
        execution = attrs.evolve(execution, state=ExecutionState.RUNNING, fence=1)
        dispatch = attrs.evolve(
            dispatch,
            dispatch_state=DispatchState.CLAIMED,
            lease_token="t",
            leased_by="w1",
            lease_expires_at=at + timedelta(seconds=5),
        )
        # Two workers both believe they hold the same live credential.
        holding = Holding(p.LeaseCredential("w1", "t", 1))
        world = attrs.evolve(world, holdings=((holding,), (holding,)))
    broken = attrs.evolve(world, executions=(execution,), dispatches=(dispatch,))
    found = check_state(broken, SMALL)
    assert found is not None and found[0] == invariant, found
    assert check_state(world if breakage != "two_live_leases" else initial_world(SMALL), SMALL) is None


def _labels(bounds: Bounds, proto: Protocol) -> set[str]:
    """The label of every move from every world reachable within ``bounds``."""
    labels: set[str] = set()
    world = initial_world(bounds)
    frontier, seen = [world], {world}
    cache: dict[tuple[object, ...], list[object]] = {}
    while frontier:
        world = frontier.pop()
        for move in moves(world, bounds, proto, cache)[0]:  # type: ignore[arg-type]
            labels.add(move.label)
            if move.world not in seen:
                seen.add(move.world)
                frontier.append(move.world)
    return labels


@pytest.mark.parametrize("bounds", REFINE, ids=["zombie", "timer", "next-claim"])
def test_composed_transactions_reach_exactly_the_uncomposed_worlds(bounds: Bounds) -> None:
    composed_result, composed = reachable(bounds, Protocol(compose=True))
    plain_result, plain = reachable(bounds, Protocol())
    assert composed_result.violation is None, composed_result.violation
    assert composed_result.complete and plain_result.complete
    extra = composed - plain
    assert not extra, f"INV-COMPOSED-REFINES: {len(extra)} worlds reachable only with composition"
    # Composition only adds moves, so nothing is lost either; and it did add some.
    assert composed == plain
    assert composed_result.transitions > plain_result.transitions


def test_every_composed_form_occurs_and_the_sixth_target_never_composes() -> None:
    labels = {label for label in _labels(REFINE[1], Protocol(compose=True)) if "in one transaction" in label}
    wanted = [
        "w1 claims e1 and records a step (fence 1)",
        "w1 records a step on e1 and records another step (fence 1)",
        *(f"w1 claims e1 and finalizes -> {t.value} (fence 1)" for t in p.FINALIZE_TARGETS),
        *(f"w1 records a step on e1 and finalizes -> {t.value} (fence 1)" for t in p.FINALIZE_TARGETS),
        # Chains, as a store composes them: every visit that calls no handler, up to the step bound.
        "w1 claims e1 and records a step and records another step (fence 1)",
        "w1 claims e1 and records a step and finalizes -> succeeded (fence 1)",
        "w1 claims e1 and records a step and records another step and finalizes -> waiting (fence 1)",
        "w1 records a step on e1 and records another step and finalizes -> failed (fence 1)",
    ]
    for needle in wanted:
        assert f"{needle}, in one transaction" in labels, f"no composed move {needle!r}"
    assert not any("-> cancelled" in label for label in labels)


def _after(world: World, bounds: Bounds, proto: Protocol, *labels: str) -> World:
    for label in labels:
        (world,) = [m.world for m in moves(world, bounds, proto)[0] if m.label == label]
    return world


def test_a_composed_move_is_its_two_commits_and_nothing_else() -> None:
    bounds, composed = REFINE[1], Protocol(compose=True)
    start = initial_world(bounds)
    together = _after(start, bounds, composed, "w1 claims e1 and records a step (fence 1), in one transaction")
    apart = _after(start, bounds, Protocol(), "w1 claims e1", "w1 records a step on e1 (fence 1)")
    assert together == apart
    assert together.executions[0].step_count == 1 and together.executions[0].fence == 1
    # At the step bound the second step is not decided, so no composed move stands in for the first one alone.
    stepped = _after(together, bounds, composed, "w1 records a step on e1 (fence 1)")
    assert not [m for m in moves(stepped, bounds, composed)[0] if "records a step on e1 and" in m.label]


def test_a_composed_chain_is_its_commits_and_nothing_else() -> None:
    bounds, composed = REFINE[1], Protocol(compose=True)
    start = initial_world(bounds)
    label = "w1 claims e1 and records a step and records another step and finalizes -> succeeded (fence 1)"
    (move,) = [m for m in moves(start, bounds, composed)[0] if m.label == f"{label}, in one transaction"]
    apart = _after(
        start,
        bounds,
        Protocol(),
        "w1 claims e1",
        "w1 records a step on e1 (fence 1)",
        "w1 records a step on e1 (fence 1)",
        "w1 commits finalize e1 -> succeeded (fence 1)",
    )
    assert move.world == apart and move.length == 4
    assert apart.executions[0].state.value == "succeeded" and apart.executions[0].step_count == 2


def test_a_finalize_composes_with_the_same_workers_claim_of_another_execution() -> None:
    composed = Protocol(compose=True)
    start = initial_world(NEXT)
    first = {m.label for m in moves(start, NEXT, composed)[0]}
    for needle in (
        "w1 claims e1 and finalizes -> succeeded and claims e2",
        "w1 claims e1 and records a step and finalizes -> failed and claims e2 and finalizes -> succeeded on e2",
        "w1 claims e2 and finalizes -> succeeded and claims e1 and records a step on e1",
    ):
        assert f"{needle} (fence 1), in one transaction" in first, needle
    # The chain a two-Command execution's step would end with: the step, the finalize, the next claim.
    held = _after(start, NEXT, Protocol(), "w1 claims e1")
    then = {m.label for m in moves(held, NEXT, composed)[0]}
    assert "w1 records a step on e1 and finalizes -> succeeded and claims e2 (fence 1), in one transaction" in then
    # Only after a finalize (a step or a claim is followed by the holder's visits), and never of an execution
    # another worker holds: that claim is refused, and the chain ends at the finalize.
    assert not [label for label in first | then if "step and claims" in label or "e1 and claims e1" in label]
    taken = _after(held, NEXT, Protocol(), "w2 claims e2")
    assert not [m for m in moves(taken, NEXT, composed)[0] if "claims e2" in m.label and m.label.startswith("w1")]
    assert [m for m in moves(taken, NEXT, composed)[0] if m.label.startswith("w1 records a step on e1 and finalizes")]


def test_a_chain_across_two_executions_is_its_commits_and_nothing_else() -> None:
    composed = Protocol(compose=True)
    start = initial_world(NEXT)
    label = "w1 claims e1 and records a step and finalizes -> succeeded and claims e2 and records a step on e2"
    (move,) = [m for m in moves(start, NEXT, composed)[0] if m.label == f"{label} (fence 1), in one transaction"]
    apart = _after(
        start,
        NEXT,
        Protocol(),
        "w1 claims e1",
        "w1 records a step on e1 (fence 1)",
        "w1 commits finalize e1 -> succeeded (fence 1)",
        "w1 claims e2",
        "w1 records a step on e2 (fence 1)",
    )
    assert move.world == apart and move.length == 5
    assert [x.state.value for x in apart.executions] == ["succeeded", "running"]
    assert apart.holdings[0][1] is not None and apart.holdings[0][1].credential.lease_token == "t.e2.1.w1"


def test_a_composed_move_ages_a_decision_in_flight_by_both_commits() -> None:
    # Both commits must fit in the race window, or composing would let more happen before the late commit.
    bounds, composed = REFINE[1], Protocol(compose=True)
    decided = _after(initial_world(bounds), bounds, composed, "ops decides cancel of e1")
    (move,) = [m for m in moves(decided, bounds, composed)[0] if m.label.startswith("w1 claims e1 and records")]
    assert move.length == 2 and move.world.inflight is not None and move.world.inflight.age == 2
    aged = _after(decided, bounds, composed, "clock ticks to 1")
    assert not [m for m in moves(aged, bounds, composed)[0] if "in one transaction" in m.label]


def test_the_refinement_check_passes_composition_and_names_a_world_it_cannot_reach() -> None:
    bounds = REFINE[1]
    refinement = check_refinement(bounds)
    assert refinement.complete and refinement.violation is None
    assert refinement.composed.states == refinement.plain.states
    # Against a protocol that can never finalize, the worlds finalization reaches are reported.
    never = Protocol(finalize=lambda *_: p.Refusal(p.RefusalCode.NOT_AUTHORIZED, "never"))
    broken = check_refinement(bounds, Protocol(), baseline=never)
    assert broken.violation is not None
    assert broken.violation.invariant == Invariant.COMPOSED_REFINES
    assert "finalize" in broken.violation.trace[-1], broken.violation.trace
    # A cut search proves no refinement, so none is claimed.
    cut = check_refinement(attrs.evolve(bounds, max_depth=2), Protocol(), baseline=never)
    assert not cut.complete and cut.violation is None


def test_standard_configurations_cover_three_workers_and_two_executions() -> None:
    assert any(b.workers >= 3 and b.executions >= 2 for _, b in STANDARD)
    assert all(b.max_tick > b.lease_ticks for _, b in STANDARD), "leases must be able to expire"


def test_command_line_prints_states_explored() -> None:
    run = subprocess.run(
        [FENCEKEEPER, "modelcheck", "--workers", "2", "--executions", "1", "--ticks", "2"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "states explored" in run.stdout
    assert "complete" in run.stdout
    assert "every invariant" in run.stdout


def test_command_line_names_every_bound_in_correct_number() -> None:
    # Before: "1 workers, 1 executions, 1 claims each", and the node steps,
    # which change what is explored, named only with --compose.
    bounds = ["--workers", "1", "--executions", "1", "--claims", "1", "--steps", "3", "--ticks", "1"]
    run = subprocess.run([FENCEKEEPER, "modelcheck", *bounds], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("custom: 1 worker, 1 execution, 1 claim each, ticks 0-1, 3 steps each: "), run.stdout
    assert "composed" not in run.stdout


def test_command_line_names_a_lease_length_other_than_the_default() -> None:
    # The second composed configuration's leases last one tick: its line says so, where the default is not named.
    (two,) = [b for _, b in COMPOSED if b.executions == 2]
    assert _bounds_text(two) == "2 workers, 2 executions, 1 claim each, ticks 0-1, leases of 1 tick, 1 step each"
    assert "leases" not in _bounds_text(Bounds())


def test_command_line_checks_a_composed_configuration() -> None:
    # Complete, a step composed with the next one, and a finalize with a claim of another execution.
    assert all(b.max_depth is None for _, b in COMPOSED)
    assert any(b.steps_per_execution >= 2 for _, b in COMPOSED)
    assert any(b.executions >= 2 and b.lease_ticks <= b.max_tick for _, b in COMPOSED)
    bounds = ["--workers", "2", "--executions", "1", "--claims", "1", "--steps", "2", "--ticks", "3"]
    run = subprocess.run(
        [FENCEKEEPER, "modelcheck", "--compose", *bounds],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "composed" in run.stdout
    assert "every world also reachable without composition" in run.stdout


@pytest.mark.parametrize("bad", [["--workers", "0"], ["--depth", "x"], ["--claims", "-1"], ["--steps", "0"]])
def test_command_line_refuses_bad_bounds(bad: list[str]) -> None:
    run = subprocess.run([FENCEKEEPER, "modelcheck", *bad], capture_output=True, text=True, check=False)
    assert run.returncode == 2
    assert bad[0] in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize(("woken", "found"), [("a.1", Invariant.ONE_WAKE), ("a.2", None)])
def test_one_wake_sees_a_wake_of_a_registration_the_execution_no_longer_waits_on(
    woken: str, found: Invariant | None
) -> None:
    """INV-ONE-WAKE: woken only while its execution waits on *it*, not on a later registration."""
    world = initial_world(SMALL)
    old, later = (p.WaitKey("e1", "n-wait", attempt) for attempt in ("a.1", "a.2"))
    spec = p.WaitSpec(node_id="n-wait", attempt_id="a.1", event_type="paid", correlation=(("k", "v"),))
    registrations = tuple(
        p.WaitRegistration(key=key, business_id="b-1", spec=attrs.evolve(spec, attempt_id=key.attempt_id))
        for key in (old, later)
    )
    waiting = attrs.evolve(world.executions[0], state=ExecutionState.WAITING, wait=later, fence=2, revision=5)
    dispatch = attrs.evolve(world.dispatches[0], dispatch_state=DispatchState.WAITING)
    before = attrs.evolve(world, executions=(waiting,), dispatches=(dispatch,), registrations=registrations)
    key = old if woken == "a.1" else later
    target = registrations[0] if key == old else registrations[1]
    # A broken wake: decided as though the execution still waited on ``key``.
    decision = p.wake(
        attrs.evolve(waiting, wait=key),
        dispatch,
        target,
        p.WakeRequest(key, p.WakeReason.EVENT, "ev-9", "b-1", p.Authority(True, "ops"), "paid", (("k", "v"),)),
        before.now,
    )
    assert isinstance(decision, p.Decision)
    assert decision.execution is not None and decision.registration is not None
    after = attrs.evolve(
        before,
        executions=(decision.execution,),
        dispatches=(decision.dispatch,),
        registrations=tuple(decision.registration if r.key == key else r for r in registrations),
    )
    action = _Action("ops wakes e1", "ops", None, "wake", 0, decision)
    broken = check_write(before, after, action, decision, "wake")
    assert (broken[0] if broken else None) == found, broken
