"""Every (state, event) pair of every machine, one test case each.

Legal pairs must give exactly the committed spec's target; illegal pairs must
raise IllegalTransition naming machine, state and event, and leave the
machine's table exactly as it was.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator

import pytest

from fencekeeper.kernel import MACHINES, IllegalTransition, KernelError, step
from fencekeeper.kernel.machines import Machine

from .oracle import committed_spec

ORACLES = {name: committed_spec(name).table() for name in MACHINES}


def _pairs() -> Iterator[tuple[str, enum.Enum, enum.Enum]]:
    for name, machine in MACHINES.items():
        for state in machine.state_type:
            for event in machine.event_type:
                yield name, state, event


@pytest.mark.parametrize(
    ("name", "state", "event"),
    list(_pairs()),
    ids=[f"{n}:{s.value}:{e.value}" for n, s, e in _pairs()],
)
def test_pair(name: str, state: enum.Enum, event: enum.Enum) -> None:
    machine: Machine[enum.Enum, enum.Enum] = MACHINES[name]
    before = dict(machine.table)
    want = ORACLES[name].get((str(state.value), str(event.value)))
    if want is not None:
        assert step(machine, state, event) == machine.state_type(want)
        assert machine.allows(state, event)
    else:
        with pytest.raises(IllegalTransition) as raised:
            step(machine, state, event)
        err = raised.value
        assert isinstance(err, KernelError)
        assert err.code == "illegal_transition"
        assert (err.machine, err.state, err.event) == (name, state.value, event.value)
        assert repr(name) in str(err) and repr(state.value) in str(err) and repr(event.value) in str(err)
        assert not machine.allows(state, event)
    assert dict(machine.table) == before


def test_pair_count_covers_every_pair() -> None:
    # Guards the parametrization itself: it must enumerate the full product.
    expected = sum(len(m.state_type) * len(m.event_type) for m in MACHINES.values())
    assert len(list(_pairs())) == expected


def test_tables_are_read_only() -> None:
    machine = MACHINES["execution"]
    with pytest.raises(TypeError):
        machine.table[next(iter(machine.table))] = next(iter(machine.state_type))  # type: ignore[index]


@pytest.mark.parametrize("name", list(MACHINES))
def test_terminal_states_are_absorbing(name: str) -> None:
    machine = MACHINES[name]
    for state in machine.terminal:
        assert machine.events_from(state) == ()
