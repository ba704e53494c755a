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



def _foreign_values(machine: Machine[enum.Enum, enum.Enum]) -> list[object]:
    """What a caller may pass by mistake: the spec string, another machine's member, None, a list."""
    state = next(iter(machine.state_type))
    others = [m for m in MACHINES.values() if m.state_type is not machine.state_type]
    return [state.value, next(iter(others[0].state_type)), None, []]


@pytest.mark.parametrize("name", list(MACHINES))
def test_a_state_or_event_of_another_type_is_a_type_error_naming_it(name: str) -> None:
    # Not IllegalTransition (the table was never asked) and not an
    # AttributeError from deep inside the error message.
    machine: Machine[enum.Enum, enum.Enum] = MACHINES[name]
    state, event = next(iter(machine.table))
    bad_state = rf"^machine '{name}': state must be a member of {machine.state_type.__name__}, got "
    bad_event = rf"^machine '{name}': event must be a member of {machine.event_type.__name__}, got "
    for value in _foreign_values(machine):
        with pytest.raises(TypeError, match=bad_state):
            step(machine, value, event)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=bad_state):
            machine.allows(value, event)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=bad_state):
            machine.events_from(value)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=bad_event):
            step(machine, state, value)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=bad_event):
            machine.allows(state, value)  # type: ignore[arg-type]


def test_step_names_a_machine_that_is_not_one() -> None:
    with pytest.raises(TypeError, match=r"^machine must be a Machine"):
        step("execution", *next(iter(MACHINES["execution"].table)))  # type: ignore[arg-type]
