"""Stored values are shown, never obeyed: ``inspect`` and ``list`` escape what a terminal would act on.

The store below holds an execution whose recorded input carries terminal
escape sequences, a bidirectional override, a tab, a newline and a lone
surrogate (admission refuses the surrogate now; a store written before
that, or by another implementation, may still hold one).  The tests prove:

- ``inspect`` in plain text exits 0, writes none of those characters raw,
  and spells each as ``\\xNN``/``\\uNNNN``, with every timeline row still one
  line;
- ``inspect --json`` gives back every value exactly;
- ``list`` shows the execution.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import parse_definition
from tests.cli.runner import fencekeeper

HOSTILE = "\x1b[2J\x1b[31mred\x1b]0;title\x07 \u202eevil\ttab\nline \x9b2J end\ud800"
DEFINITION = parse_definition(
    """\
id = "note"
revision = 1
start = "done"
inputs = ["note"]

[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"
""",
    "note.toml",
)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hostile") / "shop.db"
    store = SQLiteStore(path)
    try:
        policy = examples.grants("default", "user:operator")
        service.register(store, DEFINITION, "default", "user:operator", policy)
        # Recorded as an older store could hold it: past today's admission check.
        record = i.input_evidence("x-1", DEFINITION, "user:operator", {"note": "clean"})
        record = attrs.evolve(record, body={**record.body, "input": {"note": HOSTILE}})
        authority = policy.check("user:operator", "default", service.WORKFLOW_RUN, (("note", 1),))
        request = p.AdmitRequest("x-1", "default", "note", 1, "done", authority)
        assert isinstance(store.admit(request, [record]), p.Decision)
    finally:
        store.close()
    return path


def test_inspect_escapes_what_a_terminal_would_obey(db: Path) -> None:
    result = fencekeeper("inspect", "x-1", "--db", db, cwd=db.parent)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    for raw in ("\x1b", "\x07", "\x9b", "\u202e", "\t", "\ud800"):
        assert raw not in result.stdout, f"{raw!r} written raw"
    [line] = [line for line in result.stdout.splitlines() if "input" in line and "recorded by" in line]
    # Spelled as JSON (\u001b) where the value is quoted, as \xNN otherwise: either way, visible.
    for code, rest in (("1b", "[2J"), ("1b", "[31mred"), ("07", " "), ("9b", "2J")):
        assert f"\\x{code}{rest}" in line or f"\\u00{code}{rest}" in line, (code, rest, line)
    for spelled in ("\\u202eevil", "\\ud800"):
        assert spelled in line, (spelled, line)
    # The newline is spelled too: the value did not break its row in two.
    assert "\\n" in line or "\\x0a" in line


def test_inspect_json_gives_back_the_exact_value(db: Path) -> None:
    result = fencekeeper("inspect", "x-1", "--db", db, "--json", cwd=db.parent)
    assert result.returncode == 0, result.stderr
    view = json.loads(result.stdout)
    [record] = [e for e in view["evidence"] if e["kind"] == "ExecutionInput"]
    assert record["body"]["input"]["note"] == HOSTILE


def test_list_shows_the_execution(db: Path) -> None:
    result = fencekeeper("list", "--db", db, cwd=db.parent)
    assert result.returncode == 0, result.stderr
    assert "x-1" in result.stdout
