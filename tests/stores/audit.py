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
    final_states, problems = row_problems(loaded, TERMINAL | REVIEW)
    assert not problems, problems
    return final_states


def row_problems(loaded: Loaded, allowed: frozenset[str]) -> tuple[collections.Counter[str], list[str]]:
    """Every execution's rows, checked against each other; returns the final states and the problems found.

    ``allowed`` is the states an execution may be left in.  An execution
    that ended is ended exactly once, by its last transition; its dispatch
    row agrees with it and holds a lease only if claimed; its revisions run
    1..n, each written by exactly one transition whose states chain, and the
    newest equals the object row.
    """
    final_states: collections.Counter[str] = collections.Counter()
    problems: list[str] = []
    if loaded.dispatch.keys() != loaded.executions.keys():
        problems.append(f"executions without a dispatch row or back: {sorted(loaded.dispatch.keys() ^ loaded.executions.keys())}")
    for execution_id, obj in loaded.executions.items():
        state = obj["state"]
        final_states[state] += 1
        if state not in allowed:
            problems.append(f"{execution_id}: left {state}")
        transitions = loaded.history[execution_id]
        into_terminal = [t for t in transitions if t["to_state"] in TERMINAL]
        if state in TERMINAL:
            if len(into_terminal) != 1:
                problems.append(f"{execution_id}: ended {len(into_terminal)} times")
            elif into_terminal[0] is not transitions[-1]:
                problems.append(f"{execution_id}: written after it ended")
        elif into_terminal:
            problems.append(f"{execution_id}: {state}, but its history ended it")
        if not transitions or transitions[-1]["to_state"] != state:
            problems.append(f"{execution_id}: its last transition does not lead to {state}")

        d = loaded.dispatch.get(execution_id)
        if d is None:
            continue
        if d["dispatch_state"] != dispatch_state_of(ExecutionState(state)).value:
            problems.append(f"{execution_id}: dispatch {d['dispatch_state']} disagrees with {state}")
        claimed = d["dispatch_state"] == "claimed"
        for field in ("lease_token", "leased_by", "lease_expires_at"):
            if (d[field] is not None) != claimed:
                problems.append(f"{execution_id}: {field} {'set' if d[field] is not None else 'empty'} on {d['dispatch_state']}")

        revs = loaded.revisions[execution_id]
        if [r["revision"] for r in revs] != list(range(1, obj["revision"] + 1)):
            problems.append(f"{execution_id}: revisions {[r['revision'] for r in revs]}, object at {obj['revision']}")
            continue
        body = json.loads(revs[-1]["body"])
        if not revs[-1]["state"] == state == body["state"] or body["revision"] != obj["revision"]:
            problems.append(f"{execution_id}: the newest revision is not the object row")
        if body["step_count"] != d["step_count"]:
            problems.append(f"{execution_id}: step count {body['step_count']}, dispatch says {d['step_count']}")

        writers = [t for t in transitions if t["event"] != "renew"]
        if [t["revision"] for t in writers] != [r["revision"] for r in revs]:
            problems.append(f"{execution_id}: revisions and the transitions that wrote them do not pair up")
            continue
        previous = None
        for t, r in zip(writers, revs, strict=True):
            if t["to_state"] != r["state"] or t["from_state"] != previous or t["at"] != r["committed_at"]:
                problems.append(f"{execution_id}: revision {r['revision']} does not follow from its transition")
            previous = r["state"]
        for t in transitions:
            if t["event"] == "renew" and not (
                t["from_state"] == t["to_state"] == "running" and revs[t["revision"] - 1]["state"] == "running"
            ):
                problems.append(f"{execution_id}: a renewal outside running at revision {t['revision']}")
    return final_states, problems
