"""``fencekeeper demo``: the machines, then a zombie worker refused, all by the real kernel.

Nothing here is scripted output: every line is what the kernel answered.
The rows live in a dictionary that stands in for a store (issue by issue
the real stores replace it); like a store, it applies a decision only if
its guard holds.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TextIO

from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.errors import IllegalTransition
from fencekeeper.kernel.machines import EXECUTION, MACHINES, ExecutionEvent, ExecutionState, dispatch_state_of

_HAPPY_PATH = (
    ExecutionEvent.CLAIM,
    ExecutionEvent.RECORD_STEP,
    ExecutionEvent.FINALIZE_WAITING,
    ExecutionEvent.WAKE,
    ExecutionEvent.CLAIM,
    ExecutionEvent.FINALIZE_SUCCEEDED,
)
_START = datetime(2026, 1, 1, 9, 0, tzinfo=UTC)
_LEASE = timedelta(seconds=30)


def run(out: TextIO) -> None:
    _machines(out)
    _zombie(out)
    out.write("\nSee each machine: fencekeeper diagram execution\n")
    out.write("Prove the protocol: fencekeeper modelcheck\n")


def _machines(out: TextIO) -> None:
    out.write("fencekeeper: the machines\n\n")
    for machine in MACHINES.values():
        spec = machine.spec
        out.write(
            f"  {spec.name:<10} {len(spec.states)} states, {len(spec.transitions):>2} transitions"
            f"  (initial {', '.join(spec.initial)}; terminal {', '.join(spec.terminal)})\n"
        )
    out.write("\nAn execution and its dispatch row, one event at a time:\n\n")
    state = EXECUTION.initial[0]
    for event in _HAPPY_PATH:
        target = EXECUTION.step(state, event)
        out.write(
            f"  {state.value:<12} --{event.value:-<20}> {target.value:<12}"
            f" dispatch: {dispatch_state_of(target).value}\n"
        )
        state = target
    out.write("\nA terminal state is absorbing; the kernel refuses and nothing changes:\n\n")
    try:
        EXECUTION.step(ExecutionState.SUCCEEDED, ExecutionEvent.CLAIM)
    except IllegalTransition as exc:
        out.write(f"  refused [{exc.code}]: {exc}\n")


class _Rows:
    """One execution's rows, changed only by decisions whose guard holds."""

    def __init__(self, decision: p.Decision) -> None:
        assert decision.execution is not None and decision.dispatch is not None
        self.execution = decision.execution
        self.dispatch = decision.dispatch

    def apply(self, out: TextIO, at: datetime, who: str, what: str, outcome: p.Outcome) -> p.Decision | None:
        clock = f"+{int((at - _START).total_seconds()):>3}s"
        if isinstance(outcome, p.Refusal):
            out.write(f"  {clock}  {who:<4} {what:<38} REFUSED [{outcome.code.value}] {outcome.message}\n")
            return None
        if isinstance(outcome, p.Unchanged):
            out.write(f"  {clock}  {who:<4} {what:<38} unchanged [{outcome.code.value}] {outcome.message}\n")
            return None
        if not outcome.guard.holds(self.execution, self.dispatch, at):
            out.write(f"  {clock}  {who:<4} {what:<38} REFUSED [guard] the rows changed since the decision\n")
            return None
        self.execution = outcome.execution or self.execution
        self.dispatch = outcome.dispatch or self.dispatch
        lease = f" token {self.dispatch.lease_token} fence {self.execution.fence}" if self.dispatch.lease_token else ""
        out.write(
            f"  {clock}  {who:<4} {what:<38} -> {self.execution.state.value} "
            f"(revision {self.execution.revision}){lease}\n"
        )
        return outcome


def _zombie(out: TextIO) -> None:
    out.write("\nA worker whose lease expired is fenced out (kernel decisions, applied under their guards):\n\n")
    ops = p.Authority(True, "ops")
    admitted = p.admit(None, p.AdmitRequest("exec-1", "acme", "approval", 1, "start", ops), _START)
    assert isinstance(admitted, p.Decision)
    rows = _Rows(admitted)
    out.write(f"  +  0s  ops  {'admit exec-1':<38} -> eligible (revision 1)\n")

    now = _START
    claimed = rows.apply(
        out, now, "w1", "claim", p.claim(rows.execution, rows.dispatch, p.ClaimRequest("w1", "tok-a1", _LEASE), now)
    )
    assert claimed is not None and claimed.lease is not None
    w1 = claimed.lease

    now = _START + timedelta(seconds=45)
    out.write("  + 45s       (w1 pauses past its lease, which ended at +30s)\n")
    quarantine = p.RecoveryRequest(
        "reconcile-1", p.RecoveryKind.QUARANTINE_EXPIRED, "exec-1", "acme", rows.execution.revision, "ops", ops
    )
    rows.apply(out, now, "ops", "quarantine_expired", p.recover(rows.execution, rows.dispatch, None, quarantine, now))
    proof = p.SafeResumeEvidence(True, True, True, "the start node is idempotent by command identity")
    resume = p.RecoveryRequest(
        "reconcile-2", p.RecoveryKind.RESUME_SAFE, "exec-1", "acme", rows.execution.revision, "ops", ops, proof
    )
    rows.apply(out, now, "ops", "resume_safe (with safe-resume proof)", p.recover(rows.execution, rows.dispatch, None, resume, now))
    reclaimed = rows.apply(
        out, now, "w2", "claim", p.claim(rows.execution, rows.dispatch, p.ClaimRequest("w2", "tok-b7", _LEASE), now)
    )
    assert reclaimed is not None and reclaimed.lease is not None
    w2 = reclaimed.lease

    now += timedelta(seconds=5)
    for worker, credential in (("w1", w1), ("w2", w2)):
        request = p.FinalizeRequest(
            execution_id="exec-1",
            dispatch_id="exec-1",
            worker_id=credential.worker_id,
            lease_token=credential.lease_token,
            fence=credential.fence,
            target_state=ExecutionState.SUCCEEDED,
            business_id="acme",
            expected_revision=rows.execution.revision,
            authority=p.Authority(True, credential.worker_id),
        )
        rows.apply(out, now, worker, "finalize -> succeeded", p.finalize(rows.execution, rows.dispatch, request, now))
    out.write(
        f"\n  exec-1 is {rows.execution.state.value} at revision {rows.execution.revision}; "
        "the zombie w1 changed nothing.\n"
    )
