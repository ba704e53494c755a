"""An execution's history as a mermaid ``sequenceDiagram``: the protocol drawn over time.

Rules of this module:

- It draws the facts ``fencekeeper inspect`` reads (an
  :class:`~fencekeeper.adapters.store.ExecutionView`) and nothing else: the
  transition records, the recovery records with their proofs, the wait
  registrations, and the evidence objects (step attempts, Commands, approval
  requests and decisions) with every revision.  A message that no stored fact
  supports is never drawn.
- One exception, kept apart: a refusal writes nothing, so no store holds it.
  A caller that watched a run (the demo, the scenarios of docs/concepts.md)
  may pass what it was told as :class:`Observed` values; each is drawn as a
  crossed reply marked "returned, not stored", at the revision it was
  refused at.  ``fencekeeper inspect`` passes none.
- Participants: the principals who acted (operator, reviewers) on the left,
  the store, the workers (whoever claimed, or ran an attempt), and the
  command handler when the execution issued a Command.
- Order: each transition record in revision order; after it, what a caller
  was refused at that revision, then what the visit that started at that
  revision created (its attempt, Command, approval request).  A decision is
  drawn with the wake it caused; a decision that woke nothing, after the wake
  of its request (or at the end, when none came).  A Command settled by
  reconciliation is drawn with the recovery that settled it.
- Stored values are shown, never obeyed: every stored string goes through
  :func:`label`, which spells control characters as ``render.printable``
  does and writes mermaid's statement and comment characters (``;``, ``#``)
  and ``<`` as entity codes, so a value cannot end a message, start a
  statement, or open an HTML tag in the rendered picture.
- Output is deterministic for the same view: no clock is read here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from fencekeeper.kernel import approvals, attempts
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.evidence import Evidence

from .render import compact, printable, token
from .store import ExecutionView

STORE = "S"
HANDLER = "H"

_ENTITIES = {"#": "#35;", ";": "#59;", "<": "#60;"}


def label(value: object) -> str:
    """``value`` as text mermaid shows rather than parses."""
    return "".join(_ENTITIES.get(c, c) for c in printable(str(value)))


@attrs.frozen
class Observed:
    """An answer a caller was given during a run that no store records (a refusal writes nothing).

    ``after_revision`` is the execution revision current when it was given;
    ``to_handler`` says the request went to the command handler, not the store.
    """

    after_revision: int
    actor: str
    request: str
    answer: str
    to_handler: bool = False

    @classmethod
    def refusal(cls, after_revision: int, actor: str, request: str, refused: p.Refusal) -> Observed:
        """The store's refusal, with its code and its message (which says, for example, when the lease expired)."""
        return cls(after_revision, actor, request, f"REFUSED {refused.code.value}: {refused.message}")


def sequence_diagram(view: ExecutionView, observed: Sequence[Observed] = ()) -> str:
    """The mermaid ``sequenceDiagram`` of ``view``'s history, ending with a newline."""
    return _Drawing(view, observed).draw()


@attrs.define
class _Drawing:
    view: ExecutionView
    observed: Sequence[Observed]
    lines: list[str] = attrs.field(factory=list)
    ids: dict[str, str] = attrs.field(factory=dict)
    drawn: set[tuple[str, int]] = attrs.field(factory=set)

    # --- participants -------------------------------------------------------------------

    def _participants(self) -> list[str]:
        workers: list[str] = []
        principals: list[str] = []

        def add(who: str, into: list[str]) -> None:
            if who and who not in workers and who not in principals:
                into.append(who)

        for record in self.view.history:
            if record.event is not None and record.event.value == "claim":
                add(record.actor, workers)
        for item in self._evidence():
            if item.kind == attempts.STEP_ATTEMPT:
                add(str(item.body.get("worker_id", "")), workers)
        for o in self.observed:
            if o.actor not in principals:
                add(o.actor, workers if o.request.startswith(("record_step", "finalize", "execute")) else principals)
        for record in self.view.history:
            add(record.actor, principals)
        for item in self._evidence():
            if item.kind == approvals.APPROVAL_DECISION:
                add(str(item.body.get("reviewer_id", "")), principals)
        out = []
        for n, who in enumerate(principals, start=1):
            self.ids[who] = f"P{n}"
            out.append(f"    actor P{n} as {label(who)}")
        out.append(f"    participant {STORE} as store")
        for n, who in enumerate(workers, start=1):
            self.ids[who] = f"W{n}"
            out.append(f"    participant W{n} as {label(who)}")
        if any(e.kind == i.COMMAND and e.body.get("attempt_id") for e in self._evidence()):
            out.append(f"    participant {HANDLER} as command handler")
        return out

    # --- helpers ------------------------------------------------------------------------

    def _evidence(self) -> tuple[Evidence, ...]:
        return self.view.evidence_revisions or self.view.evidence

    def _objects(self) -> dict[str, list[Evidence]]:
        found: dict[str, list[Evidence]] = {}
        for item in self._evidence():
            found.setdefault(item.object_id, []).append(item)
        return found

    def _id(self, who: str) -> str:
        return self.ids.get(who, STORE)

    def say(self, source: str, target: str, text: str, *, reply: bool = False, refused: bool = False) -> None:
        arrow = "--x" if refused else "-->>" if reply else "->>"
        self.lines.append(f"    {source}{arrow}{target}: {text}")

    def note(self, over: str, text: str) -> None:
        self.lines.append(f"    Note over {over}: {text}")

    # --- the drawing --------------------------------------------------------------------

    def draw(self) -> str:
        x = self.view.execution
        header = ["sequenceDiagram"]
        header.append(f"    title {label(x.execution_id)}: {label(x.definition_id)} revision {x.definition_revision}")
        header += self._participants()
        objects = self._objects()
        recoveries = {r.resulting_revision: r for r in self.view.recoveries}
        revisions = {r.revision: r for r in self.view.revisions}
        registrations = {r.key.attempt_id: r for r in self.view.registrations}
        decisions = [v[-1] for v in objects.values() if v[0].kind == approvals.APPROVAL_DECISION]
        claims: dict[tuple[str | None, int], str] = {}
        waiting_on: p.WaitRegistration | None = None
        for record in self.view.history:
            who = self._id(record.actor)
            recovery = recoveries.get(record.revision)
            move = f"{record.from_state.value} -> {record.to_state.value}" if record.from_state else "eligible"
            rev = f"revision {record.revision}"
            event = record.event.value if record.event is not None else None
            if record.from_state is None:
                self._admit(who, objects, rev)
            elif event == "claim":
                claims[(record.lease_token, record.fence)] = record.actor
                self.say(who, STORE, "claim")
                self.say(
                    STORE,
                    who,
                    f"{move}: lease fence {record.fence}, token {token(record.lease_token)}, {rev}",
                    reply=True,
                )
            elif recovery is not None:
                self._recovery(
                    record=record, recovery=recovery, who=who, move=move, rev=rev, claims=claims, objects=objects
                )
            elif event == "wake":
                self._wake(record=record, who=who, move=move, rev=rev, registration=waiting_on, decisions=decisions)
                waiting_on = None
            else:
                fence = f" (fence {record.fence})" if record.lease_token else ""
                self.say(who, STORE, f"{label(event or '-')}{fence}: {label(record.reason)}{self._by_command(record)}")
                self.say(STORE, who, f"{move}, {rev}", reply=True)
                before = revisions.get(record.revision - 1)
                if before is not None and before.wait is not None:
                    closed = registrations.get(before.wait.attempt_id)
                    if closed is not None and closed.closed_by is not None:
                        self.note(
                            STORE,
                            f"wait registration {label(before.wait.attempt_id)} closed by "
                            f"{label(closed.closed_by)}: nothing can wake it now",
                        )
                if event == "finalize_waiting":
                    current = revisions.get(record.revision)
                    if current is not None and current.wait is not None:
                        waiting_on = registrations.get(current.wait.attempt_id)
                        if waiting_on is not None:
                            self._registered(waiting_on)
            for o in self.observed:
                if o.after_revision == record.revision:
                    target = HANDLER if o.to_handler else STORE
                    self.say(self._id(o.actor), target, label(o.request))
                    self.say(target, self._id(o.actor), f"{label(o.answer)} (returned, not stored)", refused=True)
            attempt = attempts.attempt_id(attrs.evolve(self.view.execution, revision=record.revision))
            self._visit(attempt, objects)
        for decision in decisions:
            if (decision.object_id, decision.revision) not in self.drawn:
                self._decision(decision, woke=False)
        d = self.view.dispatch
        last = f", last error {label(d.last_error_code)}" if d.last_error_code else ""
        self.note(
            STORE,
            f"now {x.state.value} at {label(x.current_node_id or '-')}, fence {x.fence}, "
            f"revision {x.revision}, steps {x.step_count}{last}",
        )
        return "\n".join(header + self.lines) + "\n"

    def _admit(self, who: str, objects: Mapping[str, list[Evidence]], rev: str) -> None:
        x = self.view.execution
        given = objects.get(f"{x.execution_id}/input")
        with_input = f" with input {label(compact(given[-1].body.get('input', {})))}" if given else ""
        self.say(who, STORE, f"admit{with_input}")
        self.say(STORE, who, f"eligible, {rev}", reply=True)

    def _registered(self, registration: p.WaitRegistration) -> None:
        spec = registration.spec
        waits = []
        if spec.event_type is not None:
            waits.append(f"event {spec.event_type} {compact(dict(spec.correlation))}".strip())
        if spec.wake_at is not None:
            waits.append(f"{'timeout' if spec.timeout else 'timer'} at {spec.wake_at.isoformat()}")
        continues = ", ".join(f"{outcome} -> {node}" for outcome, node in spec.continuations)
        described = f"wait registered for {registration.key.attempt_id}: " + ", ".join(waits)
        self.note(STORE, label(described + (f"; continues {continues}" if continues else "")))

    def _recovery(
        self,
        *,
        record: p.TransitionRecord,
        recovery: p.RecoveryRecord,
        who: str,
        move: str,
        rev: str,
        claims: Mapping[tuple[str | None, int], str],
        objects: Mapping[str, list[Evidence]],
    ) -> None:
        kind = recovery.kind.value
        command = f"{kind} (command {label(recovery.command_id)})"
        if kind == "reconcile_command":
            for object_id, revisions in objects.items():
                if revisions[0].kind != i.COMMAND or object_id not in record.reason:
                    continue
                for settled in revisions:
                    if settled.body.get("reconciled") and (object_id, settled.revision) not in self.drawn:
                        self.drawn.add((object_id, settled.revision))
                        self.say(who, HANDLER, f"reconcile {label(object_id)} (never execute)")
                        self.say(HANDLER, who, self._answer(settled), reply=True)
                        break
            self.say(who, STORE, f"{command}: record the answer")
            self.say(STORE, who, f"{move}, {rev}: settled, still in review", reply=True)
            return
        if recovery.proof is not None:
            self.say(
                who,
                STORE,
                f"{command} at {label(recovery.proof.continuation)} because {label(recovery.proof.idempotency_contract)}",
            )
        else:
            # The reason the operator gave is part of the stored record (the kernel writes
            # "recovery KIND by command ID: REASON"), so a governed fail shows why, as a resume does.
            given = record.reason.removeprefix(f"recovery {kind} by command {recovery.command_id}")
            because = f" because {label(given.removeprefix(': '))}" if given.startswith(": ") else ""
            self.say(who, STORE, command + because)
        self.say(STORE, who, f"{move}, {rev}", reply=True)
        if recovery.proof is not None:
            self.note(STORE, "proof from the stored facts: " + label("; ".join(recovery.proof.basis)))
        if kind == "quarantine_expired":
            holder = claims.get((record.lease_token, record.fence))
            if holder is not None:
                self.note(
                    self._id(holder),
                    f"lease fence {record.fence} (token {token(record.lease_token)}) expired and was "
                    "quarantined: it can write nothing more",
                )

    def _wake(
        self,
        *,
        record: p.TransitionRecord,
        who: str,
        move: str,
        rev: str,
        registration: p.WaitRegistration | None,
        decisions: Iterable[Evidence],
    ) -> None:
        request = None
        if registration is not None:
            for decision in decisions:
                if decision.body.get("decision_id") == registration.woken_by:
                    request = decision.body.get("request_id")
                    self._decision(decision, woke=True, move=f"{move}, {rev}: {label(record.reason)}")
        if request is None:
            self.say(who, STORE, self._waker(registration))
            self.say(STORE, who, f"{move}, {rev}: {label(record.reason)}", reply=True)
            return
        for decision in decisions:
            if decision.body.get("request_id") == request and (decision.object_id, decision.revision) not in self.drawn:
                self._decision(decision, woke=False)

    @staticmethod
    def _waker(registration: p.WaitRegistration | None) -> str:
        """What the wake's registration says woke it: an Event, or a timer or timeout that came due."""
        if registration is None or registration.woken_by is None or registration.wake_reason is None:
            return "wake"
        reason = registration.wake_reason.value
        if reason == "event":
            return f"publish Event {label(registration.woken_by)} ({label(registration.spec.event_type)}): wake"
        return f"wake: the {label(reason)} of {label(registration.key.attempt_id)} is due"

    def _decision(self, decision: Evidence, *, woke: bool, move: str = "") -> None:
        self.drawn.add((decision.object_id, decision.revision))
        body = decision.body
        reviewer = self._id(str(body.get("reviewer_id", "")))
        self.say(
            reviewer,
            STORE,
            f"decide {label(body.get('determination'))} ({label(body.get('decision_id'))}) "
            f"on {label(body.get('request_id'))}",
        )
        if woke:
            self.say(STORE, reviewer, f"{label(decision.state)}, wake: {move}", reply=True)
        else:
            effect = "kept in history, changes nothing" if decision.state != "accepted" else "recorded"
            self.say(STORE, reviewer, f"{label(decision.state)}: {effect}", reply=True)

    def _visit(self, attempt: str, objects: Mapping[str, list[Evidence]]) -> None:
        revisions = objects.get(attempt)
        if not revisions:
            return
        body = revisions[0].body
        worker = self._id(str(body.get("worker_id", "")))
        self.note(
            worker,
            f"attempt {label(attempt)}: step {label(body.get('step'))} at {label(body.get('node_id'))} "
            f"({label(body.get('node_kind'))}), fence {label(body.get('fence'))}",
        )
        for object_id, items in objects.items():
            owner = object_id.rsplit("/", 1)[0]
            if owner != attempt:
                continue
            if items[0].kind == i.COMMAND:
                self._command(worker, object_id, items)
            elif items[0].kind == approvals.APPROVAL_REQUEST:
                binding: Mapping[str, Any] = items[0].body.get("binding", {})
                reviewers = ", ".join(str(r) for r in items[0].body.get("reviewers", []))
                self.say(
                    worker,
                    STORE,
                    f"request approval {label(binding.get('operation'))} ({label(object_id)}) from {label(reviewers)}",
                )
        # A visit that refused its own node (no authority, a rejected Command) records why on the attempt.
        for revision in revisions:
            code = revision.body.get("reason") or revision.body.get("rejection")
            if code and revision.state in ("failed", "rejected"):
                detail = revision.body.get("detail")
                self.note(
                    worker,
                    f"attempt {label(attempt)} {label(revision.state)} [{label(code)}]"
                    + (f": {label(detail)}" if detail else ""),
                )
                break

    def _command(self, worker: str, object_id: str, items: list[Evidence]) -> None:
        first = items[0].body
        fence = label(first.get("fence"))
        self.say(
            worker, STORE, f"record Command {label(object_id)} {label(first.get('operation'))}: issued (fence {fence})"
        )
        self.say(worker, HANDLER, f"execute {label(first.get('operation'))} {label(object_id)} (fence {fence})")
        for item in items[1:]:
            if item.body.get("reconciled"):
                continue
            self.drawn.add((object_id, item.revision))
            self.say(HANDLER, worker, self._answer(item), reply=True)

    def _by_command(self, record: p.TransitionRecord) -> str:
        """The Command an operator's decision was made by (a cancellation is Command-mediated)."""
        if record.lease_token is not None:
            return ""
        for item in self._evidence():
            targets = item.body.get("targets") or []
            if (
                item.kind == i.COMMAND
                and not item.body.get("attempt_id")
                and item.body.get("principal_id") == record.actor
                and [record.execution_id, record.revision - 1] in [list(t) for t in targets]
            ):
                return f" (Command {label(item.object_id)} {label(item.body.get('operation'))})"
        return ""

    @staticmethod
    def _answer(item: Evidence) -> str:
        detail = item.body.get("detail")
        rejection = item.body.get("rejection")
        code = f" [{label(rejection)}]" if rejection else ""
        return label(item.state) + code + (f": {label(detail)}" if detail else "")


__all__ = ["Observed", "label", "sequence_diagram"]
