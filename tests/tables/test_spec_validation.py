"""Malformed machine specs are refused with a precise InvalidSpec; valid ones round-trip.

- Every rule of ``kernel/spec.py`` is broken once, by editing the committed
  TOML of a real machine, and the refusal must be an :class:`InvalidSpec`
  whose one-line message starts with the file name and names the culprit:
  the transition as ``event: source -> target``, or the field.
- Randomly generated valid specs (random graphs built to satisfy every
  rule, with hostile text in every string) survive
  ``parse(render(spec)) == spec``, and rendering is byte-stable.
- ``fencekeeper check-spec`` reports good files as ok (exit 0), a malformed
  file as one ``fencekeeper: error: <file>: ...`` line (exit 1), and an
  unreadable file as one line (exit 2), never with a traceback.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fencekeeper.adapters.cli import main
from fencekeeper.kernel import MACHINES, InvalidSpec, MachineSpec, TransitionSpec
from fencekeeper.kernel.spec import build_machine_spec, parse_machine_spec, render_machine_spec

from .oracle import SPECS

FILENAME = "specs/machines/broken.toml"


def _text(name: str) -> str:
    return (SPECS / f"{name}.toml").read_text(encoding="utf-8")


def _set_top(text: str, field: str, line: str | None) -> str:
    """Replace (or, with None, delete) the top-level line ``field = ...``."""
    pattern = re.compile(rf"^{field} = .*\n", re.MULTILINE)
    header, sep, rest = text.partition("\n[[transitions]]")
    new, count = pattern.subn("" if line is None else line + "\n", header, count=1)
    assert count == 1, f"no top-level {field!r}"
    return new + sep + rest


def _set_in_block(text: str, number: int, field: str, line: str | None) -> str:
    """Replace (or delete) ``field = ...`` in the ``number``-th (1-based) transition block."""
    parts = text.split("[[transitions]]\n")
    pattern = re.compile(rf"^{field} = .*\n", re.MULTILINE)
    parts[number], count = pattern.subn("" if line is None else line + "\n", parts[number], count=1)
    assert count == 1, f"no {field!r} in transition #{number}"
    return "[[transitions]]\n".join(parts)


def _add_to_block(text: str, number: int, line: str) -> str:
    parts = text.split("[[transitions]]\n")
    parts[number] = parts[number].rstrip("\n") + "\n" + line + ("\n\n" if number < len(parts) - 1 else "\n")
    return "[[transitions]]\n".join(parts)


def _append_block(text: str, event: str, source: str, target: str) -> str:
    return (
        text
        + f'\n[[transitions]]\nevent = "{event}"\nsource = "{source}"\ntarget = "{target}"\n'
        + 'cite = "a test"\nderived = false\n'
    )


@dataclass(frozen=True)
class Case:
    id: str
    build: Callable[[], str]
    fragments: tuple[str, ...]


ATTEMPT_T1 = "transition #1 (start: pending -> running)"
EXECUTION_T1 = "transition #1 (claim: eligible -> running)"

CASES = [
    # Unknown states.
    Case("unknown-transition-source", lambda: _set_in_block(_text("attempt"), 1, "source", 'source = "nowhere"'),
         ("transition #1 (start: nowhere -> running)", "field 'source'", "unknown state 'nowhere'")),
    Case("unknown-transition-target", lambda: _set_in_block(_text("attempt"), 1, "target", 'target = "nowhere"'),
         ("transition #1 (start: pending -> nowhere)", "field 'target'", "unknown state 'nowhere'")),
    Case("unknown-initial", lambda: _set_top(_text("attempt"), "initial", 'initial = ["nowhere"]'),
         ("field 'initial'", "unknown state 'nowhere'")),
    Case("unknown-terminal", lambda: _set_top(_text("attempt"), "terminal", 'terminal = ["completed", "nowhere"]'),
         ("field 'terminal'", "unknown state 'nowhere'")),
    Case("unknown-review", lambda: _set_top(_text("attempt"), "review", 'review = ["nowhere"]'),
         ("field 'review'", "unknown state 'nowhere'")),
    # Duplicates.
    Case("duplicate-source-event", lambda: _append_block(_text("attempt"), "start", "pending", "failed"),
         ("transition #12 (start: pending -> failed)", "duplicate (source, event) pair",
          "already given by (start: pending -> running)")),
    Case("duplicate-state", lambda: _set_top(_text("attempt"), "states",
                                              'states = ["pending", "running", "completed", "failed", "unknown", '
                                              '"reconciliation_required", "running"]'),
         ("field 'states'", "twice", "'running'")),
    Case("duplicate-initial", lambda: _set_top(_text("node"), "initial", 'initial = ["ready", "ready"]'),
         ("field 'initial'", "twice", "'ready'")),
    # Missing top-level fields.
    *(
        Case(f"missing-top-{field}", lambda field=field: _set_top(_text("attempt"), field, None),
             ("top level", f"missing field {field!r}"))
        for field in ("name", "source", "states", "initial", "terminal", "review")
    ),
    # Missing transition fields: the transition is still named, '?' for what is missing.
    Case("missing-transition-event", lambda: _set_in_block(_text("attempt"), 1, "event", None),
         ("transition #1 (?: pending -> running)", "missing field 'event'")),
    Case("missing-transition-source", lambda: _set_in_block(_text("attempt"), 1, "source", None),
         ("transition #1 (start: ? -> running)", "missing field 'source'")),
    Case("missing-transition-target", lambda: _set_in_block(_text("attempt"), 1, "target", None),
         ("transition #1 (start: pending -> ?)", "missing field 'target'")),
    Case("missing-transition-cite", lambda: _set_in_block(_text("attempt"), 1, "cite", None),
         (ATTEMPT_T1, "missing field 'cite'")),
    Case("missing-transition-derived", lambda: _set_in_block(_text("execution"), 1, "derived", None),
         (EXECUTION_T1, "field 'derived'")),
    # Unknown extra fields.
    Case("unknown-top-field", lambda: _set_top(_text("attempt"), "name", 'name = "attempt"\ncolour = "red"'),
         ("top level", "unknown field 'colour'")),
    Case("unknown-transition-field", lambda: _add_to_block(_text("attempt"), 1, "weight = 3"),
         (ATTEMPT_T1, "unknown field 'weight'")),
    # derived / rationale.
    Case("derived-without-rationale", lambda: _set_in_block(_text("attempt"), 1, "rationale", None),
         (ATTEMPT_T1, "derived transition needs a 'rationale'")),
    Case("derived-with-empty-rationale", lambda: _set_in_block(_text("attempt"), 1, "rationale", 'rationale = ""'),
         (ATTEMPT_T1, "derived transition needs a 'rationale'")),
    Case("rationale-without-derived", lambda: _add_to_block(_text("execution"), 1, 'rationale = "because"'),
         (EXECUTION_T1, "'rationale' belongs only to derived transitions")),
    Case("derived-is-a-string", lambda: _set_in_block(_text("execution"), 1, "derived", 'derived = "false"'),
         (EXECUTION_T1, "field 'derived' must be true or false")),
    Case("derived-is-an-integer", lambda: _set_in_block(_text("execution"), 1, "derived", "derived = 0"),
         (EXECUTION_T1, "field 'derived' must be true or false")),
    Case("rationale-not-a-string", lambda: _set_in_block(_text("attempt"), 1, "rationale", "rationale = 3"),
         (ATTEMPT_T1, "field 'rationale' must be a string")),
    # Wrong types and empty strings.
    Case("name-not-a-string", lambda: _set_top(_text("attempt"), "name", "name = 3"),
         ("top level", "field 'name' must be a string")),
    Case("empty-name", lambda: _set_top(_text("attempt"), "name", 'name = ""'),
         ("field 'name' must be a non-empty string",)),
    Case("empty-source", lambda: _set_top(_text("attempt"), "source", 'source = ""'),
         ("field 'source'",)),
    Case("states-not-a-list", lambda: _set_top(_text("attempt"), "states", 'states = "pending"'),
         ("top level", "field 'states' must be an array of strings")),
    Case("states-not-strings", lambda: _set_top(_text("attempt"), "terminal", "terminal = [1]"),
         ("top level", "field 'terminal' must be an array of strings")),
    Case("transitions-not-a-list", lambda: _text("attempt").partition("\n[[transitions]]")[0] + "\ntransitions = 3\n",
         ("field 'transitions' must be an array of tables",)),
    Case("transition-not-a-table", lambda: _text("attempt").partition("\n[[transitions]]")[0] + "\ntransitions = [1]\n",
         ("transition #1 must be a table",)),
    Case("event-not-a-string", lambda: _set_in_block(_text("attempt"), 1, "event", "event = 1"),
         ("transition #1 (1: pending -> running)", "field 'event' must be a string")),
    Case("empty-event", lambda: _set_in_block(_text("attempt"), 1, "event", 'event = ""'),
         ("transition #1 ('': pending -> running)", "field 'event' must be a non-empty string")),
    Case("empty-cite", lambda: _set_in_block(_text("attempt"), 1, "cite", 'cite = ""'),
         (ATTEMPT_T1, "field 'cite'")),
    # Not TOML at all.
    Case("invalid-toml-unterminated-string", lambda: _set_top(_text("attempt"), "name", 'name = "attempt'),
         ("not valid TOML",)),
    Case("invalid-toml-repeated-key", lambda: _set_top(_text("attempt"), "name", 'name = "attempt"\nname = "again"'),
         ("not valid TOML",)),
    Case("invalid-toml-garbage", lambda: "this is not toml\n", ("not valid TOML",)),
    # Graph rules.
    Case("unreachable-state", lambda: _set_top(_text("operation"), "states",
                                                'states = ["admitted", "awaiting_approval", "running", "succeeded", '
                                                '"failed", "cancelled", "outcome_unknown", "orphan"]'),
         ("state 'orphan' is not reachable from an initial state",)),
    Case("transition-out-of-terminal", lambda: _append_block(_text("attempt"), "reopen", "completed", "running"),
         ("transition #12 (reopen: completed -> running)", "leaves terminal state 'completed'")),
    # A dead end: a state entered but never left (no execution may be stuck without a governed exit).
    Case("cannot-reach-terminal", lambda: _append_block(
        _set_top(_text("execution"), "states",
                 'states = ["eligible", "running", "waiting", "succeeded", "failed", "cancelled", "suspended", '
                 '"reconciliation_required", "limbo"]'),
        "vanish", "waiting", "limbo"),
         ("state 'limbo' cannot reach a terminal state",)),
    Case("terminal-declared-with-exits", lambda: _set_top(_text("node"), "terminal", 'terminal = ["invalidated"]'),
         ("leaves terminal state 'invalidated'",)),
    Case("terminal-and-review", lambda: _set_top(_text("attempt"), "review",
                                                  'review = ["unknown", "reconciliation_required", "completed"]'),
         ("state 'completed' cannot be both terminal and review",)),
    Case("empty-states", lambda: _set_top(_text("attempt"), "states", "states = []"),
         ("field 'states' must list at least one state",)),
    Case("empty-initial", lambda: _set_top(_text("attempt"), "initial", "initial = []"),
         ("field 'initial' must list at least one state",)),
]


def test_case_ids_are_unique() -> None:
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_spec_is_refused_naming_file_and_culprit(case: Case) -> None:
    text = case.build()
    with pytest.raises(InvalidSpec) as raised:
        parse_machine_spec(text, FILENAME)
    err = raised.value
    assert err.code == "invalid_spec"
    assert err.filename == FILENAME
    assert str(err) == f"{FILENAME}: {err.problem}"
    assert "\n" not in str(err), "an error must fit on one line"
    for fragment in case.fragments:
        assert fragment in err.problem, f"{fragment!r} not in {err.problem!r}"


@pytest.mark.parametrize("name", list(MACHINES))
def test_committed_specs_are_valid(name: str) -> None:
    # The cases above edit these files; they must be valid to begin with, or
    # a refusal would prove nothing about the edit.
    assert parse_machine_spec(_text(name), FILENAME) == MACHINES[name].spec


def test_rules_are_enforced_on_literal_specs_too() -> None:
    # build_machine_spec (what machines.py calls) applies the same rules as
    # the parser, so a table written in code cannot skip validation.
    spec = MACHINES["attempt"].spec
    broken = MachineSpec(
        name=spec.name,
        source=spec.source,
        states=spec.states,
        initial=spec.initial,
        terminal=spec.terminal,
        review=spec.review,
        transitions=(*spec.transitions, TransitionSpec("reopen", "completed", "running", "a test")),
    )
    with pytest.raises(InvalidSpec, match=r"^machine 'attempt': transition #12 \(reopen: completed -> running\)"):
        build_machine_spec(broken, "machine 'attempt'")


# --- round trip -----------------------------------------------------------------

# Everything TOML must escape, plus the rest of Unicode minus surrogates
# (which cannot be written as UTF-8 at all).
_HOSTILE = st.one_of(
    st.sampled_from(['"', "\\", "'", "\x00", "\x1f", "\x7f", "\n", "\r", "\t", "\x85", "\u2028", "\ufeff"]),
    st.characters(exclude_categories=("Cs",)),
)
_TEXT = st.text(_HOSTILE, min_size=1, max_size=12)


@st.composite
def valid_specs(draw: st.DrawFn) -> MachineSpec:
    states = draw(st.lists(_TEXT, min_size=1, max_size=6, unique=True))
    # A chain states[0] -> ... -> states[k-1] ending in a terminal state makes
    # every chain state reachable and able to finish; the remaining states
    # hang off the chain as extra terminal or review leaves.
    k = 1 if len(states) == 1 else draw(st.integers(2, len(states)))
    chain, leaves = states[:k], states[k:]
    terminal = [chain[-1]]
    review = []
    for leaf in leaves:
        (terminal if draw(st.booleans()) else review).append(leaf)
    finishing = set(terminal)

    edges: list[tuple[str, str]] = list(itertools.pairwise(chain))
    edges += [(draw(st.sampled_from(chain[:-1])), leaf) for leaf in leaves]
    # Extra edges may start anywhere that is not terminal and go anywhere.
    sources = [s for s in states if s not in finishing]
    if sources:
        edges += draw(st.lists(st.tuples(st.sampled_from(sources), st.sampled_from(states)), max_size=6))

    transitions = []
    used: set[tuple[str, str]] = set()
    for source, target in edges:
        event = draw(_TEXT.filter(lambda e, s=source: (s, e) not in used))
        used.add((source, event))
        derived = draw(st.booleans())
        transitions.append(
            TransitionSpec(
                event=event,
                source=source,
                target=target,
                cite=draw(_TEXT),
                derived=derived,
                rationale=draw(_TEXT) if derived else None,
            )
        )
    others = [s for s in states if s != chain[0]]
    initial = [chain[0], *draw(st.lists(st.sampled_from(others), unique=True, max_size=2) if others else st.just([]))]
    spec = MachineSpec(
        name=draw(_TEXT),
        source=draw(_TEXT),
        states=tuple(states),
        initial=tuple(initial),
        terminal=tuple(terminal),
        review=tuple(review),
        transitions=tuple(draw(st.permutations(transitions))),
    )
    return build_machine_spec(spec, "generated")


@settings(max_examples=200, deadline=None)
@given(valid_specs())
def test_render_then_parse_round_trips(spec: MachineSpec) -> None:
    text = render_machine_spec(spec)
    assert parse_machine_spec(text, "x") == spec
    assert render_machine_spec(parse_machine_spec(text, "x")) == text
    text.encode("utf-8")  # the committed form must be writable as UTF-8


@pytest.mark.parametrize("name", list(MACHINES))
def test_committed_specs_round_trip(name: str) -> None:
    spec = MACHINES[name].spec
    assert parse_machine_spec(render_machine_spec(spec), "x") == spec


# --- the check-spec command -------------------------------------------------------


def test_check_spec_accepts_every_committed_file(capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted(SPECS.glob("*.toml"))
    assert len(files) == len(MACHINES)
    assert main(["check-spec", *map(str, files)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert len(lines) == len(files)
    for path, line in zip(files, lines, strict=True):
        assert line.startswith(f"{path}: ok (")


def test_check_spec_reports_a_malformed_file_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "attempt.toml"
    bad.write_text(_append_block(_text("attempt"), "start", "pending", "failed"), encoding="utf-8")
    assert main(["check-spec", str(bad)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"fencekeeper: error: {bad}: transition #12 (start: pending -> failed): duplicate (source, event) pair, "
        "already given by (start: pending -> running)\n"
    )


def test_check_spec_reports_invalid_toml_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "garbage.toml"
    bad.write_text("name = \n", encoding="utf-8")
    assert main(["check-spec", str(bad)]) == 1
    _, err = capsys.readouterr()
    assert err.startswith(f"fencekeeper: error: {bad}: not valid TOML: ")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_check_spec_missing_file_exits_2_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "absent.toml"
    assert main(["check-spec", str(missing)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"fencekeeper: error: {missing}: cannot read")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_check_spec_non_utf8_file_exits_2_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"name = \"\xff\"\n")
    assert main(["check-spec", str(binary)]) == 2
    _, err = capsys.readouterr()
    assert err == f"fencekeeper: error: {binary}: not UTF-8 text\n"


def test_installed_entry_point_reports_without_traceback(tmp_path: Path) -> None:
    # The console script, not just main(): what a user actually runs.
    script = Path(sys.executable).with_name("fencekeeper")
    assert script.exists(), script
    bad = tmp_path / "node.toml"
    bad.write_text(_set_top(_text("node"), "states", "states = []"), encoding="utf-8")
    good = SPECS / "node.toml"
    result = subprocess.run(
        [str(script), "check-spec", str(good), str(bad)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1
    assert result.stdout.startswith(f"{good}: ok (node: 8 states, ")
    assert result.stderr == f"fencekeeper: error: {bad}: field 'states' must list at least one state\n"
    missing = subprocess.run(
        [str(script), "check-spec", str(tmp_path / "absent.toml")], capture_output=True, text=True, timeout=60,
        check=False,
    )
    assert missing.returncode == 2
    assert missing.stderr.count("\n") == 1 and "Traceback" not in missing.stderr
