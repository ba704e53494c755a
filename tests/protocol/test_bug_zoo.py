"""The model checker sees every bug in the zoo, names the invariant, and passes the real protocol.

A checker that never reports anything would pass the real protocol too, so
this is the test that gives the model check its meaning: every deliberately
broken variant in ``zoo.py`` must be caught, with the invariant it names,
and the shortest trace it prints must replay to that violation move by move.
"""

from __future__ import annotations

import pytest

from fencekeeper.kernel.modelcheck import (
    Bounds,
    Invariant,
    Protocol,
    Result,
    check_state,
    explore,
    initial_world,
    moves,
    reachable,
    without_exit,
)

from .zoo import ZOO, Variant

# Two executions and three workers, every interleaving to depth 6: every
# variant's bug shows within 5 moves, and the real protocol is explored to
# the same bounds.
ZOO_BOUNDS = Bounds(workers=3, executions=2, max_depth=6)


@pytest.fixture(scope="module")
def zoo_results() -> dict[str, Result]:
    return {variant.name: explore(ZOO_BOUNDS, variant.protocol) for variant in ZOO}


def test_the_zoo_is_large_and_varied() -> None:
    assert len(ZOO) >= 8
    assert len({v.name for v in ZOO}) == len(ZOO)
    # The zoo exercises both state invariants and write invariants.
    broken = {v.breaks for v in ZOO}
    assert len(broken) >= 10
    assert {Invariant.FENCED_WRITES, Invariant.AGREE, Invariant.LEASE_IFF_CLAIMED} <= broken


@pytest.mark.parametrize("variant", ZOO, ids=[v.name for v in ZOO])
def test_variant_is_caught_with_its_invariant(variant: Variant, zoo_results: dict[str, Result]) -> None:
    result = zoo_results[variant.name]
    assert result.violation is not None, f"{variant.name}: {variant.description} went unnoticed"
    assert result.violation.invariant == variant.breaks, result.violation
    assert result.violation.trace, "a violation comes with the trace that reaches it"


@pytest.mark.parametrize("variant", ZOO, ids=[v.name for v in ZOO])
def test_trace_replays_to_the_violation(variant: Variant, zoo_results: dict[str, Result]) -> None:
    violation = zoo_results[variant.name].violation
    assert violation is not None
    world = initial_world(ZOO_BOUNDS)
    for number, label in enumerate(violation.trace, start=1):
        candidates = [m for m in moves(world, ZOO_BOUNDS, variant.protocol)[0] if m.label == label]
        assert candidates, f"step {number} ({label!r}) is not a move from the world before it"
        move = candidates[0]
        last = number == len(violation.trace)
        broken = move.broken if move.broken is not None else check_state(move.world, ZOO_BOUNDS)
        if last and broken is None:
            # A dead end is a property of the world the trace reaches: no move leaves it.
            after, _ = moves(move.world, ZOO_BOUNDS, variant.protocol)
            broken = without_exit(move.world, ZOO_BOUNDS, after)
        if last:
            assert broken is not None and broken[0] == variant.breaks
        else:
            assert broken is None, f"the trace breaks {broken} before its end"
        world = move.world


# Complete and small, with two steps so that steps compose with steps as well as with finalizes.
COMPOSE_BOUNDS = Bounds(workers=2, executions=1, claims_per_execution=1, steps_per_execution=2, max_tick=3)


def _composed_labels(bounds: Bounds, proto: Protocol) -> set[str]:
    """Every composed move made from any world reachable within ``bounds``."""
    world = initial_world(bounds)
    frontier, seen, labels = [world], {world}, set()
    while frontier:
        for move in moves(frontier.pop(), bounds, proto)[0]:
            if "in one transaction" in move.label:
                labels.add(move.label)
            if move.world not in seen:
                seen.add(move.world)
                frontier.append(move.world)
    return labels


@pytest.mark.parametrize(
    ("proto", "moves_composed"),
    [
        (Protocol(compose=True, compose_plans_on_written=False), False),
        (Protocol(compose=True, compose_guards_each=False), True),
    ],
    ids=["stale-plan-guarded", "unguarded-fresh-plan"],
)
def test_each_half_of_the_composition_bug_alone_is_harmless(proto: Protocol, moves_composed: bool) -> None:
    # Stale planning alone: every second decision fails its own guard on the written world, so no composed
    # move exists and the worlds are the uncomposed ones.  An unchecked second guard alone: a decision
    # planned on the written world holds there anyway.  The zoo's variant needs both.
    composed_result, composed = reachable(COMPOSE_BOUNDS, proto)
    plain_result, plain = reachable(COMPOSE_BOUNDS, Protocol())
    assert composed_result.violation is None, composed_result.violation
    assert composed_result.complete and composed == plain
    # Composition was tried (its second decisions were decided) ...
    assert composed_result.transitions > plain_result.transitions
    # ... and committed only where the second decision was planned on the written world.
    assert bool(_composed_labels(COMPOSE_BOUNDS, proto)) is moves_composed


def test_real_protocol_passes_the_zoo_bounds() -> None:
    result = explore(ZOO_BOUNDS, Protocol())
    assert result.violation is None, result.violation
    assert result.depth == ZOO_BOUNDS.max_depth
    # Not vacuous: the space explored is far larger than any variant needed.
    assert result.states > 10_000
