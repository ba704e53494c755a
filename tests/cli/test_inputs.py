"""How JSON reaches the command line: --input @FILE and -, JSON definitions, typed inputs.

What these tests prove, through the installed entry point:

- ``--input @FILE`` reads the input from a file and ``--input -`` from
  standard input, and the execution records exactly that input; the same
  holds for ``event --correlation`` and ``--payload``;
- a definition file may be JSON, recognised by its ``.json`` name or by its
  content: it is the same definition as its TOML form (registering one after
  the other changes nothing);
- a definition with typed inputs admits what fits and refuses the rest with
  exit 2, naming the field, before anything is written.
"""

from __future__ import annotations

import json
from pathlib import Path

from fencekeeper.kernel.definition import parse_definition, to_json
from tests.cli.runner import EXAMPLES, assert_one_error_line, data, fencekeeper, snapshot

PURCHASE = EXAMPLES / "purchase_approval.toml"
INPUT = {"amount": 2500, "order_id": "o-1", "order_revision": 1}

TYPED = """\
id = "typed-order"
revision = 1
start = "check"

[inputs]
amount = { type = "integer", minimum = 1 }
currency = { type = "string", enum = ["EUR", "GBP"] }
note = { type = "string", maxLength = 20, required = false }

[[nodes]]
id = "check"
kind = "condition"
revision = 1
expression = "input.amount >= 100"
bindings = ["input.amount"]
true_next = "done"
false_next = "done"

[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"
"""


def recorded_input(db: Path, execution_id: str, cwd: Path) -> object:
    view = data("inspect", execution_id, "--db", db, cwd=cwd)
    [record] = [e for e in view["evidence"] if e["kind"] == "ExecutionInput"]
    return record["body"]["input"]


def test_input_from_a_file_and_from_stdin(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    (tmp_path / "order.json").write_text(json.dumps(INPUT), encoding="utf-8")
    result = fencekeeper("run", PURCHASE, "--db", db, "--input", "@order.json", "--id", "po-1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert recorded_input(db, "po-1", tmp_path) == INPUT

    piped = {**INPUT, "order_id": "o-2"}
    result = fencekeeper(
        "run", PURCHASE, "--db", db, "--input", "-", "--id", "po-2", cwd=tmp_path, stdin=json.dumps(piped)
    )
    assert result.returncode == 0, result.stderr
    assert recorded_input(db, "po-2", tmp_path) == piped


def test_event_correlation_and_payload_from_a_file_and_stdin(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    assert fencekeeper("migrate", "--db", db, cwd=tmp_path).returncode == 0
    (tmp_path / "payload.json").write_text('{"paid": 10}', encoding="utf-8")
    result = fencekeeper(
        "event", "--db", db, "payment.received", "--correlation", "-", "--payload", "@payload.json",
        "--id", "ev-1", "--json", cwd=tmp_path, stdin='{"order_id": "o-9"}',
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["event_id"] == "ev-1"
    # Republishing the same content from inline JSON is the same Event: idempotent.
    again = data(
        "event", "--db", db, "payment.received", "--correlation", '{"order_id": "o-9"}',
        "--payload", '{"paid": 10}', "--id", "ev-1", cwd=tmp_path,
    )  # fmt: skip
    assert again["duplicate"] is True


def test_a_json_definition_is_the_same_definition_as_its_toml(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    definition = parse_definition(PURCHASE.read_text(encoding="utf-8"), PURCHASE.name)
    (tmp_path / "purchase.json").write_text(to_json(definition), encoding="utf-8")
    # No .json suffix: recognised by its content.
    (tmp_path / "purchase.definition").write_text(json.dumps(json.loads(to_json(definition)), indent=2), encoding="utf-8")
    first = data("run", "purchase.json", "--db", db, "--input", json.dumps(INPUT), cwd=tmp_path)
    assert first["definition_registered"] is True
    for again in ("purchase.definition", PURCHASE):
        later = data("run", again, "--db", db, "--input", json.dumps(INPUT), cwd=tmp_path)
        assert later["definition_registered"] is False, again
        assert later["definition_id"] == "purchase-approval"


def test_a_broken_json_definition_is_named(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text('{"id": "x", "revision": }', encoding="utf-8")
    line = assert_one_error_line(fencekeeper("run", "broken.json", "--db", tmp_path / "x.db", cwd=tmp_path), 2)
    assert "broken.json" in line and "not valid JSON" in line
    (tmp_path / "wrong.json").write_text('{"id": "x", "revision": 1, "start": "a", "nodes": [], "colour": 1}', encoding="utf-8")
    line = assert_one_error_line(fencekeeper("run", "wrong.json", "--db", tmp_path / "x.db", cwd=tmp_path), 2)
    assert "wrong.json" in line and "colour" in line
    assert not (tmp_path / "x.db").exists()


def test_typed_inputs_are_checked_before_anything_is_written(tmp_path: Path) -> None:
    (tmp_path / "typed.toml").write_text(TYPED, encoding="utf-8")
    db = tmp_path / "shop.db"
    ok = data("run", "typed.toml", "--db", db, "--input", '{"amount": 250, "currency": "EUR"}', "--id", "t-1", cwd=tmp_path)
    assert ok["state"] == "eligible"
    before = snapshot(tmp_path)
    for bad, words in (
        ('{"amount": "250", "currency": "EUR"}', ["input.amount", "must be an integer, found string"]),
        ('{"amount": 0, "currency": "EUR"}', ["input.amount", "below the minimum 1"]),
        ('{"amount": 250, "currency": "usd"}', ["input.currency", '"usd" is not one of "EUR", "GBP"']),
        ('{"amount": 250, "currency": "EUR", "note": "' + "x" * 21 + '"}', ["input.note", "at most 20"]),
        ('{"currency": "EUR"}', ["input.amount", "missing"]),
    ):
        result = fencekeeper("run", "typed.toml", "--db", db, "--input", bad, "--id", "t-2", cwd=tmp_path)
        line = assert_one_error_line(result, 2)
        assert line.startswith("fencekeeper: error: --input: input."), line
        for word in words:
            assert word in line, (word, line)
    assert snapshot(tmp_path) == before, "a refused admission wrote something"
