"""The operation model checker passes the real decisions and catches every variant of the zoo by its invariant."""

from __future__ import annotations

import attrs
import pytest

from fencekeeper.kernel.opsmodel import (
    STANDARD,
    Bounds,
    Invariant,
    OpsProtocol,
    Result,
    check_state,
    explore,
    initial_world,
    moves,
)

from .zoo import ZOO, Variant

# Depth 10 holds every variant's shortest trace; the submission race is complete at any depth.
# Two workers suffice for every race here (an owner and its replacement, or one of them and the
# canceller); `fencekeeper modelcheck`, which `make test` runs, explores three to depth 11.
EXECUTION = Bounds(workers=2, max_claims=3, max_tick=5, max_depth=10)
SUBMISSION = Bounds(workers=0, submitters=3, approval=False, cancel=False)


def _bounds(variant: Variant) -> Bounds:
    return SUBMISSION if variant.breaks is Invariant.ONE_OPERATION else EXECUTION


@pytest.fixture(scope="module")
def zoo_results() -> dict[str, Result]:
    return {v.name: explore(_bounds(v), v.protocol) for v in ZOO}


def test_the_real_decisions_hold_every_invariant() -> None:
    for bounds in (EXECUTION, SUBMISSION):
        result = explore(bounds)
        assert result.violation is None, result.violation
        assert result.states > 1000


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
    found = check_state(world)
    assert found is not None and found[0] is variant.breaks


def test_turning_the_store_guard_off_lets_two_claims_own_one_operation() -> None:
    result = explore(attrs.evolve(EXECUTION, max_depth=8), OpsProtocol(apply_guard=False))
    assert result.violation is not None
