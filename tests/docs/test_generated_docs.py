"""docs/machines.md and the diagrams are generated from the kernel's tables, completely.

The committed page must be exactly what the generator writes today (so a
changed table cannot leave a stale picture behind), and each diagram must
draw every transition, every initial state and every terminal state of its
spec (so the picture cannot quietly leave something out).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from pathlib import Path

import attrs
import pytest

from fencekeeper.adapters import diagrams
from fencekeeper.adapters.diagrams import machines_markdown, render_diagram
from fencekeeper.kernel import MACHINES
from fencekeeper.kernel.machines import Machine

DOCS = Path(__file__).resolve().parents[2] / "docs" / "machines.md"


def test_committed_page_is_the_generated_page() -> None:
    committed = DOCS.read_bytes()
    generated = machines_markdown().encode("utf-8")
    assert committed == generated, "docs/machines.md differs from the generator; run `make specs`"


# --- mermaid ----------------------------------------------------------------------

# An edge line as the renderer writes it: two-space indent, states, label.
_MERMAID_EDGE = re.compile(r"^  (\S+) --> (\S+): (.+)$")


def _mermaid_edges(text: str) -> list[tuple[str, str, str]]:
    edges = []
    for line in text.splitlines():
        m = _MERMAID_EDGE.match(line)
        if m:
            edges.append((m.group(1), m.group(2), m.group(3)))
    return edges


@pytest.mark.parametrize("name", list(MACHINES))
def test_mermaid_has_one_edge_line_per_transition(name: str) -> None:
    spec = MACHINES[name].spec
    text = render_diagram(spec, "mermaid")
    assert text.startswith("---\n") and "stateDiagram-v2" in text
    edges = _mermaid_edges(text)
    expected = [(t.source, t.target, t.event) for t in spec.transitions]
    # Compared as sorted lists: the renderer may order edges its own way,
    # but every transition needs its own line (no merged "a | b" labels, no
    # extras).
    assert sorted(edges) == sorted(expected), (
        f"{name}: edges drawn but not in the spec: {sorted(set(edges) - set(expected))}; "
        f"transitions not drawn on a line of their own: {sorted(set(expected) - set(edges))}"
    )


@pytest.mark.parametrize("name", list(MACHINES))
def test_mermaid_marks_initial_and_terminal_states(name: str) -> None:
    spec = MACHINES[name].spec
    lines = render_diagram(spec, "mermaid").splitlines()
    starts = sorted(line.strip()[len("[*] --> ") :] for line in lines if line.strip().startswith("[*] --> "))
    ends = sorted(line.strip()[: -len(" --> [*]")] for line in lines if line.strip().endswith(" --> [*]"))
    assert starts == sorted(spec.initial), f"{name}: initial markers {starts}, spec {list(spec.initial)}"
    assert ends == sorted(spec.terminal), f"{name}: terminal markers {ends}, spec {list(spec.terminal)}"


# --- dot --------------------------------------------------------------------------

# A node statement; graphviz quotes a state whose name is a dot keyword, so
# only the unquoted ``graph``, ``node`` and ``edge`` are attribute statements.
_DOT_NODE = re.compile(r'^\t(?:"([^"]+)"|(?!(?:graph|node|edge) )(\S+)) \[')
_DOT_EDGE = re.compile(r'^\t"?([^\s"]+)"? -> "?([^\s"]+)"? \[label=("[^"]*"|\S+?)[\s\]]')


@pytest.mark.parametrize("name", list(MACHINES))
def test_dot_has_every_state_and_every_event(name: str) -> None:
    spec = MACHINES[name].spec
    text = render_diagram(spec, "dot")
    assert text.startswith("digraph")
    lines = text.splitlines()
    nodes = {m.group(1) or m.group(2) for m in map(_DOT_NODE.match, lines) if m}
    assert nodes == set(spec.states), f"{name}: nodes {sorted(nodes)}, spec states {sorted(spec.states)}"
    labelled: dict[tuple[str, str], set[str]] = {}
    for m in map(_DOT_EDGE.match, lines):
        if m:
            source, target, label = m.groups()
            labelled.setdefault((source, target), set()).update(label.strip('"').split(" | "))
    missing = [t.describe() for t in spec.transitions if t.event not in labelled.get((t.source, t.target), set())]
    assert not missing, f"{name}: transitions without a labelled dot edge: {missing}"
    drawn = {(s, t) for s, t in labelled}
    assert drawn == {(t.source, t.target) for t in spec.transitions}, f"{name}: dot draws edges not in the spec"


# --- the byte comparison can see a change ------------------------------------------------------


AnyMachine = Machine[enum.Enum, enum.Enum]


def _without_last_transition(machine: AnyMachine) -> AnyMachine:
    spec = machine.spec
    return attrs.evolve(machine, spec=attrs.evolve(spec, transitions=spec.transitions[:-1]))


def _section(markdown: str, name: str) -> str:
    # Dispatch mirrors execution row for row, so a row is looked for only in
    # its own machine's section.
    start = markdown.index(f"\n## {name}\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end != -1 else len(markdown)]


def test_a_dropped_transition_changes_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    original = machines_markdown()
    execution = MACHINES["execution"]
    dropped = execution.spec.transitions[-1]
    changed: Mapping[str, AnyMachine] = {
        name: _without_last_transition(m) if name == "execution" else m for name, m in MACHINES.items()
    }
    monkeypatch.setattr(diagrams, "MACHINES", changed)
    mutated = machines_markdown()
    assert mutated != original
    row = f"| `{dropped.event}` | {dropped.source} | {dropped.target} |"
    assert row in _section(original, "execution") and row not in _section(mutated, "execution")
    edge = f"  {dropped.source} --> {dropped.target}: {dropped.event}"
    assert edge in render_diagram(execution.spec, "mermaid")
    assert edge not in render_diagram(_without_last_transition(execution).spec, "mermaid")
    monkeypatch.undo()
    assert machines_markdown() == original
