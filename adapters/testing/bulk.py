"""Eligible executions written in bulk into a PostgreSQL schema, for benches and tests.

Rules of this module:

- The rows are exactly the ones ``admit`` writes for a one-node execution
  (an ``objects`` row, its first revision, an eligible dispatch row due a
  second ago); only the way they get there differs: three set-based
  statements instead of one decision per execution, because admitting a
  hundred thousand executions one by one would take longer than what is
  being measured.
- Nothing here is a store: it bypasses the kernel and the guards, so it
  writes only into a freshly migrated schema that nothing else is using.
"""

from __future__ import annotations

import psycopg
from psycopg import sql


def admit_in_bulk(dsn: str, schema: str, count: int, *, prefix: str, business_id: str) -> None:
    """``count`` eligible executions ``<prefix>00000001``... of ``business_id``, committed together."""
    ids = sql.SQL("SELECT {} || lpad(g::text, 8, '0') AS id FROM generate_series(1, {}) g").format(
        sql.Literal(prefix), sql.Literal(count)
    )
    business = sql.Literal(business_id)
    with psycopg.connect(dsn) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        conn.execute(
            sql.SQL(
                "INSERT INTO objects (object_id, object_type, business_id, revision, state, created_at, updated_at) "
                "SELECT id, 'WorkflowExecution', {}, 1, 'eligible', now(), now() FROM ({}) s"
            ).format(business, ids)
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO object_revisions (object_id, revision, state, body, committed_at) "
                "SELECT id, 1, 'eligible', json_build_object('execution_id', id, 'business_id', {}, "
                "'state', 'eligible', 'revision', 1, 'definition_id', 'one-node', 'definition_revision', 1, "
                "'current_node_id', 'end', 'step_count', 0, 'fence', 0, 'wait', NULL)::text, now() "
                "FROM ({}) s"
            ).format(business, ids)
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO workflow_dispatch (workflow_execution_id, dispatch_state, eligible_at) "
                "SELECT id, 'eligible', now() - interval '1 second' FROM ({}) s"
            ).format(ids)
        )


__all__ = [
    "admit_in_bulk",
]
