"""The committed TOML specs as an independent oracle for the kernel's tables.

The kernel's tables are literal data in ``kernel/machines.py``; the
committed files under ``specs/machines/`` are what other implementations
read.  The checks here compare a live :class:`Machine` with the committed
file *pair by pair*, so that any change to a table (a dropped, retargeted or
added transition) shows up as a named discrepancy.  The table-mutation test
uses the same function to prove that it sees every such change.
"""

from __future__ import annotations

import enum
from pathlib import Path

from fencekeeper.kernel.errors import IllegalTransition
from fencekeeper.kernel.machines import Machine
from fencekeeper.kernel.spec import MachineSpec, parse_machine_spec

SPECS = Path(__file__).resolve().parents[2] / "specs" / "machines"


def committed_spec(name: str) -> MachineSpec:
    path = SPECS / f"{name}.toml"
    return parse_machine_spec(path.read_text(encoding="utf-8"), str(path))


def table_discrepancies(machine: Machine[enum.Enum, enum.Enum], oracle: MachineSpec) -> list[str]:
    """Every (state, event) pair on which ``machine`` disagrees with ``oracle``."""
    expected = oracle.table()
    problems = []
    for state in machine.state_type:
        for event in machine.event_type:
            key = (str(state.value), str(event.value))
            try:
                got: str | None = str(machine.step(state, event).value)
            except IllegalTransition:
                got = None
            want = expected.get(key)
            if got != want:
                problems.append(f"{machine.name}: {key[0]} --{key[1]}--> kernel {got}, spec {want}")
    return problems
