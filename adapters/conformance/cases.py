"""Generates the language-neutral conformance cases of specs/conformance/ from the kernel.

Rules of this module:

- Every expected result is computed by the kernel (``fencekeeper.kernel``)
  or, for the store layer, by the reference in-memory store; never written
  by hand.  Each layer's inputs are chosen in its own module
  (``protocol_cases``, ``expression_cases``, ``definition_cases``,
  ``operations_cases``, ``journal_cases``, ``journal_append_cases``,
  ``interpreter_cases``, ``store_cases``); this one holds
  the machines layer and writes the files.  ``make specs`` writes them, and
  ``tests/conformance/test_cases_committed.py`` fails if a regeneration
  would change a byte.
- Output is deterministic: cases in a fixed order, JSON with sorted keys,
  ids unique per layer.
- Every case names the parts of its expectation that are normative; free
  text never is (and is never written).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from fencekeeper.kernel.machines import MACHINES

from .basis import LAYERS, SUITE_VERSION, Case
from .definition_cases import definition_cases
from .expression_cases import expression_cases
from .interpreter_cases import interpreter_cases
from .journal_append_cases import journal_append_cases
from .journal_cases import journal_cases
from .operations_cases import operation_cases
from .protocol_cases import protocol_cases, recovery_cases
from .store_cases import store_cases

__all__ = ["LAYERS", "SUITE_VERSION", "generate", "layer_cases", "render_layer"]


# --- machines ---------------------------------------------------------------------------


def machine_cases() -> list[Case]:
    """Every (machine, state, event) pair: its target, or illegal."""
    cases = []
    for name, machine in MACHINES.items():
        for state in machine.state_type:
            for event in machine.event_type:
                found = machine.table.get((state, event))
                expected = {"illegal": True} if found is None else {"target": found.value}
                cases.append(
                    {
                        "id": f"{name}/{state.value}/{event.value}",
                        "input": {"machine": name, "state": state.value, "event": event.value},
                        "expected": expected,
                        "normative": ["illegal", "target"],
                    }
                )
    return cases


# --- files --------------------------------------------------------------------------------

_DESCRIPTIONS = {
    "machines": "Every (machine, state, event) pair of specs/machines/*.toml: its target, or illegal.",
    "protocol": "Pure lease and fencing decisions of specs/protocol.md: rows before, request and now; "
    "then the refusal code and field, the unchanged code, or the writes and the guard.",
    "recovery": "Governed recovery decisions of specs/protocol.md (recover rows) on a store holding no evidence.",
    "expressions": "specs/expressions.md: source and bindings, then true, false, unknown, or the parse error code.",
    "definitions": "specs/definitions.md: a definition in its JSON form, then valid, or the error code, node and field.",
    "operations": "Durable-operation decisions of specs/operations.md: the Operation, the request and now; then "
    "the refusal code and field, the unchanged code and Operation, or the writes and the guard.",
    "journal": "The journal fixture pack of specs/journal.md (section 9): workflow, policy and chain; then valid "
    "with the head, event count, node states and attempt history, or the refusal code and ordinal.",
    "journal-append": "Appending one command to a chain (specs/journal.md, section 6): workflow, policy, headers, "
    "chain, the command in its JSON form, now and the records a resolver finds; then the refusal code, an "
    "idempotent repeat with the head, or the digests of the records appended and the new head.",
    "interpreter": "One node visit (specs/interpreter.md): the execution row, its pinned definition, its evidence, "
    "the lease, the node's authority answer, now and a Command's result; then the plan: continue at a node, leave "
    "running for a state with its code, step and wait registration, or issue a Command, with the evidence it commits.",
    "store": "Whole-store scripts (specs/conformance.md, Store layer): sessions, requests, outcomes and "
    "final rows, including concurrent interleavings.",
}


_GENERATORS: dict[str, Callable[[], list[Case]]] = {
    "machines": machine_cases,
    "protocol": protocol_cases,
    "recovery": recovery_cases,
    "expressions": expression_cases,
    "definitions": definition_cases,
    "operations": operation_cases,
    "journal": journal_cases,
    "journal-append": journal_append_cases,
    "interpreter": interpreter_cases,
    "store": store_cases,
}
assert tuple(_GENERATORS) == LAYERS


def layer_cases(layer: str) -> list[Case]:
    """One layer's cases, in their committed order."""
    return _GENERATORS[layer]()


def render_layer(layer: str) -> str:
    cases = layer_cases(layer)
    ids = [c["id"] for c in cases]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise AssertionError(f"{layer}: duplicate case ids {duplicates[:5]}")
    document = {
        "$schema": "cases.schema.json",
        "suite": "fencekeeper-conformance",
        "version": SUITE_VERSION,
        "layer": layer,
        "description": _DESCRIPTIONS[layer],
        "cases": cases,
    }
    return json.dumps(document, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def generate(directory: Path) -> list[Path]:
    """Write one file per layer into ``directory``; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for layer in LAYERS:
        path = directory / f"{layer}.json"
        path.write_text(render_layer(layer), encoding="utf-8")
        written.append(path)
    return written
