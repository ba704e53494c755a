"""One worker process of the drain test (``tests/stores/test_sqlite_concurrency.py``).

Run as ``python -m tests.stores.drain_worker --db FILE --worker ID --seed N --lease S
--stop FILE --log FILE --deadline EPOCH``.  It is a separate *process* with its
own ``SQLiteStore`` connection, so the only thing the workers share is the
SQLite file and its locks, as real workers would.

What it does, until the stop file appears (or the deadline passes):

- ``claim_next`` with a fresh token and a short lease;
- sometimes pauses long enough that its lease expires mid-work, so that the
  reconciler in the test quarantines the execution and another worker may
  claim it again;
- records a step with evidence, sometimes renews, sometimes appends evidence,
  rarely releases, then finalizes to a random permitted target (mostly
  ``succeeded``) with evidence;
- keeps every credential that has stopped being valid (displaced, released
  or finalized) and deliberately retries finalize/renew/release/append
  evidence/record step with it, as a zombie worker would, sometimes presenting
  the execution's *current* revision (re-read from the store) so that only the
  credential can be what refuses it:

  * straight after being displaced;
  * after waiting for another worker to claim the execution (``haunt``), with
    its own dead credential and with a forged one (the new holder's token and
    fence under its own worker id);
  * when it claims an execution again that it held before, with the old
    credential while it holds the new one;
  * at random later on;
  * and, now and then, with a forged credential under its own worker id: a
    running execution's live token and fence (read from the store), or a
    token never issued with the live fence.

- ``--reuse-token`` makes the worker careless: every claim uses the same
  token, so when it claims an execution again only the fence tells its old
  credential from its new one (seed 001: the fence holds "even if a caller
  reused a token").

Every request it makes is written to its ledger (one JSON object a line):
which operation, on which execution, with which credential, the wall time
just before the call (the store reads its own clock inside the transaction,
so the decision's time is at or after it), the outcome and its code, the
evidence ids it tried to commit and, for a deliberate zombie retry,
``"zombie": "dead"`` or ``"forged"``.  The test compares the ledgers with the
database.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

import attrs

from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import Evidence, Store, SystemClock
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import ExecutionState

# Refusals that mean "this credential no longer writes, ever": tokens are
# fresh per claim, so once one of these is returned for a credential no later
# request carrying it may succeed.
DEAD_CODES = frozenset(
    {
        p.RefusalCode.DISPATCH_NOT_CLAIMED.value,
        p.RefusalCode.EXECUTION_NOT_RUNNING.value,
        p.RefusalCode.LEASE_TOKEN_MISMATCH.value,
        p.RefusalCode.WORKER_MISMATCH.value,
        p.RefusalCode.LEASE_EXPIRED.value,
        p.RefusalCode.STALE_FENCE.value,
    }
)

# Mostly succeeded; every other permitted target occurs, so the run has
# terminal failures, review states and waits (which the reconciler wakes).
TARGETS: tuple[tuple[ExecutionState, float], ...] = (
    (ExecutionState.SUCCEEDED, 0.70),
    (ExecutionState.FAILED, 0.10),
    (ExecutionState.WAITING, 0.08),
    (ExecutionState.SUSPENDED, 0.06),
    (ExecutionState.RECONCILIATION_REQUIRED, 0.06),
)

WAIT_EVENT = "approved"
WAIT_NODE = "approve"


def wait_spec(execution_id: str, fence: int) -> p.WaitSpec:
    """The registration a waiting finalization commits; the attempt is the fence, so it is unique."""
    return p.WaitSpec(
        node_id=WAIT_NODE,
        attempt_id=f"f{fence}",
        event_type=WAIT_EVENT,
        correlation=(("execution", execution_id),),
    )


@attrs.define
class Held:
    """What a worker knows about one claim: the credential and the revision it last wrote."""

    execution_id: str
    business_id: str
    credential: p.LeaseCredential
    revision: int


class Worker:
    def __init__(self, args: argparse.Namespace, ledger: TextIO, store: Store | None = None) -> None:
        # Any store: the PostgreSQL fault test runs this same worker against its store.
        self.store: Store = store if store is not None else SQLiteStore(args.db, SystemClock())
        self.worker_id: str = args.worker
        self.rng = random.Random(args.seed)
        self.lease = timedelta(seconds=args.lease)
        self.pause_probability: float = args.pause
        self.stop = Path(args.stop)
        self.reuse_token: str | None = uuid.uuid4().hex if args.reuse_token else None
        self.deadline: float = args.deadline
        self.ledger = ledger
        self.seq = 0
        self.dead: list[Held] = []
        self.authority = p.Authority(True, self.worker_id)

    # --- the ledger -----------------------------------------------------------

    def _log(
        self,
        op: str,
        held: Held | None,
        before: datetime,
        outcome: p.Outcome | None,
        *,
        evidence: Sequence[Evidence] = (),
        zombie: str | None = None,
        presented_revision: int | None = None,
        token: str | None = None,
        fence: int | None = None,
    ) -> None:
        entry: dict[str, Any] = {
            "seq": self.seq,
            "op": op,
            "worker": self.worker_id,
            "execution_id": held.execution_id if held is not None else None,
            "token": held.credential.lease_token if held is not None else token,
            "fence": held.credential.fence if held is not None else fence,
            "before": before.isoformat(),
            "zombie": zombie,
            "presented_revision": presented_revision,
            "evidence": [e.object_id for e in evidence],
        }
        if outcome is None:
            entry["result"] = "none"
        elif isinstance(outcome, p.Decision):
            entry["result"] = "decision"
            entry["events"] = [r.event.value if r.event is not None else None for r in outcome.evidence]
            entry["revision"] = outcome.execution.revision if outcome.execution is not None else None
        elif isinstance(outcome, p.Refusal):
            entry["result"] = "refusal"
            entry["code"] = outcome.code.value
        else:
            entry["result"] = "unchanged"
            entry["code"] = outcome.code.value
        self.ledger.write(json.dumps(entry, sort_keys=True) + "\n")

    def _evidence(self, held: Held, kind: str) -> Evidence:
        # The id names the credential and this very request, so the test can
        # tell from the id alone which request an evidence object belongs to
        # and check that no refused request's evidence exists.
        c = held.credential
        object_id = f"ev:{held.execution_id}:{c.worker_id}:{c.fence}:{c.lease_token}:{self.seq}"
        return Evidence(object_id, kind, {"token": c.lease_token, "fence": c.fence, "seq": self.seq})

    # --- operations with a credential -----------------------------------------------

    def step(self, held: Held, *, zombie: str | None = None, revision: int | None = None) -> bool:
        self.seq += 1
        presented = held.revision if revision is None else revision
        evidence = [self._evidence(held, "step_attempt")]
        request = p.StepRequest(
            held.credential, presented, p.StepRecord("work", f"s{held.credential.fence}-{self.seq}"), self.authority
        )
        before = datetime.now(UTC)
        outcome = self.store.record_step(held.execution_id, request, evidence)
        self._log("record_step", held, before, outcome, evidence=evidence, zombie=zombie, presented_revision=presented)
        if isinstance(outcome, p.Decision):
            assert outcome.execution is not None
            held.revision = outcome.execution.revision
            return True
        return False

    def renew(self, held: Held, *, zombie: str | None = None) -> bool:
        self.seq += 1
        before = datetime.now(UTC)
        outcome = self.store.renew(held.execution_id, p.RenewRequest(held.credential, self.lease))
        self._log("renew", held, before, outcome, zombie=zombie)
        return isinstance(outcome, p.Decision)

    def append(self, held: Held, *, zombie: str | None = None) -> bool:
        self.seq += 1
        evidence = [self._evidence(held, "note")]
        before = datetime.now(UTC)
        outcome = self.store.append_evidence(held.execution_id, held.credential, evidence)
        self._log("append_evidence", held, before, outcome, evidence=evidence, zombie=zombie)
        return isinstance(outcome, p.Decision)

    def release(self, held: Held, *, zombie: str | None = None, revision: int | None = None) -> bool:
        self.seq += 1
        presented = held.revision if revision is None else revision
        before = datetime.now(UTC)
        outcome = self.store.release(held.execution_id, p.ReleaseRequest(held.credential, presented))
        self._log("release", held, before, outcome, zombie=zombie, presented_revision=presented)
        return isinstance(outcome, p.Decision)

    def finalize(
        self, held: Held, target: ExecutionState, *, zombie: str | None = None, revision: int | None = None
    ) -> bool:
        self.seq += 1
        presented = held.revision if revision is None else revision
        c = held.credential
        evidence = [self._evidence(held, "outcome")]
        request = p.FinalizeRequest(
            execution_id=held.execution_id,
            dispatch_id=held.execution_id,
            worker_id=c.worker_id,
            lease_token=c.lease_token,
            fence=c.fence,
            target_state=target,
            business_id=held.business_id,
            expected_revision=presented,
            authority=self.authority,
            step=p.StepRecord("end", f"e{c.fence}"),
            wait=wait_spec(held.execution_id, c.fence) if target == ExecutionState.WAITING else None,
            reason=f"drain {target.value}",
        )
        before = datetime.now(UTC)
        outcome = self.store.finalize(request, evidence)
        self._log(
            f"finalize_{target.value}",
            held,
            before,
            outcome,
            evidence=evidence,
            zombie=zombie,
            presented_revision=presented,
        )
        return isinstance(outcome, p.Decision)

    # --- the loop ---------------------------------------------------------------

    def _target(self) -> ExecutionState:
        roll = self.rng.random()
        for target, weight in TARGETS:
            if roll < weight:
                return target
            roll -= weight
        return ExecutionState.SUCCEEDED

    def _pause_past_lease(self) -> None:
        time.sleep(self.lease.total_seconds() * self.rng.uniform(1.2, 2.0))

    def zombie(self, held: Held, *, forged: bool = False) -> None:
        """Retry everything with a credential that no longer writes; every one must be refused.

        The ledger marks each request ``"dead"`` (a credential this worker
        held) or ``"forged"`` (another holder's token under our identity).
        """
        kind = "forged" if forged else "dead"
        current = None
        if self.rng.random() < 0.5:
            # The strongest zombie presents the current revision, so only the
            # credential (token, worker, expiry, fence) can refuse it.
            view = self.store.read(held.execution_id)
            current = view.execution.revision if view is not None else None
        ops = ["finalize", "renew", "release", "append", "step"]
        self.rng.shuffle(ops)
        for op in ops[: self.rng.randint(1, len(ops))]:
            if op == "finalize":
                self.finalize(held, self._target(), zombie=kind, revision=current)
            elif op == "renew":
                self.renew(held, zombie=kind)
            elif op == "release":
                self.release(held, zombie=kind, revision=current)
            elif op == "append":
                self.append(held, zombie=kind)
            else:
                self.step(held, zombie=kind, revision=current)

    def displaced(self, held: Held) -> None:
        self.dead.append(held)
        # Straight after being displaced: try to finish the work anyway.
        self.zombie(held)
        if self.rng.random() < 0.5:
            self.haunt(held)

    def haunt(self, held: Held) -> None:
        """Wait (up to one lease) for someone else to hold the execution, then write over them."""
        give_up = time.monotonic() + self.lease.total_seconds()
        while time.monotonic() < give_up:
            view = self.store.read(held.execution_id)
            assert view is not None
            d = view.dispatch
            if d.lease_token is not None and d.leased_by != self.worker_id:
                self.zombie(held)
                if self.rng.random() < 0.5:
                    # A forged credential: the holder's token and fence, our
                    # identity.  The worker check must refuse it.
                    assert d.lease_token is not None
                    forged = p.LeaseCredential(self.worker_id, d.lease_token, view.execution.fence)
                    self.zombie(Held(held.execution_id, held.business_id, forged, view.execution.revision), forged=True)
                return
            if view.execution.state not in (
                ExecutionState.RUNNING,
                ExecutionState.RECONCILIATION_REQUIRED,
                ExecutionState.ELIGIBLE,
            ):
                return
            time.sleep(0.01)

    def forge(self) -> None:
        """Present a forged credential for a running execution under our own identity: it must be refused.

        Half the time it carries the holder's live token and fence (only the
        worker check can refuse it), otherwise a token never issued with the
        live fence (the token check refuses it first).  The second kind comes
        up in every run; a dead credential meets a live holder's token only
        when a displaced worker sees its execution claimed again in time.
        """
        running = self.store.execution_ids(ExecutionState.RUNNING)
        if not running:
            return
        view = self.store.read(self.rng.choice(running))
        assert view is not None
        d = view.dispatch
        if d.lease_token is None or d.leased_by == self.worker_id:
            return
        token = d.lease_token if self.rng.random() < 0.5 else f"forged-{uuid.UUID(int=self.rng.getrandbits(128)).hex}"
        forged = p.LeaseCredential(self.worker_id, token, view.execution.fence)
        self.zombie(
            Held(view.execution.execution_id, view.execution.business_id, forged, view.execution.revision), forged=True
        )

    def work(self, held: Held) -> None:
        if self.rng.random() < self.pause_probability:
            self._pause_past_lease()
        else:
            time.sleep(self.rng.uniform(0, self.lease.total_seconds() * 0.05))
        if not self.step(held):
            self.displaced(held)
            return
        for former in [d for d in self.dead if d.execution_id == held.execution_id]:
            # We held this execution before: our old credential must not
            # write now that we hold a newer one (with --reuse-token it
            # differs from the live one in its fence only).
            self.zombie(former)
        if self.rng.random() < 0.3 and not self.renew(held):
            self.displaced(held)
            return
        if self.rng.random() < self.pause_probability / 2:
            # Expire after the step, before finalization: the step is kept,
            # the finalization must be refused.
            self._pause_past_lease()
        if self.rng.random() < 0.3 and not self.append(held):
            self.displaced(held)
            return
        if self.rng.random() < 0.05:
            if self.release(held):
                self.dead.append(held)  # released: the credential is dead from now on
            else:
                self.displaced(held)
            return
        if self.finalize(held, self._target()):
            self.dead.append(held)  # finalized: the lease is cleared, the credential is dead
        else:
            self.displaced(held)

    def run(self) -> None:
        while not self.stop.exists() and time.time() < self.deadline:
            if self.dead and self.rng.random() < 0.2:
                self.zombie(self.rng.choice(self.dead))
            if self.rng.random() < 0.05:
                self.forge()
            self.seq += 1
            token = self.reuse_token or uuid.uuid4().hex
            before = datetime.now(UTC)
            outcome = self.store.claim_next(p.ClaimRequest(self.worker_id, token, self.lease))
            if outcome is None:
                time.sleep(self.rng.uniform(0.005, 0.02))
                continue
            if not isinstance(outcome, p.Decision):
                self._log("claim", None, before, outcome, token=token)
                continue
            assert outcome.execution is not None and outcome.lease is not None
            held = Held(
                outcome.execution.execution_id, outcome.execution.business_id, outcome.lease, outcome.execution.revision
            )
            self._log("claim", held, before, outcome)
            self.work(held)
        self.store.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.stores.drain_worker")
    parser.add_argument("--db", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--lease", type=float, default=0.3, help="lease duration in seconds")
    parser.add_argument("--pause", type=float, default=0.1, help="probability of pausing past the lease")
    parser.add_argument("--reuse-token", action="store_true", help="use one token for every claim")
    parser.add_argument("--stop", required=True, help="the worker exits when this file exists")
    parser.add_argument("--log", required=True, help="the ledger, one JSON object a line")
    parser.add_argument("--deadline", type=float, required=True, help="epoch seconds; exit 3 if reached")
    args = parser.parse_args(argv)
    with open(args.log, "w", encoding="utf-8") as ledger:
        Worker(args, ledger).run()
    if not Path(args.stop).exists():
        print(f"{args.worker}: deadline reached before the stop file appeared", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
