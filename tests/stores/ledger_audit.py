"""The lease audit every multi-process run ends with: the database's history, and the workers' ledgers, against the rules.

Written once for the PostgreSQL fault test (``tests/postgres``) and the
chaos run (``tests/chaos``), on either database.  Rules of this module:

- Nothing here asserts.  Every check returns the problems it found, one
  sentence each naming the execution, revision, event and credential, so a
  test asserts that the list is empty and the chaos run prints it.
- :func:`replay_leases` needs only the database: it replays each
  execution's transitions in commit order against the one lease that may be
  open, and finds any write made with a credential other than the open
  lease's, or at or after that lease's expiry (claim or last renewal plus the
  lease length of the worker that holds it, both on the store's clock).
- The ledger is what each worker wrote down about its own requests (one JSON
  object a line): an ``intent`` line before a write request, a ``done`` line
  when it returned (``returned`` or ``unavailable``), and a result line with
  the outcome.  A request with no done line was cut by SIGKILL; one whose
  done line says ``unavailable`` lost its connection; either may or may not
  have committed, and :meth:`Ledger.unknown` lists them.
- :func:`compare_writes` holds the ledgers and the database to each other:
  every accepted request is in the database, and every transition a worker
  wrote is an accepted request or one of unknown outcome.
- :func:`evidence_problems` does the same for evidence: none of a refused
  request exists, every accepted request's exists, and each was committed
  under the live lease of the credential that carried it.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import attrs

from fencekeeper.kernel.machines import ExecutionState

LEASE_WRITES = frozenset({"renew", "record_step", "release"}) | {
    f"finalize_{s.value}"
    for s in (
        ExecutionState.WAITING,
        ExecutionState.SUCCEEDED,
        ExecutionState.FAILED,
        ExecutionState.SUSPENDED,
        ExecutionState.RECONCILIATION_REQUIRED,
    )
}
"""Transitions only the holder of the open lease may write."""
LEASE_ENDS = LEASE_WRITES - {"renew", "record_step"}
GOVERNED = frozenset({"fail", "resume_safe", "wake", "cancel", "suspend"})
"""Transitions written with no lease open, by whoever the governed operation names."""

Row = Mapping[str, Any]


# --- leases, from the database alone -------------------------------------------------------


@attrs.define
class Lease:
    worker: str
    token: str
    fence: int
    claimed_at: datetime
    expires: datetime
    renewals: list[tuple[datetime, datetime]]
    """(at, new expiry) of each renewal, oldest first."""
    length: timedelta
    ended_at: datetime | None = None
    quarantined: bool = False

    def expiry_at(self, moment: datetime) -> datetime:
        expires = self.claimed_at + self.length
        for at, until in self.renewals:
            if at <= moment:
                expires = until
        return expires

    def live_at(self, moment: datetime) -> bool:
        """True if this lease was open and unexpired at ``moment``.

        The claim's own moment counts: a visit composed into the claim's
        transaction (specs/protocol.md, "Composed decisions") writes at the
        transaction's one time, under the lease that transaction grants.
        """
        return (
            self.claimed_at <= moment
            and (self.ended_at is None or moment <= self.ended_at)
            and moment < self.expiry_at(moment)
        )


def replay_leases(
    history: Mapping[str, Iterable[Row]],
    lease_of: Callable[[str], timedelta],
    *,
    is_worker: Callable[[str], bool],
    open_at_end: bool = False,
) -> tuple[dict[str, list[Lease]], list[str]]:
    """Replay each execution's transitions in commit order; returns its leases, oldest first, and the problems.

    ``lease_of(worker)`` is the lease length that worker claims and renews
    with.  ``is_worker(actor)`` tells a worker from the principals of
    governed operations (a worker never quarantines, resumes or cancels).
    ``open_at_end`` allows a lease still open after the last transition (a
    run audited while an execution is running).
    """
    leases: dict[str, list[Lease]] = collections.defaultdict(list)
    problems: list[str] = []
    for execution_id, transitions in history.items():
        lease: Lease | None = None
        fence = 0
        highest_seen = 0
        for t in transitions:
            where = f"{execution_id} revision {t['revision']} {t['event'] or 'link'} by {t['actor']}"
            if t["lease_token"] is not None:
                # Fences carried by token-bearing records never go back.
                if t["fence"] < highest_seen:
                    problems.append(f"{where}: fence {t['fence']} after fence {highest_seen}")
                highest_seen = max(highest_seen, t["fence"])
            event = t["event"]
            if event is None:
                # Admission (no state before it), or the link a reconcile_command
                # writes while the execution stays in review: no lease either way.
                if t["from_state"] is None and t["fence"] != 0:
                    problems.append(f"{where}: admitted with fence {t['fence']}")
                if lease is not None:
                    problems.append(f"{where}: written while {lease.worker}'s lease (fence {lease.fence}) was open")
            elif event == "claim":
                if lease is not None:
                    problems.append(f"{where}: claimed while {lease.worker}'s lease (fence {lease.fence}) was open")
                if t["fence"] != fence + 1:
                    problems.append(f"{where}: fence {t['fence']} after {fence}")
                fence = t["fence"]
                length = lease_of(t["actor"])
                lease = Lease(t["actor"], t["lease_token"], fence, t["at"], t["at"] + length, [], length)
                leases[execution_id].append(lease)
            elif event in LEASE_WRITES:
                if lease is None:
                    problems.append(f"{where}: a lease write with no lease open")
                    continue
                if (t["actor"], t["lease_token"], t["fence"]) != (lease.worker, lease.token, lease.fence):
                    problems.append(
                        f"{where}: written with token {str(t['lease_token'])[:8]} fence {t['fence']}, but the open "
                        f"lease is {lease.worker}'s, token {lease.token[:8]} fence {lease.fence}"
                    )
                    continue
                if t["at"] >= lease.expires:
                    problems.append(f"{where}: written at {t['at']}, after the lease expired at {lease.expires}")
                if event == "renew":
                    lease.expires = t["at"] + lease.length
                    lease.renewals.append((t["at"], lease.expires))
                elif event in LEASE_ENDS:
                    lease.ended_at = t["at"]
                    lease = None
            elif event == "quarantine_expired":
                if lease is None:
                    problems.append(f"{where}: quarantined with no lease open")
                    continue
                if is_worker(t["actor"]):
                    problems.append(f"{where}: a worker quarantined")
                if (t["lease_token"], t["fence"]) != (lease.token, lease.fence):
                    problems.append(f"{where}: quarantined a lease other than the open one")
                if t["at"] < lease.expires:
                    problems.append(f"{where}: quarantined a live lease (it expires at {lease.expires})")
                lease.quarantined = True
                lease.ended_at = t["at"]
                lease = None
            elif event in GOVERNED:
                if lease is not None or t["lease_token"] is not None or is_worker(t["actor"]):
                    problems.append(f"{where}: a governed transition made on a lease or by a worker")
            else:
                problems.append(f"{where}: an event the audit does not know")
        if lease is not None and not open_at_end:
            problems.append(f"{execution_id}: {lease.worker}'s lease (fence {lease.fence}) is still open at the end")
    return leases, problems


# --- the ledgers -----------------------------------------------------------------------------


@attrs.define
class Ledger:
    """Every worker's lines, keyed by (worker, seq): intents, how they returned, and the results."""

    intents: dict[tuple[str, int], dict[str, Any]]
    done: dict[tuple[str, int], dict[str, Any]]
    results: dict[tuple[str, int], dict[str, Any]]
    read_errors: list[dict[str, Any]]
    abandoned: list[dict[str, Any]]
    sigkilled: set[str]
    problems: list[str] = attrs.field(factory=list)

    @classmethod
    def read(cls, paths: Mapping[str, Path], sigkilled: set[str]) -> Ledger:
        """The ledger files of ``paths`` (by worker or process name); a SIGKILLed writer may have cut its last line."""
        ledger = cls({}, {}, {}, [], [], set(sigkilled))
        for writer, path in paths.items():
            if not path.exists():
                # SIGKILLed while starting, before it opened its ledger (and so before any request).
                if writer not in sigkilled:
                    ledger.problems.append(f"{writer} left no ledger")
                continue
            lines = path.read_text(encoding="utf-8").splitlines()
            for number, line in enumerate(lines):
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    # Only the last line of a SIGKILLed writer may be cut short.
                    if not (writer in sigkilled and number == len(lines) - 1):
                        ledger.problems.append(f"{writer}: ledger line {number + 1} is not JSON: {line[:80]!r}")
                    continue
                key = (entry.get("worker"), entry.get("seq"))
                if "intent" in entry:
                    ledger.intents[key] = entry
                elif "done" in entry:
                    ledger.done[key] = entry
                elif "result" in entry:
                    ledger.results[key] = entry
                elif "read_error" in entry:
                    ledger.read_errors.append(entry)
                elif "abandoned" in entry:
                    ledger.abandoned.append(entry)
                else:
                    ledger.problems.append(f"{writer}: ledger line {number + 1} of no known kind")
        return ledger

    def unknown(self) -> list[dict[str, Any]]:
        """Requests whose outcome the ledger does not hold.

        The worker could not know it (connection lost, or SIGKILLed before
        the request returned), or knew it and was SIGKILLed before writing
        its result line: the done line and the result line are two writes,
        and a kill can fall between them, only on a SIGKILLed worker's last
        request.
        """
        last: dict[str, int] = {}
        for worker, seq in self.intents:
            last[worker] = max(seq, last.get(worker, seq))
        return [
            intent
            for key, intent in self.intents.items()
            if key not in self.done
            or self.done[key]["done"] == "unavailable"
            or (key not in self.results and key[0] in self.sigkilled and key[1] == last[key[0]])
        ]


def compare_writes(
    history: Mapping[str, Iterable[Row]], ledger: Ledger, *, is_worker: Callable[[str], bool]
) -> tuple[int, list[str]]:
    """Accepted requests are in the database; every worker-written transition is accepted or of unknown outcome.

    Returns how many writes of unknown outcome landed, and the problems.
    """
    problems: list[str] = []
    decided = [e for e in ledger.results.values() if e["result"] == "decision" and is_worker(e["worker"])]
    accepted = collections.Counter(
        (e["execution_id"], event, e["worker"], e["token"], e["fence"])
        for e in decided
        for event in e["events"]
        if event is not None
    )
    written = collections.Counter(
        (t["execution_id"], t["event"], t["actor"], t["lease_token"], t["fence"])
        for ts in history.values()
        for t in ts
        if is_worker(t["actor"])
    )
    for key, n in (accepted - written).items():
        problems.append(f"accepted but not in the database ({n}x): {key}")
    unknown = ledger.unknown()
    candidates = collections.Counter(
        (i["execution_id"], i["intent"], i["worker"], i["token"], i["fence"]) for i in unknown if i["intent"] != "claim"
    )
    claim_candidates = collections.Counter((i["worker"], i["token"]) for i in unknown if i["intent"] == "claim")
    landed = 0
    for (execution_id, event, actor, token, fence), n in (written - accepted).items():
        for _ in range(n):
            if event == "claim" and claim_candidates[(actor, token)] > 0:
                claim_candidates[(actor, token)] -= 1
            elif candidates[(execution_id, event, actor, token, fence)] > 0:
                candidates[(execution_id, event, actor, token, fence)] -= 1
            else:
                problems.append(
                    f"{execution_id}: {event} by {actor} (token {str(token)[:8]}, fence {fence}) is in the database "
                    "but no request of that worker was accepted or left unknown"
                )
                continue
            landed += 1
    return landed, problems


def evidence_problems(
    committed: Mapping[str, tuple[str, datetime]], ledger: Ledger, leases: Mapping[str, list[Lease]]
) -> tuple[collections.Counter[str], list[str]]:
    """Evidence carried by the workers' lease requests, against the database.

    ``committed`` maps each evidence key the ledgers use to the execution it
    belongs to and when it was committed.  Evidence no worker request
    carried (admission input, decisions, wakes, recoveries) is not the
    business of this check.
    """
    problems: list[str] = []
    results = list(ledger.results.values())
    carriers: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for e in results:
        if e["result"] == "decision":
            for key in e["evidence"]:
                carriers[key].append(e)
    unknown = ledger.unknown()
    for i in unknown:
        for key in i["evidence"]:
            carriers[key].append(i)
    refused = {key for e in results if e["result"] == "refusal" for key in e["evidence"]}
    accepted = {key for e in results if e["result"] == "decision" for key in e["evidence"]}
    counts: collections.Counter[str] = collections.Counter(
        {"accepted": len(accepted), "refused": len(refused), "of unknown outcome": len({k for i in unknown for k in i["evidence"]})}
    )
    for key in sorted(refused & committed.keys() - carriers.keys()):
        problems.append(f"evidence {key} of a refused request exists")
    for key in sorted(accepted - committed.keys()):
        problems.append(f"evidence {key} of an accepted request is missing")
    for key, (execution_id, at) in committed.items():
        requests = carriers.get(key)
        if not requests:
            continue
        counts["checked under their lease"] += 1
        if not any(
            r["execution_id"] == execution_id
            and any(
                (lease.worker, lease.token, lease.fence) == (r["worker"], r["token"], r["fence"]) and lease.live_at(at)
                for lease in leases.get(execution_id, [])
            )
            for r in requests
        ):
            problems.append(f"evidence {key} was committed at {at}, not under the live lease of the request carrying it")
    return counts, problems
