"""The database checks every store load test ends with, written once for SQLite and PostgreSQL.

After a run, every execution must be finished (terminal or review) exactly
once, with coherent rows: its last transition is its state, its dispatch
row agrees and holds a lease only if claimed, its revisions run 1..n with
the newest equal to the object row, and every revision was written by
exactly one transition (renewals write none and carry the revision they
renewed under).  Rows are any mappings by column name (``sqlite3.Row`` or
psycopg's ``dict_row``), so both databases run the same assertions.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fencekeeper.kernel.machines import ExecutionState, dispatch_state_of

Row = Mapping[str, Any]

TERMINAL = frozenset({ExecutionState.SUCCEEDED.value, ExecutionState.FAILED.value, ExecutionState.CANCELLED.value})
REVIEW = frozenset({ExecutionState.SUSPENDED.value, ExecutionState.RECONCILIATION_REQUIRED.value})


@dataclass
class Loaded:
    executions: dict[str, Row]
    dispatch: dict[str, Row]
    revisions: dict[str, list[Row]]
    history: dict[str, list[Row]]


HISTORY = "SELECT * FROM execution_transitions ORDER BY execution_id, revision, rank, seq"
"""Every transition, in order per execution.  In both databases a revision row
carries the transition that made it (SQLite migration 4, PostgreSQL migration
4); the execution_transitions view shows those beside the transitions table's
rows (renewals, and rows written before that migration)."""


def load(rows: Callable[[str], Iterable[Row]]) -> Loaded:
    """Every execution with its dispatch row, revisions and transitions, in commit order."""
    executions = {r["object_id"]: r for r in rows("SELECT * FROM objects WHERE object_type = 'WorkflowExecution'")}
    dispatch = {r["workflow_execution_id"]: r for r in rows("SELECT * FROM workflow_dispatch")}
    assert dispatch.keys() == executions.keys()
    revisions: dict[str, list[Row]] = collections.defaultdict(list)
    for r in rows("SELECT * FROM object_revisions ORDER BY object_id, revision"):
        if r["object_id"] in executions:
            revisions[r["object_id"]].append(r)
    history: dict[str, list[Row]] = collections.defaultdict(list)
    for r in rows(HISTORY):
        history[r["execution_id"]].append(r)
    return Loaded(executions, dispatch, revisions, history)


def check_finished_once(loaded: Loaded) -> collections.Counter[str]:
    """Assert every execution finished exactly once with coherent rows; count the final states."""
    final_states: collections.Counter[str] = collections.Counter()
    for execution_id, obj in loaded.executions.items():
        state = obj["state"]
        final_states[state] += 1
        assert state in TERMINAL | REVIEW, (execution_id, state)
        transitions = loaded.history[execution_id]
        into_terminal = [t for t in transitions if t["to_state"] in TERMINAL]
        if state in TERMINAL:
            assert len(into_terminal) == 1, (execution_id, [dict(t) for t in into_terminal])
            assert into_terminal[0] is transitions[-1], f"{execution_id}: written after it ended"
        else:
            assert into_terminal == [], execution_id
        assert transitions[-1]["to_state"] == state

        d = loaded.dispatch[execution_id]
        assert d["dispatch_state"] == dispatch_state_of(ExecutionState(state)).value, execution_id
        claimed = d["dispatch_state"] == "claimed"
        for field in ("lease_token", "leased_by", "lease_expires_at"):
            assert (d[field] is not None) == claimed, (execution_id, field)

        revs = loaded.revisions[execution_id]
        assert [r["revision"] for r in revs] == list(range(1, obj["revision"] + 1)), f"{execution_id}: gap"
        body = json.loads(revs[-1]["body"])
        assert revs[-1]["state"] == state == body["state"]
        assert body["revision"] == obj["revision"]
        assert body["step_count"] == d["step_count"]

        writers = [t for t in transitions if t["event"] != "renew"]
        assert [t["revision"] for t in writers] == [r["revision"] for r in revs], f"{execution_id}: shared revision"
        previous = None
        for t, r in zip(writers, revs, strict=True):
            assert t["to_state"] == r["state"] and t["from_state"] == previous, (execution_id, dict(t))
            assert t["at"] == r["committed_at"], (execution_id, dict(t))
            previous = r["state"]
        for t in transitions:
            if t["event"] == "renew":
                assert t["from_state"] == t["to_state"] == "running"
                assert revs[t["revision"] - 1]["state"] == "running"
    return final_states
