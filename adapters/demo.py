"""``fencekeeper demo``: purchase approvals, a worker fenced out, a recovery, decisions; all real.

Rules of this module:

- Nothing is scripted or faked.  The demo drives the real kernel through a
  real store (a fresh SQLite file by default, or the ``--db`` given), real
  :class:`~fencekeeper.adapters.worker.Worker` objects on the system clock,
  and the service functions an operator or reviewer calls.  Every timeline
  line is either a transition record read back from the store, a refusal the
  store returned, or a note saying what is about to be done.
- The scenario (docs/examples/purchase_approval.toml, shipped as
  ``adapters/workflows/purchase_approval.toml``):

  1. four purchase orders are admitted, above and below the approval
     threshold of 1,000;
  2. worker w-1 claims the first with a one-second lease, plans its visit
     through the interpreter, and pauses past the lease before committing;
     worker w-2 runs the other three meanwhile; when w-1 tries to commit, the
     store refuses it (``lease_expired``);
  3. the operator quarantines the expired execution and a governed recovery
     (``workflow_reconcile``, safe resume: no Command was issued) makes it
     eligible; w-2 claims it with a new fence; w-1 tries once more with its
     old lease and is refused again (``lease_token_mismatch``); w-2 runs on;
  4. reviewers decide: an approval wakes its waiter, the same decision again
     is idempotent, a later contradicting decision is kept in history without
     changing anything, a rejection sends an order to its rejected end, and
     the requester deciding their own order is refused;
  5. w-2 runs what was woken; a closing table shows every execution.

- The database is kept, so the ``fencekeeper inspect`` command printed at the
  end works.  Beside it (for PostgreSQL, in a new temporary directory) the
  demo writes ``<id>.sequence.mmd``, the fenced-out execution's history as a
  mermaid sequence diagram (``adapters/sequence.py``: what ``inspect
  --format mermaid`` draws, plus the refusals w-1 was given, which no store
  records because a refusal writes nothing), and prints where.  With a PostgreSQL ``--db`` the demo migrates the schema first
  (the one place besides ``fencekeeper migrate`` that does).
- The demo checks its own story: if a late write by w-1 were ever accepted,
  or w-1 left any record but its claim, it says so and exits 1.
"""

from __future__ import annotations

import importlib.resources
import secrets
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

import attrs
from rich.text import Text

from fencekeeper.kernel import approvals
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import parse_definition

from . import connect, examples, service
from .ports import WORKFLOW_DISPATCH, AuthorityPolicy, ask
from .render import REFUSED_STYLE, Output, render_table, state, text, token
from .sequence import Observed, sequence_diagram
from .store import ExecutionView, TransactionalStore
from .worker import PassReport, Worker

BUSINESS = "default"
REQUESTER = "user:operator"
MANAGER = "user:manager"
CFO = "user:cfo"
LEASE = timedelta(seconds=1)
AMOUNTS = (2500, 400, 12000, 5000)
"""The first is the one w-1 claims; the threshold of the workflow is 1,000."""


def workflow_text(name: str) -> str:
    """A teaching workflow as shipped in the package (the same bytes as docs/examples/<name>)."""
    return (importlib.resources.files("fencekeeper.adapters") / "workflows" / name).read_text(encoding="utf-8")


@attrs.define
class _Timeline:
    """Prints what happened, from the store's own transition records, in commit order."""

    out: Output
    store: TransactionalStore
    ids: Sequence[str]
    seen: dict[str, int] = attrs.field(factory=dict)
    origin: datetime | None = None
    observed: list[Observed] = attrs.field(factory=list)
    """Refusals the store returned to w-1: they wrote nothing, so only the run knows them."""

    def _offset(self, moment: datetime) -> str:
        if self.origin is None:
            self.origin = moment
        return f"+{(moment - self.origin).total_seconds():.3f}s"

    def _row(self, moment: datetime, who: str, execution_id: str, *what: str | Text | tuple[str, str]) -> None:
        width = max(len(x) for x in self.ids)
        self.out.line(f"{self._offset(moment):>8}  {who:<13}  {execution_id:<{width}}  ", *what)

    def sync(self) -> None:
        records: list[p.TransitionRecord] = []
        for execution_id in self.ids:
            view = self.store.read(execution_id)
            if view is None:
                continue
            done = self.seen.get(execution_id, 0)
            records.extend(view.history[done:])
            self.seen[execution_id] = len(view.history)
        for r in sorted(records, key=lambda r: (r.at, r.execution_id, r.revision)):
            event = "admit" if r.event is None else r.event.value
            lease = f"fence {r.fence}" + (f" token {token(r.lease_token)}" if r.lease_token else "")
            move = text(
                (f"{event:<19}", "bold"),
                state(r.from_state) if r.from_state else "",
                " -> " if r.from_state else "-> ",
                state(r.to_state),
            )
            pad = " " * max(1, 56 - len(move.plain))
            self._row(r.at, r.actor, r.execution_id, move, pad, f"{lease:<24}", (r.reason, "dim"))

    def refused(self, who: str, execution_id: str, what: str, outcome: p.Refusal) -> None:
        self._row(
            self.store.clock.now(),
            who,
            execution_id,
            (f"{what:<19}", "bold"),
            ("REFUSED ", REFUSED_STYLE),
            (f"[{outcome.code.value}]", REFUSED_STYLE),
            f" {outcome.message}",
        )

    def said(
        self, who: str, execution_id: str, *what: str | Text | tuple[str, str], at: datetime | None = None
    ) -> None:
        self._row(at or self.store.clock.now(), who, execution_id, *what)

    def note(self, message: str) -> None:
        self.out.line(("          " + message, "italic dim"))


class _Unexpected(Exception):
    """The store did something the protocol forbids; the demo reports it and exits 1."""


def run(out: Output, *, db: str | None = None, schema: str | None = None, lease: timedelta = LEASE) -> int:
    """Play the scenario; 0 when everything the protocol promises held, 1 otherwise."""
    if db is None:
        directory = Path(tempfile.mkdtemp(prefix="fencekeeper-demo-"))
        db = str(directory / "demo.db")
    location = connect.parse_url(db, schema=schema)
    if location.kind == "postgresql":
        connect.migrate(db, schema=schema)
    store = connect.open_store(db, schema=schema)
    try:
        return _play(out, store=store, db=db, schema=schema, location=location, lease=lease)
    except _Unexpected as exc:
        out.line(("UNEXPECTED: ", REFUSED_STYLE), str(exc))
        return 1
    finally:
        store.close()


def _play(
    out: Output,
    *,
    store: TransactionalStore,
    db: str,
    schema: str | None,
    location: connect.Location,
    lease: timedelta,
) -> int:
    out.line(
        ("fencekeeper demo", "bold"), ": purchase approvals through the real kernel, store, workers and service calls"
    )
    out.line(f"store: {location.kind} {location.describe()}")
    # A database that already holds executions (a second run against the same --db) gets fresh
    # ids in a business of this run's own, so that no earlier work is claimed or decided.
    if store.execution_ids():
        tag = secrets.token_hex(2)
        business, prefix = f"demo-{tag}", f"po-{tag}"
    else:
        business, prefix = BUSINESS, "po"
    policy = examples.grants(business, REQUESTER, MANAGER, CFO)
    definition = parse_definition(workflow_text("purchase_approval.toml"), "purchase_approval.toml")
    service.register(store, definition, business, REQUESTER, policy)
    ids = [f"{prefix}-{n}" for n in range(1, len(AMOUNTS) + 1)]
    timeline = _Timeline(out, store, ids)
    story: dict[str, str] = {}

    _heading(out, "1. Admit four purchase orders; the workflow asks a manager above 1,000")
    for n, (execution_id, amount) in enumerate(zip(ids, AMOUNTS, strict=True), start=1):
        admitted = service.run(
            store,
            policy,
            business_id=business,
            principal_id=REQUESTER,
            definition_id=definition.definition_id,
            input={"amount": amount, "order_id": f"o-{1000 + n}", "order_revision": 1},
            execution_id=execution_id,
        )
        if not isinstance(admitted, p.Decision):
            raise _Unexpected(f"admission of {execution_id} was refused: {admitted.message}")
    timeline.sync()

    _heading(out, f"2. Two workers, leases of {lease.total_seconds():g} s; w-1 pauses past its lease")
    first = ids[0]
    claim = store.claim_next(p.ClaimRequest("w-1", secrets.token_hex(16), lease), business_id=business)
    if not isinstance(claim, p.Decision) or claim.lease is None or claim.execution is None:
        raise _Unexpected(f"w-1 could not claim: {claim}")
    if claim.execution.execution_id != first:
        raise _Unexpected(f"w-1 claimed {claim.execution.execution_id}, not the first admitted {first}")
    stale = claim.lease
    timeline.sync()
    view = store.read(first)
    assert view is not None
    ctx = i.context_from_evidence(
        view.execution,
        store.load_definition(business, view.execution.definition_id, view.execution.definition_revision),
        view.evidence,
    )
    plan = i.plan_visit(ctx, store.clock.now(), worker_id="w-1", fence=stale.fence)
    if not isinstance(plan, i.Step):
        raise _Unexpected(f"the first visit of {first} planned {type(plan).__name__}, not a step")
    authority = ask(policy, ctx.principal_id, business, WORKFLOW_DISPATCH, ((first, view.execution.revision),))
    late_step = p.StepRequest(stale, view.execution.revision, plan.step, authority)
    timeline.said(
        "w-1",
        first,
        (f"{'plan':<19}", "bold"),
        f"{plan.step.node_id} -> {plan.step.next_node_id} (attempt {plan.step.attempt_id}); pauses before committing",
    )

    worker = Worker(
        store,
        "w-2",
        policy,
        examples.handler(),
        lease=lease,
        business_id=business,
        on_event=lambda execution_id, what, detail: _worker_said(timeline, "w-2", execution_id, what, detail),
    )
    worker.run_pass()
    timeline.sync()

    deadline = time.monotonic() + lease.total_seconds() + 10
    while first not in store.expired():
        if time.monotonic() > deadline:
            raise _Unexpected(f"the lease on {first} never expired")
        time.sleep(0.05)
    timeline.note(f"w-1's lease on {first} has expired; w-1 wakes and commits the visit it planned")
    refusals: list[str] = []
    _expect_refusal(
        timeline,
        "w-1",
        first,
        what="record_step",
        outcome=store.record_step(first, late_step, plan.evidence),
        refusals=refusals,
    )

    _heading(out, "3. The operator quarantines and recovers it; w-2 claims it with a new fence")
    quarantined = service.quarantine_expired(store, policy, business_id=business, principal_id=REQUESTER)
    if not isinstance(quarantined.outcomes.get(first), p.Decision):
        raise _Unexpected(f"quarantine of {first} was not applied: {quarantined}")
    timeline.sync()
    review = service.recovery_view(store, business_id=business, execution_id=first)
    if review.unresolved or not review.permitted:
        raise _Unexpected(f"{first} should be resumable at its node: {review}")
    timeline.note(
        f"the evidence: no Command issued, nothing to settle; the operator chooses to resume at {review.permitted[0]}"
    )
    resumed = service.resume(
        store,
        policy,
        business_id=business,
        principal_id=REQUESTER,
        execution_id=first,
        at_node=review.permitted[0],
        rationale="w-1's visit committed nothing and its node has no external effect",
    )
    if not isinstance(resumed, p.Decision):
        raise _Unexpected(f"recovery of {first} was refused: {resumed}")
    timeline.sync()
    reclaim = store.claim_next(p.ClaimRequest("w-2", secrets.token_hex(16), lease), business_id=business)
    if not isinstance(reclaim, p.Decision) or reclaim.lease is None:
        raise _Unexpected(f"w-2 could not claim {first} again: {reclaim}")
    timeline.sync()
    timeline.note("w-1, still holding its old lease, tries once more")
    _expect_refusal(
        timeline,
        "w-1",
        first,
        what="record_step",
        outcome=store.record_step(first, late_step, plan.evidence),
        refusals=refusals,
    )
    report = PassReport()
    worker.drive(first, reclaim.lease, report)
    timeline.sync()
    story[first] = f"w-1 refused twice ({', '.join(refusals)}); quarantined, recovered, approved"

    _heading(out, "4. Reviewers decide")
    waiting = [x for x in ids if (v := store.read(x)) is not None and v.execution.state.value == "waiting"]
    if first not in waiting or len(waiting) < 3:
        raise _Unexpected(f"expected three orders waiting for approval, found {waiting}")
    third, fourth = waiting[1], waiting[2]
    _decide(
        timeline,
        store,
        policy,
        business=business,
        execution_id=first,
        reviewer=MANAGER,
        determination="approved",
        decision_id=f"d-{first}-1",
    )
    timeline.note("the same decision is delivered again")
    _decide(
        timeline,
        store,
        policy,
        business=business,
        execution_id=first,
        reviewer=MANAGER,
        determination="approved",
        decision_id=f"d-{first}-1",
    )
    timeline.note(f"{CFO} rejects after the approval has committed")
    _decide(
        timeline,
        store,
        policy,
        business=business,
        execution_id=first,
        reviewer=CFO,
        determination="rejected",
        decision_id=f"d-{first}-2",
    )
    _decide(
        timeline,
        store,
        policy,
        business=business,
        execution_id=third,
        reviewer=MANAGER,
        determination="rejected",
        decision_id=f"d-{third}-1",
    )
    story[third] = f"rejected by {MANAGER}"
    timeline.note(f"{REQUESTER} requested {fourth} and tries to approve it")
    _decide(
        timeline,
        store,
        policy,
        business=business,
        execution_id=fourth,
        reviewer=REQUESTER,
        determination="approved",
        decision_id=f"d-{fourth}-1",
    )
    story[fourth] = "awaits a reviewer; its requester may not decide it"

    _heading(out, "5. w-2 runs what the decisions woke")
    worker.run_pass()
    timeline.sync()

    _heading(out, "Every execution")
    rows = []
    for execution_id, amount in zip(ids, AMOUNTS, strict=True):
        final = store.read(execution_id)
        assert final is not None
        x = final.execution
        rows.append(
            (
                execution_id,
                f"{amount:,}",
                state(x.state),
                x.current_node_id or "-",
                str(x.fence),
                str(x.step_count),
                final.dispatch.last_error_code or "-",
                story.get(execution_id, "below the threshold: no approval needed" if amount < 1000 else ""),
            )
        )
    render_table(
        out.out, ("execution", "amount", "state", "node", "fence", "steps", "last error", "what happened"), rows
    )

    history = store.read(first)
    assert history is not None
    by_w1 = [r for r in history.history if r.actor == "w-1"]
    if len(by_w1) != 1 or by_w1[0].event is None or by_w1[0].event.value != "claim":
        raise _Unexpected(f"w-1 left {len(by_w1)} records in {first}'s history; only its claim was expected")
    out.line("")
    times = {1: "once", 2: "twice"}.get(len(refusals), f"{len(refusals)} times")
    out.line(f"w-1 was refused {times} and changed nothing: its only record in {first}'s history is its claim.")
    out.line("Inspect any of them (the database is kept):")
    out.line(("  fencekeeper inspect ", "bold"), (f"{first} {connect.db_option(db, schema)}", "bold"))
    picture = _write_sequence(history, timeline.observed, location)
    out.line(f"The history of {first} as a mermaid sequence diagram, with w-1's refusals:")
    out.line("  ", (str(picture), "bold"))
    return 0


def _write_sequence(view: ExecutionView, observed: Sequence[Observed], location: connect.Location) -> Path:
    """The fenced-out execution's sequence diagram, beside a SQLite database (in a new temporary directory
    for PostgreSQL); what ``fencekeeper inspect ID --format mermaid`` draws, plus the refusals w-1 was given."""
    if location.kind == "sqlite" and location.path is not None:
        directory = location.path.resolve().parent
    else:
        directory = Path(tempfile.mkdtemp(prefix="fencekeeper-demo-"))
    path = directory / f"{view.execution.execution_id}.sequence.mmd"
    path.write_text(sequence_diagram(view, observed), encoding="utf-8")
    return path


def _heading(out: Output, title: str) -> None:
    out.line("")
    out.line((title, "bold underline"))


def _worker_said(timeline: _Timeline, who: str, execution_id: str, what: str, detail: str) -> None:
    timeline.sync()
    if what == "command":
        timeline.said(who, execution_id, (f"{'command':<19}", "bold"), detail)
    elif what == "refused":
        timeline.said(who, execution_id, ("refused", REFUSED_STYLE), f" {detail}")


def _expect_refusal(
    timeline: _Timeline, who: str, execution_id: str, *, what: str, outcome: p.Outcome, refusals: list[str]
) -> None:
    if not isinstance(outcome, p.Refusal):
        raise _Unexpected(f"{who}'s late {what} on {execution_id} was not refused: {outcome}")
    refusals.append(outcome.code.value)
    view = timeline.store.read(execution_id)
    at = view.execution.revision if view is not None else 0
    timeline.observed.append(Observed.refusal(at, who, f"{what} (its old lease)", outcome))
    timeline.refused(who, execution_id, what, outcome)
    timeline.sync()


def _decide(
    timeline: _Timeline,
    store: TransactionalStore,
    policy: AuthorityPolicy,
    *,
    business: str,
    execution_id: str,
    reviewer: str,
    determination: str,
    decision_id: str,
) -> None:
    request = service.approval_request(store, execution_id)
    if request is None:
        raise _Unexpected(f"{execution_id} has no approval request")
    outcome = service.decide(
        store,
        policy,
        business_id=business,
        reviewer_id=reviewer,
        request=request,
        determination=determination,
        decision_id=decision_id,
    )
    what = (f"{'decide ' + determination:<19}", "bold")
    if isinstance(outcome, p.Decision):
        # The decision and the wake commit together; the wake's record carries their time.
        at = outcome.evidence[0].at if outcome.evidence else None
        timeline.said(
            reviewer, execution_id, what, ("accepted", "green"), f" as {decision_id}; the waiter wakes", at=at
        )
    elif isinstance(outcome, p.Unchanged):
        timeline.said(
            reviewer, execution_id, what, (f"unchanged [{outcome.code.value}]", "yellow"), f" {outcome.message}"
        )
    elif isinstance(outcome, approvals.Recorded):
        timeline.said(reviewer, execution_id, what, ("kept in history", "yellow"), f" {outcome.message}")
    elif isinstance(outcome, p.Refusal):
        timeline.refused(reviewer, execution_id, "decide " + determination, outcome)
    else:
        raise _Unexpected(f"decision {decision_id} returned {outcome!r}")
    timeline.sync()


__all__ = ["AMOUNTS", "LEASE", "run", "workflow_text"]
