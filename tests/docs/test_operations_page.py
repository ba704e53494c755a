"""docs/operations.md's Python, run as a reader would paste it: actions, resolvers, the service, a worker.

The page's blocks are taken from the page itself, in order, and run in one
namespace; only what the page leaves to the reader (its user directory) is
given here.  A block that stops working, or an import it forgets, fails; so
does a block that uses a name no block of the page imports or defines,
other than those it leaves to the reader (a DSN, a directory, a gateway).
So does a field of ``op worker --json`` the page's tables leave out, or name
and the command does not print.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import json
import re
import sqlite3
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.cli.runner import data, fencekeeper

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.DOTALL)


def test_the_pages_first_steps_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = _blocks()
    actions, resolvers, service, worker = blocks[:4]
    assert "DurableAction(" in actions and "register(" in resolvers
    assert "service.submit(" in service and "DurableOperationWorker(" in worker
    users = {"alice": SimpleNamespace(tenants={"acme"})}
    namespace: dict[str, Any] = {"my_directory": SimpleNamespace(get=users.get, down=False)}
    for block in (actions, resolvers, service, worker):
        exec(compile(block, str(PAGE), "exec"), namespace)  # the page's own code, as a reader runs it
    admission = namespace["admission"]
    assert admission.created
    record = namespace["service"].get(admission.operation_id)
    # The page cancels before its worker runs: the worker finds nothing, and the operation stays cancelled.
    assert record.state.value == "cancelled"
    assert namespace["service"].get(admission.operation_id, tenant="elsewhere") is None


class FakeGateway:
    """The page's ``gateway``: captures deduplicated by idempotency key, looked up by it, with scripted failures.

    ``script`` says what the next captures do: ``ok``; ``lost_reply`` captures
    and then times out (applied, unanswered); ``timeout`` times out before
    capturing; ``declined`` refuses without capturing.  ``failing_lookups``
    makes that many lookups raise.  ``log`` is every call, in order.
    """

    class Timeout(Exception):
        pass

    class Declined(Exception):
        pass

    def __init__(self) -> None:
        self.charges: dict[str, SimpleNamespace] = {}
        self.script: list[str] = []
        self.failing_lookups = 0
        self.log: list[tuple[str, str]] = []

    def capture(self, order: str, amount: int, *, idempotency_key: str) -> SimpleNamespace:
        self.log.append(("capture", idempotency_key))
        mode = self.script.pop(0) if self.script else "ok"
        if mode == "timeout":
            raise self.Timeout("no answer")
        if mode == "declined":
            raise self.Declined("card declined")
        charge = self.charges.setdefault(
            idempotency_key, SimpleNamespace(id=f"ch-{len(self.charges) + 1}", order=order, amount=amount)
        )
        if mode == "lost_reply":
            raise self.Timeout("the reply was lost")
        return charge

    def find_by_idempotency_key(self, key: str) -> SimpleNamespace | None:
        self.log.append(("lookup", key))
        if self.failing_lookups:
            self.failing_lookups -= 1
            raise ConnectionError("the gateway's lookup is down")
        return self.charges.get(key)

    def calls(self, effect_id: str) -> list[str]:
        return [kind for kind, key in self.log if key == effect_id]


class FakeTerminal:
    """The page's ``terminal``: no idempotency key, nothing to look up; every charge() charges."""

    class Timeout(Exception):
        pass

    def __init__(self) -> None:
        self.charged: list[tuple[int, str]] = []

    def charge(self, amount: int, *, reference: str) -> str:
        self.charged.append((amount, reference))
        raise self.Timeout("charged, and the reply was lost")


def test_the_pages_payment_capture_runs_as_written() -> None:
    from fencekeeper.adapters.operations.memory import MemoryOperationStore  # noqa: PLC0415
    from fencekeeper.adapters.operations.service import (  # noqa: PLC0415
        DurableActionRegistry,
        DurableOperationService,
        PrincipalReference,
    )
    from fencekeeper.adapters.operations.worker import DurableOperationWorker  # noqa: PLC0415
    from fencekeeper.adapters.store import ManualClock  # noqa: PLC0415

    blocks = _blocks()
    (stripe_like,) = [b for b in blocks if "class StripeLikeCapture" in b]
    (at_terminal,) = [b for b in blocks if "class TerminalCapture" in b]
    gateway, terminal = FakeGateway(), FakeTerminal()
    users = {name: SimpleNamespace(tenants={"acme"}) for name in ("alice", "bob")}
    namespace: dict[str, Any] = {
        "my_directory": SimpleNamespace(get=users.get, down=False), "gateway": gateway, "terminal": terminal,
    }
    # The page's imports and resolvers, then its two providers, as a reader runs them.
    for block in (blocks[0], blocks[1], stripe_like, at_terminal):
        exec(compile(block, str(PAGE), "exec"), namespace)
    clock = ManualClock()
    store = MemoryOperationStore(clock)
    actions = DurableActionRegistry((namespace["CAPTURE"], namespace["CAPTURE_AT_TERMINAL"]))
    service = DurableOperationService(store, actions, namespace["resolvers"], namespace="payments")
    worker = DurableOperationWorker(store, actions, namespace["resolvers"], tenant="acme", lease=timedelta(seconds=30))
    alice, bob = PrincipalReference("users", 1, "alice"), PrincipalReference("users", 1, "bob")

    def capture(order: str, *script: str) -> tuple[str, str]:
        gateway.script = list(script)
        operation_id = service.submit(
            tenant="acme", principal=alice, action="capture_payment", input={"order": order, "amount": 2500},
            client_key=f"capture-{order}",
        ).operation_id
        assert service.get(operation_id).state.value == "awaiting_approval"
        service.decide(operation_id, approver=bob, approve=True)
        return operation_id, f"{operation_id}/effect"

    def run(operation_id: str) -> str:
        report = worker.run_once()
        assert report is not None and report.operation_id == operation_id, report
        return report.outcome

    def after_backoff() -> None:
        clock.advance(timedelta(minutes=5))

    # Answered: captured once, under the operation's effect id.
    paid, effect = capture("o-1")
    assert run(paid) == "succeeded"
    assert service.get(paid).result == {"charge": gateway.charges[effect].id}
    assert gateway.calls(effect) == ["capture"]

    # Captured, reply lost: the worker asks before anything else, and the lookup settles it.
    lost, effect = capture("o-2", "lost_reply")
    assert run(lost) == "succeeded"
    assert service.get(lost).result == {"charge": gateway.charges[effect].id}
    assert gateway.calls(effect) == ["capture", "lookup"]

    # Timed out before capturing: the lookup finds nothing, the operation waits; the next attempt
    # looks again and only then captures, with the same id.
    waited, effect = capture("o-3", "timeout")
    assert run(waited) == "retry"
    record = service.get(waited)
    assert record.effect_unsettled and not record.terminal and effect not in gateway.charges
    after_backoff()
    assert run(waited) == "succeeded"
    assert gateway.calls(effect) == ["capture", "lookup", "lookup", "capture"]
    assert [(a.number, a.error_code) for a in service.get(waited).attempts] == [(1, "effect_not_applied"), (2, None)]

    # The lookup itself fails: the attempt fails like a handler error, and the next one looks again first.
    unlooked, effect = capture("o-4", "timeout")
    gateway.failing_lookups = 1
    assert run(unlooked) == "retry"
    assert service.get(unlooked).attempts[0].error_code == "handler_error"
    after_backoff()
    assert run(unlooked) == "succeeded"
    assert gateway.calls(effect) == ["capture", "lookup", "lookup", "capture"]

    # Declined: the gateway's conclusive answer, not retryable on the page: action_failed, nothing captured.
    declined, effect = capture("o-5", "declined")
    assert run(declined) == "action_failed"
    assert service.get(declined).outcome.value == "action_failed" and effect not in gateway.charges
    assert gateway.calls(effect) == ["capture"]

    # Neither deduplicated nor looked up: charged, reply lost, and the operation ends unknown, never resent.
    unknown = service.submit(
        tenant="acme", principal=alice, action="capture_at_terminal", input={"order": "o-6", "amount": 900},
        client_key="terminal-o-6",
    ).operation_id
    assert run(unknown) == "external_outcome_unknown"
    record = service.get(unknown)
    assert record.outcome.value == "external_outcome_unknown" and record.terminal
    assert [a.state for a in record.attempts] == ["outcome_unknown"]
    after_backoff()
    assert worker.run_until_idle() == []
    assert terminal.charged == [(900, f"{unknown}/effect")]
    # Only the answered captures were ever captured, each once.
    assert sorted(c.order for c in gateway.charges.values()) == ["o-1", "o-2", "o-3", "o-4"]


LEFT_TO_THE_READER = {"my_directory", "dsn", "gateway", "terminal"}


def _bound(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def test_every_name_a_block_uses_is_imported_or_defined_on_the_page() -> None:
    known = set(dir(builtins)) | LEFT_TO_THE_READER
    for n, block in enumerate(_blocks(), 1):
        tree = ast.parse(block)
        known |= _bound(tree)
        used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
        assert used <= known, f"python block {n} of docs/operations.md uses {sorted(used - known)}"


def _worker_json_fields() -> tuple[set[str], set[str]]:
    """The fields the page's two tables give ``op worker --json``: the document's, and each report's."""
    section = PAGE.read_text(encoding="utf-8").split("With `--json`, `op worker` prints one JSON document", 1)[1]
    document, report = section.split("A claim never refuses", 1)[0].split("and each report's:", 1)

    def names(table: str) -> set[str]:
        return set(re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.MULTILINE))

    return names(document), names(report)


def test_the_pages_op_worker_json_fields_are_the_commands(tmp_path: Path) -> None:
    db = tmp_path / "ops.db"
    transfer = '{"from": "acc-1", "to": "acc-2", "amount": 5}'
    bad, good = (
        data("op", "submit", "transfer", "--db", db, "--key", key, "--input", transfer, cwd=tmp_path)["operation_id"]
        for key in ("k-bad", "k-good")
    )
    # A row that contradicts its state, for "malformed"; two processes, for "errors" (always there with more than one).
    with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("UPDATE operations SET owner = 'w-old' WHERE operation_id = ?", (bad,))
    result = fencekeeper("op", "worker", "--db", db, "--until-idle", "--processes", "2", "--json", cwd=tmp_path)
    assert result.returncode == 1 and result.stderr.rstrip().endswith("[malformed_row]"), result.stderr
    summary = json.loads(result.stdout)
    documented, report_fields = _worker_json_fields()
    assert set(summary) == documented and summary["stopped_by"] == "idle", (set(summary), documented)
    assert summary["errors"] == [] and summary["malformed"] == [bad]
    outcomes = {r["operation_id"]: r["outcome"] for r in summary["reports"]}
    assert outcomes == {bad: "malformed_row", good: "succeeded"}, summary["reports"]
    # `resumed` is on a resumed attempt's report only (tests/cli/test_op_worker_outage.py makes some).
    assert all(set(r) == report_fields - {"resumed"} for r in summary["reports"]), (summary["reports"], report_fields)
    assert "resumed" in report_fields


def _log_table() -> dict[str, str]:
    """The page's table of ``op worker --log-json``'s fields: each field the table names, with its row's meaning."""
    section = PAGE.read_text(encoding="utf-8").split("### The JSON log: `--log-json`", 1)[1].split("\n#", 1)[0]
    fields: dict[str, str] = {}
    for row in re.findall(r"^\| (`[^|]+`) \| (.+) \|$", section, flags=re.MULTILINE):
        for name in re.findall(r"`([a-z_]+)`", row[0]):
            fields[name] = row[1]
    return fields


OUTAGE_AND_LIBRARY_FIELDS = {"resumed", "seconds", "failures", "logger"}
"""The log's fields a SQLite run without an outage cannot show: tests/cli/test_op_worker_outage.py shows the first three
on PostgreSQL with its sessions ended, tests/cli/test_library_logs.py the executions worker's ``logger``."""


def test_the_pages_op_worker_log_fields_and_events_are_the_commands(tmp_path: Path) -> None:
    db = tmp_path / "ops.db"
    submitted = {
        key: data("op", "submit", "transfer", "--db", db, "--key", key, "--input", json.dumps(value), cwd=tmp_path)[
            "operation_id"
        ]
        for key, value in (
            ("k-good", {"from": "acc-1", "to": "acc-2", "amount": 5}),
            ("k-failing", {"from": "acc-9", "to": "acc-2", "amount": 5}),
            ("k-bad", {"from": "acc-1", "to": "acc-2", "amount": 5}),
        )
    }
    with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("UPDATE operations SET owner = 'w-old' WHERE operation_id = ?", (submitted["k-bad"],))
    result = fencekeeper("op", "worker", "--db", db, "--until-idle", "--log-json", "--concurrency", "2", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    records = [json.loads(line) for line in result.stderr.splitlines()]
    documented = _log_table()
    seen = {field for record in records for field in record}
    # Every field the command writes is in the table, and the table names none it cannot write.
    assert seen <= set(documented) and set(documented) - seen == OUTAGE_AND_LIBRARY_FIELDS, (seen, set(documented))
    events = {record["event"] for record in records}
    assert events == {"succeeded", "action_failed", "malformed_row", "error"}, records
    # Each event and level the run wrote is one the table's `event` and `level` rows name.
    named = set(re.findall(r"`([a-z_]+)`", documented["event"]))
    assert events <= named, events - named
    for record in records:
        said = documented["level"].split(f"`{record['level']}` for ", 1)[1].split(";", 1)[0]
        kind = "refusal" if record["event"] == "malformed_row" else f"`{record['event']}`"
        if record["event"] == "action_failed":
            kind = "every other terminal outcome"
        assert kind in said, (record, said)
