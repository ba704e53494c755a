"""Every single-transition change to a machine table is caught by the project's checks.

Mutation-testing tools mutate code, not module-level data, so the tables in
``kernel/machines.py`` are mutated here by hand.  For every transition of
every machine we build each of these mutants of its :class:`MachineSpec`:

- the transition dropped;
- the transition retargeted to every other state;
- the transition duplicated with every other target, and duplicated exactly.

A mutant counts as caught if spec validation refuses it, if binding it to the
machine's enums refuses it, or if the bound machine disagrees with the
committed TOML on at least one (state, event) pair.  Every mutant must be
caught, and the number of mutants is checked against the number the tables
imply, so the test cannot pass by enumerating nothing.

The committed TOML text is mutated too (a block dropped, a target changed, a
block duplicated) to show that the byte-identity check and the parser see it.
"""

from __future__ import annotations

import enum
import re
from collections import Counter
from collections.abc import Iterator

import attrs
import pytest

from fencekeeper.kernel import MACHINES, InvalidSpec, render_machine_spec
from fencekeeper.kernel.machines import Machine, machine_from_spec
from fencekeeper.kernel.spec import MachineSpec, build_machine_spec, parse_machine_spec

from .oracle import SPECS, committed_spec, table_discrepancies

NAMES = list(MACHINES)
COMMITTED = {name: committed_spec(name) for name in NAMES}

DROP, RETARGET, DUPLICATE_OTHER, DUPLICATE_EXACT = "drop", "retarget", "duplicate-other-target", "duplicate-exact"


def _mutants(spec: MachineSpec) -> Iterator[tuple[str, str, MachineSpec]]:
    """``(kind, description, mutant)`` for every single-transition mutation of ``spec``."""
    rows = spec.transitions
    for i, t in enumerate(rows):
        before, after = rows[:i], rows[i + 1 :]
        yield DROP, f"drop ({t.describe()})", attrs.evolve(spec, transitions=before + after)
        for state in spec.states:
            if state == t.target:
                continue
            moved = attrs.evolve(t, target=state)
            yield RETARGET, f"({t.describe()}) -> {state}", attrs.evolve(spec, transitions=(*before, moved, *after))
            yield (
                DUPLICATE_OTHER,
                f"({t.describe()}) also -> {state}",
                attrs.evolve(spec, transitions=(*before, t, moved, *after)),
            )
        yield DUPLICATE_EXACT, f"({t.describe()}) twice", attrs.evolve(spec, transitions=(*before, t, t, *after))


def _expected_mutant_count(spec: MachineSpec) -> int:
    # Per transition: one drop, (states - 1) retargets, (states - 1)
    # duplicates with another target and one exact duplicate.
    return len(spec.transitions) * (1 + 2 * (len(spec.states) - 1) + 1)


def _how_caught(machine: Machine[enum.Enum, enum.Enum], mutant: MachineSpec) -> str | None:
    """Which check refuses ``mutant`` ("validation", "binding", "oracle"), or None."""
    try:
        build_machine_spec(mutant, f"mutant of {machine.name}")
    except InvalidSpec:
        return "validation"
    try:
        bound = machine_from_spec(mutant, machine.state_type, machine.event_type)
    except InvalidSpec:
        return "binding"
    if table_discrepancies(bound, COMMITTED[machine.name]):
        return "oracle"
    return None


@pytest.mark.parametrize("name", NAMES)
def test_unmutated_machine_has_no_discrepancies(name: str) -> None:
    machine = MACHINES[name]
    assert table_discrepancies(machine, COMMITTED[name]) == []
    assert _how_caught(machine, machine.spec) is None


@pytest.mark.parametrize("name", NAMES)
def test_every_table_mutant_is_caught(name: str) -> None:
    machine = MACHINES[name]
    survivors = []
    by_kind: Counter[tuple[str, str]] = Counter()
    for kind, description, mutant in _mutants(machine.spec):
        assert mutant != machine.spec
        how = _how_caught(machine, mutant)
        if how is None:
            survivors.append(description)
        else:
            by_kind[kind, how] += 1
    assert survivors == [], f"{name}: mutants no check noticed: {survivors}"
    assert sum(by_kind.values()) == _expected_mutant_count(machine.spec)
    # A duplicated (source, event) pair must be refused by validation itself,
    # not left for the oracle: a spec with one is ambiguous, whatever the
    # committed file says.
    rows = len(machine.spec.transitions)
    assert by_kind[DUPLICATE_EXACT, "validation"] == rows
    assert by_kind[DUPLICATE_OTHER, "validation"] == rows * (len(machine.spec.states) - 1)


def test_mutant_count_matches_the_tables() -> None:
    # Guards the enumeration itself: it must produce one mutant per
    # (transition, kind, other state) and the tables must not be empty.
    total = 0
    for machine in MACHINES.values():
        produced = sum(1 for _ in _mutants(machine.spec))
        assert produced == _expected_mutant_count(machine.spec) > 0
        total += produced
    assert total == sum(2 * len(m.spec.transitions) * len(m.spec.states) for m in MACHINES.values())


def test_a_retarget_the_validator_accepts_is_still_caught_by_the_oracle() -> None:
    # Proves the oracle is load-bearing: some mutants are valid machines
    # (here: release sends a running execution to waiting instead of
    # eligible), and only the comparison with the committed file sees them.
    machine = MACHINES["execution"]
    rows = tuple(
        attrs.evolve(t, target="waiting") if (t.event, t.source) == ("release", "running") else t
        for t in machine.spec.transitions
    )
    mutant = attrs.evolve(machine.spec, transitions=rows)
    build_machine_spec(mutant, "mutant")
    bound = machine_from_spec(mutant, machine.state_type, machine.event_type)
    assert table_discrepancies(bound, COMMITTED["execution"]) == [
        "execution: running --release--> kernel waiting, spec eligible"
    ]


# --- the committed TOML text ---------------------------------------------------

_BLOCK = "\n\n[[transitions]]\n"


def _split(text: str) -> tuple[str, list[str]]:
    header, *blocks = text.split(_BLOCK)
    return header, blocks


def _join(header: str, blocks: list[str]) -> str:
    return _BLOCK.join([header, *blocks])


def _committed_text(name: str) -> str:
    return (SPECS / f"{name}.toml").read_text(encoding="utf-8")


_TARGET_LINE = re.compile(r'^target = "([^"]*)"$', re.MULTILINE)


def _target_of(block: str) -> str:
    match = _TARGET_LINE.search(block)
    assert match, block
    return match.group(1)


def _retarget(block: str, state: str) -> str:
    moved, count = _TARGET_LINE.subn(f'target = "{state}"', block)
    assert count == 1, block
    return moved


@pytest.mark.parametrize("name", NAMES)
def test_block_splitting_is_lossless(name: str) -> None:
    # The text mutants below are only meaningful if splitting and rejoining
    # reproduces the committed file exactly.
    text = _committed_text(name)
    header, blocks = _split(text)
    assert len(blocks) == len(MACHINES[name].spec.transitions)
    assert _join(header, blocks) == text == render_machine_spec(MACHINES[name].spec)


def _text_mutant_is_caught(name: str, mutated: str) -> None:
    machine = MACHINES[name]
    assert render_machine_spec(machine.spec) != mutated
    try:
        parsed = parse_machine_spec(mutated, f"{name}.toml")
    except InvalidSpec:
        return
    assert parsed != machine.spec


@pytest.mark.parametrize("name", NAMES)
def test_dropping_any_committed_block_is_caught(name: str) -> None:
    header, blocks = _split(_committed_text(name))
    for i in range(len(blocks)):
        _text_mutant_is_caught(name, _join(header, blocks[:i] + blocks[i + 1 :]))


@pytest.mark.parametrize("name", NAMES)
def test_changing_any_committed_target_is_caught(name: str) -> None:
    header, blocks = _split(_committed_text(name))
    states = MACHINES[name].spec.states
    changed = 0
    for i, block in enumerate(blocks):
        old = _target_of(block)
        for state in states:
            if state != old:
                moved = _retarget(block, state)
                _text_mutant_is_caught(name, _join(header, [*blocks[:i], moved, *blocks[i + 1 :]]))
                changed += 1
    assert changed == len(blocks) * (len(states) - 1)


@pytest.mark.parametrize("name", NAMES)
def test_duplicating_any_committed_block_is_refused_by_the_parser(name: str) -> None:
    header, blocks = _split(_committed_text(name))
    states = MACHINES[name].spec.states
    for i, block in enumerate(blocks):
        old = _target_of(block)
        other = next(s for s in states if s != old)
        for copy in (block, _retarget(block, other)):
            mutated = _join(header, [*blocks[: i + 1], copy, *blocks[i + 1 :]])
            assert render_machine_spec(MACHINES[name].spec) != mutated
            with pytest.raises(InvalidSpec, match=r"duplicate \(source, event\) pair") as raised:
                parse_machine_spec(mutated, f"{name}.toml")
            assert raised.value.filename == f"{name}.toml"
            assert f"transition #{i + 2} (" in raised.value.problem
