"""One worker process of the chaos run: ``fencekeeper worker`` itself, with a ledger of every write it asks for.

Run as ``python -m tests.chaos.worker --ledger FILE -- worker --db URL ...``:
everything after ``--`` goes to :func:`fencekeeper.adapters.cli.main`
unchanged, so the process is the command line's worker (its threads, its
retries after a lost connection, its signal handling, its handler loading)
and nothing else.  The one difference: the store the command line opens is
wrapped by :class:`LedgeredStore`, which writes each write request into the
ledger in the format :mod:`tests.stores.ledger_audit` reads:

- an ``intent`` line before the request (operation, execution, credential,
  evidence), a ``done`` line when it returns (``returned``, or
  ``unavailable`` with the exception: its outcome is then unknown) and a
  result line (decision with its transition events, refusal or unchanged
  with the code);
- the ledger is line buffered, so a SIGKILL loses at most the line being
  written; every line carries the worker id of the credential and a
  sequence number unique in the process.

Evidence is named ``object_id#revision#digest`` in the ledger (:func:`evidence_key`),
since one evidence object (a step attempt) gets revisions from several requests.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Collection, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

import attrs

from fencekeeper.adapters import cli, connect
from fencekeeper.adapters.store import Composed, NextClaim, NextVisit, Planner
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.evidence import Evidence


def evidence_key(object_id: str, revision: int, body: str) -> str:
    """One committed revision of an evidence object, and what it says.

    Two requests may carry the same revision of one object (a worker's
    settlement of an attempt refused, then the reconciliation's): the digest
    of the body tells whose landed.
    """
    return f"{object_id}#{revision}#{hashlib.sha256(body.encode()).hexdigest()[:12]}"


@attrs.frozen
class _Noted:
    """A request's intent line, and what its result line repeats."""

    op: str
    execution_id: str | None
    token: str | None
    fence: int | None
    keys: list[str]
    common: dict[str, Any]
    before: datetime


class LedgeredStore:
    """A store that writes every write request, and how it ended, to a ledger; everything else passes through."""

    def __init__(self, store: Any, ledger: TextIO) -> None:
        self._store = store
        self._ledger = ledger
        self._lock = threading.Lock()
        self._seq = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def _line(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self._ledger.write(json.dumps(entry, sort_keys=True, default=str) + "\n")

    def _next(self) -> int:
        with self._lock:
            self._seq += 1
            return self._seq

    def _write(
        self,
        op: str,
        execution_id: str | None,
        who: tuple[str, str | None, int | None],
        evidence: Sequence[Evidence],
        call: Callable[[], Any],
    ) -> Any:
        """``who`` is the credential the request carries: worker id, lease token, fence."""
        noted = self._intent(op, execution_id, who, evidence)
        try:
            outcome = call()
        except BaseException as exc:
            self._line({**noted.common, "done": "unavailable", "error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"})
            raise
        self._returned(noted, outcome)
        return outcome

    def _intent(
        self, op: str, execution_id: str | None, who: tuple[str, str | None, int | None], evidence: Sequence[Evidence]
    ) -> _Noted:
        """The intent line, written (and flushed: the ledger is line buffered) before the request can commit."""
        worker, token, fence = who
        seq = self._next()
        keys = [evidence_key(e.object_id, e.revision, e.body_json()) for e in evidence]
        common = {"worker": worker, "seq": seq}
        self._line(
            {**common, "intent": op, "t": time.time(), "execution_id": execution_id, "token": token, "fence": fence,
             "evidence": keys}
        )
        return _Noted(op, execution_id, token, fence, keys, common, datetime.now(UTC))

    def _returned(self, noted: _Noted, outcome: Any) -> None:
        self._line({**noted.common, "done": "returned"})
        if outcome is None:
            return  # claim_next found nothing to claim
        entry: dict[str, Any] = {
            **noted.common,
            "op": noted.op,
            "execution_id": noted.execution_id,
            "token": noted.token,
            "fence": noted.fence,
            "before": noted.before.isoformat(),
            "zombie": None,
            "evidence": noted.keys,
        }
        if isinstance(outcome, p.Decision):
            if outcome.execution is not None:
                entry["execution_id"] = outcome.execution.execution_id
            if outcome.lease is not None:
                entry["fence"] = outcome.lease.fence
            entry["result"] = "decision"
            entry["events"] = [r.event.value if r.event is not None else None for r in outcome.evidence]
        elif isinstance(outcome, p.Refusal):
            entry["result"] = "refusal"
            entry["code"] = outcome.code.value
        else:
            entry["result"] = "unchanged"
            entry["code"] = outcome.code.value
        self._line(entry)

    def _composed(
        self,
        op: str,
        execution_id: str | None,
        who: tuple[str, str | None, int | None],
        evidence: Sequence[Evidence],
        *,
        plan: Planner,
        call: Callable[[Planner], Composed],
        claim_after: Sequence[p.ClaimRequest] = (),
    ) -> Composed:
        """A composed transaction: a ledger request for its first decision and one for each visit it plans.

        A planned visit's intent line is written when the planner returns it,
        inside the transaction and before it can commit, so a process killed
        there leaves that visit of unknown outcome, as any request cut short.
        A visit planned by an attempt the store then decided again stays
        unknown too (it did not commit; unknown allows that).  A claim the
        transaction may make after its finalize (``claim_after``, a store
        that composes claims) is a request of its own, written before the
        transaction begins, and answered with the claim it made, or none; so
        is each further claim offered after that one's finalize.
        """
        noted: dict[int, _Noted] = {}

        def planner(view: Any, now: datetime, credential: p.LeaseCredential) -> NextVisit | None:
            visit = plan(view, now, credential)
            if visit is not None:
                request = visit.request
                if isinstance(request, p.StepRequest):
                    visit_op = "record_step"
                elif isinstance(request, p.FinalizeRequest):
                    visit_op = f"finalize_{getattr(request.target_state, 'value', request.target_state)}"
                else:
                    visit_op = "append_evidence"  # a Command's intent
                noted[id(visit)] = self._intent(
                    visit_op,
                    view.execution.execution_id,
                    (credential.worker_id, credential.lease_token, credential.fence),
                    visit.evidence,
                )
            return visit

        first = self._intent(op, execution_id, who, evidence)
        afters = [self._intent("claim", None, (made.worker_id, made.lease_token, None), ()) for made in claim_after]
        try:
            composed = call(planner)
        except BaseException as exc:
            error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
            for line in (first, *afters, *noted.values()):
                self._line({**line.common, "done": "unavailable", "error": error})
            raise
        self._returned(first, composed.outcome)
        for visit, outcome in composed.followed:
            self._returned(noted[id(visit)], outcome)
        then = composed.then
        for after in afters:
            self._returned(after, None if then is None else then.outcome)
            for visit, outcome in () if then is None else then.followed:
                self._returned(noted[id(visit)], outcome)
            then = None if then is None else then.then
        return composed

    # --- the write requests the worker makes ------------------------------------------------

    def claim_next(self, request: p.ClaimRequest, *, business_id: str | None = None) -> Any:
        return self._write(
            "claim", None, (request.worker_id, request.lease_token, None), (),
            lambda: self._store.claim_next(request, business_id=business_id),
        )

    @property
    def reads_ahead(self) -> bool:
        # The worker's next claim read ahead, as the store it wraps does it (PostgreSQL): the campaign
        # ends backends in the middle of those exchanges too.
        return getattr(type(self._store), "reads_ahead", False) is True

    @property
    def composes_claims(self) -> bool:
        # A claim's or step's transaction that claims next, as the store it wraps makes it (PostgreSQL): that claim is
        # a ledger request of its own (_composed), and killed workers and ended backends meet it too.
        return getattr(type(self._store), "composes_claims", False) is True

    def claim_and_visit(
        self,
        request: p.ClaimRequest,
        plan: Planner,
        *,
        business_id: str | None = None,
        skip: Collection[str] = (),
        **ahead: Any,
    ) -> Composed:
        # The worker's claim, and the visits composed into its transaction: each its own ledger request,
        # and so is a claim offered after its finalize.
        then = ahead.get("next_claim")
        return self._composed(
            "claim", None, (request.worker_id, request.lease_token, None), (), plan=plan,
            call=lambda planner: self._store.claim_and_visit(request, planner, business_id=business_id, skip=skip, **ahead),
            claim_after=_offered(then) if self.composes_claims else (),
        )

    def record_step_and_visit(
        self, execution_id: str, request: p.StepRequest, evidence: Sequence[Evidence], plan: Planner, **ahead: Any
    ) -> Composed:
        c = request.credential
        then = ahead.get("next_claim")
        return self._composed(
            "record_step", execution_id, (c.worker_id, c.lease_token, c.fence), evidence, plan=plan,
            call=lambda planner: self._store.record_step_and_visit(execution_id, request, evidence, planner, **ahead),
            claim_after=_offered(then) if self.composes_claims else (),
        )

    def renew(self, execution_id: str, request: p.RenewRequest) -> Any:
        c = request.credential
        return self._write(
            "renew", execution_id, (c.worker_id, c.lease_token, c.fence), (),
            lambda: self._store.renew(execution_id, request),
        )

    def record_step(self, execution_id: str, request: p.StepRequest, evidence: Sequence[Evidence] = ()) -> Any:
        c = request.credential
        return self._write(
            "record_step", execution_id, (c.worker_id, c.lease_token, c.fence), evidence,
            lambda: self._store.record_step(execution_id, request, evidence),
        )

    def release(self, execution_id: str, request: p.ReleaseRequest) -> Any:
        c = request.credential
        return self._write(
            "release", execution_id, (c.worker_id, c.lease_token, c.fence), (),
            lambda: self._store.release(execution_id, request),
        )

    def finalize(self, request: p.FinalizeRequest, evidence: Sequence[Evidence] = ()) -> Any:
        return self._write(
            f"finalize_{request.target_state.value}", request.execution_id,
            (request.worker_id, request.lease_token, request.fence), evidence, lambda: self._store.finalize(request, evidence),
        )

    def append_evidence(self, execution_id: str, credential: p.LeaseCredential, evidence: Sequence[Evidence]) -> Any:
        return self._write(
            "append_evidence", execution_id, (credential.worker_id, credential.lease_token, credential.fence), evidence,
            lambda: self._store.append_evidence(execution_id, credential, evidence),
        )

    def fire_timer(self, key: p.WaitKey, authority: p.Authority) -> Any:
        return self._write(
            # The timer's principal is shared by every process: the pid keeps ledger keys apart.
            "fire_timer", key.execution_id, (f"{authority.principal_id}@{os.getpid()}", None, None), (),
            lambda: self._store.fire_timer(key, authority),
        )


def _offered(then: NextClaim | None) -> tuple[p.ClaimRequest, ...]:
    """The claims a transaction is offered to make after its finalizes, in order (none without a request)."""
    return () if then is None or then.request is None else (then.request, *then.more)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.worker")
    parser.add_argument("--ledger", required=True, help="the ledger file, one JSON object a line")
    parser.add_argument("fencekeeper", nargs=argparse.REMAINDER, help="-- then fencekeeper's own arguments")
    args = parser.parse_args(argv)
    rest = args.fencekeeper[1:] if args.fencekeeper[:1] == ["--"] else args.fencekeeper
    with open(args.ledger, "a", encoding="utf-8", buffering=1) as ledger:
        opened = connect.open_store

        def open_ledgered(*a: Any, **k: Any) -> Any:
            return LedgeredStore(opened(*a, **k), ledger)

        connect.open_store = open_ledgered  # type: ignore[assignment]
        return cli.main(rest)


if __name__ == "__main__":
    raise SystemExit(main())
