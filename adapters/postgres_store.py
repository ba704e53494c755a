"""The PostgreSQL store: many workers on many machines, fenced by the database.

Rules of this module:

- Same port, same decisions, same guarded SQL as every store
  (``store.py``, ``sql.py``); what differs is how rows are locked and where
  time comes from.
- Isolation is READ COMMITTED with explicit row locks.  A decision on an
  execution first locks its ``objects`` row and then its
  ``workflow_dispatch`` row (always in that order, so two transactions can
  never wait on each other in a cycle), and only then reads them; the
  guard in every UPDATE's WHERE clause is then a second line of defence.
  SERIALIZABLE is not needed: every decision reads only the rows it has
  locked, so no other transaction can change them before it commits.
- Claiming uses ``FOR UPDATE SKIP LOCKED`` on both rows in one statement,
  ordered by ``eligible_at, workflow_execution_id``: many workers never
  block on each other's rows, and never wait for a lock, so claim takes no
  part in any lock cycle either.
- The store's statements reach the server through :func:`_run`: each is
  prepared once per connection, under a name of the store's own, and run by
  name, with psycopg's own adapters for its parameters and rows but without
  a cursor (a cursor costs ten times the rest).  psycopg's own preparing is
  off on the store's connections: it deallocates every prepared statement
  of a connection after any rollback, the store's too.
- A transaction's ``BEGIN`` travels with its first statement, in libpq's
  pipeline mode (:func:`_run` with ``begin``), and it ends through the
  pool's connection context: COMMIT on a normal exit, ROLLBACK on any
  exception, as ``conn.transaction()`` did.  A read of one statement
  (``read_for_visit``, ``due_wakes``) runs outside a transaction block: the
  server gives a single statement a transaction and a snapshot of its own.
- A decision's writes are one statement.  Where nothing reads their result
  before the commit (an admission: inserts only, written as the
  transaction's last action, ``write_last``), that statement travels with
  the ``NOTIFY`` and ``COMMIT`` in one exchange (``commit_kept``); a
  unique-key conflict there means what it means to ``write``.
- An admission whose facts the store can predict (the identity free, the
  definition's latest revision as last read, the moment ``PREDICTED_AT``)
  reads nothing first: its ``BEGIN`` goes with that exchange, and its one
  statement writes the database's time where the decision has the predicted
  moment and fails unless every prediction holds
  (``PostgresStore.admit_run``, ``_predicted_statement``); then the
  admission is decided on read facts.  specs/protocol.md, "An admission
  decided on predicted facts".
- A composed transaction (a claim or a step, and the visits after it) keeps
  every decision's writes until its ``COMMIT``: its locking read brings the
  execution's evidence behind it, each view a next visit plans from is made
  from that and the decision (never read back), and the decisions go as
  one statement, the execution's two rows written once under the first
  decision's guard, checked by the database, each later guard checked here
  on the rows the one before wrote (``_chain_statements``).  Anything the
  transaction reads first is sent after them.  A failure there aborts the
  whole transaction, and the request is decided again with every write
  checked as it is made.  ``verify_views`` (tests) compares every made view
  with the database's read.
- A composed transaction that finishes its execution, for a worker that
  will claim next (``NextClaim``), carries that claim's ``BEGIN`` and
  locking read behind its ``COMMIT``, in the same exchange.  The
  connection is then kept for the worker's thread with the claim's
  transaction open (``_Parked``), and the thread's next claim decides on
  what that read locked.  Any other use of the store by that thread, a
  claim of another scope, ``drop_read_ahead`` and ``close`` roll it back
  first: it has written nothing, and holds its locks only until then.
- A step's transaction that finalizes its execution, for a worker that
  offers its next claim (``NextClaim.request``), makes that claim too: its
  locking read (``SKIP LOCKED``) and evidence read go in the step's first
  exchange, behind the step's own locking read, so the claim is decided
  on rows read before any write was kept, and each execution's kept
  writes go as a statement of its own with the one ``COMMIT``
  (``next_claimed_after``, ``_closed_chains``).  A claim's transaction
  offered the same makes it the same way, for each claim offered: its one
  locking read locks that many candidates more (``claim_sql``'s
  ``candidates``) and its evidence read brings every one's evidence; each
  after the first is the candidate of a claim after a finalize, and is only
  locked, never written, unless that claim is made.
- Authoritative time is the database's ``clock_timestamp()``, read once per
  transaction *after* the row locks are held, by the statement that takes
  them (its outer query reads the time from the row the lock returned):
  ``now()`` is the start of the transaction, and a transaction that waited
  for a lock would judge a lease by a moment before it got the lock, making
  an expired lease look live.  A worker's clock is never consulted.  (Tests
  may inject a clock.)
- Every query is scoped to one business when the store is opened with
  ``business_id``: rows of another business do not exist for it.
- Migrations are numbered, immutable and forward-only, applied by
  ``fencekeeper migrate`` (:func:`migrate`) under an advisory lock; opening
  a store checks the recorded version and refuses a missing or newer schema
  with a blocking, clearly worded error, as seed 001's deployment check does.
- Whatever makes work eligible sends ``NOTIFY "fencekeeper_eligible:<schema>"``
  in the same transaction, so idle workers (:meth:`PostgresStore.wait_for_work`)
  wake when it commits, not on their next poll.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import logging
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, ClassVar, LiteralString

import attrs
import psycopg
from psycopg import generators, pq
from psycopg import sql as pgsql
from psycopg.adapt import PyFormat, Transformer
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

from fencekeeper.kernel import definition as d
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import DispatchState, ExecutionState, OperationState

from . import codec
from .sql import DEFINITION_TYPE, EXECUTION_TYPE, Dialect, SqlBackend
from .store import (
    Backend,
    Clock,
    Evidence,
    ExecutionView,
    NextClaim,
    StoreError,
    TransactionalStore,
    VisitView,
    _Claim,
    _GuardFailed,
    _KeptWriteFailed,
    checked_again_if_lost,
    definition_object_id,
)

CHANNEL = "fencekeeper_eligible"
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_DISPATCH_STATES = ", ".join(f"'{s.value}'" for s in DispatchState)
_OPERATION_STATES = ", ".join(f"'{s.value}'" for s in OperationState)

MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (
        1,
        "initial",
        f"""
CREATE TABLE objects (
    seq          bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    object_id    text PRIMARY KEY,
    object_type  text NOT NULL,
    business_id  text NOT NULL,
    parent_id    text REFERENCES objects(object_id),
    revision     integer NOT NULL CHECK (revision >= 1),
    state        text,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL
);
CREATE INDEX objects_parent ON objects (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX objects_type_state ON objects (object_type, state);
CREATE INDEX objects_business ON objects (business_id, object_type);

CREATE TABLE object_revisions (
    object_id    text NOT NULL REFERENCES objects(object_id),
    revision     integer NOT NULL CHECK (revision >= 1),
    state        text,
    body         text NOT NULL,
    committed_at timestamptz NOT NULL,
    PRIMARY KEY (object_id, revision)
);

CREATE TABLE workflow_dispatch (
    workflow_execution_id text PRIMARY KEY REFERENCES objects(object_id),
    dispatch_state        text NOT NULL CHECK (dispatch_state IN ({_DISPATCH_STATES})),
    eligible_at           timestamptz NOT NULL,
    lease_token           text,
    leased_by             text,
    lease_expires_at      timestamptz,
    step_count            integer NOT NULL DEFAULT 0 CHECK (step_count BETWEEN 0 AND {p.STEP_LIMIT}),
    last_error_code       text,
    CHECK (
        (dispatch_state = 'claimed'
            AND lease_token IS NOT NULL AND leased_by IS NOT NULL AND lease_expires_at IS NOT NULL)
        OR (dispatch_state <> 'claimed'
            AND lease_token IS NULL AND leased_by IS NULL AND lease_expires_at IS NULL)
    )
);
-- Only eligible rows are in this index, so finding the next one costs the
-- same with ten rows waiting or a million.
CREATE INDEX workflow_dispatch_eligible ON workflow_dispatch (eligible_at, workflow_execution_id)
    WHERE dispatch_state = 'eligible';
CREATE INDEX workflow_dispatch_claimed ON workflow_dispatch (lease_expires_at)
    WHERE dispatch_state = 'claimed';

CREATE TABLE transitions (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    execution_id text NOT NULL REFERENCES objects(object_id),
    event        text,
    from_state   text,
    to_state     text NOT NULL,
    revision     integer NOT NULL,
    at           timestamptz NOT NULL,
    actor        text NOT NULL,
    lease_token  text,
    fence        integer NOT NULL,
    reason       text NOT NULL
);
CREATE INDEX transitions_execution ON transitions (execution_id, seq);

CREATE TABLE wait_registrations (
    seq          bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    execution_id text NOT NULL REFERENCES objects(object_id),
    node_id      text NOT NULL,
    attempt_id   text NOT NULL,
    business_id  text NOT NULL,
    spec         text NOT NULL,
    woken_by     text,
    wake_reason  text,
    PRIMARY KEY (execution_id, node_id, attempt_id)
);

CREATE TABLE events (
    event_id     text PRIMARY KEY,
    business_id  text NOT NULL,
    event_type   text NOT NULL,
    correlation  text NOT NULL,
    committed_at timestamptz NOT NULL
);
CREATE INDEX events_type ON events (business_id, event_type);

CREATE TABLE commands (
    seq          bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    command_id   text PRIMARY KEY,
    command_type text NOT NULL,
    business_id  text NOT NULL,
    execution_id text REFERENCES objects(object_id),
    body         text NOT NULL,
    recorded_at  timestamptz NOT NULL
);
CREATE INDEX commands_execution ON commands (execution_id);

CREATE FUNCTION fencekeeper_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME;
END $$;
CREATE TRIGGER object_revisions_append_only BEFORE UPDATE OR DELETE ON object_revisions
    FOR EACH ROW EXECUTE FUNCTION fencekeeper_append_only();
CREATE TRIGGER transitions_append_only BEFORE UPDATE OR DELETE ON transitions
    FOR EACH ROW EXECUTE FUNCTION fencekeeper_append_only();
CREATE TRIGGER commands_append_only BEFORE UPDATE OR DELETE ON commands
    FOR EACH ROW EXECUTE FUNCTION fencekeeper_append_only();
""",
    ),
    (
        2,
        "interpreter",
        """
ALTER TABLE wait_registrations ADD COLUMN event_type text;
ALTER TABLE wait_registrations ADD COLUMN wake_at timestamptz;
UPDATE wait_registrations SET event_type = spec::jsonb->>'event_type',
    wake_at = (spec::jsonb->>'wake_at')::timestamptz;
CREATE INDEX wait_registrations_event ON wait_registrations (business_id, event_type) WHERE woken_by IS NULL;
CREATE INDEX wait_registrations_due ON wait_registrations (wake_at) WHERE woken_by IS NULL AND wake_at IS NOT NULL;

ALTER TABLE events ADD COLUMN payload text NOT NULL DEFAULT '{}';
ALTER TABLE events ADD COLUMN seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE;
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION fencekeeper_append_only();

CREATE TABLE event_keys (
    business_id text NOT NULL,
    event_type  text NOT NULL,
    name        text NOT NULL,
    value       text NOT NULL,
    event_id    text NOT NULL REFERENCES events(event_id),
    PRIMARY KEY (business_id, event_type, name, value, event_id)
);
CREATE TRIGGER event_keys_append_only BEFORE UPDATE OR DELETE ON event_keys
    FOR EACH ROW EXECUTE FUNCTION fencekeeper_append_only();
""",
    ),
    (
        3,
        "hot_object_updates",
        # Every decision updates its execution's objects row (revision, state,
        # updated_at).  objects_type_state indexed the state, so each of those
        # updates wrote a new entry into every index of the table.  Without an
        # index on any column a decision changes, PostgreSQL updates the row
        # in place on its page (a HOT update) and touches no index at all;
        # the fillfactor leaves room on each page for those new versions.
        # Only executions are listed by state, and eligible and running ones
        # are found through workflow_dispatch's partial indexes; succeeded
        # ones, where nearly every execution ends, would be listed at the cost
        # of reading them all anyway.  The rest (waiting, failed, cancelled and
        # the review states) are found through the append-only revision rows
        # that entered them, which are written once and never updated: the
        # index costs nothing on the path from eligible to succeeded.
        """
DROP INDEX objects_type_state;
ALTER TABLE objects SET (fillfactor = 80);
CREATE INDEX object_revisions_listed ON object_revisions (state, object_id)
    WHERE state IN ('waiting', 'failed', 'cancelled', 'suspended', 'reconciliation_required');
""",
    ),
    (
        4,
        "revisions_carry_their_transition",
        # A decision that writes an execution revision wrote the same change a
        # second time as a transitions row, with two indexes and a foreign
        # key check on top.  The revision row now carries the transition that
        # made it (to_state is the revision's state and at its committed_at);
        # transitions keeps the ones that make no revision (renewals) and
        # every row written before this migration.  execution_transitions
        # shows both, one row per transition, in order per execution:
        # revision, then the revision's own before the rest, then seq.
        """
ALTER TABLE object_revisions
    ADD COLUMN event text,
    ADD COLUMN from_state text,
    ADD COLUMN actor text,
    ADD COLUMN lease_token text,
    ADD COLUMN fence integer,
    ADD COLUMN reason text;
CREATE VIEW execution_transitions AS
    SELECT object_id AS execution_id, event, from_state, state AS to_state, revision, committed_at AS at, actor,
        lease_token, fence, reason, 0 AS rank, NULL::bigint AS seq
    FROM object_revisions WHERE reason IS NOT NULL
    UNION ALL
    SELECT execution_id, event, from_state, to_state, revision, at, actor, lease_token, fence, reason, 1 AS rank, seq
    FROM transitions;
""",
    ),
    (
        5,
        "unread_object_indexes",
        # Every evidence object a decision commits is an objects row, and
        # each row was entered into four indexes.  Two of them no query
        # reads: objects_business (objects are found by id, by parent, or
        # through workflow_dispatch; a business is a condition on rows found
        # so, never a way in) and the unique index on seq (seq is an
        # identity column, GENERATED ALWAYS, whose values come from its
        # sequence and are distinct by construction; it orders an
        # execution's evidence, read through objects_parent and sorted).
        # Both are written on every insert at the right-hand edge, where
        # all workers' inserts meet on one page.
        """
DROP INDEX objects_business;
ALTER TABLE objects DROP CONSTRAINT objects_seq_key;
""",
    ),
    (
        6,
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
ALTER TABLE wait_registrations ADD COLUMN closed_by text;
UPDATE wait_registrations w
    SET closed_by = CASE WHEN o.state = 'cancelled' THEN 'cancel' ELSE 'left_waiting' END
    FROM objects o
    WHERE o.object_id = w.execution_id AND w.woken_by IS NULL AND NOT EXISTS (
        SELECT 1 FROM object_revisions r
        WHERE r.object_id = o.object_id AND r.revision = o.revision AND o.state = 'waiting'
            AND (r.body::jsonb->'wait'->>1) = w.node_id AND (r.body::jsonb->'wait'->>2) = w.attempt_id
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
        7,
        "execution_journal",
        # The execution journal (seed 002; specs/journal.md, Storage;
        # adapters/journal_postgres.py).  Headers and events are kept as their
        # canonical bytes, append-only; journal_heads is the compare-and-set
        # guard of every append, derived from the events and checked
        # against them whenever a journal is loaded.
        """
CREATE TABLE journal_headers (
    execution_id text PRIMARY KEY,
    header       bytea NOT NULL,
    digest       text NOT NULL,
    workflow     bytea NOT NULL,
    policy       bytea NOT NULL
);
CREATE TABLE journal_events (
    execution_id text NOT NULL REFERENCES journal_headers(execution_id),
    ordinal      integer NOT NULL CHECK (ordinal >= 1),
    digest       text NOT NULL,
    record       bytea NOT NULL,
    PRIMARY KEY (execution_id, ordinal)
);
CREATE TABLE journal_heads (
    execution_id text PRIMARY KEY REFERENCES journal_headers(execution_id),
    head         text NOT NULL,
    length       integer NOT NULL CHECK (length >= 0)
);
CREATE TRIGGER journal_headers_append_only BEFORE UPDATE OR DELETE ON journal_headers
    FOR EACH ROW EXECUTE FUNCTION fencekeeper_append_only();
CREATE TRIGGER journal_events_append_only BEFORE UPDATE OR DELETE ON journal_events
    FOR EACH ROW EXECUTE FUNCTION fencekeeper_append_only();
""",
    ),
    (
        8,
        "durable_operations",
        # Seed 001's durable operations, in tables of their own: nothing of
        # the executions' schema changes.  operations holds one row per
        # Operation (its current revision), locked FOR UPDATE by every
        # decision on it; operations_due covers exactly the rows a claim may
        # take (FOR UPDATE SKIP LOCKED); operation_identities the scoped
        # idempotency identities (submissions of one identity serialize on an
        # advisory lock of its key); operation_attempts one row per claim;
        # operation_transitions and operation_outbox are append-only.
        f"""
CREATE TABLE operations (
    operation_id        text PRIMARY KEY,
    namespace           text NOT NULL,
    tenant              text NOT NULL,
    principal           text NOT NULL,
    client_key          text NOT NULL,
    action_name         text NOT NULL,
    action_version      integer NOT NULL CHECK (action_version >= 1),
    effect_class        text NOT NULL CHECK (effect_class IN ('atomic', 'read_only', 'external')),
    input_digest        text NOT NULL,
    input               text NOT NULL,
    state               text NOT NULL CHECK (state IN ({_OPERATION_STATES})),
    revision            integer NOT NULL CHECK (revision >= 1),
    fence               integer NOT NULL CHECK (fence >= 0),
    attempt_count       integer NOT NULL CHECK (attempt_count >= 0),
    policy              text NOT NULL,
    admitted_at         timestamptz NOT NULL,
    deadline            timestamptz NOT NULL,
    retain_until        timestamptz NOT NULL,
    next_eligible_at    timestamptz NOT NULL,
    requires_approval   boolean NOT NULL,
    approval            text,
    owner               text,
    lease_expires_at    timestamptz,
    attempt_started_at  timestamptz,
    effect_id           text,
    outcome             text,
    error_code          text,
    result              text,
    cancel_requested_by text,
    due_at              timestamptz,
    CHECK ((state = 'running') = (owner IS NOT NULL AND lease_expires_at IS NOT NULL))
);
CREATE INDEX operations_due ON operations (tenant, due_at) WHERE due_at IS NOT NULL;
CREATE TABLE operation_identities (
    namespace    text NOT NULL,
    tenant       text NOT NULL,
    principal    text NOT NULL,
    client_key   text NOT NULL,
    operation_id text NOT NULL REFERENCES operations(operation_id),
    retain_until timestamptz NOT NULL,
    PRIMARY KEY (namespace, tenant, principal, client_key)
);
CREATE TABLE operation_attempts (
    operation_id text NOT NULL REFERENCES operations(operation_id),
    number       integer NOT NULL CHECK (number >= 1),
    worker_id    text NOT NULL,
    state        text NOT NULL,
    started_at   timestamptz NOT NULL,
    ended_at     timestamptz,
    error_code   text,
    PRIMARY KEY (operation_id, number)
);
CREATE TABLE operation_transitions (
    operation_id text NOT NULL REFERENCES operations(operation_id),
    revision     integer NOT NULL,
    event        text,
    from_state   text,
    to_state     text NOT NULL,
    at           timestamptz NOT NULL,
    actor        text NOT NULL,
    fence        integer NOT NULL,
    reason       text NOT NULL,
    PRIMARY KEY (operation_id, revision)
);
CREATE TABLE operation_outbox (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id   text NOT NULL UNIQUE,
    operation_id text NOT NULL REFERENCES operations(operation_id),
    topic        text NOT NULL,
    at           timestamptz NOT NULL
);
""",
    ),
    (
        9,
        "operations_tenant_rls",
        # Seed 001 (Required production profile): forced row-level security
        # keyed by tenant on every operation table, as defence in depth
        # beside the service's own tenant filter.  The tenant is the session
        # or transaction setting fencekeeper.tenant (the store sets it when
        # it is scoped to a tenant); unset, a role subject to these policies
        # sees and writes nothing.  FORCE binds the tables' owner too: only
        # a superuser or a BYPASSRLS role (the operator's, for migrations and
        # cross-tenant tools) reads every tenant.  The child tables carry no
        # tenant column; their policies ask the Operation's row, through a
        # VOLATILE function so that a row inserted earlier in the same
        # statement (the store writes an Operation and its first transition
        # in one statement) is visible to the check.  The function runs with
        # the caller's rights, so the Operation's own policy applies inside it,
        # and with the migration's search_path, so a caller's own search_path
        # cannot put another table named operations in front of this one.
        """
CREATE FUNCTION fencekeeper_operation_tenant(id text) RETURNS text
    LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET search_path FROM CURRENT
    AS $$ BEGIN RETURN (SELECT tenant FROM operations WHERE operation_id = id); END $$;
ALTER TABLE operations ENABLE ROW LEVEL SECURITY;
ALTER TABLE operations FORCE ROW LEVEL SECURITY;
CREATE POLICY operations_tenant ON operations
    USING (tenant = current_setting('fencekeeper.tenant', true))
    WITH CHECK (tenant = current_setting('fencekeeper.tenant', true));
ALTER TABLE operation_identities ENABLE ROW LEVEL SECURITY;
ALTER TABLE operation_identities FORCE ROW LEVEL SECURITY;
CREATE POLICY operation_identities_tenant ON operation_identities
    USING (tenant = current_setting('fencekeeper.tenant', true))
    WITH CHECK (tenant = current_setting('fencekeeper.tenant', true));
ALTER TABLE operation_attempts ENABLE ROW LEVEL SECURITY;
ALTER TABLE operation_attempts FORCE ROW LEVEL SECURITY;
CREATE POLICY operation_attempts_tenant ON operation_attempts
    USING (fencekeeper_operation_tenant(operation_id) = current_setting('fencekeeper.tenant', true))
    WITH CHECK (fencekeeper_operation_tenant(operation_id) = current_setting('fencekeeper.tenant', true));
ALTER TABLE operation_transitions ENABLE ROW LEVEL SECURITY;
ALTER TABLE operation_transitions FORCE ROW LEVEL SECURITY;
CREATE POLICY operation_transitions_tenant ON operation_transitions
    USING (fencekeeper_operation_tenant(operation_id) = current_setting('fencekeeper.tenant', true))
    WITH CHECK (fencekeeper_operation_tenant(operation_id) = current_setting('fencekeeper.tenant', true));
ALTER TABLE operation_outbox ENABLE ROW LEVEL SECURITY;
ALTER TABLE operation_outbox FORCE ROW LEVEL SECURITY;
CREATE POLICY operation_outbox_tenant ON operation_outbox
    USING (fencekeeper_operation_tenant(operation_id) = current_setting('fencekeeper.tenant', true))
    WITH CHECK (fencekeeper_operation_tenant(operation_id) = current_setting('fencekeeper.tenant', true));
""",
    ),
    (
        10,
        "outbox_and_pruning",
        # One outbox for both subsystems (docs/outbox.md): every transition
        # of an Operation or a workflow execution appends one row in its own
        # transaction; the exporter owns the
        # delivery columns (attempts .. exported_at), nothing may change what
        # a row says.  operation_outbox's rows move over unchanged in order.
        #
        # Pruning and the append-only guarantee: history tables refuse UPDATE
        # and refuse DELETE unless the deleting transaction set
        # fencekeeper.pruning to 'on' (SET LOCAL: it ends with the
        # transaction, and no other session sees it) AND the row belongs to
        # work that has ended (an outbox row: has been exported).  Windows are
        # the pruner's business; the triggers keep anything else, by mistake
        # or by a pruner's bug, from deleting live history.
        """
-- Under migration 9's forced row-level security, a table owner without
-- BYPASSRLS would see no Operation here and move nothing, silently; with
-- row_security off such a reading is an error instead, and nothing commits.
SET LOCAL row_security = off;
CREATE TABLE outbox (
    seq             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id      text NOT NULL UNIQUE,
    kind            text NOT NULL CHECK (kind IN ('operation', 'execution')),
    subject_id      text NOT NULL,
    tenant          text,
    topic           text NOT NULL,
    at              timestamptz NOT NULL,
    payload         text NOT NULL,
    attempts        integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz,
    claimed_by      text,
    claimed_until   timestamptz,
    last_error      text,
    parked_at       timestamptz,
    exported_at     timestamptz
);
CREATE INDEX outbox_pending ON outbox (seq) WHERE exported_at IS NULL;
CREATE INDEX outbox_subject_pending ON outbox (kind, subject_id, seq) WHERE exported_at IS NULL;
CREATE INDEX outbox_exported ON outbox (exported_at) WHERE exported_at IS NOT NULL;
INSERT INTO outbox (message_id, kind, subject_id, tenant, topic, at, payload)
    SELECT m.message_id, 'operation', m.operation_id, o.tenant, m.topic, m.at,
        json_build_object('kind', 'operation', 'operation_id', m.operation_id, 'topic', m.topic,
            'at', to_char(m.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
            'tenant', o.tenant, 'namespace', o.namespace)::text
    FROM operation_outbox m JOIN operations o ON o.operation_id = m.operation_id ORDER BY m.seq;
DROP TABLE operation_outbox;
CREATE FUNCTION fencekeeper_outbox_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.seq, NEW.message_id, NEW.kind, NEW.subject_id, NEW.tenant, NEW.topic, NEW.at, NEW.payload)
        IS DISTINCT FROM (OLD.seq, OLD.message_id, OLD.kind, OLD.subject_id, OLD.tenant, OLD.topic, OLD.at,
            OLD.payload) THEN
        RAISE EXCEPTION 'an outbox message never changes; only its delivery columns do'
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER outbox_message_fixed BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION fencekeeper_outbox_fixed();

ALTER TABLE operations ADD COLUMN ended_at timestamptz;
ALTER TABLE operations ADD COLUMN result_expired_at timestamptz;
UPDATE operations SET ended_at = (SELECT max(t.at) FROM operation_transitions t
    WHERE t.operation_id = operations.operation_id) WHERE outcome IS NOT NULL;
CREATE INDEX operations_ended ON operations (ended_at) WHERE outcome IS NOT NULL;
CREATE FUNCTION fencekeeper_operation_stays_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.outcome IS NOT NULL AND (NEW.outcome, NEW.state, NEW.revision, NEW.ended_at)
        IS DISTINCT FROM (OLD.outcome, OLD.state, OLD.revision, OLD.ended_at) THEN
        RAISE EXCEPTION 'an ended operation never changes; pruning may only expire its result'
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER operations_stay_ended BEFORE UPDATE ON operations
    FOR EACH ROW EXECUTE FUNCTION fencekeeper_operation_stays_ended();
CREATE TRIGGER operation_transitions_append_only BEFORE UPDATE ON operation_transitions
    FOR EACH ROW EXECUTE FUNCTION fencekeeper_append_only();

CREATE FUNCTION fencekeeper_prunable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('fencekeeper.pruning', true), '') <> 'on' THEN
        RAISE EXCEPTION '% rows are deleted only by pruning', TG_TABLE_NAME USING ERRCODE = 'restrict_violation';
    END IF;
    IF TG_TABLE_NAME = 'outbox' THEN
        IF OLD.exported_at IS NULL THEN
            RAISE EXCEPTION 'an outbox row is pruned only once exported' USING ERRCODE = 'restrict_violation';
        END IF;
    ELSIF TG_TABLE_NAME = 'operations' THEN
        IF OLD.outcome IS NULL THEN
            RAISE EXCEPTION 'an operation is pruned only once ended' USING ERRCODE = 'restrict_violation';
        END IF;
    ELSIF NOT EXISTS (SELECT 1 FROM operations o WHERE o.operation_id = OLD.operation_id
            AND o.outcome IS NOT NULL) THEN
        RAISE EXCEPTION '% rows are pruned only for ended operations', TG_TABLE_NAME
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN OLD;
END $$;
CREATE TRIGGER outbox_prunable BEFORE DELETE ON outbox FOR EACH ROW EXECUTE FUNCTION fencekeeper_prunable();
CREATE TRIGGER operations_prunable BEFORE DELETE ON operations FOR EACH ROW EXECUTE FUNCTION fencekeeper_prunable();
CREATE TRIGGER operation_identities_prunable BEFORE DELETE ON operation_identities
    FOR EACH ROW EXECUTE FUNCTION fencekeeper_prunable();
CREATE TRIGGER operation_attempts_prunable BEFORE DELETE ON operation_attempts
    FOR EACH ROW EXECUTE FUNCTION fencekeeper_prunable();
CREATE TRIGGER operation_transitions_prunable BEFORE DELETE ON operation_transitions
    FOR EACH ROW EXECUTE FUNCTION fencekeeper_prunable();

-- The tenant boundary of migration 9, carried over to the new table: an
-- Operation's rows are its tenant's; a workflow execution's carry no tenant
-- (the execution tables have no tenant policies), so they stay writable by
-- every role that may write executions.
ALTER TABLE outbox ENABLE ROW LEVEL SECURITY;
ALTER TABLE outbox FORCE ROW LEVEL SECURITY;
CREATE POLICY outbox_tenant ON outbox
    USING (kind = 'execution' OR tenant = current_setting('fencekeeper.tenant', true))
    WITH CHECK (kind = 'execution' OR tenant = current_setting('fencekeeper.tenant', true));
""",
    ),
    (
        11,
        "guard_aborts_transaction",
        # An operation decision's write is one statement, every part of it
        # conditional on the Operation's own guarded write (operations/postgres.py).
        # Its COMMIT travels in the same exchange, so a guard that did not hold
        # cannot be reported back before the commit: the statement ends by
        # passing the guard to this function, which raises when it did not
        # hold.  The statement then fails, the transaction is aborted on the
        # server, its COMMIT becomes a rollback, and the store sees the error's
        # code (class ZG is not one PostgreSQL defines) as the guard failing:
        # nothing written, the decision made again.
        """
CREATE FUNCTION fencekeeper_guard_held(held boolean) RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY INVOKER
    AS $$
BEGIN
    IF held IS NOT TRUE THEN
        RAISE EXCEPTION 'the decision''s guard did not hold; nothing of it is written' USING ERRCODE = 'ZG001';
    END IF;
    RETURN true;
END $$;
""",
    ),
    (
        12,
        "execution_pruning",
        # As SQLite's migration 9: an execution that has ended (succeeded,
        # failed, cancelled: states it never leaves) may have its rows
        # deleted by pruning, under the same explicit mode as migration 10's
        # (fencekeeper.pruning set for the transaction).  Every table of an
        # execution refuses DELETE otherwise, and refuses it for any row not
        # of an ended execution: its objects row, revisions, dispatch row,
        # transitions, wait registrations and commands, and its evidence
        # objects (parent_id) with their revisions.  The append-only function
        # of migration 1 lets the DELETE of those three history tables through
        # to this check; UPDATE stays refused, and events and event_keys
        # (a Business's, not one execution's) are never deleted.
        """
CREATE OR REPLACE FUNCTION fencekeeper_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND TG_TABLE_NAME IN ('object_revisions', 'transitions', 'commands') THEN
        RETURN OLD;  -- fencekeeper_execution_prunable decides
    END IF;
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME;
END $$;
CREATE FUNCTION fencekeeper_execution_ended(execution text) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM objects e WHERE e.object_id = execution AND e.object_type = 'WorkflowExecution'
        AND e.state IN ('succeeded', 'failed', 'cancelled'))
$$;
CREATE FUNCTION fencekeeper_execution_prunable() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    owner text;
BEGIN
    IF coalesce(current_setting('fencekeeper.pruning', true), '') <> 'on' THEN
        RAISE EXCEPTION '% rows are deleted only by pruning', TG_TABLE_NAME USING ERRCODE = 'restrict_violation';
    END IF;
    IF TG_TABLE_NAME = 'objects' THEN
        IF (OLD.object_type = 'WorkflowExecution' AND OLD.state IN ('succeeded', 'failed', 'cancelled'))
            OR fencekeeper_execution_ended(OLD.parent_id) THEN
            RETURN OLD;
        END IF;
    ELSIF TG_TABLE_NAME = 'object_revisions' THEN
        SELECT coalesce(x.parent_id, x.object_id) INTO owner FROM objects x WHERE x.object_id = OLD.object_id;
        IF fencekeeper_execution_ended(owner) THEN
            RETURN OLD;
        END IF;
    ELSIF TG_TABLE_NAME = 'workflow_dispatch' THEN
        IF fencekeeper_execution_ended(OLD.workflow_execution_id) THEN
            RETURN OLD;
        END IF;
    ELSIF fencekeeper_execution_ended(OLD.execution_id) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% rows are pruned only for ended executions', TG_TABLE_NAME USING ERRCODE = 'restrict_violation';
END $$;
CREATE TRIGGER objects_prunable BEFORE DELETE ON objects FOR EACH ROW EXECUTE FUNCTION fencekeeper_execution_prunable();
CREATE TRIGGER object_revisions_prunable BEFORE DELETE ON object_revisions
    FOR EACH ROW EXECUTE FUNCTION fencekeeper_execution_prunable();
CREATE TRIGGER workflow_dispatch_prunable BEFORE DELETE ON workflow_dispatch
    FOR EACH ROW EXECUTE FUNCTION fencekeeper_execution_prunable();
CREATE TRIGGER transitions_prunable BEFORE DELETE ON transitions
    FOR EACH ROW EXECUTE FUNCTION fencekeeper_execution_prunable();
CREATE TRIGGER wait_registrations_prunable BEFORE DELETE ON wait_registrations
    FOR EACH ROW EXECUTE FUNCTION fencekeeper_execution_prunable();
CREATE TRIGGER commands_prunable BEFORE DELETE ON commands
    FOR EACH ROW EXECUTE FUNCTION fencekeeper_execution_prunable();
""",
    ),
    (
        13,
        "external_effect_settlement",
        # As SQLite's migration 10: the fence of the Attempt whose intent
        # began an external effect's unanswered issues, NULL when none is
        # (seed 001, Tasks, external effects, history, and retention;
        # specs/operations.md, Effect classes).  An intent recorded before
        # this column existed becomes 0, which no Attempt's answer settles:
        # such an Operation is reconciled before any repeat, as it was.
        """
-- As in migration 10: under forced row-level security an owner without
-- BYPASSRLS would update no row, silently; with row_security off that is an
-- error instead, and nothing commits.
SET LOCAL row_security = off;
ALTER TABLE operations ADD COLUMN effect_unsettled_since integer CHECK (effect_unsettled_since >= 0);
UPDATE operations SET effect_unsettled_since = 0
    WHERE effect_id IS NOT NULL AND (outcome IS NULL OR outcome <> 'succeeded');
""",
    ),
    (
        14,
        "journal_heads_move_forward",
        # As SQLite's migrations 6 and 11: the head row is the
        # compare-and-set guard of every append (seed 002, Typical developer
        # flow 5; specs/journal.md, Storage), and migration 7 left it open to
        # DELETE, and to an UPDATE that moves it back to a head a stale
        # writer still expects.  DELETE is refused; an UPDATE must keep the
        # execution and raise the event count, as an append's does.  Whether
        # the new head is the chain's is checked against the events on every
        # load (broken_chain).  Retention never deletes a journal.
        """
CREATE FUNCTION fencekeeper_journal_head_forward() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'journal_heads rows are never deleted' USING ERRCODE = 'restrict_violation';
    END IF;
    IF NEW.execution_id IS DISTINCT FROM OLD.execution_id OR NEW.length IS NULL OR NEW.length <= OLD.length THEN
        RAISE EXCEPTION 'journal_heads moves only forward: an append raises its event count'
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER journal_heads_move_forward BEFORE UPDATE OR DELETE ON journal_heads
    FOR EACH ROW EXECUTE FUNCTION fencekeeper_journal_head_forward();
""",
    ),
    (
        15,
        "stable_principal_identities",
        # As SQLite's migration 12: the idempotency identity is keyed by the
        # principal's stable reference (seed 001, Scoped idempotency;
        # specs/operations.md, "Scoped idempotency"), so
        # operation_identities.principal becomes resolver:v*:subject and a
        # retry after the resolver moved to a new version finds the
        # Operation its first submission admitted; operations.principal
        # keeps the full reference, the provenance the worker resolves.
        # Submissions of one key serialize on one advisory lock
        # (operations/postgres.py), which now leaves the version out too.
        #
        # Rows written before could name one principal under two versions
        # of its resolver with one client key: two Operations, one key.  The
        # key goes to one of them: an Operation not yet ended first (it
        # keeps its identity while it can run, as submit's rule says), then
        # the first admitted, then the lower id.  The other rows keep their
        # full reference, which no lookup asks for any more: their
        # Operations stay, reachable by id as every Operation is, and
        # retention prunes those rows once their window has passed, as any
        # other.  Nothing is deleted, so fencekeeper_prunable (a DELETE
        # trigger) is not met, and no key collides: a stable form holds '*',
        # which no reference does, and a key already in the stable form is
        # kept, so running this again (a schema whose record of it was lost)
        # changes nothing.
        """
-- As in migration 10: under forced row-level security an owner without
-- BYPASSRLS would update no row, silently; with row_security off that is an
-- error instead, and nothing commits.
SET LOCAL row_security = off;
WITH versioned AS (
    SELECT i.namespace, i.tenant, i.principal, i.client_key,
        regexp_replace(i.principal, '^([^:]*):v[0-9]+:(.+)$', '\\1:v*:\\2') AS stable,
        o.outcome, o.admitted_at, o.operation_id
    FROM operation_identities i JOIN operations o ON o.operation_id = i.operation_id
    WHERE i.principal ~ '^[^:]*:v[0-9]+:.+$'
), ranked AS (
    SELECT *, row_number() OVER (PARTITION BY namespace, tenant, stable, client_key
        ORDER BY outcome IS NULL DESC, admitted_at, operation_id) AS rank
    FROM versioned v WHERE NOT EXISTS (SELECT 1 FROM operation_identities x WHERE x.namespace = v.namespace
        AND x.tenant = v.tenant AND x.principal = v.stable AND x.client_key = v.client_key)
)
UPDATE operation_identities i SET principal = k.stable FROM ranked k
WHERE k.rank = 1 AND i.namespace = k.namespace AND i.tenant = k.tenant AND i.principal = k.principal
    AND i.client_key = k.client_key;
""",
    ),
    (
        16,
        "attempt_claim_tokens",
        # As SQLite's migration 13: each claim's Attempt keeps the token its worker made for it
        # (seed 001, Durable truth and recovery; specs/operations.md, "An
        # owner write of unknown outcome"): a worker whose claim lost its
        # answer finds the Attempt by that token, never by its worker id
        # alone, which another process may share.  Attempts written before
        # have none, and no lookup by token finds them.  IF NOT EXISTS: a
        # schema whose record of it was lost runs it again, changing nothing.
        """
ALTER TABLE operation_attempts ADD COLUMN IF NOT EXISTS claim_token text;
""",
    ),
)
"""Numbered, immutable, forward-only.  Never edit one: add the next."""

GUARD_FAILED = "ZG001"
"""The SQLSTATE migration 11's ``fencekeeper_guard_held`` raises when a decision's guard did not hold."""


def _checksum(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _aware(value: Any) -> datetime:
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise StoreError("schema_altered", f"a timestamp column returned {value!r}, not an aware datetime")
    return value.astimezone(UTC)


def check_schema_name(schema: str) -> str:
    """``schema`` if it is a name this store accepts; StoreError ``store_unavailable`` otherwise."""
    return _check_schema_name(schema)


def _check_schema_name(schema: str) -> str:
    if not _SCHEMA_NAME.fullmatch(schema):
        raise StoreError("store_unavailable", f"schema name {schema!r} must match {_SCHEMA_NAME.pattern}")
    return schema


POSTGRES = Dialect(
    name="postgresql",
    placeholder="%s",
    same="IS NOT DISTINCT FROM",
    seq="seq",
    encode_time=lambda moment: moment,
    decode_time=_aware,
    # A foreign key fails only for a revision of an object nobody made (SQLStore._missing_revision).
    integrity_errors=(psycopg.errors.UniqueViolation, psycopg.errors.ForeignKeyViolation),
    wait_item="(({body})::jsonb->'wait'->>{index})",
    # A body that is no JSON, or holds an escape jsonb cannot keep (\u0000), fails the cast.
    unreadable_json=(psycopg.errors.InvalidTextRepresentation, psycopg.errors.UntranslatableCharacter),
)


@functools.lru_cache(maxsize=1024)
def _numbered(sql: str) -> bytes:
    """``sql`` with PostgreSQL's own ``$1, $2, ...`` for the store's ``%s`` placeholders."""
    pieces = sql.split("%s")
    if any("%" in piece for piece in pieces):
        # The store's SQL holds no other "%"; one would need psycopg's own quoting rules.
        raise ValueError(f"a '%' that is not a placeholder in {sql!r}")
    return ("".join(f"{piece}${n}" for n, piece in enumerate(pieces[:-1], 1)) + pieces[-1]).encode()


class _Rows:
    """A statement's result, read the way the shared SQL reads a cursor."""

    __slots__ = ("rowcount", "rows")

    def __init__(self, rows: list[tuple[Any, ...]], rowcount: int) -> None:
        self.rows = rows
        self.rowcount = rowcount

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.rows)


PREPARED_MAX = 256
"""Statements prepared per connection; beyond them a statement is sent unprepared (a decision's shape repeats)."""
_NAMES = itertools.count()
_OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
_BINARY = pq.Format.BINARY


class _Session:
    """What the store keeps for one connection: the statements it prepared there, one Transformer, how to wait.

    A synchronous connection waits on its socket in this thread; an asyncio
    one (postgres_async) hands the same wait to the event loop through
    :func:`~fencekeeper.adapters.bridge.await_only`.  Either way the bytes
    sent and the results read are the same, built by psycopg's generators.
    """

    __slots__ = ("bridged", "lock", "names", "transformer")

    def __init__(self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
        # By text and parameter types: psycopg dumps an int as the smallest
        # integer type that holds it, and a None as unknown, so one text may
        # be prepared more than once.
        self.names: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        self.transformer = Transformer(conn)
        # Which wait to use, not a bound ``conn.wait``: the session must not
        # hold its connection (it is the value of a weak-keyed map keyed by
        # it), and the wait is looked up at each call, as psycopg's own is.
        self.bridged = isinstance(conn, psycopg.AsyncConnection)
        self.lock: contextlib.AbstractContextManager[Any]
        if isinstance(conn, psycopg.AsyncConnection):
            # A fresh entry per use: the asyncio lock is entered as the thread lock is.
            self.lock = _AsyncLock(conn.lock)
        else:
            self.lock = conn.lock

    def wait(self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], gen: Any) -> Any:
        """Run psycopg generator ``gen`` on ``conn``: in this thread, or on the event loop through the bridge."""
        if self.bridged:
            from . import bridge  # noqa: PLC0415 - greenlet loads for the asyncio store only, not for every worker

            return bridge.await_only(conn.wait(gen))
        return conn.wait(gen)


_LOGGER = logging.getLogger("psycopg")
"""Where psycopg's own connection context warns of a failed rollback (_Checkout warns there too)."""


class _Checkout:
    """A connection of a pool for a ``with`` block, as ``ConnectionPool.connection()`` gives it, for less.

    What that context does: the connection's own context (psycopg's) commits
    on a normal exit and rolls back on an exception, warning rather than
    hiding the exception if the rollback fails; then the connection goes back
    to the pool, which discards it when it is broken.  What it costs less: a
    class instead of two generator contexts, no pool usage statistic
    (``usage_ms``, which nothing here reads), and no ``commit()`` on a
    connection with no transaction open (psycopg's does nothing then either,
    after taking the connection's lock and running a generator): some 20,000
    instructions of every decision's transaction.
    """

    __slots__ = ("_conn", "_given", "_kept", "_pool")

    def __init__(self, pool: ConnectionPool[Any], conn: psycopg.Connection[Any] | None = None) -> None:
        self._pool = pool
        self._conn: psycopg.Connection[Any] | None = None
        # A connection already out of the pool (a claim read ahead, _Parked): it goes back at the exit.
        self._given = conn
        self._kept = False

    def __enter__(self) -> psycopg.Connection[Any]:
        self._conn = self._given if self._given is not None else self._pool.getconn()
        return self._conn

    def keep(self) -> None:
        """On a normal exit, leave the connection out of the pool, its transaction open (a claim read ahead)."""
        self._kept = True

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        conn, self._conn = self._conn, None
        assert conn is not None
        if self._kept and exc_type is None:
            return
        if exc_type is not None:
            _give_back(self._pool, conn)
            return
        try:
            if not conn.closed and conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
                conn.commit()
        finally:
            self._pool.putconn(conn)


def _give_back(pool: ConnectionPool[Any], conn: psycopg.Connection[Any]) -> None:
    """Return ``conn`` to ``pool`` with its transaction rolled back, warning rather than raising if that fails.

    The pool discards a connection that is closed or broken.
    """
    try:
        if not conn.closed:
            conn.rollback()
    except Exception as failed:
        _LOGGER.warning("error ignored in rollback on %s: %s", conn, failed)
    finally:
        pool.putconn(conn)


class _AsyncLock:
    """An asyncio lock taken and released from bridged synchronous code."""

    __slots__ = ("_lock",)

    def __init__(self, lock: Any) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        from . import bridge  # noqa: PLC0415 - as in the wait above: asyncio connections only

        bridge.await_only(self._lock.acquire())

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()


# Keyed by the connection object: a connection the pool replaces takes its
# prepared statements with it, and its entry goes when it is collected.
_SESSIONS: weakref.WeakKeyDictionary[Any, _Session] = weakref.WeakKeyDictionary()


def _run(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    sql: str,
    params: Sequence[object],
    *,
    begin: bool = False,
    commit: bool = False,
    then: bytes | None = None,
    preface: bytes | None = None,
) -> _Rows:
    """Run one statement of the store: prepared on its first run on ``conn``, then executed by name.

    With ``begin``, a ``BEGIN`` goes ahead of it in the same exchange (libpq's
    pipeline mode): the transaction's first statement costs no round trip of
    its own for opening it.  The caller then ends the transaction.

    With ``commit``, a ``COMMIT`` follows it in the same exchange and the
    same pipeline segment, before the one sync (as :func:`_run_kept`'s): it
    runs only if the statement succeeded.  A failed statement's error is
    raised with the ``COMMIT`` skipped and the transaction left aborted, for
    the caller's connection context to roll back: one more exchange on the
    rare failure, one flush and one reply less on every success.  The
    statement must be the transaction's last.  ``then``, with ``commit``, is one more statement
    without parameters (a ``NOTIFY``) sent between the two, in the
    statement's part of the exchange: it runs only if the statement
    succeeded, and commits with it or not at all.  ``preface`` is one
    statement without parameters sent ahead of it (after ``BEGIN``), in the
    same exchange: a ``SET LOCAL`` for the statement's planning.

    This is what a psycopg cursor does, less what the store does not need:
    ``conn.execute`` spends about 35 us of Python on every statement (a new
    cursor with its own Transformer, query conversion, prepare bookkeeping),
    and this path about 4 us (psycopg's own adapters dump the parameters and
    load the binary rows; libpq sends and receives).  At 8 workers that is
    about a tenth of the machine's CPU per execution (bench/README.md).
    Errors are psycopg's own exceptions, as a cursor raises them, but for
    a statement something else deallocated (``store_unavailable``).
    """
    session = _SESSIONS.get(conn)
    if session is None:
        session = _SESSIONS[conn] = _Session(conn)
    tx = session.transformer
    values = tx.dump_sequence(params, [PyFormat.AUTO] * len(params))
    types = tx.types or ()
    query = _numbered(sql)
    pgconn = conn.pgconn
    with session.lock:
        name = _prepared(conn, session, query, types)
        pipelined = begin or commit or preface is not None
        if pipelined:
            pgconn.enter_pipeline_mode()
        if begin:
            pgconn.send_query_params(b"BEGIN", None)
        if preface is not None:
            pgconn.send_query_params(preface, None)
        if name is None:
            pgconn.send_query_params(query, values, param_types=types, param_formats=tx.formats, result_format=_BINARY)
        else:
            pgconn.send_query_prepared(name, values, param_formats=tx.formats, result_format=_BINARY)
        if pipelined:
            assert then is None or commit, "a statement sent after this one needs the COMMIT behind it"
            if then is not None:
                pgconn.send_query_params(then, None)
            results = _pipelined(
                conn, session, begin=begin, commit=commit, then=then is not None, prefaced=preface is not None
            )
            result = _result(conn, session, results)
        else:
            result = _result(conn, session, session.wait(conn, generators.execute(pgconn)))
    tx.set_pgresult(result)
    rows = tx.load_rows(0, result.ntuples, tuple)
    count = result.command_tuples
    return _Rows(rows, -1 if count is None else count)


def _prepared(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    session: _Session,
    query: bytes,
    types: Sequence[int],
) -> bytes | None:
    """The name ``query`` is prepared under on ``conn`` (preparing it now, the first time); None past PREPARED_MAX.

    Called holding ``session.lock``, outside pipeline mode.
    """
    key = (query, tuple(types))
    name = session.names.get(key)
    if name is None and len(session.names) < PREPARED_MAX:
        # A name is never reused: a statement whose preparing was cut
        # short may still exist on the server.
        name = f"fencekeeper_{next(_NAMES)}".encode()
        conn.pgconn.send_prepare(name, query, param_types=types)
        _result(conn, session, session.wait(conn, generators.execute(conn.pgconn)))
        session.names[key] = name
    return name


_Send = tuple[bytes, bytes | None, Sequence[Any], Sequence[int], Sequence[pq.Format] | None]
"""A statement ready to send: its text, its prepared name (None: past PREPARED_MAX), values, types, formats."""


def _prepared_all(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    session: _Session,
    statements: Sequence[tuple[str, Sequence[object]]],
) -> list[_Send]:
    """Dump each statement's parameters and prepare it if it is new: before pipeline mode, holding the lock."""
    tx = session.transformer
    sends: list[_Send] = []
    for sql, params in statements:
        values = tx.dump_sequence(params, [PyFormat.AUTO] * len(params))
        types, formats = tx.types or (), tx.formats
        query = _numbered(sql)
        sends.append((query, _prepared(conn, session, query, types), values, types, formats))
    return sends


def _send_all(pgconn: pq.abc.PGconn, sends: Sequence[_Send]) -> None:
    """Send each statement, by name where it is prepared, asking for binary rows (in pipeline mode)."""
    for query, name, values, types, formats in sends:
        if name is None:
            pgconn.send_query_params(query, values, param_types=types, param_formats=formats, result_format=_BINARY)
        else:
            pgconn.send_query_prepared(name, values, param_formats=formats, result_format=_BINARY)


def _run_pair(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    first: tuple[str, Sequence[object]],
    second: tuple[str, Sequence[object]],
    *,
    begin: bool = False,
    preface: bytes | None = None,
) -> tuple[_Rows, _Rows]:
    """Run two statements of the store in one exchange (:func:`_run_many`): a write and the read of what it leaves, say."""
    one, two = _run_many(conn, (first, second), begin=begin, preface=preface)
    return one, two


def _run_many(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    statements: Sequence[tuple[str, Sequence[object]]],
    *,
    begin: bool = False,
    preface: bytes | None = None,
) -> list[_Rows]:
    """Run statements of the store in one exchange (pipeline mode, one sync), as :func:`_run` runs one.

    Each runs only if every one before it succeeded (a failed statement
    aborts the rest of its pipeline); the first error is raised as ``_run``
    raises it, and the transaction is left for its caller to end.  With
    ``begin``, a ``BEGIN`` goes ahead of them, and ``preface`` (as ``_run``'s)
    after it.  Statements that need nothing from each other's rows cost one
    round trip this way instead of one each.
    """
    session = _SESSIONS.get(conn)
    if session is None:
        session = _SESSIONS[conn] = _Session(conn)
    tx = session.transformer
    pgconn = conn.pgconn
    with session.lock:
        sends = _prepared_all(conn, session, statements)
        pgconn.enter_pipeline_mode()
        try:
            if begin:
                pgconn.send_query_params(b"BEGIN", None)
            if preface is not None:
                pgconn.send_query_params(preface, None)
            _send_all(pgconn, sends)
            pgconn.pipeline_sync()
            began, prefaced, answers, synced = session.wait(
                conn, _many_results(pgconn, len(sends), begin, preface is not None)
            )
            if not _only_sync(synced):
                raise psycopg.OperationalError(f"the server ended the session during a pipelined exchange: {synced}")
            pgconn.exit_pipeline_mode()
        except BaseException:
            # Cut short: the connection's state is unknown, so it is closed and the pool replaces it.
            conn.pgconn.finish()
            raise
        for opened in (began, prefaced):
            if opened is not None:
                _result(conn, session, opened)
        rows = []
        for results in answers:
            # In order: the first error is raised before a statement it skipped is looked at.
            result = _result(conn, session, results)
            tx.set_pgresult(result)
            count = result.command_tuples
            rows.append(_Rows(tx.load_rows(0, result.ntuples, tuple), -1 if count is None else count))
    return rows


def _run_kept(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    statements: Sequence[tuple[str, Sequence[object]]],
    *,
    commit: bool = False,
    then: bytes | None = None,
    ahead: _Ahead | None = None,
    begin: bool = False,
    rows: list[_Rows] | None = None,
) -> tuple[_Rows, _Rows] | None:
    """Send writes kept by the transaction (``_Kept``), in order, in one exchange; raise the first one's error.

    A failed statement aborts the transaction and the rest are skipped, so
    none of them is written.  With ``commit``, a ``COMMIT`` follows them in
    the same pipeline segment, before the one sync: it runs only if every
    statement succeeded, and the transaction commits every statement.  One
    having failed, the ``COMMIT`` is skipped too and the transaction is left
    aborted; the error raised here ends it, and the caller's connection
    context rolls it back (``_Checkout``; the asyncio store's transaction
    block).  That costs the rare failure one more exchange, where a
    ``COMMIT`` after a sync of its own (as :func:`_run`'s) would cost every
    success a second flush of the client's buffer (libpq's
    ``PQpipelineSync`` sends at once) and a second reply to wait for (the
    server flushes at every sync): one ``send``, one ``poll`` and one
    ``recv`` more per transaction.  ``then`` (a ``NOTIFY``) goes behind
    the last statement and runs only if all of them succeeded.  Without
    ``commit`` the transaction goes on, open, after them.

    ``ahead``, with ``commit``: the next claim's locking read and the read
    of its evidence, sent behind the ``COMMIT`` in the same segment, after a
    ``BEGIN`` (and the claim's ``preface``): the next transaction's first
    exchange rides on this one's last.  Skipped, as the ``COMMIT`` is, after
    a failure.  Returns their rows when they ran; when the read itself
    failed, None, with that new transaction left for the caller to end.

    ``begin``: a ``BEGIN`` goes ahead of the statements, in the same segment
    (a transaction that is this one exchange: an admission decided on
    predicted facts, ``_predicted_statement``).  ``rows``, when given, gets
    each statement's rows, in order.
    """
    session = _SESSIONS.get(conn)
    if session is None:
        session = _SESSIONS[conn] = _Session(conn)
    pgconn = conn.pgconn
    assert ahead is None or commit, "a claim read ahead opens the transaction after this one's COMMIT"
    with session.lock:
        sends = _prepared_all(conn, session, statements)
        reads = _prepared_all(conn, session, ahead.statements) if ahead is not None else []
        pgconn.enter_pipeline_mode()
        try:
            if begin:
                pgconn.send_query_params(b"BEGIN", None)
            _send_all(pgconn, sends)
            if then is not None:
                pgconn.send_query_params(then, None)
            if commit:
                # In the statements' segment: skipped, as they are, after a failure (see above).
                pgconn.send_query_params(b"COMMIT", None)
            if ahead is not None:
                pgconn.send_query_params(b"BEGIN", None)
                if ahead.preface is not None:
                    pgconn.send_query_params(ahead.preface, None)
                _send_all(pgconn, reads)
            pgconn.pipeline_sync()
            began, answers, followed, committed, synced = session.wait(
                conn, _kept_results(pgconn, len(sends), commit, then is not None, _ahead_count(ahead), begin=begin)
            )
            if not _only_sync(synced):
                raise psycopg.OperationalError(f"the server ended the session during a pipelined exchange: {synced}")
            pgconn.exit_pipeline_mode()
        except BaseException:
            # Cut short: the connection's state is unknown, so it is closed and the pool replaces it.
            conn.pgconn.finish()
            raise
        if began is not None:
            _result(conn, session, began)
        for results in answers:
            # In order: the first failure is raised; the statements after it were skipped.
            result = _result(conn, session, results)
            if rows is not None:
                session.transformer.set_pgresult(result)
                count = result.command_tuples
                rows.append(_Rows(session.transformer.load_rows(0, result.ntuples, tuple), -1 if count is None else count))
        if followed is not None:
            _result(conn, session, followed)
        if committed is not None:
            ended = _result(conn, session, committed[0])
            if ended.command_status != b"COMMIT":
                raise StoreError("store_unavailable", f"the transaction was rolled back at COMMIT ({ended.command_status!r})")
        if ahead is None:
            return None
        # Committed: the read ahead is the next transaction's, and its failure is not this one's.
        try:
            for opened in committed[1 : -len(reads)]:
                _result(conn, session, opened)
            found = []
            for results in committed[-len(reads) :]:
                result = _result(conn, session, results)
                session.transformer.set_pgresult(result)
                count = result.command_tuples
                found.append(_Rows(session.transformer.load_rows(0, result.ntuples, tuple), -1 if count is None else count))
        except psycopg.Error:
            return None
        return found[0], found[1]


@attrs.frozen
class _Parked:
    """A claim read ahead on a connection kept out of the pool, its transaction open, until its worker claims.

    What it read holds the row locks of the execution it found (none is kept
    when it found none: nothing would be held, and what it saw would be old
    by the time the worker claims).
    """

    conn: Any
    claim: NextClaim
    statement: tuple[str, Sequence[object]]
    rows: _Rows
    evidence: _Rows
    at: float
    """When it was read (the process clock): one kept too long is not used (``_claim_transaction``)."""
    candidates: int = 1
    """How many candidates it locked at most (:func:`claim_sql`): those after the first are the claims after finalizes'."""


@attrs.frozen
class _Ahead:
    """A claim read ahead (``_run_kept``'s ``ahead``): its locking read and evidence read, and what it plans with."""

    statements: tuple[tuple[str, Sequence[object]], tuple[str, Sequence[object]]]
    preface: bytes | None
    candidates: int = 1


def _ahead_count(ahead: _Ahead | None) -> int:
    """How many results a read ahead brings: its BEGIN, its preface, its two reads."""
    return 0 if ahead is None else 3 + (ahead.preface is not None)


def _kept_results(pgconn: pq.abc.PGconn, count: int, commit: bool, then: bool, after: int = 0, *, begin: bool = False) -> Any:
    # As _pipeline_results, for ``count`` statements; the COMMIT's results, then ``after`` more (a read ahead).
    yield from generators.send(pgconn)
    began = (yield from generators.fetch_many(pgconn)) if begin else None
    answers = []
    for _ in range(count):
        answers.append((yield from generators.fetch_many(pgconn)))
    followed = (yield from generators.fetch_many(pgconn)) if then else None
    committed = None
    if commit:
        committed = [(yield from generators.fetch_many(pgconn))]
        for _ in range(after):
            committed.append((yield from generators.fetch_many(pgconn)))
    synced = yield from generators.fetch_many(pgconn)
    return began, answers, followed, committed, synced


def _many_results(pgconn: pq.abc.PGconn, count: int, begin: bool, prefaced: bool) -> Any:
    # As _pipeline_results: send everything, then each command's results and the sync.
    yield from generators.send(pgconn)
    began = (yield from generators.fetch_many(pgconn)) if begin else None
    preface = (yield from generators.fetch_many(pgconn)) if prefaced else None
    answers = []
    for _ in range(count):
        answers.append((yield from generators.fetch_many(pgconn)))
    synced = yield from generators.fetch_many(pgconn)
    return began, preface, answers, synced


def _pipelined(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    session: _Session,
    *,
    begin: bool,
    commit: bool,
    then: bool = False,
    prefaced: bool = False,
) -> list[pq.abc.PGresult]:
    """The results of one statement sent in pipeline mode, with ``BEGIN`` ahead and ``COMMIT`` behind: one exchange.

    With ``then``, one more statement was sent after it (``_run``'s ``then``):
    its error is raised if the statement succeeded and it did not.  With
    ``prefaced``, one was sent ahead of it (``_run``'s ``preface``).
    """
    pgconn = conn.pgconn
    try:
        if commit:
            # In the statement's segment: skipped, as a statement after it is, when it fails (_run).
            pgconn.send_query_params(b"COMMIT", None)
        pgconn.pipeline_sync()
        began, preface, results, followed, committed, synced = session.wait(
            conn, _pipeline_results(pgconn, begin, commit, then, prefaced)
        )
        if not _only_sync(synced):
            # More than the sync came back: the server ended the session (an
            # administrator's termination, a shutdown) with the exchange in
            # flight, so whether it committed is unknown; as a lost connection.
            errors = [
                psycopg.errors.error_from_result(r, encoding=conn.info.encoding)
                for r in synced
                if r.status == pq.ExecStatus.FATAL_ERROR
            ]
            raise psycopg.OperationalError(
                f"the server ended the session during a pipelined exchange: {_one_line(errors[0]) if errors else synced}"
            )
        pgconn.exit_pipeline_mode()
        assert isinstance(results, list)
    except BaseException:
        # Cut short (a lost connection, an interrupt): the connection's state is unknown,
        # so it is closed and the pool replaces it.
        conn.pgconn.finish()
        raise
    for opened in (began, preface):
        if opened is not None:
            _result(conn, session, opened)
    if followed is not None and _succeeded(results):
        # The statement's own error, when it failed, is its caller's to raise; the one after it was then skipped.
        _result(conn, session, followed)
    if committed is not None:
        # Skipped (PIPELINE_ABORTED) when the statement failed: its error is its caller's to raise.
        ended = _result(conn, session, [*results, *committed]) if _succeeded(results) else None
        if ended is not None and ended.command_status != b"COMMIT":
            # The statement succeeded, so the transaction was aborted before it: nothing committed.
            raise StoreError("store_unavailable", f"the transaction was rolled back at COMMIT ({ended.command_status!r})")
    return results


def _notify_and_commit(conn: psycopg.Connection[Any], notify: bytes) -> None:
    """Send ``notify`` and ``COMMIT`` in one exchange (pipeline mode); raise if either fails."""
    session = _SESSIONS.get(conn)
    if session is None:
        session = _SESSIONS[conn] = _Session(conn)
    pgconn = conn.pgconn
    with session.lock:
        pgconn.enter_pipeline_mode()
        pgconn.send_query_params(notify, None)
        _result(conn, session, _pipelined(conn, session, begin=False, commit=True))


def _succeeded(results: list[pq.abc.PGresult]) -> bool:
    return all(result.status in _OK for result in results)


def _pipeline_results(
    pgconn: pq.abc.PGconn, begin: bool, commit: bool, then: bool = False, prefaced: bool = False
) -> Any:
    # A generator as psycopg's own: send everything, then each command's results and each sync.
    yield from generators.send(pgconn)
    began = (yield from generators.fetch_many(pgconn)) if begin else None
    preface = (yield from generators.fetch_many(pgconn)) if prefaced else None
    results = yield from generators.fetch_many(pgconn)
    followed = (yield from generators.fetch_many(pgconn)) if then else None
    committed = (yield from generators.fetch_many(pgconn)) if commit else None
    synced = yield from generators.fetch_many(pgconn)
    return began, preface, results, followed, committed, synced


def _only_sync(synced: list[pq.abc.PGresult]) -> bool:
    return [r.status for r in synced] == [pq.ExecStatus.PIPELINE_SYNC]


def _result(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], session: _Session, results: list[pq.abc.PGresult]) -> pq.abc.PGresult:
    """The statement's one result, or the error psycopg would raise for it."""
    for result in results:
        if result.status not in _OK:
            if result.status != pq.ExecStatus.FATAL_ERROR:
                raise psycopg.InternalError(f"unexpected result status {pq.ExecStatus(result.status).name}")
            error = psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
            if isinstance(error, psycopg.errors.InvalidSqlStatementName):
                # Something else deallocated this connection's statements
                # (DISCARD ALL, say; the store never does): this request fails
                # as a retryable one, and the next prepares them again.
                session.names.clear()
                raise StoreError(
                    "store_unavailable", f"a prepared statement of the store was deallocated: {_one_line(error)}"
                ) from None
            raise error
    return results[-1]


class _Deferred:
    """The row count of a write that runs later, inside the decision's one statement."""

    rowcount = -1


@attrs.frozen
class _Link:
    """A decision of a composed transaction whose writes are kept (write_and_view, write_last), and the view
    it was decided on: the rows the decision before it left."""

    decision: p.Decision
    evidence: tuple[Evidence, ...]
    before: VisitView


@attrs.frozen
class _Kept:
    """A decision's one write statement, kept to be sent with the transaction's COMMIT (write_last)."""

    statement: str
    params: Sequence[object]
    guarded: bool
    """Whether the statement checks guards on the server (``fencekeeper_guard_held``): any failure is then
    the request's to decide again (``_KeptWriteFailed``)."""
    decision: p.Decision
    """What the statement writes, and its evidence: what a conflict on a unique key means (SqlBackend._write_conflict)."""
    evidence: tuple[Evidence, ...]


# Executions in these states are listed through the revision rows that
# entered them (migration 3's object_revisions_listed; its condition, spelt
# the same way).  Any other state is listed by reading every execution.
_LISTED_BY_REVISION = ("waiting", "failed", "cancelled", "suspended", "reconciliation_required")
_LISTED_CONDITION = "state IN (" + ", ".join(f"'{s}'" for s in _LISTED_BY_REVISION) + ")"


@functools.lru_cache(maxsize=256)
def _guarded_statement(parts: tuple[str, ...], checked: tuple[int, ...]) -> str:
    """The writes of one decision as one statement that fails unless each ``checked`` part touched one row.

    What a write sent with its COMMIT needs (write_last): the guard cannot be
    read back before the COMMIT is sent, so the database checks it and
    raises (migration 11's ``fencekeeper_guard_held``, SQLSTATE ZG001); the
    statement fails, the transaction is aborted, and its COMMIT is a rollback.
    """
    # Every part is read in order through one UNION ALL, as _one_statement reads them: the parts then
    # run in that order, so rows numbered by a sequence (objects.seq) keep the order of the decision.
    ctes = ", ".join(f"w{n} AS ({sql} RETURNING {n} AS part)" for n, sql in enumerate(parts))
    touched = " UNION ALL ".join(f"SELECT part FROM w{n}" for n in range(len(parts)))
    held = " AND ".join(f"count(*) FILTER (WHERE part = {n}) = 1" for n in checked) or "true"
    return f"WITH {ctes}, touched AS ({touched}) SELECT fencekeeper_guard_held({held}) FROM touched"


class _CannotPredict(Exception):
    """An admission that cannot be decided on predicted facts (``PostgresStore.admit_run``); nothing was sent."""


PREDICTED_AT = datetime(1111, 11, 11, 11, 11, 11, 111111, tzinfo=UTC)
"""The time an admission decided on predicted facts is decided at; its statement writes the database's time instead.

A moment no store ever reads from a clock, so every value the decision
derived from it is recognised where it stands (``_predicted_statement``).
"""

_PREDICTED_DAY = PREDICTED_AT.date().isoformat()
_PREDICTED_AT_JSON = f'"at":"{codec.encode_time(PREDICTED_AT)}"'
# The same text, of the time the statement reads (codec.encode_time: UTC, microseconds, "+00:00").
_DATABASE_AT_JSON = (
    "(SELECT '\"at\":\"' || to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US') || '+00:00\"' "
    "FROM fencekeeper_now)"
)
_OUTBOX_INSERT = "INSERT INTO outbox ("


def _predicted_statement(
    parts: tuple[str, ...], params: Sequence[object], definition: tuple[str, str, int, int]
) -> tuple[str, list[object]]:
    """An admission's writes, decided at :data:`PREDICTED_AT`, as one statement that writes the database's time there.

    The statement reads ``clock_timestamp()`` once and writes it wherever a
    parameter is ``PREDICTED_AT``, and its text where the outbox row's
    payload says ``"at"`` of it; and it fails (``fencekeeper_guard_held``,
    SQLSTATE ZG001) unless the definition's latest registered revision is
    within ``definition``'s bounds: (object id, business, lowest, highest).
    Its one row is the time it read.  Any other value that could derive
    from that moment (a time before 1900, the day's text anywhere else)
    raises :class:`_CannotPredict`: such a decision is decided on read facts.
    """
    marks: list[str] = []
    values: list[object] = []
    index = 0
    for part in parts:
        count = part.count("%s")
        payload = index + count - 1 if part.startswith(_OUTBOX_INSERT) else -1
        for at in range(index, index + count):
            value = params[at]
            if isinstance(value, datetime):
                if value == PREDICTED_AT:
                    marks.append("t")
                    continue
                if value.year < 1900:
                    raise _CannotPredict
            elif isinstance(value, str) and _PREDICTED_DAY in value:
                if at != payload or value.count(_PREDICTED_DAY) != 1 or _PREDICTED_AT_JSON not in value:
                    raise _CannotPredict
                marks.append("j")
                values.append(value)
                continue
            marks.append("p")
            values.append(value)
        index += count
    object_id, business_id, lowest, highest = definition
    return _predicted_text(parts, tuple(marks)), [*values, object_id, business_id, lowest, highest]


@functools.lru_cache(maxsize=64)
def _predicted_text(parts: tuple[str, ...], marks: tuple[str, ...]) -> str:
    """The text of :func:`_predicted_statement` (an admission's shape repeats, so its text is kept)."""
    spelled = {"p": "%s", "t": "(SELECT at FROM fencekeeper_now)", "j": f"replace(%s, '{_PREDICTED_AT_JSON}', {_DATABASE_AT_JSON})"}
    written = iter(marks)
    texts = []
    for part in parts:
        pieces = part.split("%s")
        texts.append(pieces[0] + "".join(spelled[next(written)] + piece for piece in pieces[1:]))
    # Each part read in order through one UNION ALL, as _guarded_statement's: objects.seq keeps the decision's order.
    ctes = ", ".join(f"w{n} AS ({sql} RETURNING {n} AS part)" for n, sql in enumerate(texts))
    touched = " UNION ALL ".join(f"SELECT part FROM w{n}" for n in range(len(texts)))
    head = f"(SELECT revision FROM objects WHERE object_id = %s AND object_type = '{DEFINITION_TYPE}' AND business_id = %s)"
    return (
        f"WITH fencekeeper_now AS MATERIALIZED (SELECT clock_timestamp() AS at), {ctes}, touched AS ({touched}) "
        f"SELECT fencekeeper_guard_held(count(*) > 0 AND coalesce({head} BETWEEN %s AND %s, false)), "
        "(SELECT at FROM fencekeeper_now) FROM touched"
    )


@functools.lru_cache(maxsize=256)
def _one_statement(parts: tuple[str, ...]) -> str:
    """The writes of one decision as one statement (a decision's shape repeats, so its text is kept)."""
    # Each part returns its own number once per row it touched, and the
    # statement returns all of them: a plan of one Append, where a count per
    # part would start an aggregate and a subquery for each.
    ctes = ", ".join(f"w{n} AS ({sql} RETURNING {n})" for n, sql in enumerate(parts))
    return f"WITH {ctes} " + " UNION ALL ".join(f"SELECT * FROM w{n}" for n in range(len(parts)))


def _locking_read(where: str, also: str = "", order: str = "") -> str:
    """A statement that locks an execution's rows, then reads them and the time.

    The inner query locks objects, then workflow_dispatch (the order of its
    row marks: the one lock order of this store).  The outer one reads the
    current revision's body and ``clock_timestamp()`` from the row the lock
    returned, so the time is read after the lock is held, however long the
    wait for it: the decision's time, in the same round trip.  The rows read
    are what load() answers from: once locked they cannot change until this
    transaction ends.
    """
    return (
        "SELECT (SELECT body FROM object_revisions r WHERE r.object_id = c.object_id AND r.revision = c.revision), "
        "c.dispatch_state, c.eligible_at, c.lease_token, c.leased_by, c.lease_expires_at, c.step_count, "
        f"c.last_error_code, c.business_id, c.object_id, c.revision, clock_timestamp(){also} FROM ("
        "SELECT d.dispatch_state, d.eligible_at, d.lease_token, d.leased_by, d.lease_expires_at, d.step_count, "
        "d.last_error_code, o.business_id, o.object_id, o.revision "
        f"FROM objects o JOIN workflow_dispatch d ON d.workflow_execution_id = o.object_id {where}) c{order}"
    )


_LOCK_SQL = _locking_read("WHERE o.object_id = ? AND o.object_type = ? FOR UPDATE OF o, d")

_ADMISSION_FACTS_SQL = (
    "SELECT clock_timestamp(), (SELECT object_type FROM objects WHERE object_id = ?), "
    f"(SELECT revision FROM objects WHERE object_id = ? AND object_type = '{DEFINITION_TYPE}' AND business_id = ?)"
)

LOCK_TIMEOUT = 5.0
"""Seconds a statement of the store waits for a row lock before failing with ``row_locked``.

A decision holds its rows for milliseconds; a wait this long means the
holder has stalled (a stopped process, a hung client, an operator's open
psql transaction), and failing the one request, with nothing written, is
better than queueing every worker behind it."""

IDLE_IN_TRANSACTION_TIMEOUT = 30.0
"""Seconds the server lets one of the store's sessions sit idle inside a transaction before ending it.

The store never waits for anything but the database inside a transaction,
so a session idle that long belongs to a stopped or hung process; ending it
releases its row locks (its transaction rolls back, so nothing partial is
ever committed) and lets the rest of the deployment go on."""


@functools.cache
def claim_sql(bound: str, *, scoped: bool, skipping: bool = False, candidates: int = 1) -> str:
    """The claim's locking read: the first eligible execution due at ``bound``, of one business if ``scoped``.

    It also names the execution it locked in the transaction's setting
    ``fencekeeper.claimed`` (:data:`_CLAIMED_EVIDENCE_SQL` reads its evidence
    by it, in the same exchange).  ``skipping`` passes over the executions
    in an array, its last parameter: those whose rows a worker found
    malformed.  It is a statement of its own, run only while a worker
    passes some over, so that every other claim is the statement it always
    was (no parameter to send, no condition to test on each row).

    ``candidates`` more than one locks the first that many, for a claim
    that offers claims after its finalize (``NextClaim.request`` and
    ``more``): each after the first is the candidate of the next such
    claim.  It names them all, as an array, in ``fencekeeper.claimed_ids``
    (:data:`_CLAIMED_ALL_EVIDENCE_SQL`).  The array is a window aggregate
    over the locked rows, so every row is locked before the first is
    returned, and the time each row reads comes after every lock is held.
    """
    return _locking_read(
        f"WHERE d.dispatch_state = 'eligible' AND d.eligible_at <= {bound} "
        + ("AND o.business_id = ? " if scoped else "")
        + ("AND d.workflow_execution_id <> ALL(?::text[]) " if skipping else "")
        + f"ORDER BY d.eligible_at, d.workflow_execution_id LIMIT {candidates} FOR UPDATE OF o, d SKIP LOCKED",
        also=(
            ", set_config('fencekeeper.claimed_ids', (array_agg(c.object_id) OVER ())::text, true)"
            if candidates > 1
            else ", set_config('fencekeeper.claimed', c.object_id, true)"
        ),
        # The claim's order, said again: the first row is the claim's candidate, each next one the next claim's.
        order=" ORDER BY c.eligible_at, c.object_id" if candidates > 1 else "",
    )


_EVIDENCE_COLUMNS = (
    "SELECT o.object_id, o.object_type, v.body, o.revision, o.state FROM objects o CROSS JOIN LATERAL "
    "(SELECT r.body FROM object_revisions r WHERE r.object_id = o.object_id AND r.revision = o.revision OFFSET 0) v "
)
"""An execution's current evidence: each object's row, and its current revision's body looked up by key.

Written so that each body is found through object_revisions' primary key,
one lookup per object, whatever PostgreSQL knows of the table.  As a plain
join, a plan made while the table was new (no statistics, a few pages:
PostgreSQL plans a prepared statement again only when statistics change)
hashed the whole table on every read, and kept doing so as it grew: every
visit of a new deployment's first minutes read the entire revision history
(bench/README.md, "Plans made without statistics").  ``OFFSET 0`` keeps the
subquery from being folded back into that join.  An object whose revision
row is missing is left out, as the join left it out.
"""

_CLAIM_PLANNING = b"SET LOCAL enable_bitmapscan = off"
"""Sent ahead of a claim of one business, in its exchange: its plan walks the eligible index in order.

The claim wants the first eligible row, in ``eligible_at`` order, whose
execution belongs to the business.  Walking workflow_dispatch_eligible in
order finds it after the rows of other businesses before it, and locks it;
a bitmap scan of the index instead reads and joins every eligible row, which
must then be sorted.  Which of the two PostgreSQL picks rests on its
statistics: with none yet (a new schema, or one last analysed while empty,
until autovacuum analyses the tables) it takes the business to match one
row in 200 and eligible rows to be a handful, and takes the bitmap, so that
every claim of a queue of 3,000 cost 5 to 15 ms instead of 0.1 to 0.4 ms
(bench/README.md, "Plans made without statistics").  Without bitmap
scans, an index is read in its order, and the ordered walk is the plan
whatever the statistics say.

Not ``enable_sort = off``, which says the same more directly: a statement
that cannot do without a sort (the evidence read behind the claim, ordered
by ``seq``) is then costed past ``jit_above_cost`` and compiled, 100 ms a
claim.  A bitmap scan always has a plain index scan to stand in for it.
``SET LOCAL`` ends with the claim's transaction.  An unscoped claim has no
condition on the business and walks the index already.
"""

_CLAIMED_EVIDENCE_SQL = (
    _EVIDENCE_COLUMNS + "WHERE o.parent_id = current_setting('fencekeeper.claimed', true) ORDER BY o.{seq}"
)
"""The current evidence of the execution the claim's locking read has just locked, sent behind it.

A statement of its own, so on a snapshot taken after the lock was held: it
sees whatever the execution's previous holder committed, as a read after
the claim's write did.  The setting is local to the transaction, and read
only when the claim found an execution (else it is an earlier claim's, or
empty, and the rows are not used)."""

_CLAIMED_ALL_EVIDENCE_SQL = (
    _EVIDENCE_COLUMNS.replace("o.state FROM", "o.state, o.parent_id FROM")
    + "WHERE o.parent_id = ANY(NULLIF(current_setting('fencekeeper.claimed_ids', true), '')::text[]) ORDER BY o.{seq}"
)
"""The current evidence of every execution a claim of several ``candidates`` (:func:`claim_sql`) has just
locked, each row naming its execution last.  A setting of its own, so that it is never another claim's single id; empty or
unset (the claim found nothing), it reads no row rather than failing to parse."""

_LOCKED_EVIDENCE_SQL = _EVIDENCE_COLUMNS + "WHERE o.parent_id = ? ORDER BY o.{seq}"
"""The current evidence of an execution whose rows :data:`_LOCK_SQL`, just before, locked."""


def listing_sql(state: ExecutionState) -> str:
    """The statement listing executions in one of ``_LISTED_BY_REVISION``'s states."""
    # An execution is in the state when its current revision is one that
    # entered it; the index's condition is repeated so the planner sees it holds.
    return (
        "SELECT o.object_id FROM object_revisions r JOIN objects o "
        "ON o.object_id = r.object_id AND o.revision = r.revision "
        f"WHERE r.{_LISTED_CONDITION} AND r.state = '{state.value}' "
        f"AND o.object_type = '{EXECUTION_TYPE}' ORDER BY o.object_id"
    )


class _PostgresBackend(SqlBackend):
    dialect = POSTGRES
    revisions_carry_transitions = True
    evidence_sql = _LOCKED_EVIDENCE_SQL  # every read of an execution's evidence looks its bodies up by key
    guards_on_server: ClassVar[bool] = True
    """Whether the schema has migration 11's ``fencekeeper_guard_held``, so that a guarded decision's
    writes may go with the COMMIT (write_last), checked by the database."""
    verify_views: ClassVar[bool] = False
    """Whether a view made from a kept write (:meth:`write_and_view`) is checked against the database's
    own, read after sending the write: for tests, which set it; it costs a round trip per view."""
    _collecting: list[tuple[str, _Deferred]] | None = None
    _parked: _Parked | None = None
    """The claim read ahead that this transaction began with (:meth:`read_ahead_with`), until a claim uses it."""

    def __init__(
        self, conn: psycopg.Connection[Any], business_id: str | None, database_clock: bool, *, begin: bool = False
    ) -> None:
        super().__init__(conn)
        self.business_id = business_id
        self.database_clock = database_clock
        # True until the transaction's first statement: that one carries BEGIN (_run).
        self._begin = begin
        self.made_eligible = False
        # Whether a transaction's last writes may carry its COMMIT
        # (write_last): only where the store, not a psycopg transaction
        # block, ends the transaction.
        self.commits_with_last = False
        self._locked: dict[str, tuple[p.Execution, p.Dispatch | None, str]] = {}
        # The time read by the statement that took this transaction's locks,
        # after it had them, and the claim's candidate found with it: each is
        # used once.
        self._time: datetime | None = None
        self._candidate: tuple[datetime, str | None, frozenset[str], str | None] | None = None
        # The parameters of the writes being collected into one statement, in order.
        self._params: list[object] = []
        # The decision whose statement, being collected, may be kept for the COMMIT
        # (write_last), and the one kept: sent by commit_kept when the transaction ends.
        self._keeping: tuple[p.Decision, tuple[Evidence, ...]] | None = None
        self.kept: _Kept | None = None
        # An admission decided on predicted facts (PostgresStore.admit_run): the definition's
        # object id, business and bounds its latest revision must be within; nothing is sent
        # before its one exchange, which carries BEGIN and returns the time it wrote.
        self._predicting: tuple[str, str, int, int] | None = None
        self.predicted_at: datetime | None = None
        # The decisions of a composed transaction whose writes are kept (write_and_view, and the
        # write_last that may end them), at the transaction's one time: sent ahead of the next
        # statement, or with the COMMIT (_chain_statements).  Closed once write_last has joined.
        self._chain: list[_Link] = []
        self._chain_now: datetime | None = None
        self._chain_closed = False
        # The chains of executions finalized before a claim after them (claim_after) began another:
        # sent with it, each its own statement.
        self._closed_chains: list[list[_Link]] = []
        # The candidates of claim_after, in order, locked by the transaction's first exchange, each with
        # its evidence; and whether the claim of the next, made, begins a chain of its own.
        self._pre_claim: list[tuple[_Rows, _Rows]] = []
        self._opens_chain = False
        # Where _batch puts the statements it builds for the chain, instead of running them.
        self._building: list[_Kept] | None = None
        # What a visit is planned from, per execution whose rows this transaction holds: as the
        # locking read found it, or as the kept writes since have left it (write_and_view).
        self._views: dict[str, VisitView] = {}
        # The read sent in the same exchange as a decision's write (write_and_view), and its rows.
        self._read_after: tuple[str, Sequence[object]] | None = None
        self._read_rows: _Rows | None = None
        # The body texts of evidence revisions encoded for a made view (_made_view), for _queue_evidence.
        self._texts: dict[int, tuple[Evidence, str]] = {}

    @contextlib.contextmanager
    def _batch(self) -> Iterator[None]:
        # Every write of a decision goes to the server as ONE statement: each
        # INSERT or UPDATE becomes a data-modifying CTE, and the statement
        # returns how many rows each touched, which is what write() checks.
        # PostgreSQL runs all of them on one snapshot, to completion, all or
        # nothing, and checks foreign keys at the end of the statement, so an
        # evidence object and its first revision may be inserted side by side.
        # One statement instead of six costs the client a sixth of the CPU
        # (psycopg spends tens of microseconds on every statement) and the
        # server a sixth of the parse and protocol work.
        self._collecting = []
        self._params = []
        try:
            yield
            parts = self._collecting
        finally:
            self._collecting = None
        if not parts:
            return
        texts = tuple(sql for sql, _ in parts)
        if self._predicting is not None:
            if self._keeping is None or self._checks or self._revision_checks:
                raise _CannotPredict
            self.kept = _Kept(*_predicted_statement(texts, self._params, self._predicting), True, *self._keeping)
            for _, deferred in parts:
                deferred.rowcount = 1
            return
        if self._building is not None:
            # The chain's writes, checked by the database as a kept write is (write_last).
            checked = {id(cursor) for cursor in (*self._checks, *(c for _, c in self._revision_checks))}
            numbers = tuple(n for n, (_, deferred) in enumerate(parts) if id(deferred) in checked)
            assert self._keeping is None
            self._building.append(_Kept(_guarded_statement(texts, numbers), self._params, True, *self._building_for))
            for _, deferred in parts:
                deferred.rowcount = 1
            return
        if self._keeping is not None and not self._checks and not self._revision_checks:
            # No part's row count is checked: the statement can only fail, and
            # only as a whole; it goes with the COMMIT (write_last).
            self.kept = _Kept(_one_statement(texts), self._params, False, *self._keeping)
            return
        if self._keeping is not None:
            # The parts whose row counts are checked are checked by the database, and the
            # statement goes with the COMMIT; they are taken to hold until it fails there.
            checked = {id(cursor) for cursor in (*self._checks, *(c for _, c in self._revision_checks))}
            numbers = tuple(n for n, (_, deferred) in enumerate(parts) if id(deferred) in checked)
            self.kept = _Kept(_guarded_statement(texts, numbers), self._params, True, *self._keeping)
            for _, deferred in parts:
                deferred.rowcount = 1
            return
        statement = _one_statement(texts)
        counts = [0] * len(parts)
        self._flush_pending()
        begin = self._opening()
        if self._read_after is not None:
            # The read of what the writes leave travels with them (write_and_view).
            sql, params = self._read_after
            written, self._read_rows = _run_pair(self.conn, (statement, self._params), (sql, params), begin=begin)
        else:
            written = _run(self.conn, statement, self._params, begin=begin)
        for (part,) in written.rows:
            counts[part] += 1
        for (_, deferred), count in zip(parts, counts, strict=True):
            deferred.rowcount = count

    def _opening(self) -> bool:
        """Whether the next statement must carry BEGIN: the transaction's first, where none is open yet."""
        begin, self._begin = self._begin, False
        return begin and self.conn.pgconn.transaction_status == pq.TransactionStatus.IDLE

    def _execute(self, sql: str, params: Sequence[object] = ()) -> Any:
        if self._collecting is None and self._predicting is not None:
            # A read would be the transaction's first exchange: the admission is decided on read facts.
            raise _CannotPredict
        if self._collecting is None:
            self._nothing_kept()
            self._flush_pending()
            return _run(self.conn, self._sql(sql), params, begin=self._opening())
        deferred = _Deferred()
        self._collecting.append((self._sql(sql), deferred))
        self._params.extend(params)
        return deferred

    def admission_facts(
        self, execution_id: str, definition_object_id: str, business_id: str
    ) -> tuple[p.Execution | None, bool, int | None]:
        # One statement (carrying BEGIN) reads the time, what the identity
        # names and the definition's latest revision; the execution itself is
        # read only when the identity already names one (a repeated admission).
        row = self._execute(_ADMISSION_FACTS_SQL, (execution_id, definition_object_id, business_id)).fetchone()
        if self.database_clock:
            self._time = row[0]
        return self._admission_from(execution_id, row[1], row[2])

    def predict(self, definition: tuple[str, str, int, int]) -> None:
        """Keep this transaction's one decision, an admission on predicted facts, for one exchange with BEGIN.

        ``definition``: the object id, business and bounds its latest
        revision must be within (``_predicted_statement``).  Nothing is sent
        until ``commit_kept``; anything that would send first raises
        :class:`_CannotPredict`.
        """
        self._predicting = definition
        self.keeps_writes = True

    def keeps_any(self) -> bool:
        """Whether writes are kept for the COMMIT (commit_kept sends them)."""
        return self.kept is not None or bool(self._chain) or bool(self._closed_chains)

    def _flush_pending(self) -> None:
        """Send the chain's kept writes, in one exchange: whatever is sent next sees them."""
        if not self._chain and not self._closed_chains:
            return
        self._send_kept(self._chain_statements())
        self._verify_views()

    def _send_kept(
        self, statements: Sequence[_Kept], *, commit: bool = False, notify: bytes | None = None, ahead: _Ahead | None = None
    ) -> tuple[_Rows, _Rows] | None:
        try:
            return _run_kept(self.conn, [(k.statement, k.params) for k in statements], commit=commit, then=notify, ahead=ahead)
        except psycopg.DatabaseError as exc:
            if isinstance(exc, self.dialect.integrity_errors) or exc.sqlstate == GUARD_FAILED:
                # The transaction is aborted on the server: decided again, every write checked as it is made.
                raise _KeptWriteFailed from None
            raise

    def _chain_statements(self) -> list[_Kept]:
        """The chain's writes as statements: one, when each decision's guard holds on the rows the one before left.

        Decided in one transaction at one time, each on the view the one
        before it left, a chain is normally one: the execution's two rows are
        then written once, as the last decision leaves them, under the first
        decision's guard (which the database checks), and every decision's
        records and evidence besides, in order.  Each later guard is checked
        here, on exactly the rows the one before wrote, at the same time, as
        the database would check it; where one does not hold, each decision
        is its own statement under its own guard, and the database refuses it.
        """
        chains, self._closed_chains, self._chain = [*self._closed_chains, self._chain], [], []
        built: list[_Kept] = []
        for chain in chains:
            if chain:
                built.extend(self._statements_of(chain))
        return built

    def _statements_of(self, chain: list[_Link]) -> list[_Kept]:
        """One execution's chain of kept decisions as statements (:meth:`_chain_statements`)."""
        now = self._chain_now
        assert now is not None and chain
        built: list[_Kept] = []
        self._building = built
        # A decision being written may have sent the chain ahead of its own statement (_batch):
        # its parameters and row-count checks are its own again afterwards.
        held = (self._params, getattr(self, "_checks", []), getattr(self, "_revision_checks", []))
        try:
            if _one_statement_holds(chain, now):
                first = chain[0]
                guard = first.decision.guard
                execution = next((k.decision.execution for k in reversed(chain) if k.decision.execution is not None), None)
                dispatch = next((k.decision.dispatch for k in reversed(chain) if k.decision.dispatch is not None), None)
                evidence = tuple(item for link in chain for item in link.evidence)
                self._checks, self._revision_checks = [], []
                self._building_for = (first.decision, evidence)
                with self._batch():
                    self._queue_rows(guard, execution, dispatch, now)
                    for link in chain:
                        self._queue_records(link.decision, now)
                    at = self.dialect.encode_time(now)
                    self._queue_evidence(guard.execution_id, evidence, at, first.before.execution.business_id)
            else:
                for link in chain:
                    self._checks, self._revision_checks = [], []
                    self._building_for = (link.decision, link.evidence)
                    with self._batch():
                        self._queue_writes(link.decision, link.evidence, now)
        finally:
            self._building = None
            self._params, self._checks, self._revision_checks = held
        return built

    def _verify_views(self) -> None:
        """With ``verify_views``: every view this transaction holds is what the database now reads."""
        if not self.verify_views:
            return
        for execution_id, made in list(self._views.items()):
            sql, params = self._visit_view_statement(execution_id)
            read = self._visit_view_from(execution_id, _run(self.conn, self._sql(sql), params).rows)
            assert read is not None and _same_view(made, read), f"a view made from kept writes:\n{made}\nread:\n{read}"

    def _can_keep(self) -> bool:
        """Whether a guarded decision's writes may be kept for a later exchange (write_and_view, write_last)."""
        return (
            self.commits_with_last
            and self.keeps_writes
            and self.guards_on_server
            and self.kept is None
            and not self._chain_closed
            and self.conn.pgconn.transaction_status == pq.TransactionStatus.INTRANS
        )

    def _nothing_kept(self) -> None:
        if self.kept is not None or self._chain_closed:
            # A write kept for the COMMIT is not on the server yet: a statement sent now would
            # not see it.  write_last's caller promised it was the transaction's last action.
            raise RuntimeError("a statement after write_last(): the transaction's writes are kept for its COMMIT")

    def execution_ids(self, state: ExecutionState | None) -> list[str]:
        if state is None or state.value not in _LISTED_BY_REVISION:
            return super().execution_ids(state)
        return [str(r[0]) for r in self._execute(listing_sql(state)).fetchall()]

    def _conflict_table(self, exc: Exception) -> str | None:
        diag = getattr(exc, "diag", None)
        return None if diag is None else diag.table_name

    def _conflict_object(self, exc: Exception) -> str | None:
        # "Key (object_id, revision)=(att-1, 2) already exists."; identifiers hold no comma.
        diag = getattr(exc, "diag", None)
        match = re.match(r"Key \(object_id, revision\)=\(([^,]+), \d+\)", (diag and diag.message_detail) or "")
        return match.group(1) if match else None

    def _missing_object(self, exc: Exception) -> str | None:
        # 'Key (object_id)=(att-1) is not present in table "objects".': a revision's object row (never the
        # parent_id or execution keys, whose column names differ).
        diag = getattr(exc, "diag", None)
        match = re.match(r'Key \(object_id\)=\((.+)\) is not present in table "objects"', (diag and diag.message_detail) or "")
        return match.group(1) if match else None

    def _remember(self, row: Sequence[Any] | None, evidence: _Rows | None = None) -> str | None:
        if row is None:
            return None
        execution_id = str(row[9])
        # A row locked after waiting is re-read at its newest version, but the
        # revision subquery still sees the statement's snapshot: if the body is
        # not the object's current revision, load() reads afresh instead.
        if row[0] is not None:
            execution = codec.decode_execution(row[0], execution_id)
            if execution.revision == row[10]:
                dispatch = self._dispatch_from(execution_id, row[1:8])
                self._locked[execution_id] = (execution, dispatch, str(row[8]))
                if evidence is not None and dispatch is not None and self.business_id in (None, row[8]):
                    # Read by a statement of its own after the lock was held (_CLAIMED_EVIDENCE_SQL).
                    self._views[execution_id] = VisitView(
                        execution, dispatch, tuple(Evidence(r[0], r[1], json.loads(r[2]), r[3], r[4]) for r in evidence)
                    )
        return execution_id

    def _body_text(self, item: Evidence) -> str:
        known = self._texts.get(id(item))
        # The revision itself, not another at the same address: the entry holds the one it was made for.
        return known[1] if known is not None and known[0] is item else item.body_json()

    def _views_kept(self) -> bool:
        """Whether this transaction reads evidence with its locks, for views made from kept writes (write_and_view)."""
        return self.commits_with_last and self.keeps_writes and self.guards_on_server and self.kept is None

    def lock_for_visit(self, execution_id: str) -> None:
        # The execution's evidence travels behind the locking read (a statement of its own, so
        # read after the lock is held): the composed decisions' first view needs no read of its own.
        # So does a claim after the visit's finalize (claim_after): its locking read and its candidate's
        # evidence, so that the claim, made after writes kept for the COMMIT, sends nothing before it.
        evidence = self._views_kept()
        self.lock(execution_id, evidence=evidence, after=self.claim_after if evidence and self.database_clock else None)

    def lock(
        self, execution_id: str, *, wait: float | None = None, evidence: bool = False, after: NextClaim | None = None
    ) -> None:
        if wait is not None:
            # For this transaction only; the session's lock_timeout comes back with the next one.
            self._execute("SELECT set_config('lock_timeout', ?, true)", (f"{_milliseconds(wait)}ms",))
        found = None
        try:
            if evidence:
                self._nothing_kept()
                self._flush_pending()
                statements: list[tuple[str, Sequence[object]]] = [
                    (self._sql(_LOCK_SQL), (execution_id, EXECUTION_TYPE)),
                    (self._sql(_LOCKED_EVIDENCE_SQL), (execution_id,)),
                ]
                preface = None
                if after is not None:
                    # Never waits: SKIP LOCKED passes over rows another transaction holds, and this
                    # execution's own are no longer eligible.  The preface is the claim's planning only.
                    sql, values, preface = self._claim_statement("statement_timestamp()", after.business_id, after.skip)
                    statements += [(sql, values), (self._sql(_CLAIMED_EVIDENCE_SQL), ())]
                results = _run_many(self.conn, statements, begin=self._opening(), preface=preface)
                rows, found = results[0], results[1]
                if after is not None:
                    self._pre_claim = [(results[2], results[3])]
                row = rows.fetchone()
            else:
                row = self._execute(_LOCK_SQL, (execution_id, EXECUTION_TYPE)).fetchone()
            if row is None:
                # Not an execution (or half of one): lock whatever row exists, as before.
                self._execute("SELECT 1 FROM objects WHERE object_id = ? FOR UPDATE", (execution_id,))
                self._execute(
                    "SELECT 1 FROM workflow_dispatch WHERE workflow_execution_id = ? FOR UPDATE", (execution_id,)
                )
                return
        except psycopg.errors.LockNotAvailable:
            if wait is None:
                raise
            raise StoreError(
                "row_locked",
                f"execution {execution_id}: its rows have been locked by another transaction for over {wait:g} s; "
                "skipped, nothing written",
            ) from None
        self._remember(row, found)
        self._time = row[11]

    def load(self, execution_id: str) -> tuple[p.Execution | None, p.Dispatch | None]:
        cached = self._locked.get(execution_id)
        if cached is None:
            return super().load(execution_id)
        execution, dispatch, business_id = cached
        if self.business_id is not None and business_id != self.business_id:
            return None, None
        return execution, dispatch

    def lock_topic(self, business_id: str, event_type: str) -> None:
        # Event publication and waiter registration of one Business and Event
        # Type serialize on this lock, taken before any row lock by both, so
        # neither can commit without seeing the other (seed 000,
        # wait_for_event: the race is closed by the coordination boundary).
        self._execute(
            "SELECT pg_advisory_xact_lock(hashtext(?))",
            (f"fencekeeper.topic:{business_id}:{event_type}",),
        )

    def now(self, clock: Clock) -> datetime:
        if not self.database_clock:
            return clock.now()
        moment, self._time = self._time, None
        if moment is None:
            moment = self._execute("SELECT clock_timestamp()").fetchone()[0]
        return _aware(moment)

    def _claim(
        self, bound: str, business_id: str | None, skip: frozenset[str], *values: object, candidates: int = 1
    ) -> tuple[str | None, Any]:
        # eligible_at, workflow_execution_id order through the partial index
        # of eligible rows, up to ``bound``; locked rows are skipped, never
        # waited for.  Unscoped and scoped claims are different statements:
        # one statement with "(? IS NULL OR business_id = ?)" costs the
        # planner more as a generic plan than as a custom one, so PostgreSQL
        # planned it again on every claim.
        sql, params, preface = self._claim_statement(bound, business_id, skip, *values, candidates=candidates)
        self._nothing_kept()
        self._flush_pending()
        parked, self._parked = self._parked, None
        if parked is not None and parked.statement == (
            (sql, params)
            if parked.candidates == candidates
            else self._claim_statement(bound, business_id, skip, *values, candidates=parked.candidates)[:2]
        ):
            # Read ahead behind the COMMIT of this worker's transaction before (NextClaim): this
            # transaction began with it, and holds what it locked, however many candidates this claim
            # would have read.
            return self._claimed(parked.rows, parked.evidence if self._views_kept() else None, parked.candidates)
        if not self._views_kept():
            row = _run(self.conn, sql, params, begin=self._opening(), preface=preface).fetchone()
            return self._remember(row), row
        # The claimed execution's evidence, read behind the lock in the same exchange, for the view
        # the claim's write leaves (write_and_view), which is then made here, not read.
        rows, evidence = _run_pair(
            self.conn,
            (sql, params),
            (self._sql(_CLAIMED_ALL_EVIDENCE_SQL if candidates > 1 else _CLAIMED_EVIDENCE_SQL), ()),
            begin=self._opening(),
            preface=preface,
        )
        return self._claimed(rows, evidence, candidates)

    def _claimed(self, rows: _Rows, evidence: _Rows | None, candidates: int) -> tuple[str | None, Any]:
        """The claim's candidate, from its locking read and the read of its evidence.

        Of a read of several ``candidates`` (:func:`claim_sql`), the first
        row is; each next one, with its own evidence, is the candidate of the
        next claim after a finalize (:meth:`next_claimed_after`).  Unused, it
        stays locked until the transaction ends, and is claimed by whoever
        comes next.
        """
        if candidates == 1:
            row = rows.fetchone()
            return self._remember(row, evidence), row
        if not rows.rows:
            return None, None
        first, *rest = rows.rows
        if evidence is not None:
            self._pre_claim = [(_Rows([row], 1), _evidence_of(evidence, row[9])) for row in rest]
        return self._remember(first, None if evidence is None else _evidence_of(evidence, first[9])), first

    def _claim_statement(
        self, bound: str, business_id: str | None, skip: frozenset[str], *values: object, candidates: int = 1
    ) -> tuple[str, tuple[object, ...], bytes | None]:
        """A claim's locking read: its text, its values and the preface its exchange carries."""
        scope = business_id if business_id is not None else self.business_id
        if scope is not None:
            values = (*values, scope)
        if skip:
            values = (*values, sorted(skip))
        sql = claim_sql(bound, scoped=scope is not None, skipping=bool(skip), candidates=candidates)
        return self._sql(sql), values, _CLAIM_PLANNING if scope is not None else None

    def _chains(self) -> bool:
        """Whether a claim's locking read may lock several candidates, those after the first for claims after finalizes.

        Only where that claim can be made with nothing sent before it: the
        database's time, and views made from kept writes (as ``lock_for_visit``).
        """
        return self.database_clock and self._views_kept()

    def claim_time(self, clock: Clock, business_id: str | None, skip: frozenset[str] = frozenset()) -> datetime:
        if not self.database_clock:
            return clock.now()
        # The time the locking read brings is the claim's, and the rows it
        # returns are the candidate next_eligible() returns.  The bound is
        # statement_timestamp(), the start of this statement and so no later
        # than that time, because the index can only be searched up to a
        # value that stays the same during the scan (clock_timestamp() would
        # be a filter on every eligible row, due or not).
        after = self.claim_after
        candidates = 2 + len(after.more) if after is not None and after.request is not None and self._chains() else 1
        execution_id, row = self._claim("statement_timestamp()", business_id, skip, candidates=candidates)
        if row is None:
            # Nothing due: a claim at the time read next finds nothing either.
            moment = self.now(clock)
            self._candidate = (moment, business_id, skip, None)
            return moment
        moment = _aware(row[11])
        self._candidate = (moment, business_id, skip, execution_id)
        return moment

    def next_eligible(self, now: datetime, business_id: str | None, skip: frozenset[str] = frozenset()) -> str | None:
        candidate, self._candidate = self._candidate, None
        if candidate is not None and candidate[:3] == (now, business_id, skip):
            return candidate[3]
        # The claimed rows come back with the lock, so the claim's load() is free.
        return self._claim("?", business_id, skip, now)[0]

    def write(self, decision: p.Decision, evidence: Sequence[Evidence], now: datetime) -> bool:
        self._locked.pop(decision.guard.execution_id, None)
        # A view is made from the writes kept since the locking read, and these are not among them.
        self._views.clear()
        if not super().write(decision, evidence, now):
            return False
        dispatch = decision.dispatch
        if dispatch is not None and dispatch.dispatch_state == DispatchState.ELIGIBLE:
            self.made_eligible = True
        return True

    def append_objects(self, execution_id: str, evidence: Sequence[Evidence], now: datetime) -> bool:
        self._views.clear()
        return super().append_objects(execution_id, evidence, now)

    def next_claimed_after(self) -> str | None:
        found = self._pre_claim.pop(0) if self._pre_claim else None
        row = None if found is None else found[0].fetchone()
        if found is None or row is None:
            return None
        execution_id = self._remember(row, found[1])
        if execution_id is None or execution_id not in self._locked or execution_id not in self._views:
            # Read at another revision than its body's, or of another business: claimed, if at all, by a
            # transaction of its own, since a read now would come after writes kept for the COMMIT.
            self._locked.pop(str(row[9]), None)
            return None
        self._opens_chain = True
        return execution_id

    def write_and_view(
        self, decision: p.Decision, evidence: Sequence[Evidence], now: datetime, execution_id: str
    ) -> tuple[bool, VisitView | None]:
        if self._opens_chain:
            # The claim after a finalize: the finalized execution's chain is complete, and this one
            # begins another, kept for the same COMMIT as its own statement.
            self._opens_chain = False
            if self._chain_closed:
                self._closed_chains.append(self._chain)
                self._chain, self._chain_closed = [], False
        before = self._views.get(execution_id)
        if (
            before is not None
            and decision.guard.execution_id == execution_id
            and decision.guard.expected_revision != 0
            and (not self._chain or now == self._chain_now)
            and self._can_keep()
        ):
            return True, self._kept_and_viewed(before, decision, evidence, now, execution_id)
        # The decision's one write statement and the view's one read, in one exchange: the read
        # runs only if the write did, and what it sees is discarded when a guard did not hold.
        sql, params = self._visit_view_statement(execution_id)
        self._read_after, self._read_rows = (self._sql(sql), params), None
        try:
            written = self.write(decision, evidence, now)
        finally:
            self._read_after = None
        rows, self._read_rows = self._read_rows, None
        if not written:
            return False, None
        if rows is None:
            return True, self.view_so_far(execution_id)
        return True, self._visit_view_from(execution_id, rows.rows)

    def _kept_and_viewed(
        self, before: VisitView, decision: p.Decision, evidence: Sequence[Evidence], now: datetime, execution_id: str
    ) -> VisitView:
        """Keep ``decision``'s writes for the next exchange and make the view they leave from ``before``.

        The writes are checked when they are sent, ahead of the transaction's
        next statement or with its COMMIT (``_chain_statements``), and a failure
        there aborts the transaction, which is then decided again with every
        write checked as it is made (``_KeptWriteFailed``): so the view is
        used only if they are written as made.  It is what a read after them
        would return, under the row locks this transaction holds: the
        decision's execution and dispatch row, and every evidence object at
        its newest revision in creation order, a new one after the others
        (objects.seq, as _queue_evidence inserts them); the bodies as stored.
        """
        self._locked.pop(execution_id, None)
        self._chain.append(_Link(decision, tuple(evidence), before))
        self._chain_now = now
        if decision.dispatch is not None and decision.dispatch.dispatch_state == DispatchState.ELIGIBLE:
            self.made_eligible = True
        view = self._views[execution_id] = _made_view(before, decision, evidence, self._texts)
        return view

    def write_last(self, decision: p.Decision, evidence: Sequence[Evidence], now: datetime) -> bool:
        # An admission's writes are inserts only: no part's row count is
        # checked, so nothing needs their result before the COMMIT, and they
        # travel with it (commit_kept): one round trip instead of two.  Only
        # where the store sends that COMMIT itself, in a transaction already
        # open (BEGIN went with the admission's facts).
        # A guarded decision's writes go the same way, their guard checked by the database in the
        # statement (_guarded_statement), unless a kept write already failed at this request's COMMIT.
        if self._predicting is not None:
            # Kept before anything is sent: the one exchange carries BEGIN (commit_kept).
            self._keeping = (decision, tuple(evidence))
            try:
                self.write(decision, evidence, now)
            finally:
                self._keeping = None
            if self.kept is None:
                raise _CannotPredict
            return True
        if (
            not self.commits_with_last
            or not self.keeps_writes
            or (decision.guard.expected_revision != 0 and not self.guards_on_server)
            or self.made_eligible
            or self.kept is not None
            or self.conn.pgconn.transaction_status != pq.TransactionStatus.INTRANS
        ):
            return self.write(decision, evidence, now)
        view = self._views.get(decision.guard.execution_id)
        if self._chain and view is not None and now == self._chain_now and self._can_keep():
            # The last of a composed transaction's decisions: it joins the chain, and goes with it.
            self._locked.pop(decision.guard.execution_id, None)
            self._chain.append(_Link(decision, tuple(evidence), view))
            self._chain_closed = True
            if self.verify_views:
                # Nothing plans from it (nothing is decided after it): it is made only for
                # verify_views to compare with the database's read.
                self._views[decision.guard.execution_id] = _made_view(view, decision, evidence, self._texts)
            else:
                self._views.pop(decision.guard.execution_id, None)
            if decision.dispatch is not None and decision.dispatch.dispatch_state == DispatchState.ELIGIBLE:
                self.made_eligible = True
            return True
        self._keeping = (decision, tuple(evidence))
        try:
            return self.write(decision, evidence, now)
        finally:
            self._keeping = None

    def commit_kept(self, notify: bytes | None, ahead: _Ahead | None = None) -> tuple[_Rows, _Rows] | None:
        """Send the kept writes, ``notify`` when given, and ``COMMIT``: one exchange, all of it or none.

        With ``ahead``, the next claim's locking read rides behind the
        ``COMMIT`` (``_run_kept``), and its rows are returned: the connection
        is then in that claim's transaction (None: the read failed, and its
        transaction is the caller's to roll back).

        A unique-key conflict rolls the transaction back and means what it
        means to :meth:`write`: a named conflict is raised as its StoreError,
        and the guard failing (another admission of the id committed first)
        as :class:`_GuardFailed`, so that the request is decided again.
        """
        kept, self.kept = self.kept, None
        if self._chain or self._closed_chains:
            # Every write kept in this transaction, checked by the database: one exchange, with the COMMIT.
            if self.verify_views:
                # Sent first, and every view checked against the database's read, before the COMMIT.
                self._flush_pending()
                statements = [kept] if kept is not None else []
            else:
                statements = [*self._chain_statements(), *([kept] if kept is not None else [])]
            return self._send_kept(statements, commit=True, notify=notify, ahead=ahead)
        assert kept is not None
        predicted = self._predicting is not None
        rows: list[_Rows] = []
        try:
            # The COMMIT in the statement's pipeline segment, behind one sync (as a chain's): skipped if the
            # statement fails, which leaves the transaction aborted for the connection's context to roll back.
            # A predicted admission's BEGIN goes ahead of it: the whole transaction is this exchange.
            _run_kept(
                self.conn, [(kept.statement, kept.params)], commit=True, then=notify, begin=predicted, rows=rows if predicted else None
            )
        except self.dialect.integrity_errors as exc:
            if kept.guarded:
                raise _KeptWriteFailed from None
            self._write_conflict(kept.decision, kept.evidence, exc)
            raise _GuardFailed from None
        except psycopg.DatabaseError as exc:
            if kept.guarded and exc.sqlstate == GUARD_FAILED:
                raise _KeptWriteFailed from None
            raise
        if predicted:
            self.predicted_at = _aware(rows[0].rows[0][1])
        # Not a composed transaction's: nothing is read ahead behind it.
        return None

    def ahead_of(self, claim: NextClaim) -> _Ahead:
        """The statements of ``claim``'s locking read, as :meth:`claim_time` sends them, to read it ahead.

        ``claim.chain`` candidates (the claims the worker will offer its next
        claim after its finalize, and its own), where those claims could be made
        (:meth:`_chains`); the claim uses whichever read it finds.
        """
        candidates = claim.chain if self._chains() else 1
        sql, values, preface = self._claim_statement(
            "statement_timestamp()", claim.business_id, claim.skip, candidates=candidates
        )
        evidence = _CLAIMED_ALL_EVIDENCE_SQL if candidates > 1 else _CLAIMED_EVIDENCE_SQL
        return _Ahead(((sql, values), (self._sql(evidence), ())), preface, candidates)

    def read_ahead_with(self, parked: _Parked) -> None:
        """Claim from what ``parked`` read ahead, in its transaction: the next claim's locking read is not sent again."""
        self._parked = parked


_CONNECTION_LOST = (psycopg.OperationalError, psycopg.errors.IdleInTransactionSessionTimeout)
"""What a request meets when its session is gone: the server ended it (idle in a transaction past
the timeout: a process that was stopped and has resumed) or the connection broke.  The pool
discards the connection; the request fails as ``store_unavailable``, which callers retry."""


def _evidence_of(evidence: _Rows, execution_id: str) -> _Rows:
    """The rows of a claim's evidence read of several candidates (:data:`_CLAIMED_ALL_EVIDENCE_SQL`) that belong to ``execution_id``, in order."""
    rows = [row for row in evidence.rows if row[5] == execution_id]
    return _Rows(rows, len(rows))


def _one_statement_holds(chain: Sequence[_Link], now: datetime) -> bool:
    """Whether a chain's decisions may go as one statement (``_chain_statements``).

    Each later guard must hold on the rows the decision before it left.  And
    no part may need to see another's write, since every part of one
    statement runs on the same snapshot: the evidence objects are written
    once for the whole chain (``_queue_evidence`` groups their revisions),
    but a wait registration inserted by one decision and closed by a later
    one would not be, nor would two closings of one registration.  So only
    the last decision may register a wait (a finalization to waiting ends a
    composed transaction anyway), and at most one may close one.  Nor is a
    later revision's kind compared with the kind an earlier decision stored
    (the one statement compares only the kind of an object's first write in
    the chain, as its own statement would), so a later decision may revise
    an object only at the kind it has in the view that decision was made on.
    """
    return (
        all(link.decision.guard.holds(link.before.execution, link.before.dispatch, now) for link in chain[1:])
        and all(link.decision.registration is None for link in chain[:-1])
        and sum(link.decision.closes is not None for link in chain) <= 1
        and all(_same_kinds(link) for link in chain[1:])
    )


def _same_kinds(link: _Link) -> bool:
    """Whether every evidence revision of ``link`` that revises an object of its view is of that object's kind."""
    kinds = {item.object_id: item.kind for item in link.before.evidence}
    return all(kinds.get(item.object_id, item.kind) == item.kind for item in link.evidence)


def _made_view(
    before: VisitView, decision: p.Decision, evidence: Sequence[Evidence], texts: dict[int, tuple[Evidence, str]]
) -> VisitView:
    """The view ``decision``'s writes leave, made from ``before`` (what a read after them returns; _kept_and_viewed).

    Each body encoded here is put in ``texts`` (by the revision's identity, beside the revision, which
    keeps that identity from being reused), so that the statement writing it does not encode it again.
    """
    # The newest revision of each object the decision writes, in the order the objects first appear
    # (a dict keeps a key where it was first put): only those are read back, so only they are decoded.
    newest: dict[str, Evidence] = {}
    # An object's kind is what it was stored as: the kind of its first revision (_queue_evidence
    # inserts the object row once, and a later revision's kind does not change it).
    kinds: dict[str, str] = {}
    for item in evidence:
        kinds.setdefault(item.object_id, item.kind)
        seen = newest.get(item.object_id)
        if seen is None or item.revision > seen.revision:
            newest[item.object_id] = item
    objects = {item.object_id: n for n, item in enumerate(before.evidence)}
    current = list(before.evidence)
    for object_id, item in newest.items():
        at = objects.get(object_id)
        if at is not None and item.revision <= current[at].revision:
            continue
        kind = kinds[object_id] if at is None else current[at].kind
        text = item.body_json()
        texts[id(item)] = (item, text)
        stored = Evidence(object_id, kind, json.loads(text), item.revision, item.state)
        if at is None:
            objects[object_id] = len(current)
            current.append(stored)
        else:
            current[at] = stored
    return VisitView(
        decision.execution if decision.execution is not None else before.execution,
        decision.dispatch if decision.dispatch is not None else before.dispatch,
        tuple(current),
    )


def _same_view(made: VisitView, read: VisitView) -> bool:
    """Whether two views are the same, evidence bodies included (an Evidence's equality leaves its body out)."""
    return made == read and all(a.body == b.body for a, b in zip(made.evidence, read.evidence, strict=True))


def _milliseconds(seconds: float) -> int:
    """A timeout setting's value: whole milliseconds, at least one (PostgreSQL reads 0 as no timeout at all)."""
    return max(1, round(seconds * 1000))


class PostgresStore(TransactionalStore):
    """A store in one PostgreSQL schema, shared by many workers on many machines."""

    _commits_with_last = True
    """Whether a write transaction's last read may carry its COMMIT (see ``_begun``)."""

    reads_ahead: ClassVar[bool] = True
    """Whether a worker's next claim may be read ahead behind the COMMIT of its transaction before
    (:class:`~fencekeeper.adapters.store.NextClaim`): one exchange less per execution."""

    composes_claims: ClassVar[bool] = True
    """Whether a step's transaction that finalizes its execution makes the worker's next claim too
    (``NextClaim.request``), read with the step's locking read: one transaction less per execution."""

    predicts_admissions: ClassVar[bool] = True
    """Whether an admission after the store's first of a definition is decided on predicted facts, in one
    exchange (:meth:`admit_run`); without it every admission reads its facts first."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "fencekeeper",
        clock: Clock | None = None,
        business_id: str | None = None,
        pool_size: int = 4,
        lock_timeout: float = LOCK_TIMEOUT,
        idle_in_transaction_timeout: float = IDLE_IN_TRANSACTION_TIMEOUT,
    ) -> None:
        super().__init__(clock)
        # Claims read ahead and not yet used, by the thread whose worker will use them (NextClaim).
        self._parked: dict[int, _Parked] = {}
        self._parked_lock = threading.Lock()
        for name, seconds in (("lock_timeout", lock_timeout), ("idle_in_transaction_timeout", idle_in_transaction_timeout)):
            if not 0 < seconds <= 86_400:
                raise ValueError(f"{name}: must be positive seconds, at most a day, got {seconds!r}")
        self.lock_timeout = lock_timeout
        # A claim read ahead and kept longer than half of this is not used: the server may end its session.
        self._idle_timeout = idle_in_transaction_timeout
        self.dsn = dsn
        self.schema = _check_schema_name(schema)
        self.business_id = business_id
        self._database_clock = clock is None
        # One channel per schema: work made eligible in one deployment wakes only its own workers.
        self.channel = f"{CHANNEL}:{self.schema}"
        # The schema name is checked ([a-z_][a-z0-9_]*), so the quoted identifier needs no escaping.
        self._notify = f'NOTIFY "{self.channel}"'.encode()
        self._listener = Listener(dsn, self.channel, f"the PostgreSQL store of schema {self.schema}")
        # The store prepares its own statements (_run); psycopg's own
        # preparing is off, because psycopg deallocates every prepared
        # statement of a connection, the store's too, after a rollback.
        # The session settings travel with the connection request: no
        # round trip of their own (docs/operating-postgres.md, Timeouts).
        # TimeZone=UTC changes no instant the store reads or writes (its
        # statements compare timestamptz values, and the one that spells a
        # time as text says AT TIME ZONE 'UTC'); it is the zone psycopg
        # gives datetime.UTC for, so a time is read without a zoneinfo
        # conversion and used without another (_aware): about 2 us a value,
        # where a server's default zone ('Etc/UTC', say) is any other name.
        settings = {
            "options": f"-c search_path={self.schema} -c lock_timeout={_milliseconds(lock_timeout)} "
            f"-c idle_in_transaction_session_timeout={_milliseconds(idle_in_transaction_timeout)} -c TimeZone=UTC",
            "prepare_threshold": None,
        }
        try:
            self._open_pool(dsn, pool_size, settings)
        except Exception as exc:
            raise StoreError("store_unavailable", f"cannot connect to PostgreSQL ({_safe(dsn)}): {_one_line(exc)}") from None
        def check() -> None:
            with self._pooled() as conn:
                check_schema_with(functools.partial(self._statement, conn), self.schema)

        try:
            checked_again_if_lost(check, psycopg.OperationalError)
        except psycopg.OperationalError as exc:
            self._close_pool()
            raise StoreError("store_unavailable", f"PostgreSQL connection failed: {_one_line(exc)}") from None
        except BaseException:
            self._close_pool()
            raise

    # How the store reaches its connections: the one part of it that differs
    # between this synchronous store and the asyncio one
    # (postgres_async.AsyncPostgresStore), which awaits the same steps.

    def _open_pool(self, dsn: str, pool_size: int, settings: dict[str, Any]) -> None:
        self._pool = ConnectionPool(
            dsn,
            min_size=1,
            max_size=pool_size,
            kwargs=settings,
            open=True,
            timeout=10,
            # No check on checkout: it would cost a round trip on every
            # request.  A connection killed while idle fails the one request
            # that gets it, as StoreError('store_unavailable'), and is
            # discarded; the pool's other idle connections are then checked
            # (_unavailable), so the next request gets a live one.
        )
        try:
            self._pool.wait(timeout=10)
        except BaseException:
            # No store is made, so nothing else would close it: its threads and any connection would outlive the error.
            self._pool.close()
            raise

    def _pooled(self) -> contextlib.AbstractContextManager[Any]:
        """A connection of the pool, for the length of a ``with`` block.

        A claim this thread read ahead is rolled back first: its worker asks
        for something else, so it will not be used (NextClaim).
        """
        if self._parked:
            self.drop_read_ahead()
        return _Checkout(self._pool)

    def drop_read_ahead(self) -> None:
        """Roll back the claim this thread read ahead (:class:`~fencekeeper.adapters.store.NextClaim`), if any.

        It wrote nothing; its row locks are released.  A worker calls this
        when it stops claiming; any other call of the store on the thread
        does it first.
        """
        with self._parked_lock:
            parked = self._parked.pop(threading.get_ident(), None)
        if parked is not None:
            _give_back(self._pool, parked.conn)

    def _claim_transaction(self, claim: _Claim) -> contextlib.AbstractContextManager[Backend]:
        if not self._parked:
            return self._transaction()
        with self._parked_lock:
            parked = self._parked.pop(threading.get_ident(), None)
        if parked is None:
            return self._transaction()
        if (parked.claim.business_id, parked.claim.skip) != (claim.business_id, claim.skip) or (
            time.monotonic() - parked.at > self._idle_timeout / 2
        ):
            # Another claim's, or kept so long (a worker's hook stalled) that the server may be ending its
            # session as idle in a transaction: rolled back, and this claim reads afresh.
            _give_back(self._pool, parked.conn)
            return self._transaction()
        return self._transaction(parked)

    def _park(self, checkout: _Checkout, conn: psycopg.Connection[Any], claim: NextClaim, ahead: _Ahead, read: tuple[_Rows, _Rows] | None) -> None:
        """Keep the claim read ahead behind a COMMIT for this thread's next claim, when it found an execution."""
        if read is None or read[0].fetchone() is None:
            # Nothing due (or the read failed): nothing is worth holding, and what it saw will be old
            # when the worker claims.  Its transaction ends now.  The COMMIT before it stands whatever
            # happens here: a connection that cannot roll back is closed, and the pool replaces it.
            if conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
                try:
                    conn.rollback()
                except psycopg.Error:
                    conn.close()
            return
        checkout.keep()
        parked = _Parked(conn, claim, ahead.statements[0], read[0], read[1], time.monotonic(), ahead.candidates)
        with self._parked_lock:
            stale = self._parked.pop(threading.get_ident(), None)
            self._parked[threading.get_ident()] = parked
        if stale is not None:
            _give_back(self._pool, stale.conn)

    def _begun(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """What opens the transaction on ``conn`` before its first statement.

        Nothing, here: the first statement carries ``BEGIN`` (``_run``) and the
        pool's connection context ends the transaction.  A store that opens it
        otherwise (the asyncio store's ``conn.transaction()``) is seen by the
        backend, which then sends no second ``BEGIN``.
        """
        del conn
        return contextlib.nullcontext()

    def _statement(self, conn: Any, statement: Any, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        """A statement outside the store's prepared ones (session and schema checks); its rows."""
        cursor = conn.execute(statement, params)
        return cursor.fetchall() if cursor.description is not None else []

    def _close_pool(self) -> None:
        self._pool.close()

    def _check_pool(self) -> None:
        """Test the pool's idle connections, replacing those that are broken (after a lost connection)."""
        self._pool.check()

    def _privileges(self, statement: Any, params: Sequence[object]) -> list[tuple[Any, ...]]:
        """A privilege lookup (:func:`permission_denied`), on a connection of its own: the refused one's transaction is aborted."""
        with self._pooled() as conn:
            return self._statement(conn, statement, params)

    @contextlib.contextmanager
    def _transaction(self, parked: _Parked | None = None) -> Iterator[Backend]:
        try:
            # BEGIN goes to the server with the transaction's first statement
            # (_run's begin), so it costs no round trip of its own; the pool's
            # connection context commits on a normal exit and rolls back on any
            # exception, as conn.transaction() did.  A claim read ahead (parked)
            # began its transaction already, and goes on in it.
            checkout = self._pooled() if parked is None else _Checkout(self._pool, parked.conn)
            with checkout as conn, self._begun(conn):
                backend = _PostgresBackend(conn, self.business_id, self._database_clock, begin=True)
                backend.commits_with_last = self._commits_with_last
                if parked is not None:
                    backend.read_ahead_with(parked)
                yield backend
                if backend.keeps_any():
                    # The decision's writes, NOTIFY when they make work eligible, and COMMIT: one exchange;
                    # and behind them, when the transaction finished its execution, its worker's next claim.
                    claim = backend.read_ahead if self.reads_ahead else None
                    ahead = backend.ahead_of(claim) if claim is not None else None
                    read = backend.commit_kept(self._notify if backend.made_eligible else None, ahead)
                    if claim is not None and ahead is not None:
                        assert isinstance(checkout, _Checkout)
                        self._park(checkout, conn, claim, ahead, read)
                elif backend.made_eligible:
                    if self._commits_with_last and conn.pgconn.transaction_status == pq.TransactionStatus.INTRANS:
                        # NOTIFY and COMMIT in one exchange; the pool's context then finds nothing to commit.
                        _notify_and_commit(conn, self._notify)
                    else:
                        self._statement(conn, pgsql.SQL("NOTIFY {}").format(pgsql.Identifier(self.channel)))
        except psycopg.errors.InsufficientPrivilege as exc:
            # Rolled back by the pool's context: nothing was written.
            raise permission_denied(exc, self._privileges) from None
        except psycopg.errors.LockNotAvailable as exc:
            raise StoreError(
                "row_locked",
                f"a row this request needs has been locked by another transaction for over {self.lock_timeout:g} s "
                f"(lock_timeout); nothing was written. A stalled session holds it: find it in pg_stat_activity "
                f"(state 'idle in transaction', or the oldest xact_start) and end it, or retry ({_one_line(exc)})",
            ) from None
        except _CONNECTION_LOST as exc:
            raise self._unavailable(exc) from None

    def admit_run(
        self,
        execution_id: str,
        business_id: str,
        definition_id: str,
        revision: int | None,
        make: Callable[[d.Definition], tuple[p.AdmitRequest, Sequence[Evidence]]],
    ) -> p.Outcome | None:
        """:meth:`TransactionalStore.admit_run`, in one exchange where the facts it needs can be predicted.

        An admission's facts are the database's time, whether its identity is
        free and the definition's latest registered revision.  Once an
        admission of this store has read the latest revision, the next is
        decided without reading: on an identity that is free, that revision,
        and the moment :data:`PREDICTED_AT`.  Its one statement then checks
        each prediction where it writes (``_predicted_statement``): the
        identity by the objects' unique key, the revision by the guard, and
        the time by writing the database's own wherever the decision has it.
        ``BEGIN``, that statement, ``NOTIFY`` and ``COMMIT`` go in one
        exchange (``commit_kept``).  A prediction that does not hold fails
        the statement and writes nothing, and the admission is decided again
        on read facts, as :meth:`TransactionalStore.admit_run` decides every one.
        The decision returned is the kernel's at the time the statement wrote.
        """
        made: dict[int, tuple[p.AdmitRequest, Sequence[Evidence]]] = {}

        def once(definition: d.Definition) -> tuple[p.AdmitRequest, Sequence[Evidence]]:
            # Decided again on read facts at the revision predicted: the request already made
            # (its input checked, its authority asked) is the same, and is not made twice.
            if definition.revision not in made:
                made[definition.revision] = make(definition)
            return made[definition.revision]

        def on_read_facts() -> p.Outcome | None:
            return super(PostgresStore, self).admit_run(execution_id, business_id, definition_id, revision, once)

        # Only where the store sends the COMMIT itself, and time is the database's (an injected
        # clock is a test's, and its time is read in the transaction).
        head = self._heads.get((business_id, definition_id))
        if self._closed or not self.predicts_admissions or not self._commits_with_last or not self._database_clock or head is None:
            return on_read_facts()
        number = head if revision is None else revision
        definition = self._definitions.get((business_id, definition_id, number)) if 1 <= number <= head else None
        if definition is None:
            return on_read_facts()
        request, evidence = once(definition)
        if request.execution_id != execution_id:
            raise ValueError("admit_run: make() must admit the execution_id it was given")
        decided = p.admit(None, request, PREDICTED_AT, id_taken=False)
        if not isinstance(decided, p.Decision):
            # A refusal's code depends on what the identity names: decided on read facts.
            return on_read_facts()
        # The latest revision must still be the one predicted; a revision asked for, at least it.
        bounds = (definition_object_id(business_id, definition_id), business_id, number, head if revision is None else 2**31 - 1)
        try:
            with self._transaction() as tx:
                assert isinstance(tx, _PostgresBackend)
                tx.predict(bounds)
                tx.write_last(decided, evidence, PREDICTED_AT)
        except (_GuardFailed, _CannotPredict):
            return on_read_facts()
        at = tx.predicted_at
        assert at is not None
        outcome = p.admit(None, request, at, id_taken=False)
        assert isinstance(outcome, p.Decision), outcome
        return outcome

    @contextlib.contextmanager
    def _read(self) -> Iterator[_PostgresBackend]:
        try:
            with self._pooled() as conn, self._begun(conn):
                # One snapshot for the whole view.
                self._statement(conn, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                yield _PostgresBackend(conn, self.business_id, self._database_clock)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise permission_denied(exc, self._privileges) from None
        except _CONNECTION_LOST as exc:
            raise self._unavailable(exc) from None

    def expired(self) -> list[str]:
        with self._read() as tx:
            now = tx.now(self.clock)
            return [eid for eid in tx.expired(now) if self._visible(tx, eid)]

    def execution_ids(self, state: ExecutionState | None = None) -> list[str]:
        with self._read() as tx:
            return [eid for eid in tx.execution_ids(state) if self._visible(tx, eid)]

    def leased_to(self, worker_id: str, lease_token: str) -> str | None:
        with self._read() as tx:
            found = tx.leased_to(worker_id, lease_token)
            return found if found is not None and self._visible(tx, found) else None

    def read(self, execution_id: str) -> ExecutionView | None:
        with self._read() as tx:
            if not self._visible(tx, execution_id):
                return None
            return tx.read_view(execution_id)

    def due_wakes(self, limit: int = 100, *, business_id: str | None = None) -> list[p.WaitKey]:
        # A read of one statement (a worker asks before every claim), outside a
        # transaction block: one round trip instead of four.  Due means due by
        # the database's clock as the statement starts (statement_timestamp(),
        # which the wake_at index can be searched up to); each timer found is
        # fired in a decision of its own, which checks it under its guard.
        try:
            with self._pooled() as conn:
                tx = _PostgresBackend(conn, self.business_id, self._database_clock)
                now = None if self._database_clock else self.clock.now()
                return tx.due_registrations(now, limit, business_id)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise permission_denied(exc, self._privileges) from None
        except _CONNECTION_LOST as exc:
            raise self._unavailable(exc) from None

    def read_for_visit(self, execution_id: str) -> VisitView | None:
        # One statement outside a transaction block: the server runs it in a
        # transaction of its own, on one snapshot, in one round trip (BEGIN
        # and COMMIT would be two more).
        try:
            with self._pooled() as conn:
                return _PostgresBackend(conn, self.business_id, self._database_clock).visit_view(execution_id)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise permission_denied(exc, self._privileges) from None
        except _CONNECTION_LOST as exc:
            raise self._unavailable(exc) from None

    def _unavailable(self, exc: BaseException) -> StoreError:
        """``store_unavailable`` for a call whose connection failed, or that came after :meth:`close`.

        A closed pool refuses as a lost connection would (psycopg's PoolClosed
        is an OperationalError); told so, a caller would look for a server
        fault that is not there.  The SQLite and in-memory stores say closed.
        """
        if self._closed:
            return StoreError("store_unavailable", f"the PostgreSQL store of schema {self.schema} is closed")
        # The pool hands its idle connections out unchecked (a round trip a request saved).  After a
        # server restart, a failover or an administrator's pg_terminate_backend every one of them is
        # dead, and each failed a request of its own: as many failures in a row as the pool held
        # connections.  Checked now, on the failure's path only, the dead ones are replaced and the
        # next request gets a live connection.
        with contextlib.suppress(Exception):
            self._check_pool()
        return StoreError("store_unavailable", f"PostgreSQL connection failed: {_one_line(exc)}")

    def _visible(self, tx: _PostgresBackend, execution_id: str) -> bool:
        return self.business_id is None or tx.load(execution_id)[0] is not None

    def wait_for_work(self, timeout: float) -> bool:
        """Block until something may have become eligible, or ``timeout`` seconds pass.

        True when a notification arrived.  Workers still poll after a
        timeout: a notification is a hint, never the only way to find work.
        """
        return self._listener.wait(timeout)

    def close(self) -> None:
        self._closed = True
        with self._parked_lock:
            parked = list(self._parked.values())
            self._parked.clear()
        for claim in parked:
            _give_back(self._pool, claim.conn)
        self._listener.close()
        self._close_pool()


class Listener:
    """A store's ``LISTEN`` connection: opened by the first wait, opened again after it is lost, closed with the store.

    A notification is a hint that something may have become eligible, never
    the only way work is found: whoever waits here still polls after a
    timeout.  One thread waits at a time (a process's one listening thread).
    """

    def __init__(self, dsn: str, channel: str, store: str) -> None:
        self._dsn = dsn
        self.channel = channel
        self._store = store
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def listening(self) -> bool:
        """Whether a listening connection is open (none before the first wait, none after :meth:`close`)."""
        return self._conn is not None and not self._conn.closed

    def wait(self, timeout: float) -> bool:
        """Block until a notification arrives (True) or ``timeout`` seconds pass (False)."""
        with self._lock:
            self._refuse_if_closed()
            conn = self._conn
        if conn is None or conn.closed:
            # Opened outside the lock: towards a server that does not answer (a partition), the connect lasts
            # until libpq's connect_timeout, and close() must not wait for it.
            fresh = psycopg.connect(self._dsn, autocommit=True)
            kept = False
            try:
                fresh.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(self.channel)))
                with self._lock:
                    # Closed meanwhile: else a listening connection would be kept that nothing closes.
                    self._refuse_if_closed()
                    if self._conn is None or self._conn.closed:
                        self._conn, kept = fresh, True
                    conn = self._conn
            finally:
                if not kept:  # refused, failed, or another waiter's connection was opened first
                    fresh.close()
        for _ in conn.notifies(timeout=timeout, stop_after=1):
            return True
        return False

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise StoreError("store_unavailable", f"{self._store} is closed")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _one_line(exc: BaseException) -> str:
    # libpq's messages span lines ("... refused\n\tIs the server running..."); errors here are one line.
    return " ".join(str(exc).split())


def _safe(dsn: str) -> str:
    """The DSN without its password, for messages."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "an unparsable DSN"
    params.pop("password", None)
    return make_conninfo("", **params)


# --- a grant the role lacks ------------------------------------------------------------------

# PostgreSQL raises insufficient_privilege (42501) both for row-level security and for a missing
# grant.  Row-level security raises it where a new or moved row fails the policies
# (ExecWithCheckOptions: "new row violates row-level security policy for table ...") and where the
# policies would filter a query run with row_security off (check_enable_rls); a missing grant raises
# it from aclcheck_error ("permission denied for table ...").  The function's name travels with
# every error and, unlike the message, is never translated (lc_messages); the message is the
# fallback for a server that does not send it.
_ROW_SECURITY_SOURCES = frozenset({"ExecWithCheckOptions", "check_enable_rls"})

# aclcheck_error names the object, never the privilege: the role's privileges on it are looked up
# afterwards, among those a store or an application asks for.  A table's name is parsed as an
# identifier (quoted here), a schema's is taken as it is.
_DENIED = re.compile(r"permission denied for (table|view|sequence|schema) (.+)")
_ONE_PER_PRIVILEGE = " FROM unnest(%s::text[]) WITH ORDINALITY AS u(p, n) ORDER BY n"
_ON_TABLE: LiteralString = "SELECT current_user, p, has_table_privilege(%s, p)" + _ONE_PER_PRIVILEGE
_PRIVILEGE_CHECKS: dict[str, tuple[LiteralString, tuple[str, ...]]] = {
    "table": (_ON_TABLE, ("SELECT", "INSERT", "UPDATE", "DELETE")),
    "view": (_ON_TABLE, ("SELECT", "INSERT", "UPDATE", "DELETE")),
    "sequence": ("SELECT current_user, p, has_sequence_privilege(%s, p)" + _ONE_PER_PRIVILEGE, ("USAGE", "SELECT", "UPDATE")),
    "schema": ("SELECT current_user, p, has_schema_privilege(%s, p)" + _ONE_PER_PRIVILEGE, ("USAGE", "CREATE")),
}


def row_security_refusal(exc: psycopg.Error) -> bool:
    """Whether an insufficient_privilege error is row-level security's refusal rather than a missing grant."""
    return exc.diag.source_function in _ROW_SECURITY_SOURCES or "row-level security" in (exc.diag.message_primary or "")


def permission_denied(exc: psycopg.Error, query: Query) -> StoreError:
    """StoreError ``permission_denied`` for a missing grant (SQLSTATE 42501), naming the role, object and privileges.

    ``query`` runs the privilege lookup on a usable connection (the failed
    statement's transaction is aborted); if it fails, the error keeps its
    code and PostgreSQL's own words.
    """
    primary = exc.diag.message_primary or _one_line(exc)
    what = None
    denied = _DENIED.fullmatch(primary)
    if denied is not None:
        kind, name = denied[1], denied[2]
        target = name if kind == "schema" else '"' + name.replace('"', '""') + '"'
        what = _lacking(query, kind, name, target)
    return _permission_denied(what or "the database role lacks a privilege this statement needs", primary)


def _permission_denied(what: str, primary: str | None) -> StoreError:
    said = "" if primary is None else f" (PostgreSQL: {primary})"
    # A deployment's grants, not a tenant or a schema to migrate: an operator looks at GRANTs.
    return StoreError(
        "permission_denied",
        f"{what}: a missing grant, not the tenant boundary. Grant the role what the statement needs "
        f"(docs/operating-postgres.md lists the store's), or run it as the schema's owner (creating tables, "
        f"as an actions module's prepare does, is the owner's); nothing was written{said}",
    )


def _lacking(query: Query, kind: str, name: str, target: str) -> str | None:
    """Which of the privileges a store asks for on ``target`` the current role lacks and holds; None if unknown."""
    statement, privileges = _PRIVILEGE_CHECKS[kind]
    try:
        rows = query(statement, (target, list(privileges)))
    except psycopg.Error:
        # Only a richer message is lost: the code and PostgreSQL's own words remain.
        return None
    missing = [str(r[1]) for r in rows if not r[2]]
    if not rows or not missing:
        return None
    held = [str(r[1]) for r in rows if r[2]]
    return f"role {rows[0][0]} lacks {', '.join(missing)} on {kind} {name} (it has {', '.join(held) or 'none of these'})"


# --- migrations and the deployment check -------------------------------------------------


def migrate(dsn: str, schema: str = "fencekeeper") -> list[int]:
    """Apply every pending migration to ``schema``; returns the versions applied.  Safe to run concurrently."""
    schema = _check_schema_name(schema)
    try:
        conn = psycopg.connect(dsn)
    except psycopg.Error as exc:
        raise StoreError("store_unavailable", f"cannot connect to PostgreSQL ({_safe(dsn)}): {_one_line(exc)}") from None
    applied: list[int] = []
    try:
        with conn.transaction():
            # One migrator at a time, whatever the schema; released at commit.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('fencekeeper.migrate'))")
            # Only when it is missing: PostgreSQL checks the database's CREATE privilege before it
            # looks whether the schema exists, and an owner role given a schema an administrator
            # created for it (docs/operating-postgres.md) has no such privilege and needs none.
            if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is None:
                conn.execute(pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(pgsql.Identifier(schema)))
            conn.execute(pgsql.SQL("SET LOCAL search_path TO {}").format(pgsql.Identifier(schema)))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, name text NOT NULL, "
                "checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"
            )
            version = _recorded_version(lambda statement, params: conn.execute(statement, params).fetchall(), schema)
            for number, name, text in MIGRATIONS:
                if number <= version:
                    continue
                conn.execute(text)
                conn.execute(
                    "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                    (number, name, _checksum(text)),
                )
                applied.append(number)
    finally:
        conn.close()
    return applied


Query = Callable[[Any, Sequence[object]], list[tuple[Any, ...]]]
"""Runs one statement with its parameters and returns its rows (a sync or a bridged async connection's)."""


def check_schema(conn: psycopg.Connection[Any], schema: str) -> int:
    """The deployment check: the schema exists at exactly this code's version, unaltered migrations."""
    return check_schema_with(lambda statement, params: conn.execute(statement, params).fetchall(), schema)


def check_schema_with(query: Query, schema: str) -> int:
    """:func:`check_schema`, its statements run by ``query``."""
    # The catalogs, not information_schema: information_schema lists only what the role holds some
    # privilege on, so a role without its grants would be told to migrate a schema that is there.
    found = query(
        "SELECT has_schema_privilege(n.oid, 'USAGE'), has_table_privilege(c.oid, 'SELECT') FROM pg_namespace n "
        "JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = 'schema_migrations' WHERE n.nspname = %s",
        (schema,),
    )
    newest = max(number for number, _, _ in MIGRATIONS)
    if not found:
        raise StoreError(
            "schema_missing",
            f"schema {schema!r} has no fencekeeper tables; run `fencekeeper migrate --db ...` first",
        )
    usage, select = found[0]
    if not usage:
        what = _lacking(query, "schema", schema, schema)
        raise _permission_denied(what or f"the database role lacks USAGE on schema {schema}", None)
    if not select:
        raise unreadable_table(query, schema, "schema_migrations")
    version = _recorded_version(query, schema)
    if version < newest:
        raise StoreError(
            "schema_outdated",
            f"schema {schema!r} is at version {version}, this fencekeeper needs {newest}; run `fencekeeper migrate`",
        )
    return version


def unreadable_table(query: Query, schema: str, table: str) -> StoreError:
    """``permission_denied`` for a table of ``schema`` the catalogs list but the role may not SELECT from.

    For a check that looks before it reads: no statement was refused, so the
    privileges are looked up by name (``query`` runs the lookup).
    """
    # The schema's name is checked ([a-z_][a-z0-9_]*) and the table's is the store's own: quoting needs no escaping.
    what = _lacking(query, "table", table, f'"{schema}".{table}')
    return _permission_denied(what or f"the database role lacks SELECT on table {schema}.{table}", None)


def _recorded_version(query: Query, schema: str) -> int:
    rows = query(
        pgsql.SQL("SELECT version, name, checksum FROM {}.schema_migrations ORDER BY version").format(
            pgsql.Identifier(schema)
        ),
        (),
    )
    known = {number: (name, _checksum(text)) for number, name, text in MIGRATIONS}
    newest = max(known)
    version = 0
    for number, name, checksum in rows:
        if number > newest:
            raise StoreError(
                "schema_too_new",
                f"schema {schema!r} is at version {number} ({name}), newer than this fencekeeper (version "
                f"{newest}); upgrade fencekeeper before running it against this database",
            )
        if known.get(number) != (name, checksum):
            raise StoreError(
                "schema_altered", f"schema {schema!r}: migration {number} ({name}) differs from this fencekeeper's"
            )
        version = number
    return version


__all__ = [
    "CHANNEL",
    "MIGRATIONS",
    "PREDICTED_AT",
    "Listener",
    "PostgresStore",
    "check_schema",
    "check_schema_name",
    "check_schema_with",
    "migrate",
    "permission_denied",
    "row_security_refusal",
    "unreadable_table",
]
