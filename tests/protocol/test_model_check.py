"""The model checker itself: deterministic, complete within its bounds, honest about cuts, and runnable.

The bug zoo (test_bug_zoo.py) shows the checker finds bugs; these tests
show the rest of its contract: the same bounds explore the same states, a
depth cut is reported as incomplete, state invariants are checked on hand
made broken worlds, and ``fencekeeper modelcheck`` prints what it explored
and fails on bad options.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import attrs
import pytest

from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import DispatchState, ExecutionState
from fencekeeper.kernel.modelcheck import (
    STANDARD,
    Bounds,
    Holding,
    Invariant,
    Protocol,
    check_state,
    explore,
    initial_world,
    moves,
)

SMALL = Bounds(workers=2, executions=1, claims_per_execution=2, max_tick=2)
# Time enough for the timer wake (due at tick 3) and a replacement lease.
WALK = attrs.evolve(SMALL, max_tick=3)
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


@pytest.mark.parametrize("bad", [["--workers", "0"], ["--depth", "x"], ["--claims", "-1"]])
def test_command_line_refuses_bad_bounds(bad: list[str]) -> None:
    run = subprocess.run([FENCEKEEPER, "modelcheck", *bad], capture_output=True, text=True, check=False)
    assert run.returncode == 2
    assert bad[0] in run.stderr
    assert "Traceback" not in run.stderr
