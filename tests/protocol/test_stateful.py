"""Long random runs of the protocol, with every invariant checked after every move.

The model checker is exhaustive but shallow; this Hypothesis state machine
goes deep instead: hundreds of moves per run over the same decisions and
the same moves (claims, renewals, steps, releases, finalizations, racing
wakes, cancellations, recovery), with generous bounds and the real step
limit of 100, which the model checker's small bounds never reach.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.modelcheck import Bounds, Move, Protocol, World, check_state, initial_world, moves

BOUNDS = Bounds(
    workers=3,
    executions=2,
    claims_per_execution=1_000,
    steps_per_execution=p.STEP_LIMIT + 1,  # one past the limit, so the refusal itself is exercised
    lease_ticks=2,
    max_tick=100_000,
    race_window=3,
)


class ProtocolRuns(RuleBasedStateMachine):
    world: World

    @initialize()
    def start(self) -> None:
        self.world = initial_world(BOUNDS)
        self.cache: dict[tuple[object, ...], list[object]] = {}  # shared by every moves() call of this run
        self.protocol = Protocol()
        self.steps_seen = 0

    def _successors(self) -> list[Move]:
        found, _ = moves(self.world, BOUNDS, self.protocol, self.cache)  # type: ignore[arg-type]
        return found

    @rule(data=st.data())
    def any_move(self, data: st.DataObject) -> None:
        successors = self._successors()
        assert successors, "the world can always move (at least the clock ticks)"
        move = data.draw(st.sampled_from(successors), label="move")
        assert move.broken is None, f"{move.label}: {move.broken}"
        self.world = move.world

    @rule(count=st.integers(min_value=1, max_value=40))
    def work_hard(self, count: int) -> None:
        # A lease holder records many steps in a row, renewing as it goes, so
        # that runs reach the 100-step limit the decisions must enforce.
        for _ in range(count):
            successors = self._successors()
            busy = [m for m in successors if " records a step " in m.label] or [
                m for m in successors if " renews " in m.label
            ]
            if not busy:
                return
            move = busy[0]
            assert move.broken is None, f"{move.label}: {move.broken}"
            self.world = move.world

    @invariant()
    def invariants_hold(self) -> None:
        if hasattr(self, "world"):
            broken = check_state(self.world, BOUNDS)
            assert broken is None, broken
            for execution in self.world.executions:
                assert execution.step_count <= p.STEP_LIMIT
                self.steps_seen = max(self.steps_seen, execution.step_count)


def test_long_random_runs() -> None:
    run_state_machine_as_test(
        ProtocolRuns,
        settings=settings(
            max_examples=25,
            stateful_step_count=300,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


def test_runs_reach_the_step_limit() -> None:
    # The work_hard rule must actually drive an execution to the limit, or the
    # run above would never exercise step_limit_reached.
    machine = ProtocolRuns()
    machine.start()
    claim = next(m for m in machine._successors() if m.label == "w1 claims e1")
    machine.world = claim.world
    for _ in range(10):
        machine.work_hard(40)
    assert max(e.step_count for e in machine.world.executions) == p.STEP_LIMIT
    assert not any(" records a step " in m.label for m in machine._successors())
