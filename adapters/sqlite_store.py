"""The SQLite store: the embedded default, with fenced and coherent commits.

Rules of this module:

- Every request is one ``BEGIN IMMEDIATE`` transaction: the write lock is
  taken before anything is read, so the rows the kernel decides on are the
  rows the writes land on.  The guard is nonetheless carried into every
  UPDATE's WHERE clause; a guarded write that touches no row rolls the whole
  transaction back (defence in depth against anything that bypasses the
  store, and the same code shape as the PostgreSQL store, where it matters).
- Nothing is overwritten to hide history: execution revisions, transition
  records and evidence are appended; triggers refuse UPDATE and DELETE on
  the append-only tables.  ``workflow_dispatch`` has exactly the seed's
  fields (seed 000, Persistence) and a CHECK that its lease fields are set
  if and only if it is claimed.
- The schema is built by numbered, immutable, forward-only migrations
  recorded in ``schema_migrations`` with a checksum.  Opening a database
  whose recorded version is newer than this code, whose recorded migration
  differs from this code's, or whose schema was altered by hand is refused
  with a ``StoreError`` naming the version; nothing is written first.
- A file that is not a SQLite database, is corrupt or cannot be written is
  refused before any write, so it is left exactly as it was.
- sqlite-utils answers schema introspection when a file that is not yet
  ours is opened (which tables exist, whether they are something else's);
  a file that holds ``schema_migrations`` needs no inspection and does not
  import it (about 60 ms of a worker's start-up); the hot path uses the ``sqlite3``
  connection directly: a row update through ``db[table].update()`` costs
  about 49-54 us against 1.9-2.3 us for ``conn.execute`` (bench/sqlite_hot_path.py,
  23-26x over two runs), and could not carry the guard in its WHERE clause anyway.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import DispatchState, ExecutionState, OperationState

from . import codec
from .sql import Dialect, SqlBackend
from .store import Backend, Clock, ExecutionView, StoreError, TransactionalStore, VisitView

BUSY_TIMEOUT_MS = 10_000

_DISPATCH_STATES = ", ".join(f"'{s.value}'" for s in DispatchState)
_OPERATION_STATES = ", ".join(f"'{s.value}'" for s in OperationState)

MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (
        1,
        "initial",
        f"""
CREATE TABLE objects (
    object_id    TEXT PRIMARY KEY,
    object_type  TEXT NOT NULL,
    business_id  TEXT NOT NULL,
    parent_id    TEXT REFERENCES objects(object_id),
    revision     INTEGER NOT NULL CHECK (revision >= 1),
    state        TEXT,
    created_at   TEXT NOT NULL,
    updated_at   TEXT NOT NULL
);
CREATE INDEX objects_parent ON objects (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX objects_type_state ON objects (object_type, state);

CREATE TABLE object_revisions (
    object_id    TEXT NOT NULL REFERENCES objects(object_id),
    revision     INTEGER NOT NULL CHECK (revision >= 1),
    state        TEXT,
    body         TEXT NOT NULL,
    committed_at TEXT NOT NULL,
    PRIMARY KEY (object_id, revision)
);
CREATE TRIGGER object_revisions_no_update BEFORE UPDATE ON object_revisions
BEGIN SELECT RAISE(ABORT, 'object_revisions is append-only'); END;
CREATE TRIGGER object_revisions_no_delete BEFORE DELETE ON object_revisions
BEGIN SELECT RAISE(ABORT, 'object_revisions is append-only'); END;

CREATE TABLE workflow_dispatch (
    workflow_execution_id TEXT PRIMARY KEY REFERENCES objects(object_id),
    dispatch_state        TEXT NOT NULL CHECK (dispatch_state IN ({_DISPATCH_STATES})),
    eligible_at           TEXT NOT NULL,
    lease_token           TEXT,
    leased_by             TEXT,
    lease_expires_at      TEXT,
    step_count            INTEGER NOT NULL DEFAULT 0 CHECK (step_count BETWEEN 0 AND {p.STEP_LIMIT}),
    last_error_code       TEXT,
    CHECK (
        (dispatch_state = 'claimed'
            AND lease_token IS NOT NULL AND leased_by IS NOT NULL AND lease_expires_at IS NOT NULL)
        OR (dispatch_state <> 'claimed'
            AND lease_token IS NULL AND leased_by IS NULL AND lease_expires_at IS NULL)
    )
);
CREATE INDEX workflow_dispatch_eligible ON workflow_dispatch (eligible_at, workflow_execution_id)
    WHERE dispatch_state = 'eligible';
CREATE INDEX workflow_dispatch_claimed ON workflow_dispatch (lease_expires_at)
    WHERE dispatch_state = 'claimed';

CREATE TABLE transitions (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    execution_id TEXT NOT NULL REFERENCES objects(object_id),
    event        TEXT,
    from_state   TEXT,
    to_state     TEXT NOT NULL,
    revision     INTEGER NOT NULL,
    at           TEXT NOT NULL,
    actor        TEXT NOT NULL,
    lease_token  TEXT,
    fence        INTEGER NOT NULL,
    reason       TEXT NOT NULL
);
CREATE INDEX transitions_execution ON transitions (execution_id, seq);
CREATE TRIGGER transitions_no_update BEFORE UPDATE ON transitions
BEGIN SELECT RAISE(ABORT, 'transitions is append-only'); END;
CREATE TRIGGER transitions_no_delete BEFORE DELETE ON transitions
BEGIN SELECT RAISE(ABORT, 'transitions is append-only'); END;

CREATE TABLE wait_registrations (
    execution_id TEXT NOT NULL REFERENCES objects(object_id),
    node_id      TEXT NOT NULL,
    attempt_id   TEXT NOT NULL,
    business_id  TEXT NOT NULL,
    spec         TEXT NOT NULL,
    woken_by     TEXT,
    wake_reason  TEXT,
    PRIMARY KEY (execution_id, node_id, attempt_id)
);

CREATE TABLE events (
    event_id     TEXT PRIMARY KEY,
    business_id  TEXT NOT NULL,
    event_type   TEXT NOT NULL,
    correlation  TEXT NOT NULL,
    committed_at TEXT NOT NULL
);
CREATE INDEX events_type ON events (business_id, event_type);

CREATE TABLE commands (
    command_id   TEXT PRIMARY KEY,
    command_type TEXT NOT NULL,
    business_id  TEXT NOT NULL,
    execution_id TEXT REFERENCES objects(object_id),
    body         TEXT NOT NULL,
    recorded_at  TEXT NOT NULL
);
CREATE INDEX commands_execution ON commands (execution_id);
CREATE TRIGGER commands_no_update BEFORE UPDATE ON commands
BEGIN SELECT RAISE(ABORT, 'commands is append-only'); END;
CREATE TRIGGER commands_no_delete BEFORE DELETE ON commands
BEGIN SELECT RAISE(ABORT, 'commands is append-only'); END;
""",
    ),
    (
        2,
        "interpreter",
        """
ALTER TABLE wait_registrations ADD COLUMN event_type TEXT;
ALTER TABLE wait_registrations ADD COLUMN wake_at TEXT;
UPDATE wait_registrations SET event_type = json_extract(spec, '$.event_type'), wake_at = json_extract(spec, '$.wake_at');
CREATE INDEX wait_registrations_event ON wait_registrations (business_id, event_type) WHERE woken_by IS NULL;
CREATE INDEX wait_registrations_due ON wait_registrations (wake_at) WHERE woken_by IS NULL AND wake_at IS NOT NULL;

ALTER TABLE events ADD COLUMN payload TEXT NOT NULL DEFAULT '{}';
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'events is append-only'); END;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'events is append-only'); END;

CREATE TABLE event_keys (
    business_id TEXT NOT NULL,
    event_type  TEXT NOT NULL,
    name        TEXT NOT NULL,
    value       TEXT NOT NULL,
    event_id    TEXT NOT NULL REFERENCES events(event_id),
    PRIMARY KEY (business_id, event_type, name, value, event_id)
);
CREATE TRIGGER event_keys_no_update BEFORE UPDATE ON event_keys
BEGIN SELECT RAISE(ABORT, 'event_keys is append-only'); END;
CREATE TRIGGER event_keys_no_delete BEFORE DELETE ON event_keys
BEGIN SELECT RAISE(ABORT, 'event_keys is append-only'); END;
""",
    ),
    (
        3,
        "fewer_pages_per_commit",
        # Every b-tree a commit touches is at least one more page written and
        # fsynced (bench/README.md, sqlite_store).  The claim and the end of
        # an execution wrote about 28 pages; this takes away what no query
        # needed:
        # - objects_type_state indexed every object by type and state, so each
        #   execution transition moved an index entry and each evidence object
        #   added one.  Only executions are listed by state; eligible and
        #   running ones are found through workflow_dispatch's own partial
        #   indexes, and succeeded ones, where nearly every execution ends,
        #   would be listed at the cost of reading them all anyway.  The index
        #   keeps the executions in the other states: the few an operator
        #   looks for (waiting, failed, cancelled and the review states).
        # - transitions was AUTOINCREMENT, which writes sqlite_sequence on every
        #   insert.  Its rows can never be deleted (a trigger refuses it), so the
        #   largest rowid is never freed and a plain INTEGER PRIMARY KEY already
        #   only ever grows.
        """
DROP INDEX objects_type_state;
CREATE INDEX objects_execution_state ON objects (state, object_id)
    WHERE object_type = 'WorkflowExecution' AND state NOT IN ('eligible', 'running', 'succeeded');

CREATE TABLE transitions_v3 (
    seq          INTEGER PRIMARY KEY,
    execution_id TEXT NOT NULL REFERENCES objects(object_id),
    event        TEXT,
    from_state   TEXT,
    to_state     TEXT NOT NULL,
    revision     INTEGER NOT NULL,
    at           TEXT NOT NULL,
    actor        TEXT NOT NULL,
    lease_token  TEXT,
    fence        INTEGER NOT NULL,
    reason       TEXT NOT NULL
);
INSERT INTO transitions_v3 (seq, execution_id, event, from_state, to_state, revision, at, actor, lease_token, fence, reason)
    SELECT seq, execution_id, event, from_state, to_state, revision, at, actor, lease_token, fence, reason
    FROM transitions ORDER BY seq;
DROP TABLE transitions;
ALTER TABLE transitions_v3 RENAME TO transitions;
CREATE INDEX transitions_execution ON transitions (execution_id, seq);
CREATE TRIGGER transitions_no_update BEFORE UPDATE ON transitions
BEGIN SELECT RAISE(ABORT, 'transitions is append-only'); END;
CREATE TRIGGER transitions_no_delete BEFORE DELETE ON transitions
BEGIN SELECT RAISE(ABORT, 'transitions is append-only'); END;
""",
    ),
    (
        4,
        "revisions_carry_their_transition",
        # A decision that writes an execution revision wrote the same change a
        # second time as a transitions row, with the table's own index on
        # top: two more pages in every commit.  The revision row now carries
        # the transition that made it (to_state is the revision's state and
        # at its committed_at); transitions keeps the ones that make no
        # revision (renewals) and every row written before this migration.
        # execution_transitions shows both, one row per transition, in order
        # per execution: revision, then the revision's own before the rest,
        # then seq.
        """
ALTER TABLE object_revisions ADD COLUMN event TEXT;
ALTER TABLE object_revisions ADD COLUMN from_state TEXT;
ALTER TABLE object_revisions ADD COLUMN actor TEXT;
ALTER TABLE object_revisions ADD COLUMN lease_token TEXT;
ALTER TABLE object_revisions ADD COLUMN fence INTEGER;
ALTER TABLE object_revisions ADD COLUMN reason TEXT;
CREATE VIEW execution_transitions AS
    SELECT object_id AS execution_id, event, from_state, state AS to_state, revision, committed_at AS at, actor,
        lease_token, fence, reason, 0 AS rank, NULL AS seq
    FROM object_revisions WHERE reason IS NOT NULL
    UNION ALL
    SELECT execution_id, event, from_state, to_state, revision, at, actor, lease_token, fence, reason, 1 AS rank, seq
    FROM transitions;
""",
    ),
    (
        5,
        "closed_wait_registrations",
        # A wait registration is open exactly while its execution waits on
        # it.  Before this migration a cancelled waiter left its registration
        # open, and the due-timer query returned such rows first, up to its
        # limit, so enough of them starved every later timer.  closed_by
        # records the event that took the execution out of waiting without a
        # wake; every registration left open with nothing waiting on it is
        # closed here ('cancel' for a cancelled execution, the only way out
        # there was; 'left_waiting' for anything else), and the partial
        # indexes of open registrations leave closed ones out.
        """
ALTER TABLE wait_registrations ADD COLUMN closed_by TEXT;
UPDATE wait_registrations
    SET closed_by = CASE (SELECT o.state FROM objects o WHERE o.object_id = wait_registrations.execution_id)
        WHEN 'cancelled' THEN 'cancel' ELSE 'left_waiting' END
    WHERE woken_by IS NULL AND NOT EXISTS (
        SELECT 1 FROM objects o JOIN object_revisions r ON r.object_id = o.object_id AND r.revision = o.revision
        WHERE o.object_id = wait_registrations.execution_id AND o.state = 'waiting'
            AND json_extract(r.body, '$.wait[1]') = wait_registrations.node_id
            AND json_extract(r.body, '$.wait[2]') = wait_registrations.attempt_id
    );
DROP INDEX wait_registrations_event;
DROP INDEX wait_registrations_due;
CREATE INDEX wait_registrations_event ON wait_registrations (business_id, event_type)
    WHERE woken_by IS NULL AND closed_by IS NULL;
CREATE INDEX wait_registrations_due ON wait_registrations (wake_at)
    WHERE woken_by IS NULL AND closed_by IS NULL AND wake_at IS NOT NULL;
""",
    ),
    (
        6,
        "execution_journal",
        # The execution journal (seed 002; specs/journal.md, Storage;
        # adapters/journal_store.py).  Headers and events are kept as their
        # canonical bytes, append-only; journal_heads is the compare-and-set
        # guard of every append, derived from the events and checked
        # against them whenever a journal is loaded.
        """
CREATE TABLE journal_headers (
    execution_id TEXT PRIMARY KEY,
    header       BLOB NOT NULL,
    digest       TEXT NOT NULL,
    workflow     BLOB NOT NULL,
    policy       BLOB NOT NULL
);
CREATE TRIGGER journal_headers_no_update BEFORE UPDATE ON journal_headers
BEGIN SELECT RAISE(ABORT, 'journal_headers is append-only'); END;
CREATE TRIGGER journal_headers_no_delete BEFORE DELETE ON journal_headers
BEGIN SELECT RAISE(ABORT, 'journal_headers is append-only'); END;

CREATE TABLE journal_events (
    execution_id TEXT NOT NULL REFERENCES journal_headers(execution_id),
    ordinal      INTEGER NOT NULL CHECK (ordinal >= 1),
    digest       TEXT NOT NULL,
    record       BLOB NOT NULL,
    PRIMARY KEY (execution_id, ordinal)
) WITHOUT ROWID;
CREATE TRIGGER journal_events_no_update BEFORE UPDATE ON journal_events
BEGIN SELECT RAISE(ABORT, 'journal_events is append-only'); END;
CREATE TRIGGER journal_events_no_delete BEFORE DELETE ON journal_events
BEGIN SELECT RAISE(ABORT, 'journal_events is append-only'); END;

CREATE TABLE journal_heads (
    execution_id TEXT PRIMARY KEY REFERENCES journal_headers(execution_id),
    head         TEXT NOT NULL,
    length       INTEGER NOT NULL CHECK (length >= 0)
);
CREATE TRIGGER journal_heads_no_delete BEFORE DELETE ON journal_heads
BEGIN SELECT RAISE(ABORT, 'journal_heads rows are never deleted'); END;
""",
    ),
    (
        7,
        "durable_operations",
        # Seed 001's durable operations, in tables of their own: nothing of
        # the executions' schema changes.  operations holds one row per
        # Operation (its current revision); operation_identities the scoped
        # idempotency identities; operation_attempts one row per claim;
        # operation_transitions and operation_outbox are append-only.
        # operations_due covers exactly the rows a claim may take.
        f"""
CREATE TABLE operations (
    operation_id        TEXT PRIMARY KEY,
    namespace           TEXT NOT NULL,
    tenant              TEXT NOT NULL,
    principal           TEXT NOT NULL,
    client_key          TEXT NOT NULL,
    action_name         TEXT NOT NULL,
    action_version      INTEGER NOT NULL CHECK (action_version >= 1),
    effect_class        TEXT NOT NULL CHECK (effect_class IN ('atomic', 'read_only', 'external')),
    input_digest        TEXT NOT NULL,
    input               TEXT NOT NULL,
    state               TEXT NOT NULL CHECK (state IN ({_OPERATION_STATES})),
    revision            INTEGER NOT NULL CHECK (revision >= 1),
    fence               INTEGER NOT NULL CHECK (fence >= 0),
    attempt_count       INTEGER NOT NULL CHECK (attempt_count >= 0),
    policy              TEXT NOT NULL,
    admitted_at         TEXT NOT NULL,
    deadline            TEXT NOT NULL,
    retain_until        TEXT NOT NULL,
    next_eligible_at    TEXT NOT NULL,
    requires_approval   INTEGER NOT NULL,
    approval            TEXT,
    owner               TEXT,
    lease_expires_at    TEXT,
    attempt_started_at  TEXT,
    effect_id           TEXT,
    outcome             TEXT,
    error_code          TEXT,
    result              TEXT,
    cancel_requested_by TEXT,
    due_at              TEXT,
    CHECK ((state = 'running') = (owner IS NOT NULL AND lease_expires_at IS NOT NULL))
);
CREATE INDEX operations_due ON operations (tenant, due_at) WHERE due_at IS NOT NULL;
CREATE TABLE operation_identities (
    namespace    TEXT NOT NULL,
    tenant       TEXT NOT NULL,
    principal    TEXT NOT NULL,
    client_key   TEXT NOT NULL,
    operation_id TEXT NOT NULL REFERENCES operations(operation_id),
    retain_until TEXT NOT NULL,
    PRIMARY KEY (namespace, tenant, principal, client_key)
);
CREATE TABLE operation_attempts (
    operation_id TEXT NOT NULL REFERENCES operations(operation_id),
    number       INTEGER NOT NULL CHECK (number >= 1),
    worker_id    TEXT NOT NULL,
    state        TEXT NOT NULL,
    started_at   TEXT NOT NULL,
    ended_at     TEXT,
    error_code   TEXT,
    PRIMARY KEY (operation_id, number)
);
CREATE TABLE operation_transitions (
    operation_id TEXT NOT NULL REFERENCES operations(operation_id),
    revision     INTEGER NOT NULL,
    event        TEXT,
    from_state   TEXT,
    to_state     TEXT NOT NULL,
    at           TEXT NOT NULL,
    actor        TEXT NOT NULL,
    fence        INTEGER NOT NULL,
    reason       TEXT NOT NULL,
    PRIMARY KEY (operation_id, revision)
);
CREATE TRIGGER operation_transitions_no_update BEFORE UPDATE ON operation_transitions
BEGIN SELECT RAISE(ABORT, 'operation_transitions is append-only'); END;
CREATE TRIGGER operation_transitions_no_delete BEFORE DELETE ON operation_transitions
BEGIN SELECT RAISE(ABORT, 'operation_transitions is append-only'); END;
CREATE TABLE operation_outbox (
    seq          INTEGER PRIMARY KEY,
    message_id   TEXT NOT NULL UNIQUE,
    operation_id TEXT NOT NULL REFERENCES operations(operation_id),
    topic        TEXT NOT NULL,
    at           TEXT NOT NULL
);
""",
    ),
    (
        8,
        "outbox_and_pruning",
        # One outbox for both subsystems (docs/outbox.md): every transition
        # of an Operation or a workflow execution appends one row in its own
        # transaction; the exporter owns the
        # delivery columns (attempts .. exported_at), nothing may change what
        # a row says.  operation_outbox's rows move over unchanged in order.
        #
        # Pruning and the append-only guarantee: history tables still refuse
        # UPDATE, and refuse DELETE unless the deleting transaction holds a
        # row of pruning_mode (written and removed inside the pruning
        # transaction, so no other connection ever sees one: SQLite has one
        # writer at a time) AND the row belongs to work that has ended (an
        # outbox row: has been exported).  Windows are the pruner's business;
        # the triggers keep anything else, by mistake or by a pruner's bug,
        # from deleting live history.
        """
CREATE TABLE outbox (
    seq             INTEGER PRIMARY KEY,
    message_id      TEXT NOT NULL UNIQUE,
    kind            TEXT NOT NULL CHECK (kind IN ('operation', 'execution')),
    subject_id      TEXT NOT NULL,
    tenant          TEXT,
    topic           TEXT NOT NULL,
    at              TEXT NOT NULL,
    payload         TEXT NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at TEXT,
    claimed_by      TEXT,
    claimed_until   TEXT,
    last_error      TEXT,
    parked_at       TEXT,
    exported_at     TEXT
);
CREATE INDEX outbox_pending ON outbox (seq) WHERE exported_at IS NULL;
CREATE INDEX outbox_subject_pending ON outbox (kind, subject_id, seq) WHERE exported_at IS NULL;
CREATE INDEX outbox_exported ON outbox (exported_at) WHERE exported_at IS NOT NULL;
INSERT INTO outbox (message_id, kind, subject_id, tenant, topic, at, payload)
    SELECT m.message_id, 'operation', m.operation_id, o.tenant, m.topic, m.at,
        json_object('kind', 'operation', 'operation_id', m.operation_id, 'topic', m.topic, 'at', m.at,
            'tenant', o.tenant, 'namespace', o.namespace)
    FROM operation_outbox m JOIN operations o ON o.operation_id = m.operation_id ORDER BY m.seq;
DROP TABLE operation_outbox;
CREATE TRIGGER outbox_message_fixed BEFORE UPDATE OF seq, message_id, kind, subject_id, tenant, topic, at, payload
ON outbox BEGIN SELECT RAISE(ABORT, 'an outbox message never changes; only its delivery columns do'); END;

ALTER TABLE operations ADD COLUMN ended_at TEXT;
ALTER TABLE operations ADD COLUMN result_expired_at TEXT;
UPDATE operations SET ended_at = (SELECT max(t.at) FROM operation_transitions t
    WHERE t.operation_id = operations.operation_id) WHERE outcome IS NOT NULL;
CREATE INDEX operations_ended ON operations (ended_at) WHERE outcome IS NOT NULL;
CREATE TRIGGER operations_stay_ended BEFORE UPDATE ON operations WHEN OLD.outcome IS NOT NULL AND (
    NEW.outcome IS NOT OLD.outcome OR NEW.state IS NOT OLD.state OR NEW.revision IS NOT OLD.revision
    OR NEW.ended_at IS NOT OLD.ended_at)
BEGIN SELECT RAISE(ABORT, 'an ended operation never changes; pruning may only expire its result'); END;

CREATE TABLE pruning_mode (holder TEXT PRIMARY KEY);
CREATE TRIGGER outbox_no_delete BEFORE DELETE ON outbox
WHEN NOT EXISTS (SELECT 1 FROM pruning_mode) OR OLD.exported_at IS NULL
BEGIN SELECT RAISE(ABORT, 'outbox rows are deleted only by pruning, once exported'); END;
DROP TRIGGER operation_transitions_no_delete;
CREATE TRIGGER operation_transitions_no_delete BEFORE DELETE ON operation_transitions
WHEN NOT EXISTS (SELECT 1 FROM pruning_mode) OR NOT EXISTS (
    SELECT 1 FROM operations o WHERE o.operation_id = OLD.operation_id AND o.outcome IS NOT NULL)
BEGIN SELECT RAISE(ABORT, 'operation_transitions is append-only; only pruning deletes, and only of ended operations'); END;
CREATE TRIGGER operation_attempts_no_delete BEFORE DELETE ON operation_attempts
WHEN NOT EXISTS (SELECT 1 FROM pruning_mode) OR NOT EXISTS (
    SELECT 1 FROM operations o WHERE o.operation_id = OLD.operation_id AND o.outcome IS NOT NULL)
BEGIN SELECT RAISE(ABORT, 'operation_attempts are deleted only by pruning, and only of ended operations'); END;
CREATE TRIGGER operation_identities_no_delete BEFORE DELETE ON operation_identities
WHEN NOT EXISTS (SELECT 1 FROM pruning_mode) OR NOT EXISTS (
    SELECT 1 FROM operations o WHERE o.operation_id = OLD.operation_id AND o.outcome IS NOT NULL)
BEGIN SELECT RAISE(ABORT, 'operation_identities are deleted only by pruning, and only of ended operations'); END;
CREATE TRIGGER operations_no_delete BEFORE DELETE ON operations
WHEN NOT EXISTS (SELECT 1 FROM pruning_mode) OR OLD.outcome IS NULL
BEGIN SELECT RAISE(ABORT, 'operations are deleted only by pruning, and only once ended'); END;
""",
    ),
    (
        9,
        "execution_pruning",
        # Retention of workflow executions (docs/outbox.md, Retention): an
        # execution that has ended (succeeded, failed, cancelled: states it
        # never leaves) may have its rows deleted by pruning, as migration 8
        # lets an ended Operation's.  Each of an execution's tables refuses
        # DELETE unless the deleting transaction holds a row of pruning_mode
        # AND the row belongs to an ended execution: the execution's own
        # objects row, revisions, dispatch row, transitions, wait
        # registrations and commands, and its evidence objects (parent_id)
        # with their revisions.  UPDATE stays refused where it was.  No other
        # object (a definition) and no event is ever deleted: events belong
        # to their Business, not to one execution.
        """
DROP TRIGGER object_revisions_no_delete;
DROP TRIGGER transitions_no_delete;
DROP TRIGGER commands_no_delete;
CREATE TRIGGER objects_no_delete BEFORE DELETE ON objects
WHEN NOT EXISTS (SELECT 1 FROM pruning_mode) OR NOT ((OLD.object_type = 'WorkflowExecution' AND OLD.state IN ('succeeded', 'failed', 'cancelled')) OR EXISTS (SELECT 1 FROM objects e WHERE e.object_id = OLD.parent_id AND e.object_type = 'WorkflowExecution' AND e.state IN ('succeeded', 'failed', 'cancelled')))
BEGIN SELECT RAISE(ABORT, 'objects are deleted only by pruning, and only of ended executions'); END;
CREATE TRIGGER object_revisions_no_delete BEFORE DELETE ON object_revisions
WHEN NOT EXISTS (SELECT 1 FROM pruning_mode) OR NOT (EXISTS (SELECT 1 FROM objects e WHERE e.object_id = OLD.object_id AND e.object_type = 'WorkflowExecution' AND e.state IN ('succeeded', 'failed', 'cancelled')) OR EXISTS (SELECT 1 FROM objects e WHERE e.object_id = (SELECT x.parent_id FROM objects x WHERE x.object_id = OLD.object_id) AND e.object_type = 'WorkflowExecution' AND e.state IN ('succeeded', 'failed', 'cancelled')))
BEGIN SELECT RAISE(ABORT, 'object_revisions is append-only; only pruning deletes, and only of ended executions'); END;
CREATE TRIGGER workflow_dispatch_no_delete BEFORE DELETE ON workflow_dispatch
WHEN NOT EXISTS (SELECT 1 FROM pruning_mode) OR NOT (EXISTS (SELECT 1 FROM objects e WHERE e.object_id = OLD.workflow_execution_id AND e.object_type = 'WorkflowExecution' AND e.state IN ('succeeded', 'failed', 'cancelled')))
BEGIN SELECT RAISE(ABORT, 'workflow_dispatch rows are deleted only by pruning, and only of ended executions'); END;
CREATE TRIGGER transitions_no_delete BEFORE DELETE ON transitions
WHEN NOT EXISTS (SELECT 1 FROM pruning_mode) OR NOT (EXISTS (SELECT 1 FROM objects e WHERE e.object_id = OLD.execution_id AND e.object_type = 'WorkflowExecution' AND e.state IN ('succeeded', 'failed', 'cancelled')))
BEGIN SELECT RAISE(ABORT, 'transitions is append-only; only pruning deletes, and only of ended executions'); END;
CREATE TRIGGER wait_registrations_no_delete BEFORE DELETE ON wait_registrations
WHEN NOT EXISTS (SELECT 1 FROM pruning_mode) OR NOT (EXISTS (SELECT 1 FROM objects e WHERE e.object_id = OLD.execution_id AND e.object_type = 'WorkflowExecution' AND e.state IN ('succeeded', 'failed', 'cancelled')))
BEGIN SELECT RAISE(ABORT, 'wait_registrations are deleted only by pruning, and only of ended executions'); END;
CREATE TRIGGER commands_no_delete BEFORE DELETE ON commands
WHEN NOT EXISTS (SELECT 1 FROM pruning_mode) OR NOT (EXISTS (SELECT 1 FROM objects e WHERE e.object_id = OLD.execution_id AND e.object_type = 'WorkflowExecution' AND e.state IN ('succeeded', 'failed', 'cancelled')))
BEGIN SELECT RAISE(ABORT, 'commands is append-only; only pruning deletes, and only of ended executions'); END;
""",
    ),
    (
        10,
        "external_effect_settlement",
        # Whether an external effect may have been issued without a
        # conclusive answer (seed 001, Tasks, external effects, history, and
        # retention; specs/operations.md, Effect classes): the fence of the
        # Attempt whose intent began the unanswered issues, NULL when none
        # is.  An intent recorded before this column existed cannot be told
        # apart from an unanswered one, so it becomes 0, which no Attempt's
        # answer settles: such an Operation is reconciled before any repeat,
        # as it was.  An Operation that succeeded was answered.
        """
ALTER TABLE operations ADD COLUMN effect_unsettled_since INTEGER CHECK (effect_unsettled_since >= 0);
UPDATE operations SET effect_unsettled_since = 0
    WHERE effect_id IS NOT NULL AND (outcome IS NULL OR outcome <> 'succeeded');
""",
    ),
    (
        11,
        "journal_heads_move_forward",
        # The head row is the compare-and-set guard of every append (seed
        # 002, Typical developer flow 5; specs/journal.md, Storage):
        # migration 6 refused its DELETE, but an UPDATE could move it back
        # to a head a stale writer still expects, or give it to another
        # execution.  An append only ever moves it forward, by the events it
        # writes, so an UPDATE that keeps the execution and raises the event
        # count is the only one allowed; whether the new head is the chain's
        # is checked against the events on every load (broken_chain).
        # Retention never deletes a journal.
        """
CREATE TRIGGER journal_heads_move_forward BEFORE UPDATE ON journal_heads
WHEN NEW.execution_id IS NOT OLD.execution_id OR NEW.length IS NULL OR NEW.length <= OLD.length
BEGIN SELECT RAISE(ABORT, 'journal_heads moves only forward: an append raises its event count'); END;
""",
    ),
    (
        12,
        "stable_principal_identities",
        # The idempotency identity is keyed by the principal's stable
        # reference (seed 001, Scoped idempotency; specs/operations.md,
        # "Scoped idempotency"): operation_identities.principal becomes
        # resolver:v*:subject, so a retry after the principal's resolver
        # moved to a new version finds the Operation its first submission
        # admitted.  operations.principal keeps the full reference: it is
        # the provenance the worker resolves.
        #
        # Rows written before could name one principal under two versions of
        # its resolver with one client key: two Operations, one key.  The
        # key goes to one of them; an Operation not yet ended first (it
        # keeps its identity while it can run, as submit's rule says), then
        # the first admitted, then the lower id.  The other rows keep their
        # full reference, which no lookup asks for any more: their
        # Operations stay, reachable by id as every Operation is, and
        # retention prunes those rows once their window has passed, as any
        # other.  Nothing is deleted, so the pruning triggers are not met
        # (they guard DELETE; UPDATE of an identity is the store's own).  A
        # key already in the stable form is kept, so running this again
        # (a file whose record of it was lost) changes nothing.
        """
CREATE TEMP TABLE stable_identity_keys AS
WITH first_split AS (
    SELECT i.rowid AS id, i.namespace, i.tenant, i.client_key, o.outcome, o.admitted_at, o.operation_id,
        substr(i.principal, 1, instr(i.principal, ':') - 1) AS resolver,
        substr(i.principal, instr(i.principal, ':') + 1) AS rest
    FROM operation_identities i JOIN operations o ON o.operation_id = i.operation_id
    WHERE instr(i.principal, ':') > 0
), parts AS (
    SELECT *, substr(rest, 1, instr(rest, ':') - 1) AS version, substr(rest, instr(rest, ':') + 1) AS subject
    FROM first_split WHERE instr(rest, ':') > 0
), versioned AS (
    SELECT *, resolver || ':v*:' || subject AS stable FROM parts
    WHERE substr(version, 1, 1) = 'v' AND length(version) > 1 AND substr(version, 2) NOT GLOB '*[^0-9]*'
        AND subject <> ''
)
SELECT id, stable, row_number() OVER (PARTITION BY namespace, tenant, stable, client_key
    ORDER BY outcome IS NULL DESC, admitted_at, operation_id) AS rank
FROM versioned v WHERE NOT EXISTS (SELECT 1 FROM operation_identities x WHERE x.namespace = v.namespace
    AND x.tenant = v.tenant AND x.principal = v.stable AND x.client_key = v.client_key);
UPDATE operation_identities SET principal = (SELECT k.stable FROM stable_identity_keys k WHERE k.id = operation_identities.rowid)
    WHERE rowid IN (SELECT id FROM stable_identity_keys WHERE rank = 1);
DROP TABLE stable_identity_keys;
""",
    ),
    (
        13,
        "attempt_claim_tokens",
        # Each claim's Attempt keeps the token its worker made for it
        # (seed 001, Durable truth and recovery; specs/operations.md, "An
        # owner write of unknown outcome"): a worker whose claim lost its
        # answer finds the Attempt by that token, never by its worker id
        # alone, which another process may share.  Attempts written before
        # have none, and no lookup by token finds them.
        """
ALTER TABLE operation_attempts ADD COLUMN claim_token TEXT;
""",
    ),
)
"""Numbered, immutable, forward-only.  Never edit one: add the next."""



def _checksum(sql: str) -> str:
    return hashlib.sha256(sql.encode("utf-8")).hexdigest()


def _schema_fingerprint(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
    rows = conn.execute(
        "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' "
        "AND name <> 'schema_migrations' ORDER BY type, name"
    ).fetchall()
    return [(str(t), str(n), " ".join(str(s).split())) for t, n, s in rows]


def _own_objects(conn: sqlite3.Connection, expected: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The fingerprint of fencekeeper's objects: everything named by its migrations or built on their tables.

    An application's own tables (which atomic operations write in the same
    file and transaction, seed 001) and their indexes are the
    application's; an index or trigger added by hand to fencekeeper's tables
    is still an alteration.
    """
    names = {name for _, name, _ in expected}
    rows = conn.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' "
        "AND name <> 'schema_migrations' ORDER BY type, name"
    ).fetchall()
    return [
        (str(t), str(n), " ".join(str(sql).split())) for t, n, table, sql in rows if n in names or table in names
    ]


def _expected_fingerprint(version: int) -> list[tuple[str, str, str]]:
    conn = sqlite3.connect(":memory:")
    try:
        for number, _, sql in MIGRATIONS:
            if number <= version:
                conn.executescript(sql)
        return _schema_fingerprint(conn)
    finally:
        conn.close()


SQLITE = Dialect(
    name="sqlite",
    placeholder="?",
    same="IS",
    seq="rowid",
    encode_time=codec.encode_time,
    decode_time=codec.decode_time,
    integrity_errors=(sqlite3.IntegrityError,),
    # CASE evaluates its branch only when the body is JSON: json_extract raises on any other text.
    wait_item="CASE WHEN json_valid({body}) THEN json_extract({body}, '$.wait[{index}]') END",
)


class _SQLiteBackend(SqlBackend):
    """BEGIN IMMEDIATE already holds the file's write lock, so no row locks are needed."""

    dialect = SQLITE
    revisions_carry_transitions = True



_BUSY = frozenset(
    code for code in (getattr(sqlite3, "SQLITE_BUSY", 5), getattr(sqlite3, "SQLITE_BUSY_SNAPSHOT", 517)) if code
)


def _processes_with(path: Path) -> list[str]:
    """Other processes that have ``path`` open (Linux's /proc), as ``pid NNN (command)``; best effort.

    SQLite does not say which connection holds its write lock; a process
    with the file open is where an operator looks first.  Where /proc is
    absent or unreadable the list is empty and the message says so.
    """
    try:
        target = path.resolve()
        found: list[str] = []
        for entry in sorted(Path("/proc").iterdir(), key=lambda e: e.name):
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if not any(Path(os.readlink(fd)) == target for fd in (entry / "fd").iterdir()):
                    continue
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            found.append(f"pid {entry.name} ({' '.join(command.split())[:80] or '?'})")
            if len(found) == 5:
                break
        return found
    except OSError:
        return []


def locked_error(path: Path, busy_timeout: float) -> StoreError:
    """``store_locked``: another writer has held the file's write lock for longer than this store waits."""
    holders = _processes_with(path)
    who = f"open by {', '.join(holders)}" if holders else "find the process with the file open (fuser, lsof)"
    return StoreError(
        "store_locked",
        f"{path}: the database is locked by another writer: this write waited {busy_timeout:g} s for its write "
        f"lock ({who}); nothing was written. A writer stopped (SIGSTOP, a debugger) or hung in the middle of a "
        "write keeps the lock until it resumes or exits: resume it (kill -CONT PID) or end it, then retry",
    )


def begin_error(exc: sqlite3.OperationalError, path: Path, busy_timeout: float) -> StoreError:
    """What a ``BEGIN IMMEDIATE`` on ``path`` that raised ``exc`` is, for every SQLite store of a fencekeeper file.

    Another writer holding the file's write lock past the busy timeout is
    ``store_locked``, naming the holders (:func:`locked_error`): the store is
    there and the request is refused for now (exit 1, retried by workers),
    not a store that cannot be used (``store_unavailable``, any other
    failure).  The executions', operations' and journals' stores share one
    file, so one held lock must read the same in each.
    """
    if exc.sqlite_errorcode in _BUSY:
        return locked_error(path, busy_timeout)
    return StoreError("store_unavailable", f"{path}: cannot begin a write: {exc}")


class _Write:
    """One ``BEGIN IMMEDIATE`` transaction under the store's lock: commits on normal exit, else rolls back.

    A class rather than a generator context manager: every decision enters
    one, and this costs a few microseconds less each time.
    """

    __slots__ = ("store",)

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store

    def __enter__(self) -> Backend:
        store = self.store
        store._lock.acquire()
        try:
            store._connection().execute("BEGIN IMMEDIATE")
        except BaseException as exc:
            store._lock.release()
            if isinstance(exc, sqlite3.OperationalError):
                raise begin_error(exc, store.path, store.busy_timeout) from None
            raise
        return _SQLiteBackend(store._conn)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        conn = self.store._conn
        try:
            if kind is not None:
                conn.execute("ROLLBACK")
                return
            try:
                conn.execute("COMMIT")
            except BaseException:
                # A commit that fails (disk full, I/O error) leaves the
                # transaction open; end it, so the next request starts clean.
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        finally:
            self.store._lock.release()


class SQLiteStore(TransactionalStore):
    """A store in one SQLite file.  One connection per store object; safe to share between threads."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        clock: Clock | None = None,
        *,
        read_only: bool = False,
        busy_timeout: float = BUSY_TIMEOUT_MS / 1000,
    ) -> None:
        """Open (creating and migrating as needed) the store at ``path``.

        With ``read_only`` the file must exist and be at this code's schema
        version; it is opened only to read (:func:`connect_read_only`), so a
        read-only file, directory or mount can still be listed and
        inspected, and nothing is created beside it or migrated.
        """
        super().__init__(clock)
        if not 0 < busy_timeout <= 3600:
            raise ValueError(f"busy_timeout: must be positive seconds, at most an hour, got {busy_timeout!r}")
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        """Seconds a write waits for another writer's lock before ``StoreError('store_locked')``."""
        self._lock = threading.RLock()
        self._conn = _open_read_only(self.path) if read_only else _open(self.path, busy_timeout)

    def _connection(self) -> sqlite3.Connection:
        # Called with the lock held.  After close, sqlite3's own ProgrammingError named nothing.
        if self._closed:
            raise StoreError("store_unavailable", f"{self.path}: the store is closed")
        return self._conn

    def _transaction(self) -> contextlib.AbstractContextManager[Backend]:
        return _Write(self)

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        # A read transaction, so that a view is taken from one consistent snapshot.
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")

    def expired(self) -> list[str]:
        now = self.clock.now()
        with self._read() as conn:
            return _SQLiteBackend(conn).expired(now)

    def execution_ids(self, state: ExecutionState | None = None) -> list[str]:
        with self._read() as conn:
            return _SQLiteBackend(conn).execution_ids(state)

    def leased_to(self, worker_id: str, lease_token: str) -> str | None:
        with self._read() as conn:
            return _SQLiteBackend(conn).leased_to(worker_id, lease_token)

    def read(self, execution_id: str) -> ExecutionView | None:
        with self._read() as conn:
            return _SQLiteBackend(conn).read_view(execution_id)

    def due_wakes(self, limit: int = 100, *, business_id: str | None = None) -> list[p.WaitKey]:
        # A read of one statement (a worker asks before every claim): no
        # transaction block, and no write lock taken from other writers.
        # Each timer found is fired in a decision of its own, which checks
        # that it is due under that decision's guard.
        now = self.clock.now()
        with self._lock:
            return _SQLiteBackend(self._connection()).due_registrations(now, limit, business_id)

    def read_for_visit(self, execution_id: str) -> VisitView | None:
        # One statement: SQLite runs it in a read transaction of its own, one
        # snapshot, so neither BEGIN nor COMMIT is needed.
        with self._lock:
            return _SQLiteBackend(self._connection()).visit_view(execution_id)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._conn.close()


# --- opening, checking and migrating ----------------------------------------------------


def _open(path: Path, busy_timeout: float = BUSY_TIMEOUT_MS / 1000) -> sqlite3.Connection:
    """Open ``path``, refuse it without writing if it is not ours, then migrate it forward."""
    existed = path.exists()
    if existed and path.is_dir():
        raise StoreError("not_a_database", f"{path}: is a directory, not a SQLite database")
    if not existed and not path.parent.exists():
        raise StoreError("store_unavailable", f"{path}: directory {path.parent} does not exist")
    # WAL mode writes the file and creates -wal and -shm beside it, so both the
    # file and its directory must be writable; finding out later would leave
    # those files behind or fail mid-request.
    problem = read_only_problem(path)
    if problem is not None:
        raise StoreError("read_only", problem)
    try:
        conn = sqlite3.connect(path, isolation_level=None, timeout=busy_timeout, check_same_thread=False)
    except sqlite3.Error as exc:
        raise StoreError("store_unavailable", f"{path}: cannot open: {exc}") from None
    try:
        _check_readable(conn, path)
        version = _check_schema(conn, path)
        _configure(conn, path, busy_timeout)
        _migrate(conn, path, version, busy_timeout)
    except BaseException:
        conn.close()
        raise
    return conn


def read_only_problem(path: Path) -> str | None:
    """Why a store at ``path`` could not write (a read-only mount, file or directory), or None."""
    existing = [needed for needed in (path, path.parent) if needed.exists()]
    with contextlib.suppress(OSError):
        if existing and os.statvfs(existing[0]).f_flag & os.ST_RDONLY:
            return f"{path}: is on a read-only file system (mount); a store must be able to write"
    for needed, what in ((path, "the file"), (path.parent, "its directory")):
        if needed.exists() and not os.access(needed, os.W_OK):
            return f"{path}: {what} is read-only; a store must be able to write"
    return None


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection to the existing file ``path`` that can only read and leaves nothing beside it.

    Reading a WAL database needs its ``-shm`` index, which SQLite creates
    beside the file, and a connection that can write removes it (with the
    ``-wal``) when it is the last to close; one that cannot write leaves
    both behind.  So:

    - file and directory writable: an ordinary connection with
      ``query_only``: it sees every commit, and cleans up as any store
      connection does;
    - otherwise, with a ``-wal`` beside the file (commits may be in it):
      ``mode=ro``, which reads the WAL through the existing index;
    - otherwise ``immutable=1``: nobody can write the file, and no WAL holds
      commits it lacks, so nothing can change while it is read, and SQLite
      then creates no file at all (a read-only directory or mount, an
      immutable file).

    Raises StoreError ``read_only`` when the file cannot be read this way.
    """
    writable = all(os.access(needed, os.W_OK) for needed in (path, path.parent))
    if writable:
        mode = "mode=rw"
    elif Path(f"{path}-wal").exists():
        mode = "mode=ro"
    else:
        mode = "immutable=1"
    uri = f"file:{urllib.parse.quote(str(path.resolve()))}?{mode}"
    try:
        conn = sqlite3.connect(
            uri, uri=True, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False
        )
        conn.execute("PRAGMA query_only=ON")
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    except sqlite3.Error as exc:
        raise StoreError("read_only", f"{path}: cannot be opened to read ({mode}): {exc}") from None
    return conn


def _open_read_only(path: Path) -> sqlite3.Connection:
    """Open ``path`` to read: it must be a store at this code's schema version (nothing is migrated)."""
    if not path.exists():
        raise StoreError("store_unavailable", f"{path}: no database here")
    if path.is_dir():
        raise StoreError("not_a_database", f"{path}: is a directory, not a SQLite database")
    conn = connect_read_only(path)
    try:
        version = check_database(conn, path)
        newest = max(number for number, _, _ in MIGRATIONS)
        if version < newest:
            raise StoreError(
                "schema_outdated",
                f"{path}: schema version {version}, this fencekeeper's is {newest}; it is not migrated when only "
                f"read (`fencekeeper migrate --db {path}` does it)",
            )
    except BaseException:
        conn.close()
        raise
    return conn


def check_database(conn: sqlite3.Connection, path: Path) -> int:
    """The checks opening a store makes, without migrating or writing: its schema version (0 when empty).

    Raises StoreError (``not_a_database``, ``schema_too_new``, ``schema_altered``)
    naming ``path``; ``fencekeeper check`` reports with it.
    """
    _check_readable(conn, path)
    return _check_schema(conn, path)


def _check_readable(conn: sqlite3.Connection, path: Path) -> None:
    # Reading the schema touches every page header SQLite needs; a file that is
    # not a database or is damaged fails here, before anything is written.
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        if conn.execute("PRAGMA quick_check").fetchone() != ("ok",):
            raise StoreError("not_a_database", f"{path}: the database is corrupt (quick_check failed)")
    except sqlite3.DatabaseError as exc:
        if _is_read_only_error(exc):
            raise StoreError("read_only", f"{path}: cannot be read without writing beside it: {exc}") from None
        raise StoreError("not_a_database", f"{path}: not a usable SQLite database: {exc}") from None


def _is_read_only_error(exc: sqlite3.Error) -> bool:
    # A WAL database whose index cannot be created (a read-only mount or
    # directory) fails to open with CANTOPEN or READONLY: the file is fine.
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY)


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone()
    return row is not None


def _check_schema(conn: sqlite3.Connection, path: Path) -> int:
    if not _has_table(conn, "schema_migrations"):
        # Not (yet) ours: a new file, or something else's.  Only here does
        # the file need inspecting, and only here is sqlite-utils imported:
        # its import and plugin scan cost about 60 ms, which every worker's
        # start-up on a database that is already ours used to pay.
        import sqlite_utils  # noqa: PLC0415

        tables = set(sqlite_utils.Database(conn).table_names())
        ours = {"objects", "workflow_dispatch"} & tables
        if tables and ours:
            raise StoreError("schema_altered", f"{path}: has fencekeeper tables but no schema_migrations record")
        if tables:
            raise StoreError(
                "not_a_database", f"{path}: is a SQLite database of something else (tables {sorted(tables)[:5]})"
            )
        return 0
    recorded = conn.execute("SELECT version, name, checksum FROM schema_migrations ORDER BY version").fetchall()
    known = {number: (name, _checksum(sql)) for number, name, sql in MIGRATIONS}
    newest = max(known)
    version = 0
    for number, name, checksum in recorded:
        if number > newest:
            raise StoreError(
                "schema_too_new",
                f"{path}: schema version {number} ({name}) is newer than this fencekeeper, which knows up to "
                f"version {newest}; upgrade fencekeeper",
            )
        if known.get(number) != (name, checksum):
            raise StoreError(
                "schema_altered", f"{path}: migration {number} ({name}) differs from this fencekeeper's version {number}"
            )
        version = number
    # Built once: it replays every migration into a database in memory (about 7 ms).
    expected = _expected_fingerprint(version)
    if _own_objects(conn, expected) != expected:
        raise StoreError(
            "schema_altered", f"{path}: the schema at version {version} was altered outside fencekeeper's migrations"
        )
    return version


def _configure(conn: sqlite3.Connection, path: Path, busy_timeout: float = BUSY_TIMEOUT_MS / 1000) -> None:
    try:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
    except sqlite3.OperationalError as exc:
        raise StoreError("read_only", f"{path}: cannot be written: {exc}") from None
    if mode is None or str(mode[0]).lower() != "wal":
        raise StoreError("read_only", f"{path}: cannot switch to WAL mode (got {mode}); is it read-only?")
    conn.execute(f"PRAGMA busy_timeout={round(busy_timeout * 1000)}")
    conn.execute("PRAGMA foreign_keys=ON")
    # FULL: a committed decision survives power loss, not only a crash.
    conn.execute("PRAGMA synchronous=FULL")


def _migrate(conn: sqlite3.Connection, path: Path, version: int, busy_timeout: float = BUSY_TIMEOUT_MS / 1000) -> None:
    pending = [(n, name, sql) for n, name, sql in MIGRATIONS if n > version]
    if not pending:
        return
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
            "checksum TEXT NOT NULL, applied_at TEXT NOT NULL)"
        )
        for number, name, sql in pending:
            for statement in _statements(sql):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations (version, name, checksum, applied_at) "
                "VALUES (?, ?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
                (number, name, _checksum(sql)),
            )
        conn.execute("COMMIT")
    except sqlite3.OperationalError as exc:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        if exc.sqlite_errorcode in _BUSY:
            raise locked_error(path, busy_timeout) from None
        if "readonly" in str(exc) or "read-only" in str(exc):
            raise StoreError("read_only", f"{path}: cannot be written: {exc}") from None
        raise StoreError("store_unavailable", f"{path}: migration failed: {exc}") from None


def _statements(script: str) -> Iterator[str]:
    # executescript() would COMMIT the surrounding transaction; split instead,
    # keeping trigger bodies (which contain ';') whole.
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                yield buffer.strip()
            buffer = ""
    if buffer.strip():
        raise ValueError(f"incomplete migration statement: {buffer.strip()[:60]}")


__all__ = [
    "BUSY_TIMEOUT_MS",
    "MIGRATIONS",
    "SQLITE",
    "SQLiteStore",
    "check_database",
    "connect_read_only",
    "locked_error",
    "read_only_problem",
]
