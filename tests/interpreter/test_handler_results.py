"""A handler's result that no store can keep is a handler error: the Command is unknown, never a crash.

specs/interpreter.md, The handler contract (what a result may hold).  A
``detail`` with a NUL, a lone surrogate or past the bound, ``outputs`` that
are no object of JSON values (NaN, a key that is not a string, a set, an
object, a value past the bound, a lone surrogate): before, a worker wrote
them as ``str()`` of the object, as non-standard JSON, or not at all (a NUL
in an unknown result's detail had its finalization refused, leaving the
execution running under its lease; outputs that were no mapping ended the
worker with a TypeError).  Now each is taken as UNKNOWN, on every store:
the execution goes to reconciliation_required, the attempt and the Command
record a detail naming the Command and the field, the lease is released,
and every stored body is JSON a store reads back.
"""

from __future__ import annotations

import enum
import json
import math
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters import service
from fencekeeper.adapters.ports import ScriptedHandler
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.evidence import Evidence
from fencekeeper.kernel.machines import ExecutionState
from fencekeeper.kernel.text import first_problem
from tests.cli.runner import EXAMPLES as CLI_EXAMPLES
from tests.cli.runner import assert_one_error_line, data, fencekeeper, ok

from .conftest import BUSINESS, OPS, World, example

SUCCEEDED, REJECTED, UNKNOWN = i.CommandStatus.SUCCEEDED, i.CommandStatus.REJECTED, i.CommandStatus.UNKNOWN
HUGE = "x" * (i.MAX_RESULT_LENGTH + 1)


class Opaque:
    """No JSON value: a worker used to store it as ``str()`` (its address) on a database, as itself in memory."""


class Flooding:
    """An object whose own ``repr`` holds a NUL: the evidence must not quote it."""

    def __repr__(self) -> str:
        return "\x00"


def _cyclic() -> dict[str, Any]:
    outputs: dict[str, Any] = {}
    outputs["self"] = outputs
    return outputs


def _nested(levels: int) -> dict[str, Any]:
    """Outputs ``levels`` objects below the outputs object itself: ``levels + 1`` levels in all."""
    outputs: dict[str, Any] = {}
    for _ in range(levels):
        outputs = {"inner": outputs}
    return outputs


UNSTORABLE: list[tuple[str, i.CommandResult, str]] = [
    ("detail NUL", i.CommandResult(REJECTED, i.Rejection.REJECTED, "a\x00b"), "detail: contains NUL"),
    ("detail surrogate", i.CommandResult(REJECTED, i.Rejection.REJECTED, "a\ud800b"), "detail: contains an unpaired"),
    ("detail huge", i.CommandResult(REJECTED, i.Rejection.REJECTED, HUGE), "detail: is 65537 characters long"),
    ("detail not text", i.CommandResult(REJECTED, i.Rejection.REJECTED, 42), "detail: must be text, not int"),  # type: ignore[arg-type]
    ("unknown detail NUL", i.CommandResult(UNKNOWN, None, "lost\x00"), "detail: contains NUL"),
    ("succeeded detail NUL", i.CommandResult(SUCCEEDED, None, "done\x00", {"ok": True}), "detail: contains NUL"),
    ("outputs NUL", i.CommandResult(SUCCEEDED, None, "", {"note": "a\x00"}), "outputs.note: contains NUL"),
    ("outputs surrogate", i.CommandResult(SUCCEEDED, None, "", {"note": ["\udc00"]}), "outputs.note[0]: contains an unpaired"),
    ("outputs key surrogate", i.CommandResult(SUCCEEDED, None, "", {"\udc00": 1}), "outputs key '\\udc00': contains an unpaired"),
    ("outputs NaN", i.CommandResult(SUCCEEDED, None, "", {"rate": math.nan}), "outputs.rate: must be a finite number"),
    ("outputs infinity", i.CommandResult(SUCCEEDED, None, "", {"rate": -math.inf}), "outputs.rate: must be a finite number"),
    ("outputs int key", i.CommandResult(SUCCEEDED, None, "", {"lines": {1: "a"}}), "outputs.lines: has the key 1, of type int; object keys must be strings"),
    ("outputs object", i.CommandResult(SUCCEEDED, None, "", {"order": Opaque()}), "outputs.order: is a Opaque"),
    ("outputs set", i.CommandResult(SUCCEEDED, None, "", {"ids": {1, 2}}), "outputs.ids: is a set"),
    ("outputs huge", i.CommandResult(SUCCEEDED, None, "", {"blob": HUGE}), "outputs: is 65548 characters long as JSON"),
    ("outputs not an object", i.CommandResult(SUCCEEDED, None, "", [1, 2]), "outputs: must be an object"),  # type: ignore[arg-type]
    ("outputs contain themselves", i.CommandResult(SUCCEEDED, None, "", _cyclic()), "outputs: nests deeper than 32 levels"),
    ("outputs nest too deep", i.CommandResult(SUCCEEDED, None, "", _nested(32)), "outputs: nests deeper than 32 levels"),
    ("outputs nest far too deep", i.CommandResult(SUCCEEDED, None, "", _nested(5000)), "outputs: nests deeper than 32 levels"),
    ("outputs integer too long", i.CommandResult(SUCCEEDED, None, "", {"n": 10**5000}), "outputs: cannot be written as JSON"),
    ("outputs repr with NUL", i.CommandResult(SUCCEEDED, None, "", {"x": Flooding()}), "outputs.x: is a Flooding"),
    ("status not a status", i.CommandResult("succeeded", None, ""), "status: must be a CommandStatus, not str"),  # type: ignore[arg-type]
    ("rejection not a rejection", i.CommandResult(REJECTED, "validation", ""), "rejection: must be a Rejection"),  # type: ignore[arg-type]
]


def _answering(result: i.CommandResult, settled: i.CommandResult | None = None) -> ScriptedHandler:
    """A handler that answers ``result`` to the refund, and ``settled`` (default: the same) when asked later."""
    return ScriptedHandler(
        {"payment.refund": lambda command: result},
        settled={"payment.refund": lambda command: result if settled is None else settled},
    )


def _storable_everywhere(bodies: list[Evidence]) -> None:
    """Every stored body is JSON any reader reads back, with no text a store cannot keep."""
    for item in bodies:
        assert first_problem(item.body, "body") is None, (item.object_id, item.revision)
        json.dumps(item.body, allow_nan=False)


def _refund(world: World, handler: ScriptedHandler) -> None:
    world.handler = handler
    world.register(example("refund_needs_reconciliation"))
    world.admit("refund", "r-1", payment_id="p-1", amount=40)


@pytest.mark.parametrize(("result", "named"), [(r, n) for _, r, n in UNSTORABLE], ids=[c for c, _, _ in UNSTORABLE])
def test_an_unstorable_result_leaves_the_command_unknown_and_the_lease_released(
    world: World, result: i.CommandResult, named: str
) -> None:
    _refund(world, _answering(result))
    report = world.run_pass()  # the worker does not crash
    assert report.refused == [] and report.finished == {"reconciliation_required": 1}
    view = world.view("r-1")
    assert view.execution.state == ExecutionState.RECONCILIATION_REQUIRED
    assert view.execution.current_node_id == "send_refund"  # neither next nor on_failure was taken
    assert view.dispatch.last_error_code == "command_unknown"
    assert view.dispatch.lease_token is None and view.dispatch.leased_by is None
    attempt = next(e for e in view.evidence if e.kind == "StepAttempt")
    command = next(e for e in view.evidence if e.kind == i.COMMAND)
    assert (attempt.state, command.state) == ("unknown", "unknown")
    for detail in (attempt.body["detail"], command.body["detail"]):
        assert f"Command {command.object_id} (payment.refund) cannot be stored" in detail
        assert named in detail, detail
        assert len(detail) < 1000
    assert command.body["outputs"] == {}
    _storable_everywhere(list(view.evidence_revisions))
    assert named in view.history[-1].reason
    # Never resent: a later pass finds nothing to do.
    assert world.run_pass().claimed == []
    assert len(world.handler.executed) == 1


def test_an_unstorable_answer_to_reconciliation_records_nothing_and_says_why(world: World) -> None:
    bad = i.CommandResult(SUCCEEDED, None, "refunded", {"at": math.nan})
    _refund(world, _answering(i.CommandResult(UNKNOWN, None, "no reply"), settled=bad))
    world.run_pass()
    before = world.view("r-1")

    def reconcile() -> service.Reconciled:
        return service.reconcile(
            world.store, world.policy, world.handler, business_id=BUSINESS, principal_id=OPS, execution_id="r-1"
        )

    reconciled = reconcile()
    assert isinstance(reconciled.outcome, p.Refusal)
    assert reconciled.outcome.code == p.RefusalCode.NO_UNRESOLVED_COMMAND
    assert "outputs.at: must be a finite number" in reconciled.outcome.message
    assert reconciled.result.status == UNKNOWN
    assert world.view("r-1") == before
    # Once the handler answers something storable, the Command settles as usual.
    world.handler.settled["payment.refund"] = lambda command: i.CommandResult(SUCCEEDED, None, "refunded", {"at": 1.5})
    assert isinstance(reconcile().outcome, p.Decision)
    settled = next(e for e in world.view("r-1").evidence if e.kind == i.COMMAND)
    assert (settled.state, settled.body["outputs"]) == ("succeeded", {"at": 1.5})


class Colour(enum.IntEnum):
    RED = 1


def test_storable_outputs_are_kept_as_every_store_reads_them_back(world: World) -> None:
    # A tuple is a list and an IntEnum its number on a database; the in-memory store now agrees.
    outputs = {"lines": ("a", Colour.RED), "none": None, "nested": {"ok": True, "n": -0.5}}
    _refund(world, _answering(i.CommandResult(SUCCEEDED, None, "refunded", outputs)))
    assert world.run_pass().finished == {"succeeded": 1}
    attempt = next(e for e in world.view("r-1").evidence if e.kind == "StepAttempt")
    kept = attempt.body["outputs"]
    assert kept == {"lines": ["a", 1], "none": None, "nested": {"ok": True, "n": -0.5}}
    assert type(kept["lines"][1]) is int


def test_a_rejection_with_a_storable_detail_still_follows_on_failure(world: World) -> None:
    detail = "y" * i.MAX_RESULT_LENGTH  # at the bound: kept whole
    _refund(world, _answering(i.CommandResult(REJECTED, i.Rejection.REJECTED, detail)))
    assert world.run_pass().finished == {"failed": 1}
    attempt = next(e for e in world.view("r-1").evidence if e.kind == "StepAttempt")
    assert (attempt.state, attempt.body["detail"]) == ("failed", detail)


# --- the kernel's own answer --------------------------------------------------------------------

COMMAND = i.Command("r-1/a2/command", "r-1", "r-1/a2", "user:alice", BUSINESS, "payment.refund", (("p-1", 1),), {})


@pytest.mark.parametrize(("result", "named"), [(r, n) for _, r, n in UNSTORABLE], ids=[c for c, _, _ in UNSTORABLE])
def test_storable_result_names_the_command_and_the_field(result: i.CommandResult, named: str) -> None:
    checked = i.storable_result(COMMAND, result)
    assert (checked.status, checked.rejection, checked.outputs) == (UNKNOWN, None, {})
    assert checked.detail.startswith("the handler's result for Command r-1/a2/command (payment.refund) cannot be stored")
    assert named in checked.detail
    assert first_problem(checked.detail, "detail") is None and len(checked.detail) < 1000


def test_storable_result_keeps_a_good_result() -> None:
    good = i.CommandResult(REJECTED, i.Rejection.STALE_VERSION, "the order changed", {"revision": 3})
    assert i.storable_result(COMMAND, good) == good
    assert i.storable_result(COMMAND, good).outputs == {"revision": 3}


def test_outputs_of_exactly_the_depth_bound_are_kept() -> None:
    deepest = i.CommandResult(SUCCEEDED, None, "", _nested(31))
    assert i.storable_result(COMMAND, deepest) == deepest


# --- through the command line a user runs -------------------------------------------------------

BAD_HANDLER = '''
from fencekeeper import CommandResult, CommandStatus


class Handler:
    """Answers the refund with outputs no store can keep, and the same when asked later."""

    def execute(self, command):
        return CommandResult(CommandStatus.SUCCEEDED, None, "refunded", {"receipt": "r\\x00", "fee": float("nan")})

    reconcile = execute


def make():
    return Handler()
'''


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "shop.db")
    dsn = request.getfixturevalue("pg_dsn")
    return f"{dsn}?schema={request.getfixturevalue('pg_schema')}"


def test_fencekeeper_worker_with_a_handler_whose_result_cannot_be_stored(db: str, tmp_path: Path) -> None:
    (tmp_path / "bad_handler.py").write_text(BAD_HANDLER, encoding="utf-8")
    refund = CLI_EXAMPLES / "refund_needs_reconciliation.toml"
    ok("run", refund, "--db", db, "--input", '{"amount": 40, "payment_id": "p-1"}', "--id", "r-1", cwd=tmp_path)
    summary = data("worker", "--db", db, "--until-idle", "--handler", "bad_handler:make", cwd=tmp_path)
    assert summary["finished"] == {"reconciliation_required": 1} and summary["refused"] == []
    view = data("inspect", "r-1", "--db", db, cwd=tmp_path)
    assert view["execution"]["state"] == "reconciliation_required"
    assert view["dispatch"]["last_error_code"] == "command_unknown"
    assert "outputs.receipt: contains NUL" in view["history"][-1]["reason"]
    before = data("inspect", "r-1", "--db", db, cwd=tmp_path)
    refused = fencekeeper("reconcile", "r-1", "--db", db, "--settle", "--handler", "bad_handler:make", cwd=tmp_path)
    line = assert_one_error_line(refused, 1)
    assert "outputs.receipt: contains NUL" in line, line
    assert data("inspect", "r-1", "--db", db, cwd=tmp_path) == before
