"""``fencekeeper journal``: exit codes, one-line errors, --json documents, nothing written on bad input.

Most commands run through ``cli.main`` in this process (the console script
calls the same function; tests/journal/test_docs.py explains why); one test
runs the installed script, to prove the group is wired into it.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from typing import Any

import attrs
import pytest

from fencekeeper.adapters import cli
from fencekeeper.adapters.journal_store import SQLiteJournalStore
from fencekeeper.kernel import journal as j
from tests.cli.runner import ROOT, fencekeeper
from tests.stores.test_sqlite_files import read_only

EXAMPLE = ROOT / "docs" / "examples" / "journal"
PACK = ROOT / "specs" / "journal" / "fixtures"
DEEP = "[" * 100_000 + "]" * 100_000


def main(*args: str | Path) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main([str(a) for a in args])
    return code, stdout.getvalue(), stderr.getvalue()


def data(*args: str | Path) -> Any:
    code, out, err = main(*args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for path in EXAMPLE.iterdir():
        shutil.copy(path, tmp_path / path.name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def new(db: str = "review.db", execution_id: str = "review-1") -> Any:
    return data("journal", "new", execution_id, "--db", db, "--workflow", "review.workflow.json",
                "--policy", "review.policy.json", "--as", "carol")  # fmt: skip


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fencekeeper: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_the_group_is_part_of_the_installed_command(tmp_path: Path) -> None:
    result = fencekeeper("journal", "--help", cwd=tmp_path)
    assert result.returncode == 0
    for name in ("new", "append", "show", "verify", "export", "replay", "fixtures"):
        assert name in result.stdout


def test_new_then_append_then_json_views(workdir: Path) -> None:
    created = new()
    assert created["events"] == 0 and created["states"]["search"] == "ready"
    appended = data("journal", "append", "review-1", "--db", "review.db", "--file", "review-1.jsonl",
                    "--expect", created["head"])  # fmt: skip
    assert [r["outcome"] for r in appended["results"]] == ["appended"] * 20
    shown = data("journal", "show", "review-1", "--db", "review.db")
    assert shown["head"] == appended["head"] and len(shown["records"]) == 20
    assert data("journal", "show", "review-1", "--db", "review.db", "--head")["head"] == appended["head"]
    replayed = data("journal", "replay", "review-1", "--db", "review.db")
    assert replayed["agrees"] and set(replayed["states"].values()) == {"completed"}
    assert data("journal", "verify", "review-1", "--db", "review.db") == {
        "ok": True, "journal": "review-1", "head": appended["head"], "events": 20,
    }  # fmt: skip
    # Appending the same file again, from the same head, is a run of idempotent repeats.
    again = data("journal", "append", "review-1", "--db", "review.db", "--file", "review-1.jsonl",
                 "--expect", created["head"])  # fmt: skip
    assert {r["outcome"] for r in again["results"]} == {"unchanged"}
    assert data("journal", "show", "review-1", "--db", "review.db", "--head")["head"] == appended["head"]


def test_bad_input_is_exit_2_and_writes_nothing(workdir: Path) -> None:
    (workdir / "broken.json").write_text("{", encoding="utf-8")
    code, _, err = main("journal", "new", "review-1", "--db", "review.db", "--workflow", "broken.json",
                        "--policy", "review.policy.json", "--as", "carol")  # fmt: skip
    assert code == 2 and "broken.json" in one_error_line(err)
    assert not (workdir / "review.db").exists()
    (workdir / "extra.json").write_text(json.dumps({"workflow": "w", "nodes": [], "colour": "red"}), encoding="utf-8")
    code, _, err = main("journal", "new", "review-1", "--db", "review.db", "--workflow", "extra.json",
                        "--policy", "review.policy.json", "--as", "carol")  # fmt: skip
    assert code == 2 and "unknown_field" in one_error_line(err)
    assert not (workdir / "review.db").exists()

    head = new()["head"]
    before = SQLiteJournalStore(workdir / "review.db").stored("review-1")
    for command, needle in (
        ("{not json", "not valid JSON"),
        ('{"command": "transition", "request": "r"}', "missing field"),
        ('{"command": "teleport"}', "teleport"),
    ):
        code, _, err = main("journal", "append", "review-1", "--db", "review.db", "--command", command, "--expect", head)
        assert code == 2 and needle in one_error_line(err)
    code, _, err = main("journal", "append", "review-9", "--db", "review.db", "--file", "review-1.jsonl", "--expect", head)
    assert code == 2 and "no journal 'review-9'" in one_error_line(err)
    code, _, err = main("journal", "show", "review-1", "--db", "missing.db")
    assert code == 2 and "missing.db" in one_error_line(err)
    assert not (workdir / "missing.db").exists()
    assert SQLiteJournalStore(workdir / "review.db").stored("review-1") == before


def test_a_commands_field_errors_name_the_field_once(workdir: Path) -> None:
    head = new()["head"]
    before = SQLiteJournalStore(workdir / "review.db").stored("review-1")
    start = {"command": "transition", "request": "r2", "actor": "bot:search", "role": "searcher", "node": "search",
             "event": "work-started", "prior_state": "ready", "attempt": {"id": "search-1", "sequence": 1}}  # fmt: skip
    # "command 1" names the command: the field follows it alone, as a record's member follows "event 7: ".
    for command, said in (
        ({"command": "transition", "request": "r2"}, "missing field 'actor' [missing_field]"),
        ({**start, "colour": "red"}, "unknown field 'colour' [unknown_field]"),
        ({**start, "node": 5}, "node: must be a string [malformed_record]"),
        ({**start, "attempt": {"id": "search-1"}}, "attempt: missing field 'sequence' [missing_field]"),
        ({"command": "teleport"}, "command: 'teleport' is not one of ['bind-successor', 'invalidate', 'transition'] "
                                  "[malformed_record]"),
    ):  # fmt: skip
        code, out, err = main("journal", "append", "review-1", "--db", "review.db", "--command", json.dumps(command),
                              "--expect", head)  # fmt: skip
        assert code == 2 and out == "", err
        assert one_error_line(err) == f"fencekeeper: error: --command command 1: {said}", err
    (workdir / "two.jsonl").write_text(json.dumps(start) + "\n" + json.dumps({**start, "request": "r3", "role": 1})
                                       + "\n", encoding="utf-8")  # fmt: skip
    code, _, err = main("journal", "append", "review-1", "--db", "review.db", "--file", "two.jsonl", "--expect", head)
    assert code == 2
    assert one_error_line(err) == "fencekeeper: error: --file two.jsonl command 2: role: must be a string [malformed_record]"
    assert SQLiteJournalStore(workdir / "review.db").stored("review-1") == before


def test_a_first_command_without_a_head_says_how_to_give_one(workdir: Path) -> None:
    new()
    before = SQLiteJournalStore(workdir / "review.db").stored("review-1")
    first = (workdir / "review-1.jsonl").read_text(encoding="utf-8").splitlines()[0]
    assert "expected_head" not in json.loads(first)
    (workdir / "first.jsonl").write_text(first + "\n", encoding="utf-8")
    null = json.dumps({**json.loads(first), "expected_head": None})
    for given in (("--command", first), ("--file", "first.jsonl"), ("--command", null)):
        code, out, err = main("journal", "append", "review-1", "--db", "review.db", *given)
        line = one_error_line(err)
        assert code == 2 and out == "", err
        assert "command 1: missing field 'expected_head'" in line and "[missing_field]" in line, line
        assert "--expect HEAD" in line and "--head-file FILE" in line, line
    assert SQLiteJournalStore(workdir / "review.db").stored("review-1") == before


def test_later_commands_of_a_file_expect_the_head_before_them_with_or_without_expect(workdir: Path) -> None:
    head = new()["head"]
    commands = [json.loads(c) for c in (workdir / "review-1.jsonl").read_text(encoding="utf-8").splitlines()[:3]]
    # Only the first names its head: no --expect, no --head-file.
    lines = [json.dumps({**commands[0], "expected_head": head}), *(json.dumps(c) for c in commands[1:])]
    (workdir / "three.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    appended = data("journal", "append", "review-1", "--db", "review.db", "--file", "three.jsonl")
    assert [r["outcome"] for r in appended["results"]] == ["appended"] * 3
    # And the help says so, not that it takes --expect.
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), pytest.raises(SystemExit):
        cli.main(["journal", "append", "--help"])
    text = " ".join(stdout.getvalue().split())
    assert "With --expect" not in text
    assert ("A command without expected_head expects the head the command before it produced, the first command "
            "the head --expect or --head-file gives.") in text, text  # fmt: skip


def test_a_refusal_is_exit_1_with_its_code_and_writes_nothing(workdir: Path) -> None:
    head = new()["head"]
    before = SQLiteJournalStore(workdir / "review.db").stored("review-1")
    forged = json.dumps({"command": "transition", "request": "r", "node": "search", "event": "work-started",
                         "prior_state": "ready", "actor": "mallory", "role": "searcher",
                         "attempt": {"id": "s-1", "sequence": 1}})  # fmt: skip
    code, out, err = main("journal", "append", "review-1", "--db", "review.db", "--command", forged, "--expect", head)
    assert code == 1 and "refused [forged_role]" in one_error_line(err)
    assert out == ""
    assert SQLiteJournalStore(workdir / "review.db").stored("review-1") == before
    # A policy for another workflow is refused authority, not read as bad JSON.
    policy = json.loads((workdir / "review.policy.json").read_text())
    policy["workflow_digest"] = "sha256:" + "1" * 64
    (workdir / "other.policy.json").write_text(json.dumps(policy), encoding="utf-8")
    code, _, err = main("journal", "new", "review-2", "--db", "review.db", "--workflow", "review.workflow.json",
                        "--policy", "other.policy.json", "--as", "carol")  # fmt: skip
    assert code == 1 and "unverified_authority" in one_error_line(err)


@pytest.mark.parametrize("name", ["removal", "non-canonical", "forged-role", "partial-invalidation"])
def test_verify_names_the_first_bad_record_of_an_exported_file(name: str) -> None:
    manifest = json.loads((PACK / "manifest.json").read_text(encoding="utf-8"))
    case = next(c for c in manifest["cases"] if c["name"] == name)
    code, out, _ = main("journal", "verify", "--file", PACK / case["chain"], "--workflow", PACK / "workflow.json",
                        "--policy", PACK / "policy.json", "--json")  # fmt: skip
    assert code == 1
    report = json.loads(out)
    assert (report["ok"], report["code"], report["ordinal"]) == (False, case["expect"]["code"], case["expect"]["ordinal"])


def _flip(record: bytes, old: bytes, new: bytes) -> bytes:
    assert old in record
    return record.replace(old, new, 1)


def _own_digest(record: bytes) -> bytes:
    return str(json.loads(record)["digest"]).encode()


def _other_digit(digest: bytes) -> bytes:
    return digest[:-1] + (b"1" if digest.endswith(b"0") else b"0")


# Each hand-made change of an exported chain (its lines, header first), and
# the record verify must name for it: (code, ordinal; 0 is the header).
TAMPERED: dict[str, tuple[Any, str, int]] = {
    "a line removed": (lambda c, _: c[:4] + c[5:], "broken_chain", 4),
    "two lines swapped": (lambda c, _: [*c[:3], c[4], c[3], *c[5:]], "broken_chain", 3),
    "a line duplicated": (lambda c, _: [*c[:4], c[3], *c[4:]], "broken_chain", 4),
    "a line inserted": (lambda c, _: [*c[:10], c[2], *c[10:]], "broken_chain", 10),
    "a line of another journal": (lambda c, o: [c[0], o[1], *c[2:]], "foreign_record", 1),
    "a digit of a digest": (lambda c, _: [*c[:5], _flip(c[5], _own_digest(c[5]), _other_digit(_own_digest(c[5]))),
                                          *c[6:]], "altered_digest", 5),
    "a letter of a string": (lambda c, _: [*c[:2], _flip(c[2], b"timed out", b"timed 0ut"), *c[3:]],
                             "altered_digest", 2),
    "a space": (lambda c, _: [*c[:2], _flip(c[2], b'"error":', b'"error": '), *c[3:]], "non_canonical", 2),
    "an unknown member": (lambda c, _: [*c[:2], c[2][:-1] + b',"zz":1}', *c[3:]], "unknown_field", 2),
    "the last line cut": (lambda c, _: [*c[:-1], c[-1][:-20]], "non_canonical", 20),
    "a trailing blank line": (lambda c, _: [*c, b""], "non_canonical", 21),
    "a BOM": (lambda c, _: [b"\xef\xbb\xbf" + c[0], *c[1:]], "non_canonical", 0),
    "CRLF line ends": (lambda c, _: [r + b"\r" for r in c], "non_canonical", 0),
    "nothing at all": (lambda c, _: [], "non_canonical", 0),
    "not JSON": (lambda c, _: [b"hello, auditor", *c[1:]], "non_canonical", 0),
    "a record nested too deeply": (lambda c, _: [*c[:7], c[7][:-1] + b',"zz":' + DEEP.encode() + b"}", *c[8:]],
                                   "non_canonical", 7),
}  # fmt: skip


@pytest.mark.parametrize("change", TAMPERED)
def test_verify_names_the_first_bad_record_of_a_file_changed_by_hand(workdir: Path, change: str) -> None:
    head = new()["head"]
    data("journal", "append", "review-1", "--db", "review.db", "--file", "review-1.jsonl", "--expect", head)
    other = new(execution_id="review-2")["head"]
    data("journal", "append", "review-2", "--db", "review.db", "--file", "review-2.jsonl", "--expect", other)
    for execution_id in ("review-1", "review-2"):
        data("journal", "export", execution_id, "--db", "review.db", "--out", f"{execution_id}.chain.jsonl")
    chain = (workdir / "review-1.chain.jsonl").read_bytes().split(b"\n")[:-1]
    others = (workdir / "review-2.chain.jsonl").read_bytes().split(b"\n")[:-1]
    tamper, code, ordinal = TAMPERED[change]
    (workdir / "changed.jsonl").write_bytes(b"".join(r + b"\n" for r in tamper(chain, others)))
    given = ("--file", "changed.jsonl", "--workflow", "review.workflow.json", "--policy", "review.policy.json")
    # The record's line too: the header is line 1, event n line n + 1; an empty file has none.
    line = ordinal + 1 if (workdir / "changed.jsonl").stat().st_size else None
    result, out, err = main("journal", "verify", *given, "--json")
    assert result == 1 and err == "", err
    assert {k: v for k, v in json.loads(out).items() if k != "message"} == {
        "ok": False, "journal": "changed.jsonl", "code": code, "ordinal": ordinal, "line": line}  # fmt: skip
    result, out, err = main("journal", "verify", *given)
    where = ("header" if ordinal == 0 else f"event {ordinal}") + ("" if line is None else f" (line {line})")
    assert result == 1 and out.startswith(f"BAD changed.jsonl: the first bad record is {where}: [{code}] "), out + err


def test_a_file_without_its_header_line_says_so_once(workdir: Path) -> None:
    head = new()["head"]
    data("journal", "append", "review-1", "--db", "review.db", "--file", "review-1.jsonl", "--expect", head)
    data("journal", "export", "review-1", "--db", "review.db", "--out", "chain.jsonl")
    lines = (workdir / "chain.jsonl").read_bytes().split(b"\n")
    (workdir / "headless.jsonl").write_bytes(b"\n".join(lines[1:]))
    code, out, err = main("journal", "verify", "--file", "headless.jsonl", "--workflow", "review.workflow.json",
                          "--policy", "review.policy.json")  # fmt: skip
    assert code == 1 and err == "", err
    assert out == "BAD headless.jsonl: the first bad record is header (line 1): [unknown_field] unknown field 'actor'\n", out


def test_a_file_whose_last_line_has_no_newline_is_refused_at_that_record(workdir: Path) -> None:
    head = new()["head"]
    (workdir / "h").write_text(head, encoding="utf-8")
    data("journal", "append", "review-1", "--db", "review.db", "--file", "review-1.jsonl", "--head-file", "h")
    data("journal", "export", "review-1", "--db", "review.db", "--out", "reviewed.jsonl")
    # Ends with the invalidation of five nodes: one batch, events 21 to 25.
    data("journal", "append", "review-1", "--db", "review.db", "--file", "retraction.jsonl", "--head-file", "h")
    data("journal", "export", "review-1", "--db", "review.db", "--out", "retracted.jsonl")
    reviewed = (workdir / "reviewed.jsonl").read_bytes()
    retracted = (workdir / "retracted.jsonl").read_bytes()
    # An export ends every line, the last too, and so verifies.
    assert reviewed.endswith(b"}\n") and retracted.endswith(b"}\n")
    lines = reviewed.split(b"\n")[:-1]
    given = ("--workflow", "review.workflow.json", "--policy", "review.policy.json")
    for name, cut, code, ordinal in (
        ("the whole review", reviewed[:-1], "non_canonical", 20),
        # A bad record before it is still the first one named.
        ("a line removed", b"\n".join(lines[:4] + lines[5:]), "broken_chain", 4),
        ("the header alone", lines[0], "non_canonical", 0),
        # The last record of a batch: named itself, not its batch as partial.
        ("a batch at the end", retracted[:-1], "non_canonical", 25),
    ):
        (workdir / "cut.jsonl").write_bytes(cut)
        result, out, err = main("journal", "verify", "--file", "cut.jsonl", *given, "--json")
        assert result == 1 and err == "", (name, err)
        report = json.loads(out)
        assert (report["code"], report["ordinal"]) == (code, ordinal), (name, report)
    (workdir / "cut.jsonl").write_bytes(reviewed[:-1])
    result, out, err = main("journal", "verify", "--file", "cut.jsonl", *given)
    assert result == 1 and err == "", err
    assert out.startswith("BAD cut.jsonl: the first bad record is event 20 (line 21): [non_canonical] the file's last line "
                          "does not end with a newline"), out  # fmt: skip
    for whole in ("reviewed.jsonl", "retracted.jsonl"):
        assert data("journal", "verify", "--file", whole, *given)["ok"]


def test_verify_names_no_record_when_the_policy_does_not_bind_the_workflow(workdir: Path) -> None:
    head = new()["head"]
    data("journal", "append", "review-1", "--db", "review.db", "--file", "review-1.jsonl", "--expect", head)
    data("journal", "export", "review-1", "--db", "review.db", "--out", "chain.jsonl")
    policy = json.loads((workdir / "review.policy.json").read_text(encoding="utf-8"))
    (workdir / "other.policy.json").write_text(json.dumps({**policy, "workflow_digest": "sha256:" + "1" * 64}))
    given = ("--file", "chain.jsonl", "--workflow", "review.workflow.json", "--policy", "other.policy.json")
    code, out, err = main("journal", "verify", *given)
    # Every record may be sound: the policy given is for another workflow, and no record is blamed for it.
    assert code == 1 and err == "" and out.startswith("BAD chain.jsonl: [unverified_authority] policy "), out + err
    code, out, _ = main("journal", "verify", *given, "--json")
    assert code == 1 and (json.loads(out)["code"], json.loads(out)["ordinal"]) == ("unverified_authority", None)


def test_verify_of_a_stored_journal_refuses_a_workflow_or_policy_it_would_not_use(workdir: Path) -> None:
    new()
    for given in (("--workflow", "review.workflow.json"), ("--policy", "missing.json")):
        code, out, err = main("journal", "verify", "review-1", "--db", "review.db", *given)
        assert code == 2 and out == "" and f"{given[0]} applies to --file" in one_error_line(err)


def test_export_writes_exactly_what_is_stored(workdir: Path) -> None:
    head = new()["head"]
    data("journal", "append", "review-1", "--db", "review.db", "--file", "review-1.jsonl", "--expect", head)
    data("journal", "export", "review-1", "--db", "review.db", "--out", "chain.jsonl",
         "--workflow-out", "w.json", "--policy-out", "p.json")  # fmt: skip
    stored = SQLiteJournalStore(workdir / "review.db").stored("review-1")
    assert stored is not None
    assert (workdir / "chain.jsonl").read_bytes() == b"".join(r + b"\n" for r in (stored.header, *stored.events))
    result = fencekeeper("journal", "export", "review-1", "--db", "review.db", cwd=workdir)
    assert result.returncode == 0 and result.stdout.encode() == (workdir / "chain.jsonl").read_bytes()
    code, out, _ = main("journal", "verify", "--file", "chain.jsonl", "--workflow", "w.json", "--policy", "p.json")
    assert code == 0 and out.startswith("ok chain.jsonl: 20 events")


def test_fixtures_writes_the_committed_pack(tmp_path: Path) -> None:
    code, _, err = main("journal", "fixtures", tmp_path)
    assert code == 0, err
    assert (tmp_path / "manifest.json").read_bytes() == (PACK / "manifest.json").read_bytes()


def test_on_postgresql(workdir: Path, pg_dsn: str, pg_schema: str) -> None:
    url = f"{pg_dsn}?schema={pg_schema}"
    head = new(url)["head"]
    appended = data("journal", "append", "review-1", "--db", url, "--file", "review-1.jsonl", "--expect", head)
    assert data("journal", "verify", "review-1", "--db", url)["head"] == appended["head"]
    code, _, err = main("journal", "append", "review-1", "--db", url, "--file", "retraction.jsonl", "--expect", head)
    assert code == 1 and "stale_head" in one_error_line(err)


def test_verify_names_the_first_bad_record_of_a_stored_journal(workdir: Path) -> None:
    import sqlite3  # noqa: PLC0415

    head = new()["head"]
    data("journal", "append", "review-1", "--db", "review.db", "--file", "review-1.jsonl", "--expect", head)
    # Someone with the file rewrites event 7, putting the trigger back so that
    # the schema looks untouched (opening the file checks it).
    conn = sqlite3.connect(workdir / "review.db", isolation_level=None)
    try:
        (trigger,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'journal_events_no_update'").fetchone()
        conn.execute("DROP TRIGGER journal_events_no_update")
        conn.execute(
            "UPDATE journal_events SET record = CAST(replace(CAST(record AS TEXT), 'alice', 'bob') AS BLOB) "
            "WHERE ordinal = 7"
        )
        conn.execute(trigger)
    finally:
        conn.close()
    code, out, err = main("journal", "verify", "review-1", "--db", "review.db")
    assert code == 1, err
    assert out.startswith("BAD review-1: the first bad record is event 7: [altered_digest]"), out + err


def rewrite_by_hand(db: Path, statement: str, *triggers: str) -> None:
    """Run ``statement`` past the append-only ``triggers``, putting them back so that the schema looks untouched."""
    import sqlite3  # noqa: PLC0415

    conn = sqlite3.connect(db, isolation_level=None)
    try:
        saved = [conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (t,)).fetchone()[0] for t in triggers]
        for trigger in triggers:
            conn.execute(f"DROP TRIGGER {trigger}")
        conn.execute(statement)
        for sql in saved:
            conn.execute(sql)
    finally:
        conn.close()


@pytest.mark.parametrize(("table", "column", "where", "named"), [
    ("journal_events", "record", "ordinal = 7", "event 7: [altered_digest]"),
    ("journal_headers", "header", "execution_id = 'review-1'", "header: [altered_digest]"),
])  # fmt: skip
def test_verify_names_a_record_rewritten_as_text(
    workdir: Path, table: str, column: str, where: str, named: str
) -> None:
    head = new()["head"]
    data("journal", "append", "review-1", "--db", "review.db", "--file", "review-1.jsonl", "--expect", head)
    # SQLite's replace() returns TEXT: the plainest rewrite of a row leaves
    # the record a string, not a blob.  It is still the record's bytes.
    rewrite_by_hand(workdir / "review.db", f"UPDATE {table} SET {column} = replace({column}, 'screen-a', 'screen-x') "
                    f"WHERE {where}", f"{table}_no_update")  # fmt: skip
    import sqlite3  # noqa: PLC0415

    with contextlib.closing(sqlite3.connect(workdir / "review.db")) as conn:
        assert conn.execute(f"SELECT typeof({column}) FROM {table} WHERE {where}").fetchone() == ("text",)
    code, out, err = main("journal", "verify", "review-1", "--db", "review.db")
    assert code == 1 and err == "", err
    assert out.startswith(f"BAD review-1: the first bad record is {named}"), out
    for command in ("show", "replay"):
        code, out, err = main("journal", command, "review-1", "--db", "review.db")
        assert code == 1 and "[altered_digest]" in one_error_line(err) and "internal error" not in err


@pytest.mark.parametrize(("table", "where", "named"), [
    ("journal_events", "ordinal = 7", "event 7: [altered_digest]"),
    ("journal_headers", "execution_id = 'review-1'", "header: [altered_digest]"),
])  # fmt: skip
def test_a_digest_column_that_disagrees_with_its_record_is_named(
    workdir: Path, table: str, where: str, named: str
) -> None:
    head = new()["head"]
    data("journal", "append", "review-1", "--db", "review.db", "--file", "review-1.jsonl", "--expect", head)
    before = SQLiteJournalStore(workdir / "review.db").stored("review-1")
    rewrite_by_hand(workdir / "review.db", f"UPDATE {table} SET digest = 'sha256:{'0' * 64}' WHERE {where}",
                    f"{table}_no_update")  # fmt: skip
    code, out, err = main("journal", "verify", "review-1", "--db", "review.db")
    assert code == 1 and err == "", err
    assert out.startswith(f"BAD review-1: the first bad record is {named} the row's digest column holds"), out
    for command in ("show", "replay"):
        code, out, err = main("journal", command, "review-1", "--db", "review.db")
        assert code == 1 and "[altered_digest]" in one_error_line(err) and "digest column" in err, err
    after = SQLiteJournalStore(workdir / "review.db").stored("review-1")
    assert before is not None and after is not None and (after.header, after.events) == (before.header, before.events)


def test_an_ordinal_column_that_disagrees_with_its_record_is_named(workdir: Path) -> None:
    head = new()["head"]
    data("journal", "append", "review-1", "--db", "review.db", "--file", "review-1.jsonl", "--expect", head)
    # Event 20 is the last: its row moved to 100 is still read last, so the
    # chain's order is unchanged, and only the column betrays it.
    rewrite_by_hand(workdir / "review.db", "UPDATE journal_events SET ordinal = 100 WHERE ordinal = 20",
                    "journal_events_no_update")  # fmt: skip
    code, out, err = main("journal", "verify", "review-1", "--db", "review.db")
    assert code == 1 and err == "", err
    assert out == ("BAD review-1: the first bad record is event 20: [ordinal_gap] the row's ordinal column holds 100, "
                   "but the record's ordinal is 20: one of them was changed outside the store\n"), out  # fmt: skip
    for command in ("show", "replay"):
        code, out, err = main("journal", command, "review-1", "--db", "review.db")
        assert code == 1 and "[ordinal_gap]" in one_error_line(err) and "ordinal column" in err, err
    # An append is refused too, and writes nothing: the row stays where it was put.
    (workdir / "h").write_text(head, encoding="utf-8")
    code, _, err = main("journal", "append", "review-1", "--db", "review.db", "--file", "retraction.jsonl",
                        "--head-file", "h")  # fmt: skip
    assert code != 0 and "[ordinal_gap]" in one_error_line(err), err
    chain = SQLiteJournalStore(workdir / "review.db").stored("review-1")
    assert chain is not None and chain.length == 20 and chain.event_ordinals[-1] == 100


def test_a_record_resigned_in_place_is_named_by_its_digest_column(workdir: Path) -> None:
    import sqlite3  # noqa: PLC0415

    head = new()["head"]
    data("journal", "append", "review-1", "--db", "review.db", "--file", "review-1.jsonl", "--expect", head)
    # Event 7 given another time and its digest recomputed: a record sound on
    # its own, which only its row's digest column (and event 8's link) betrays.
    with contextlib.closing(sqlite3.connect(workdir / "review.db")) as conn:
        (record,) = conn.execute("SELECT record FROM journal_events WHERE ordinal = 7").fetchone()
    event = j.decode_event(bytes(record))
    _, resigned = attrs.evolve(event, at="2026-01-01T00:00:00.000000Z").signed()
    rewrite_by_hand(workdir / "review.db", f"UPDATE journal_events SET record = x'{resigned.hex()}' WHERE ordinal = 7",
                    "journal_events_no_update")  # fmt: skip
    code, out, _ = main("journal", "verify", "review-1", "--db", "review.db", "--json")
    assert code == 1 and (json.loads(out)["code"], json.loads(out)["ordinal"]) == ("altered_digest", 7), out


def test_records_resolve_from_a_directory_by_digest(workdir: Path) -> None:
    head = new()["head"]
    records = workdir / "records"
    (records / "search-results").mkdir(parents=True)
    first_two = (workdir / "review-1.jsonl").read_text(encoding="utf-8").splitlines()[:5]
    (workdir / "search.jsonl").write_text("\n".join(first_two) + "\n", encoding="utf-8")
    # The example's record digests are SHA-256 of "kind/id"; a file with other content does not resolve ...
    (records / "search-results" / "search-results").write_text("tampered", encoding="utf-8")
    code, _, err = main("journal", "append", "review-1", "--db", "review.db", "--file", "search.jsonl",
                        "--expect", head, "--records", records)  # fmt: skip
    assert code == 1 and "unresolved_record" in one_error_line(err)
    # ... the record as referenced does, and the stored journal verifies against the directory.
    # (Sent again from the same head: the refusal appended none of the file.)
    (records / "search-results" / "search-results").write_text("search-results/search-results", encoding="utf-8")
    assert data("journal", "append", "review-1", "--db", "review.db", "--file", "search.jsonl",
                "--expect", head, "--records", records)["results"][-1]["outcome"] == "appended"  # fmt: skip
    assert data("journal", "verify", "review-1", "--db", "review.db", "--records", records)["ok"]
    (records / "search-results" / "search-results").write_text("changed later", encoding="utf-8")
    code, out, _ = main("journal", "verify", "review-1", "--db", "review.db", "--records", records, "--json")
    assert code == 1 and json.loads(out)["code"] == "unresolved_record"


def test_a_refused_new_creates_no_database(workdir: Path) -> None:
    for extra, code_text in ((("--as", "bot:search"), "unverified_authority"),
                             (("--as", "carol", "--supersedes", "review-1"), "bad_successor_binding")):  # fmt: skip
        code, _, err = main("journal", "new", "review-1", "--db", "review.db", "--workflow", "review.workflow.json",
                            "--policy", "review.policy.json", *extra)  # fmt: skip
        assert code == 1 and code_text in one_error_line(err)
        assert not (workdir / "review.db").exists()


def test_a_file_is_appended_whole_or_not_at_all(workdir: Path) -> None:
    head = new()["head"]
    commands = (workdir / "review-1.jsonl").read_text(encoding="utf-8").splitlines()
    # Command 4 forged: mallory has no assignment.
    forged = json.loads(commands[3])
    forged["actor"] = "mallory"
    (workdir / "forged.jsonl").write_text("\n".join([*commands[:3], json.dumps(forged)]) + "\n", encoding="utf-8")
    (workdir / "start.head").write_text(head + "\n", encoding="utf-8")
    before = SQLiteJournalStore(workdir / "review.db").stored("review-1")
    code, out, err = main("journal", "append", "review-1", "--db", "review.db", "--file", "forged.jsonl",
                          "--head-file", "start.head")  # fmt: skip
    line = one_error_line(err)
    assert code == 1 and "command 4 refused [forged_role]" in line and "nothing was appended" in line, line
    assert out == ""
    assert SQLiteJournalStore(workdir / "review.db").stored("review-1") == before
    assert (workdir / "start.head").read_text(encoding="utf-8").strip() == head
    code, out, _ = main("journal", "append", "review-1", "--db", "review.db", "--file", "forged.jsonl",
                        "--expect", head, "--json")  # fmt: skip
    assert code == 1 and json.loads(out)["appended"] == 0 and json.loads(out)["refused"] == 4


def test_a_successor_is_checked_against_the_stored_header(workdir: Path) -> None:
    head = new()["head"]
    (workdir / "h").write_text(head, encoding="utf-8")
    data("journal", "append", "review-1", "--db", "review.db", "--file", "review-1.jsonl", "--head-file", "h")
    data("journal", "append", "review-1", "--db", "review.db", "--file", "retraction.jsonl", "--head-file", "h")
    binding = json.loads((workdir / "bind-successor.jsonl").read_text(encoding="utf-8"))
    # review-3 exists but does not declare that it supersedes review-1: refused, --records or not.
    new(execution_id="review-3")
    for command in ({**binding, "successor": {"kind": "execution", "id": "review-3"}},
                    {**binding, "successor": {"kind": "execution", "id": "ghost-9", "digest": "sha256:" + "9" * 64}}):  # fmt: skip
        code, _, err = main("journal", "append", "review-1", "--db", "review.db", "--head-file", "h",
                            "--command", json.dumps(command))  # fmt: skip
        assert code == 1 and "bad_successor_binding" in one_error_line(err)
    data("journal", "new", "review-2", "--db", "review.db", "--workflow", "review.workflow.json",
         "--policy", "review.policy.json", "--as", "carol", "--supersedes", "review-1")  # fmt: skip
    data("journal", "append", "review-1", "--db", "review.db", "--file", "bind-successor.jsonl", "--head-file", "h")
    assert data("journal", "verify", "review-1", "--db", "review.db")["ok"]
    data("journal", "export", "review-1", "--db", "review.db", "--out", "chain.jsonl")
    chain = ["--file", "chain.jsonl", "--workflow", "review.workflow.json", "--policy", "review.policy.json"]
    assert data("journal", "verify", *chain)["ok"]
    assert data("journal", "verify", *chain, "--db", "review.db")["ok"]
    # Against a database without review-2 the binding cannot be checked, and is refused.
    new(db="other.db")
    code, out, _ = main("journal", "verify", *chain, "--db", "other.db", "--json")
    assert code == 1 and json.loads(out)["code"] == "bad_successor_binding"


def test_a_successor_whose_stored_header_cannot_be_read_is_named(workdir: Path) -> None:
    head = new()["head"]
    (workdir / "h").write_text(head, encoding="utf-8")
    data("journal", "append", "review-1", "--db", "review.db", "--file", "review-1.jsonl", "--head-file", "h")
    data("journal", "append", "review-1", "--db", "review.db", "--file", "retraction.jsonl", "--head-file", "h")
    new(execution_id="review-2")
    rewrite_by_hand(workdir / "review.db", "UPDATE journal_headers SET header = CAST(substr(header, 1, 40) AS BLOB) "
                    "WHERE execution_id = 'review-2'", "journal_headers_no_update")  # fmt: skip
    before = SQLiteJournalStore(workdir / "review.db").stored("review-1")
    # bind-successor.jsonl leaves the digest out: it is read from review-2's stored header, which is no record.
    code, out, err = main("journal", "append", "review-1", "--db", "review.db", "--file", "bind-successor.jsonl",
                          "--head-file", "h")  # fmt: skip
    line = one_error_line(err)
    assert code == 1 and out == "" and "internal error" not in line, line
    assert "successor 'review-2': its stored header cannot be read" in line and "[non_canonical]" in line, line
    assert SQLiteJournalStore(workdir / "review.db").stored("review-1") == before


def test_a_successor_whose_header_row_digest_column_was_changed_is_not_bound(workdir: Path) -> None:
    head = new()["head"]
    (workdir / "h").write_text(head, encoding="utf-8")
    data("journal", "append", "review-1", "--db", "review.db", "--file", "review-1.jsonl", "--head-file", "h")
    data("journal", "append", "review-1", "--db", "review.db", "--file", "retraction.jsonl", "--head-file", "h")
    data("journal", "new", "review-2", "--db", "review.db", "--workflow", "review.workflow.json",
         "--policy", "review.policy.json", "--as", "carol", "--supersedes", "review-1")  # fmt: skip
    # unbound.db is the database before the binding, with its own head file.
    shutil.copy(workdir / "review.db", workdir / "unbound.db")
    shutil.copy(workdir / "h", workdir / "unbound-h")
    data("journal", "append", "review-1", "--db", "review.db", "--file", "bind-successor.jsonl", "--head-file", "h")
    changed = f"UPDATE journal_headers SET digest = 'sha256:{'0' * 64}' WHERE execution_id = 'review-2'"
    for db in ("review.db", "unbound.db"):
        rewrite_by_hand(workdir / db, changed, "journal_headers_no_update")
    # The header record is review-2's own; only its row's digest column was changed.
    code, out, err = main("journal", "verify", "review-1", "--db", "review.db", "--json")
    assert code == 1 and err == "", err
    assert json.loads(out)["code"] == "bad_successor_binding", out
    assert "its header cannot be read: the row's digest column holds" in json.loads(out)["message"], out
    # bind-successor.jsonl leaves the digest out: it is not read from a row that disagrees with itself.
    before = SQLiteJournalStore(workdir / "unbound.db").stored("review-1")
    code, out, err = main("journal", "append", "review-1", "--db", "unbound.db", "--file", "bind-successor.jsonl",
                          "--head-file", "unbound-h")  # fmt: skip
    line = one_error_line(err)
    assert code == 1 and out == "", line
    assert "successor 'review-2': its stored header cannot be read: the row's digest column holds" in line, line
    assert line.endswith("[altered_digest]"), line
    assert SQLiteJournalStore(workdir / "unbound.db").stored("review-1") == before


def test_show_and_replay_say_which_event_cut_an_attempt_off(workdir: Path) -> None:
    head = new()["head"]
    (workdir / "h").write_text(head, encoding="utf-8")
    # The retraction arrives while alice is screening: the first seven commands end with screen-a started.
    lines = (workdir / "review-1.jsonl").read_text(encoding="utf-8").splitlines()[:7]
    (workdir / "started.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    data("journal", "append", "review-1", "--db", "review.db", "--file", "started.jsonl", "--head-file", "h")
    retraction = json.loads((workdir / "retraction.jsonl").read_text(encoding="utf-8"))
    states = {"screen-a": "active"}
    retraction["nodes"] = [{**n, "prior_state": states.get(n["node"], "pending")} for n in retraction["nodes"]]
    appended = data("journal", "append", "review-1", "--db", "review.db", "--head-file", "h",
                    "--command", json.dumps(retraction))  # fmt: skip
    assert appended["head"] == (workdir / "h").read_text(encoding="utf-8").strip()
    shown = data("journal", "show", "review-1", "--db", "review.db")
    ending = next(r["ordinal"] for r in shown["records"] if r["node"] == "screen-a" and r["event"] == "work-invalidated")
    assert shown["attempts"]["screen-a"] == [
        {"id": "screen-a-1", "sequence": 1, "status": "invalidated", "error": None, "ended_by": ending}
    ]
    assert [a["ended_by"] for a in shown["attempts"]["search"]] == [None, None]
    assert data("journal", "replay", "review-1", "--db", "review.db")["attempts"] == shown["attempts"]
    for command in ("show", "replay"):
        code, out, _ = main("journal", command, "review-1", "--db", "review.db")
        row = next(line for line in out.splitlines() if line.startswith("screen-a "))
        assert code == 0 and row.endswith(f"#1 screen-a-1 invalidated by event {ending}"), row


def test_a_chain_cut_short_verifies_unless_a_later_head_was_kept(workdir: Path) -> None:
    # specs/journal.md, "What this does not claim": dropping the last events
    # leaves a valid chain; only a head kept from after them shows the cut.
    head = new()["head"]
    kept = data("journal", "append", "review-1", "--db", "review.db", "--file", "review-1.jsonl", "--expect", head)["head"]
    data("journal", "export", "review-1", "--db", "review.db", "--out", "chain.jsonl")
    lines = (workdir / "chain.jsonl").read_bytes().splitlines(keepends=True)
    (workdir / "cut.jsonl").write_bytes(b"".join(lines[:-3]))
    chain = ["--workflow", "review.workflow.json", "--policy", "review.policy.json"]
    assert data("journal", "verify", "--file", "cut.jsonl", *chain)["events"] == len(lines) - 4
    code, out, _ = main("journal", "verify", "--file", "cut.jsonl", *chain, "--kept-head", kept, "--json")
    assert code == 1 and json.loads(out)["ok"] is False
    assert data("journal", "verify", "--file", "chain.jsonl", *chain, "--kept-head", kept)["ok"]


def test_a_command_file_that_is_not_utf8_is_exit_2_naming_the_file(workdir: Path) -> None:
    head = new()["head"]
    before = SQLiteJournalStore(workdir / "review.db").stored("review-1")
    (workdir / "latin1.jsonl").write_bytes(b'{"command": "transition", "rationale": "caf\xe9"}\n')
    code, _, err = main(
        "journal", "append", "review-1", "--db", "review.db", "--file", "latin1.jsonl", "--expect", head
    )
    assert code == 2 and "latin1.jsonl: not UTF-8 text" in one_error_line(err)
    assert SQLiteJournalStore(workdir / "review.db").stored("review-1") == before


START = ('{"command": "transition", "request": "r", "node": "search", "event": "work-started", "prior_state": "ready", '
         '"actor": "bot:search", "role": "searcher", "attempt": {"id": "s-1", "sequence": 1}')  # fmt: skip


@pytest.mark.parametrize(("given", "problem"), [
    (START + ', "actor": "alice"}', "duplicate key 'actor' in an object"),
    (START + ', "rationale": NaN}', "NaN is not a JSON number"),
    (START + ', "rationale": ' + DEEP + "}", "nested too deeply"),
])  # fmt: skip
def test_json_that_does_not_mean_one_thing_is_exit_2_naming_the_input(workdir: Path, given: str, problem: str) -> None:
    # json would keep the last of two "actor"s, read NaN, or overflow the
    # stack: a command (or workflow, or policy) is read to mean exactly one thing.
    head = new()["head"]
    before = SQLiteJournalStore(workdir / "review.db").stored("review-1")
    (workdir / "given.jsonl").write_text(given + "\n", encoding="utf-8")
    workflow = given.replace(START, '{"workflow": "w", "nodes": [], "actor": "x"')
    (workdir / "given.json").write_text(workflow, encoding="utf-8")
    for source, where in ((("--command", given), "--command"), (("--file", "given.jsonl"), "--file given.jsonl:1")):
        code, out, err = main("journal", "append", "review-1", "--db", "review.db", *source, "--expect", head)
        assert code == 2 and out == "", err
        assert one_error_line(err) == f"fencekeeper: error: {where}: not valid JSON: {problem}"
    assert SQLiteJournalStore(workdir / "review.db").stored("review-1") == before
    code, _, err = main("journal", "new", "review-2", "--db", "review.db", "--workflow", "given.json",
                        "--policy", "review.policy.json", "--as", "carol")  # fmt: skip
    assert code == 2 and one_error_line(err).startswith("fencekeeper: error: --workflow given.json: not valid JSON: ")
    assert SQLiteJournalStore(workdir / "review.db").execution_ids() == ["review-1"]


def test_an_output_that_cannot_be_written_is_refused_before_anything_is_written(workdir: Path) -> None:
    code, _, err = main("journal", "new", "review-1", "--db", "review.db", "--workflow", "review.workflow.json",
                        "--policy", "review.policy.json", "--as", "carol", "--head-file", "nowhere/start.head")  # fmt: skip
    assert code == 2 and "--head-file nowhere/start.head" in one_error_line(err)
    # Not created: the same `new` with a usable head file must still be able to create it.
    assert not (workdir / "review.db").exists()
    new()
    code, _, err = main("journal", "export", "review-1", "--db", "review.db", "--out", "chain.jsonl",
                        "--workflow-out", "w.json", "--policy-out", "nowhere/p.json")  # fmt: skip
    assert code == 2 and "--policy-out nowhere/p.json" in one_error_line(err)
    assert not (workdir / "chain.jsonl").exists() and not (workdir / "w.json").exists()


def test_an_error_shows_what_was_typed_without_the_terminal_obeying_it(workdir: Path) -> None:
    head = new()["head"]
    code, _, err = main("journal", "append", "review-1", "--db", "review.db", "--file", "\x1b[2Kgone.jsonl",
                        "--expect", head)  # fmt: skip
    assert code == 2 and "\x1b" not in err and "--file \\x1b[2Kgone.jsonl: cannot read" in one_error_line(err)


def test_an_output_naming_the_database_is_refused_and_the_journal_kept(workdir: Path) -> None:
    code, _, err = main("journal", "new", "review-1", "--db", "review.db", "--workflow", "review.workflow.json",
                        "--policy", "review.policy.json", "--as", "carol", "--head-file", "review.db")  # fmt: skip
    assert code == 2 and "--head-file review.db: is the SQLite database" in one_error_line(err)
    assert not (workdir / "review.db").exists()
    policy = (workdir / "review.policy.json").read_bytes()
    code, _, err = main("journal", "new", "review-1", "--db", "review.db", "--workflow", "review.workflow.json",
                        "--policy", "review.policy.json", "--as", "carol",
                        "--head-file", "./review.policy.json")  # fmt: skip
    assert code == 2 and "--head-file review.policy.json: is also --policy" in one_error_line(err)
    assert not (workdir / "review.db").exists() and (workdir / "review.policy.json").read_bytes() == policy
    head = new()["head"]
    data("journal", "append", "review-1", "--db", "review.db", "--file", "review-1.jsonl", "--expect", head)
    before = (workdir / "review.db").read_bytes()
    (workdir / "alias.db").symlink_to(workdir / "review.db")
    for output in (("--out", "review.db"), ("--workflow-out", "./review.db"), ("--policy-out", "alias.db")):
        code, out, err = main("journal", "export", "review-1", "--db", "review.db", "--out", "chain.jsonl", *output)
        assert code == 2 and out == ""
        assert f"{output[0]} {Path(output[1])}: is the SQLite database" in one_error_line(err)
    assert (workdir / "review.db").read_bytes() == before and not (workdir / "chain.jsonl").exists()
    assert data("journal", "verify", "review-1", "--db", "sqlite:///alias.db")["events"] == 20


def test_export_refuses_two_outputs_in_one_file(workdir: Path) -> None:
    new()
    code, out, err = main("journal", "export", "review-1", "--db", "review.db", "--out", "chain.jsonl",
                          "--workflow-out", "w.json", "--policy-out", "./chain.jsonl")  # fmt: skip
    assert code == 2 and out == "" and "--policy-out chain.jsonl: is also --out" in one_error_line(err)
    assert not (workdir / "chain.jsonl").exists() and not (workdir / "w.json").exists()


def test_a_malformed_value_is_exit_2_as_for_every_command(workdir: Path) -> None:
    # tests/cli/test_exit_codes.py: a malformed identifier, and a refusal for a
    # malformed request field (invalid_request), are what was typed: 2.
    code, _, err = main("journal", "new", "a b", "--db", "review.db", "--workflow", "review.workflow.json",
                        "--policy", "review.policy.json", "--as", "carol")  # fmt: skip
    assert code == 2 and "[invalid_request]" in one_error_line(err)
    assert not (workdir / "review.db").exists()
    head = new()["head"]
    before = SQLiteJournalStore(workdir / "review.db").stored("review-1")
    malformed = json.dumps({"command": "transition", "request": "a b", "node": "search", "event": "work-started",
                            "prior_state": "ready", "actor": "bot:search", "role": "searcher",
                            "attempt": {"id": "s-1", "sequence": 1}})  # fmt: skip
    code, _, err = main("journal", "append", "review-1", "--db", "review.db", "--command", malformed, "--expect", head)
    assert code == 2 and "refused [invalid_request]" in one_error_line(err)
    code, _, err = main("journal", "append", "review-1", "--db", "review.db", "--file", "review-1.jsonl",
                        "--expect", "nonsense")  # fmt: skip
    assert code == 2 and "--expect" in one_error_line(err)
    assert SQLiteJournalStore(workdir / "review.db").stored("review-1") == before
    # A kept head that is no digest is a typing error, not evidence that the chain was rewritten.
    code, out, err = main("journal", "verify", "review-1", "--db", "review.db", "--kept-head", "nonsense")
    assert code == 2 and "--kept-head" in one_error_line(err) and out == ""


def test_a_head_file_that_cannot_be_written_back_is_refused_before_appending(workdir: Path) -> None:
    head = new()["head"]
    (workdir / "review-1.head").write_text(head + "\n", encoding="utf-8")
    before = SQLiteJournalStore(workdir / "review.db").stored("review-1")
    with read_only(workdir / "review-1.head"):
        code, _, err = main("journal", "append", "review-1", "--db", "review.db", "--file", "review-1.jsonl",
                            "--head-file", "review-1.head")  # fmt: skip
    assert code == 2 and "--head-file review-1.head" in one_error_line(err)
    # Appending first would leave the journal moved and the head file still holding the old head.
    assert SQLiteJournalStore(workdir / "review.db").stored("review-1") == before


def test_a_pack_directory_that_cannot_take_the_pack_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "chains").write_text("in the way\n", encoding="utf-8")
    code, _, err = main("journal", "fixtures", tmp_path)
    assert code == 2 and "chains" in one_error_line(err) and "internal error" not in err


def test_a_lone_surrogate_or_a_huge_value_is_one_short_exit_2_line_naming_the_field(workdir: Path) -> None:
    # Before: a lone surrogate in the rationale was refused malformed_record,
    # exit 1, naming a character position; a megabyte request id was quoted
    # whole, a megabyte error line.
    head = new()["head"]
    before = SQLiteJournalStore(workdir / "review.db").stored("review-1")
    command = {"command": "transition", "request": "r-1", "node": "search", "event": "work-started",
               "prior_state": "ready", "actor": "bot:search", "role": "searcher", "attempt": {"id": "s-1", "sequence": 1}}  # fmt: skip
    changes = (
        ({"rationale": "\ud800"}, "rationale: "),
        ({"request": "x" * 1_000_000}, "request_id: "),
        # Over the bound of free text (specs/journal.md, section 6, rule 2): ten megabytes were appended.
        ({"rationale": "x" * 10_000_000}, "rationale: must be at most 2000 characters, got 10000000"),
    )
    for change, field in changes:
        text = json.dumps({**command, **change})
        code, out, err = main("journal", "append", "review-1", "--db", "review.db", "--command", text, "--expect", head)
        line = one_error_line(err)
        assert code == 2 and out == "" and "refused [invalid_request]: " + field in line, line[:200]
        assert len(line) < 300, line[:300]
    assert SQLiteJournalStore(workdir / "review.db").stored("review-1") == before
