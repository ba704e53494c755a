"""An exhaustive bounded model checker for durable operations (seed 001).

It explores, breadth first, every interleaving of a small world -- several
clients submitting the same idempotency identity at once (one of them,
with ``Bounds.revoked_submitter``, no longer authorized; another, with
``Bounds.moved_submitter``, under the next version of its resolver),
several workers
claiming, heartbeating, completing and failing one Operation, a clock that
ticks past lease expiry (so expired owners are reclaimed automatically), an
approver and a canceller -- and checks every invariant of
``specs/operations.md`` in every reachable state and on every committed
write.  A violation comes back with the shortest trace that reaches it.

Rules of this module:

- Every actor works the way a store runs a request: it *decides* on the
  world as it is (``decide ...``), and the decision *commits* later
  (``commit ...``), after any number of other moves, only if its guard
  still holds on the world at commit time.  So every race the guard exists
  for -- two claims of one Operation, a cancellation and the effect, two
  identical submissions, a zombie's completion after its replacement -- is
  one of the interleavings.
- It is pure and deterministic; time is the world's ``tick``.  Operation
  ids are derived from the submitting client, so two submissions that both
  commit would be two Operations, which is what INV-OP-ONE-OPERATION looks
  for.
- The decisions under test come in an :class:`OpsProtocol` bundle, so the
  operation bug zoo (``tests/operations/zoo.py``) checks broken variants
  with the same explorer.  ``apply_guard`` switches the store's guard off.
- Workers keep every credential they were given, forever: a replaced owner
  keeps trying everything (the zombie), which is the adversary the fence
  exists for.
- With ``Bounds.external`` the action is an external effect whose provider
  is neither idempotent nor reconcilable: a worker records its intent, and
  then does what the worker does (``adapters/operations/worker.py``): with
  the kernel's ``effect_plan`` of the Operation it claimed, it calls the
  provider (``perform``) or, an earlier issue being unanswered, ends the
  Operation ``external_outcome_unknown`` (``reconcile``).  A call is one
  move with four answers -- declined (not applied, and said so), succeeded,
  a lost reply (applied, unanswered), a timeout (not applied, unanswered)
  -- and a zombie whose intent committed may still make its call.
- ``Bounds.deadline_ticks`` puts the overall deadline inside the explored
  clock, before a claim's lease ends: a live owner then decides and commits
  on both sides of it, and INV-OP-NO-EFFECT-AFTER-DEADLINE asks that no
  intent and no atomic success commits from the deadline on.  A worker
  refused its intent past the deadline does what the worker does: with an
  earlier issue unanswered it would look, and this provider cannot say,
  so it ends the Operation ``external_outcome_unknown``; otherwise its
  retryable failure ends it by the deadline.
  INV-OP-UNANSWERED-NOT-DEADLINE asks that no commit ends it
  ``deadline_exceeded`` while an intent has no "not applied" answer.
- ``Bounds.denials`` lets a worker, before its intent, meet a revoked
  principal or a handler failure that is not retryable instead, and with
  ``maximum_attempts`` below ``max_claims`` a replacement finds every
  Attempt used: INV-OP-UNANSWERED-NOT-FAILED asks that none of these ends
  the Operation ``max_attempts_exceeded``, ``not_authorized`` or
  ``action_failed`` while an intent has no "not applied" answer.
- ``Bounds.older_approval`` starts from a row an earlier release left: the
  Operation's approval was given by its requester under the resolver's
  next version (``decide`` refuses that now; that release consumed it), and
  its Attempt 1, by a worker no longer present, recorded its intent.  No
  claim may end it ``approval_misbound`` while that call is unanswered
  (INV-OP-UNANSWERED-NOT-FAILED): the kernel's own decisions never reach
  ``approval_misbound`` after a call, so only such a row can.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs

from . import operations as o
from .machines import OPERATION, OperationState

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
TICK = timedelta(seconds=1)
IDENTITY = o.Identity("model", "tenant", "users:v1:requester", "key-1")
MOVED_IDENTITY = attrs.evolve(IDENTITY, principal="users:v2:requester")
"""The requester's identity under the next version of the ``users`` resolver: the same key as ``IDENTITY``."""
DIGEST = "0" * 64
APPROVER = "users:v1:approver"
CANCELLER = "users:v1:requester"


class Invariant(enum.Enum):
    """The invariants of specs/operations.md, by stable id."""

    ONE_OWNER = "INV-OP-ONE-OWNER"
    FENCED_WRITES = "INV-OP-FENCED-WRITES"
    APPROVAL_ONCE = "INV-OP-APPROVAL-ONCE"
    CANCEL_OR_EFFECT = "INV-OP-CANCEL-OR-EFFECT"
    ONE_TERMINAL = "INV-OP-ONE-TERMINAL"
    ONE_OPERATION = "INV-OP-ONE-OPERATION"
    TABLES = "INV-OP-TABLES"
    NO_BLIND_RESEND = "INV-OP-NO-BLIND-RESEND"
    UNKNOWN_ONLY_IF_AMBIGUOUS = "INV-OP-UNKNOWN-ONLY-IF-AMBIGUOUS"
    AUTHORIZED_ANSWER = "INV-OP-AUTHORIZED-ANSWER"
    DUE_CLAIMED = "INV-OP-DUE-CLAIMED"
    NO_EFFECT_AFTER_DEADLINE = "INV-OP-NO-EFFECT-AFTER-DEADLINE"
    UNANSWERED_NOT_DEADLINE = "INV-OP-UNANSWERED-NOT-DEADLINE"
    UNANSWERED_NOT_FAILED = "INV-OP-UNANSWERED-NOT-FAILED"


class Answer(enum.Enum):
    """What one call of an external provider did, and what its caller learnt."""

    DECLINED = "declined"
    """Not applied, and the provider said so (a conclusive FAILED)."""
    SUCCEEDED = "succeeded"
    LOST_REPLY = "lost_reply"
    """Applied; the reply never arrived."""
    TIMEOUT = "timeout"
    """Not applied; the caller cannot tell."""


@attrs.frozen(cache_hash=True)
class WorkerEffect:
    """What a worker knows of the external effect under its latest credential."""

    plan: o.EffectPlan
    """``effect_plan`` of the Operation its claim wrote."""
    intended: bool = False
    """Its intent committed."""
    answer: Answer | None = None
    """Its call's answer; None before it called."""


@attrs.frozen(cache_hash=True)
class OpsProtocol:
    """The decision functions under test.  Defaults are the real ones."""

    submit: Callable[..., o.Outcome] = o.submit
    claim: Callable[..., o.Outcome] = o.claim
    heartbeat: Callable[..., o.Outcome] = o.heartbeat
    complete: Callable[..., o.Outcome] = o.complete
    fail: Callable[..., o.Outcome] = o.fail
    decide: Callable[..., o.Outcome] = o.decide
    cancel: Callable[..., o.Outcome] = o.cancel
    record_intent: Callable[..., o.Outcome] = o.record_intent
    outcome_unknown: Callable[..., o.Outcome] = o.outcome_unknown
    effect_plan: Callable[[o.Operation], o.EffectPlan] = o.effect_plan
    apply_guard: bool = True
    due_claim: Callable[..., o.Outcome] | None = None
    """The claim ``INV-OP-DUE-CLAIMED`` asks of every due Operation in every state; None: ``claim``.

    Apart from ``claim`` so that a caller recording the explored decisions records only the actors' calls.
    """


@attrs.frozen(cache_hash=True)
class Bounds:
    """How large a world the operations checker explores; the bounds are what make the search finite.

    ``max_claims`` bounds the fence, ``max_tick`` the clock and
    ``maximum_attempts`` the retry policy; the flags choose who takes part
    (submitters, an approver, a canceller) and whether the action is an
    external effect.  Within them the search is complete unless
    ``max_depth`` or ``max_states`` cuts it, and :class:`Result` says which.
    """

    workers: int = 3
    submitters: int = 0
    """Clients submitting the identity concurrently; 0 starts with the Operation admitted."""
    approval: bool = True
    cancel: bool = True
    max_claims: int = 3
    lease_ticks: int = 2
    max_tick: int = 5
    maximum_attempts: int = 3
    max_depth: int | None = None
    max_states: int = 3_000_000
    external: bool = False
    """The action is an external effect of a provider neither idempotent nor reconcilable (see the module rules)."""
    revoked_submitter: bool = False
    """The last submitter's principal is no longer authorized: the same identity and input, a denied authority."""
    deadline_ticks: int = 100
    """The retry policy's ``schedule_to_close``, in ticks from admission at tick 0 (beyond ``max_tick`` by default)."""
    denials: bool = False
    """External effects: before its intent a worker may instead meet a revoked principal, or a handler's failure that
    is not retryable, and fail so (each ends the Operation whatever an earlier Attempt's call did)."""
    older_approval: bool = False
    """External effects: the world starts from the row an earlier release left (see the module rules): an approval
    that authorizes nothing now, consumed by Attempt 1, whose lost worker recorded its intent."""
    moved_submitter: bool = False
    """The second submitter is the same principal under the next version of its resolver: the same identity key.

    The world's one identity is the store's row of that key (``operations.identity_key``), which the
    stores find whatever the version (seed 001, Scoped idempotency: "stable initiating-principal reference").
    """


STANDARD: tuple[tuple[str, Bounds], ...] = (
    (
        "operations: three clients submit one identity at once (one under the resolver's next version), and a "
        "fourth no longer authorized (complete)",
        Bounds(workers=0, submitters=4, approval=False, cancel=False, revoked_submitter=True, moved_submitter=True),
    ),
    (
        "operations: three workers, reclaim, approval and cancel (every interleaving to depth 11)",
        Bounds(workers=3, max_claims=3, max_tick=5, max_depth=11),
    ),
    (
        "operations: an external effect, two workers, every provider answer (every interleaving to depth 17)",
        Bounds(workers=2, approval=False, cancel=False, max_claims=3, max_tick=3, max_depth=17, external=True),
    ),
    (
        "operations: an external effect whose Attempts run out, a revoked principal and a failure that is not "
        "retryable (every interleaving to depth 15)",
        Bounds(
            workers=2, approval=False, cancel=False, max_claims=3, maximum_attempts=2, max_tick=3, max_depth=15,
            external=True, denials=True,
        ),
    ),
    (
        "operations: an external call issued under an approval an earlier release consumed, which authorizes nothing "
        "now, two workers and a canceller (complete)",
        Bounds(workers=2, approval=False, max_claims=3, max_tick=3, external=True, older_approval=True),
    ),
    (
        "operations: the deadline falls inside a live lease, an atomic action and a canceller (every interleaving to depth 13)",
        Bounds(workers=2, approval=False, max_claims=2, max_tick=3, deadline_ticks=1, max_depth=13),
    ),
    (
        "operations: the deadline falls inside a live lease, an external effect (every interleaving to depth 16)",
        Bounds(
            workers=2, approval=False, cancel=False, max_claims=2, max_tick=3, deadline_ticks=1, max_depth=16,
            external=True,
        ),
    ),
)
"""The configurations ``fencekeeper modelcheck`` runs for operations by default.

Depth 10 already holds the deepest scenario seed 001 describes (approve,
claim, expiry, automatic reclaim, the zombie's completion: every decision
and its commit are two moves); 11 adds one more move anywhere in it.
Depth 14 (2.2 million states, about 6.5 minutes here) found nothing more;
``explore(attrs.evolve(STANDARD[1][1], max_depth=14))`` repeats it.
The external configuration's depth 17 holds two Attempts that each call
the provider and a third that claims after them (about 86,000 states, ten
seconds here).  The one whose Attempts run out (two Attempts, three claims)
reaches at depth 15 a lost reply, its retry's failure and a replacement
that finds every Attempt used, 14 moves (about 73,000 states, eight
seconds here).
"""


@attrs.frozen(cache_hash=True)
class Pending:
    """A decision an actor made on an earlier world, waiting to commit.

    Committed only if its guard still holds on the world at commit time, as
    a store commits a request (specs/operations.md, Shape of a decision):
    the moves between the decision and its commit are the races the guard
    exists for.
    """

    label: str
    actor: str
    kind: str
    decision: o.Decision
    credential: o.Credential | None = None


@attrs.frozen(cache_hash=True)
class World:
    """One state of the model: the store's rows, the clock, each actor's credentials and pending decision.

    Hashable and compared by value, so the search visits each world once;
    it holds exactly what the invariants of specs/operations.md (Invariants)
    are judged on, including the effects and provider calls they count.
    """

    tick: int
    operations: tuple[o.Operation, ...]
    holder: str | None
    """The Operation id the idempotency identity names."""
    attempts: tuple[o.Attempt, ...]
    credentials: tuple[tuple[o.Credential, ...], ...]
    """``credentials[worker]``: every credential a claim gave it."""
    pending: tuple[Pending | None, ...]
    """One slot per actor: workers, then submitters, then approver, then canceller."""
    submitted: tuple[bool, ...]
    effects: int = 0
    consumptions: int = 0
    decided: bool = False
    cancelled: bool = False
    knows: tuple[WorkerEffect | None, ...] = ()
    """External effects: ``knows[worker]``, what it knows under its latest credential (None before a claim)."""
    calls: tuple[tuple[int, Answer], ...] = ()
    """External effects: every provider call, in order, as (the caller's fence, its answer)."""
    intents: frozenset[int] = frozenset()
    """External effects: the fences whose intent committed."""
    answered: frozenset[int] = frozenset()
    """External effects: the fences whose "not applied" answer committed (a fail with ``effect_not_applied``)."""

    @property
    def now(self) -> datetime:
        """The world's time: ``EPOCH`` plus ``tick`` seconds, the only clock the model reads."""
        return EPOCH + self.tick * TICK


@attrs.frozen(cache_hash=True)
class Violation:
    """An invariant of specs/operations.md broken, what broke it, and the shortest trace of moves that does."""

    invariant: Invariant
    message: str
    trace: tuple[str, ...]


@attrs.frozen(cache_hash=True)
class Result:
    """What an exploration found: how much it explored, how deep, whether completely, and the violation if any."""

    states: int
    transitions: int
    depth: int
    complete: bool
    """True when every reachable state within the bounds was explored."""
    violation: Violation | None


@attrs.frozen(cache_hash=True)
class Move:
    """One successor of a world: what happened, and the world after it.

    ``broken`` is set (and ``world`` is the world the bad write produced)
    when the move committed a write, or a submission got an answer, that
    breaks an invariant.
    """

    label: str
    world: World
    broken: tuple[Invariant, str] | None = None


def worker_id(index: int) -> str:
    """The id of the ``index``-th worker of a world (counted from 0): ``w1``, ``w2``, ..."""
    return f"w{index + 1}"


def _policy(bounds: Bounds) -> o.RetryPolicy:
    return o.RetryPolicy(
        initial_interval=TICK,
        backoff_coefficient=1.0,
        maximum_interval=TICK,
        maximum_attempts=bounds.maximum_attempts,
        schedule_to_close=bounds.deadline_ticks * TICK,
    )


def _revoked(bounds: Bounds, client: int) -> bool:
    return bounds.revoked_submitter and client == bounds.submitters - 1


def _submit_request(bounds: Bounds, client: int) -> o.SubmitRequest:
    granted = not _revoked(bounds, client)
    identity = MOVED_IDENTITY if bounds.moved_submitter and client == 1 else IDENTITY
    return o.SubmitRequest(
        operation_id=f"op-c{client + 1}",
        identity=identity,
        action_name="capture" if bounds.external else "transfer",
        action_version=1,
        effect_class=o.EffectClass.EXTERNAL if bounds.external else o.EffectClass.ATOMIC,
        input_digest=DIGEST,
        authority=o.Authority(granted, identity.principal, "" if granted else "revoked: the principal was revoked"),
        policy=_policy(bounds),
        requires_approval=bounds.approval,
    )


def _older_row(bounds: Bounds) -> tuple[o.Operation, tuple[o.Attempt, ...]]:
    """The Operation and its Attempt as an earlier release left them (``Bounds.older_approval``), at tick 0.

    Made by today's decisions up to the intent of Attempt 1 (by ``w0``, no worker of the world), then given the
    approval that release stored and consumed: the requester's own, under the next version of their resolver.
    """
    request = attrs.evolve(_submit_request(bounds, 0), operation_id="op-1", requires_approval=True)
    admitted = o.submit(None, request, EPOCH)
    assert isinstance(admitted, o.Decision)
    op = admitted.operation
    approve = o.DecideRequest(
        "ap-1", op.operation_id, op.input_digest, op.action_name, op.action_version, op.identity.tenant, APPROVER,
        True, EPOCH + 100 * TICK, o.Authority(True, APPROVER),
    )
    decided = o.decide(op, approve, EPOCH)
    assert isinstance(decided, o.Decision)
    claimed = o.claim(decided.operation, o.ClaimRequest("w0", bounds.lease_ticks * TICK), EPOCH)
    assert isinstance(claimed, o.Decision) and claimed.credential is not None
    intent = o.record_intent(claimed.operation, o.IntentRequest(claimed.credential), EPOCH)
    assert isinstance(intent, o.Decision)
    op = intent.operation
    assert op.approval is not None
    return attrs.evolve(op, approval=attrs.evolve(op.approval, approver=MOVED_IDENTITY.principal)), claimed.attempts


def initial_world(bounds: Bounds) -> World:
    """The world a search starts from: tick 0, one admitted Operation (none while submitters race to admit it).

    With ``Bounds.older_approval``, the running Operation an earlier release left instead, its intent committed.
    """
    slots = bounds.workers + bounds.submitters + 2
    operations: tuple[o.Operation, ...] = ()
    attempts: tuple[o.Attempt, ...] = ()
    holder = None
    if bounds.older_approval:
        older, attempts = _older_row(bounds)
        operations, holder = (older,), older.operation_id
    elif bounds.submitters == 0:
        admitted = o.submit(None, attrs.evolve(_submit_request(bounds, 0), operation_id="op-1"), EPOCH)
        assert isinstance(admitted, o.Decision)
        operations, holder = (admitted.operation,), admitted.operation.operation_id
    return World(
        tick=0,
        operations=operations,
        holder=holder,
        attempts=attempts,
        credentials=((),) * bounds.workers,
        pending=(None,) * slots,
        submitted=(False,) * bounds.submitters,
        knows=(None,) * bounds.workers if bounds.external else (),
        intents=frozenset({1}) if bounds.older_approval else frozenset(),
    )


# --- actions ---------------------------------------------------------------------


def _decisions(world: World, bounds: Bounds, proto: OpsProtocol) -> Iterator[tuple[int, str, str, o.Outcome, o.Credential | None]]:
    """Every decision an idle actor could make now: (slot, label, kind, outcome, credential)."""
    now = world.now
    op = world.operations[0] if world.operations else None
    lease = bounds.lease_ticks * TICK
    for w in range(bounds.workers):
        if world.pending[w] is not None or op is None:
            continue
        name = worker_id(w)
        if op.fence < bounds.max_claims:
            yield w, f"{name} decides claim", "claim", proto.claim(op, o.ClaimRequest(name, lease), now), None
        held = world.credentials[w]
        for credential in held[-1:]:
            # Only the latest credential: an older one of the same worker is weaker than the latest (both stale).
            f = credential.fence
            yield (
                w,
                f"{name} decides heartbeat (fence {f})",
                "heartbeat",
                proto.heartbeat(op, o.HeartbeatRequest(credential, lease), now),
                credential,
            )
            if bounds.external:
                yield from _external_decisions(world, w, credential, proto, bounds)
                continue
            yield (
                w,
                f"{name} decides complete (fence {f})",
                "complete",
                proto.complete(op, o.CompleteRequest(credential, o.Authority(True, IDENTITY.principal)), now),
                credential,
            )
            yield (
                w,
                f"{name} decides retryable failure (fence {f})",
                "fail",
                proto.fail(op, o.FailRequest(credential, "busy", retryable=True), now),
                credential,
            )
    for c in range(bounds.submitters):
        slot = bounds.workers + c
        if world.pending[slot] is not None or world.submitted[c]:
            continue
        existing = next((x for x in world.operations if x.operation_id == world.holder), None)
        outcome = proto.submit(existing, _submit_request(bounds, c), now)
        yield slot, f"c{c + 1} decides submit", "submit", outcome, None
    approver = bounds.workers + bounds.submitters
    if bounds.approval and op is not None and not world.decided and world.pending[approver] is None:
        decision_request = o.DecideRequest(
            "ap-1",
            op.operation_id,
            op.input_digest,
            op.action_name,
            op.action_version,
            op.identity.tenant,
            APPROVER,
            True,
            EPOCH + 100 * TICK,
            o.Authority(True, APPROVER),
        )
        yield approver, "approver decides approve", "decide", proto.decide(op, decision_request, now), None
    canceller = approver + 1
    if bounds.cancel and op is not None and not world.cancelled and world.pending[canceller] is None:
        cancel_request = o.CancelRequest(op.operation_id, CANCELLER, o.Authority(True, CANCELLER))
        yield canceller, "requester decides cancel", "cancel", proto.cancel(op, cancel_request, now), None


def _external_decisions(
    world: World, w: int, credential: o.Credential, proto: OpsProtocol, bounds: Bounds
) -> Iterator[tuple[int, str, str, o.Outcome, o.Credential | None]]:
    """The worker's next decision on an external effect, from what it knows (its call is a move of its own)."""
    op, now, name = world.operations[0], world.now, worker_id(w)
    knows = world.knows[w]
    assert knows is not None
    unknown = o.UnknownRequest(credential, "ambiguous and not reconcilable")
    choices: list[tuple[str, str, o.Outcome]] = []
    if not knows.intended:
        intent = proto.record_intent(op, o.IntentRequest(credential), now)
        choices.append(("intent", "intent", intent))
        if bounds.denials:
            # What the worker meets before its intent: a principal revoked since the claim (after a look this provider
            # cannot answer), or a payload builder's failure that is not retryable.
            denied = o.FailRequest(credential, "not_authorized", retryable=False, not_authorized=True)
            choices.append(("denial", "fail", proto.fail(op, denied, now)))
            rejected = o.FailRequest(credential, "rejected", retryable=False)
            choices.append(("failure that is not retryable", "fail", proto.fail(op, rejected, now)))
        if isinstance(intent, o.Refusal) and intent.code is o.RefusalCode.DEADLINE_EXCEEDED:
            # As the worker answers it: with an earlier issue unanswered it would look, and this provider cannot
            # say, so the outcome is unknown; with none, its retryable failure ends the Operation by the deadline.
            if knows.plan is o.EffectPlan.RECONCILE:
                choices.append(("outcome unknown", "unknown", proto.outcome_unknown(op, unknown, now)))
            else:
                late = o.FailRequest(credential, "deadline_exceeded", retryable=True)
                choices.append(("failure past the deadline", "fail", proto.fail(op, late, now)))
    elif knows.plan is o.EffectPlan.RECONCILE:
        # An earlier issue is unanswered and this provider can neither be asked nor deduplicate.
        choices.append(("outcome unknown", "unknown", proto.outcome_unknown(op, unknown, now)))
    elif knows.answer is Answer.DECLINED:
        declined = o.FailRequest(credential, "effect_failed", retryable=True, effect_not_applied=True)
        choices.append(("declined", "declined", proto.fail(op, declined, now)))
    elif knows.answer is Answer.SUCCEEDED:
        succeeded = o.CompleteRequest(credential, o.Authority(True, IDENTITY.principal))
        choices.append(("complete", "complete", proto.complete(op, succeeded, now)))
    elif knows.answer is not None:
        choices.append(("outcome unknown", "unknown", proto.outcome_unknown(op, unknown, now)))
        # An adapter that raised instead of answering: a retryable handler error, nothing settled.
        raised = o.FailRequest(credential, "handler_error", retryable=True)
        choices.append(("handler error", "fail", proto.fail(op, raised, now)))
    for what, kind, outcome in choices:
        yield w, f"{name} decides {what} (fence {credential.fence})", kind, outcome, credential


def _calls(world: World, bounds: Bounds) -> Iterator[Move]:
    """Every provider call a worker may make now: after its intent committed, on a ``perform`` plan, once.

    The call does not ask the store anything, so a replaced owner (a zombie) makes it too.
    """
    for w, knows in enumerate(world.knows):
        if world.pending[w] is not None or knows is None or not knows.intended or knows.answer is not None:
            continue
        if knows.plan is not o.EffectPlan.PERFORM:
            continue
        fence = world.credentials[w][-1].fence
        broken: tuple[Invariant, str] | None = None
        earlier = [(f, a.value) for f, a in world.calls if a is not Answer.DECLINED]
        if earlier:
            why = f"{worker_id(w)} (fence {fence}) calls the provider; earlier calls not known unapplied: {earlier}"
            broken = Invariant.NO_BLIND_RESEND, why
        for answer in Answer:
            knows_now = (*world.knows[:w], attrs.evolve(knows, answer=answer), *world.knows[w + 1 :])
            after = attrs.evolve(world, knows=knows_now, calls=(*world.calls, (fence, answer)))
            yield Move(f"{worker_id(w)} calls the provider (fence {fence}): {answer.value}", after, broken)


def _guard_holds(world: World, guard: o.Guard) -> bool:
    op = next((x for x in world.operations if x.operation_id == guard.operation_id), None)
    return guard.holds(op, world.holder, world.now)


def _apply(world: World, pending: Pending, slot: int, bounds: Bounds, proto: OpsProtocol) -> World:
    decision = pending.decision
    new = decision.operation
    others = tuple(x for x in world.operations if x.operation_id != new.operation_id)
    old = next((x for x in world.operations if x.operation_id == new.operation_id), None)
    operations = tuple(sorted((*others, new), key=lambda x: x.operation_id))
    attempts = {(a.operation_id, a.number): a for a in world.attempts}
    for attempt in decision.attempts:
        attempts[(attempt.operation_id, attempt.number)] = attempt
    credentials = world.credentials
    knows, intents, answered = world.knows, world.intents, world.answered
    if decision.credential is not None and slot < bounds.workers:
        mine = (*credentials[slot], decision.credential)
        credentials = (*credentials[:slot], mine, *credentials[slot + 1 :])
        if bounds.external:
            # What the worker decides before the provider, from the Operation its claim wrote.
            fresh = WorkerEffect(proto.effect_plan(new))
            knows = (*knows[:slot], fresh, *knows[slot + 1 :])
    if bounds.external and pending.credential is not None:
        fence = pending.credential.fence
        if pending.kind == "intent":
            intents = intents | {fence}
            mine_now = knows[slot]
            assert mine_now is not None
            knows = (*knows[:slot], attrs.evolve(mine_now, intended=True), *knows[slot + 1 :])
        elif pending.kind == "declined":
            answered = answered | {fence}
    consumed_before = old.approval.consumed_by if old is not None and old.approval is not None else None
    consumed_after = new.approval.consumed_by if new.approval is not None else None
    consumption = consumed_after is not None and consumed_after != consumed_before
    return attrs.evolve(
        world,
        operations=operations,
        holder=new.operation_id if decision.guard.identity is not None else world.holder,
        attempts=tuple(attempts[k] for k in sorted(attempts)),
        credentials=credentials,
        effects=world.effects + (1 if pending.kind == "complete" else 0),
        consumptions=world.consumptions + (1 if consumption else 0),
        knows=knows,
        intents=intents,
        answered=answered,
    )


def _retire(world: World, slot: int, bounds: Bounds, kind: str) -> World:
    """The actor's pending slot is free again; a one-shot actor (submitter, approver, canceller) is spent."""
    pending = (*world.pending[:slot], None, *world.pending[slot + 1 :])
    world = attrs.evolve(world, pending=pending)
    if kind == "submit":
        c = slot - bounds.workers
        world = attrs.evolve(world, submitted=(*world.submitted[:c], True, *world.submitted[c + 1 :]))
    elif kind == "decide":
        world = attrs.evolve(world, decided=True)
    elif kind == "cancel":
        world = attrs.evolve(world, cancelled=True)
    return world


def moves(world: World, bounds: Bounds, proto: OpsProtocol) -> tuple[list[Move], int]:
    """Every move from ``world`` (a clock tick, a provider call, a decision, a pending commit) and the decisions made.

    A commit is applied only if its guard still holds; a move that breaks a
    write invariant carries the violation (:func:`check_write`).
    """
    found: list[Move] = []
    decided = 0
    if world.tick < bounds.max_tick:
        found.append(Move(f"clock ticks to {world.tick + 1}", attrs.evolve(world, tick=world.tick + 1)))
    if bounds.external:
        found.extend(_calls(world, bounds))
    for slot, label, kind, outcome, credential in _decisions(world, bounds, proto):
        decided += 1
        if kind == "submit" and _revoked(bounds, slot - bounds.workers):
            broken = check_unauthorized_submission(outcome)
            if broken is not None:
                found.append(Move(label, _retire(world, slot, bounds, kind), broken))
                continue
        if isinstance(outcome, o.Decision):
            pending = Pending(label, label.split()[0], kind, outcome, credential)
            slots = (*world.pending[:slot], pending, *world.pending[slot + 1 :])
            found.append(Move(label, attrs.evolve(world, pending=slots)))
    for slot, waiting in enumerate(world.pending):
        if waiting is None:
            continue
        label = f"{waiting.actor} commits {waiting.kind}"
        base = _retire(world, slot, bounds, waiting.kind)
        if proto.apply_guard and not _guard_holds(world, waiting.decision.guard):
            found.append(Move(f"{label}: guard fails, nothing written", base))
            continue
        after = _apply(base, waiting, slot, bounds, proto)
        found.append(Move(label, after, check_write(world, after, waiting)))
    return found, decided


# --- invariants ------------------------------------------------------------------


def check_state(world: World, proto: OpsProtocol = OpsProtocol()) -> tuple[Invariant, str] | None:
    """The first state invariant of specs/operations.md ``world`` breaks, with what broke it; None when all hold."""
    key = o.identity_key(IDENTITY)
    identical = [x for x in world.operations if o.identity_key(x.identity) == key]
    if len(identical) > 1:
        return Invariant.ONE_OPERATION, f"one identity, {len(identical)} operations: {[x.operation_id for x in identical]}"
    for op in world.operations:
        running = [a for a in world.attempts if a.operation_id == op.operation_id and a.state is o.AttemptState.RUNNING]
        if len(running) > 1:
            return Invariant.ONE_OWNER, f"{op.operation_id}: attempts {[a.number for a in running]} are all running"
        if running and (op.state is not OperationState.RUNNING or running[0].number != op.fence):
            return Invariant.ONE_OWNER, (
                f"{op.operation_id}: attempt {running[0].number} runs while the operation is {op.state.value} "
                f"at fence {op.fence}"
            )
        if op.state is OperationState.CANCELLED and world.effects:
            return Invariant.CANCEL_OR_EFFECT, f"{op.operation_id} is cancelled and its effect committed"
        if o.due(op, world.now):
            # A store finds work by ``due``: a claim that refused a due Operation would leave it first in
            # its tenant's queue, refused again by every later claim.
            claim = proto.claim if proto.due_claim is None else proto.due_claim
            claimed = claim(op, o.ClaimRequest("w-due", TICK), world.now)
            if isinstance(claimed, o.Refusal):
                return Invariant.DUE_CLAIMED, (
                    f"{op.operation_id} is due ({op.state.value}) at tick {world.tick} and its claim is refused "
                    f"{claimed.code.value}: {claimed.message}"
                )
    if world.effects > 1:
        return Invariant.CANCEL_OR_EFFECT, f"the effect committed {world.effects} times"
    return None


def check_unauthorized_submission(outcome: o.Outcome) -> tuple[Invariant, str] | None:
    """A submission whose authority is not granted is refused ``not_authorized``, whatever the identity names."""
    if isinstance(outcome, o.Refusal) and outcome.code is o.RefusalCode.NOT_AUTHORIZED:
        return None
    if isinstance(outcome, o.Refusal):
        what = f"refused {outcome.code.value}: {outcome.message}"
    else:
        what = f"answered {type(outcome).__name__} with {outcome.operation.operation_id}"
    return Invariant.AUTHORIZED_ANSWER, f"a submission without current authority was {what}"


def check_write(before: World, after: World, pending: Pending) -> tuple[Invariant, str] | None:
    """The first write invariant of specs/operations.md the commit of ``pending`` breaks; None when all hold."""
    decision = pending.decision
    new = decision.operation
    old = next((x for x in before.operations if x.operation_id == new.operation_id), None)
    if pending.kind == "complete" and old is not None and old.state is OperationState.CANCELLED:
        return Invariant.CANCEL_OR_EFFECT, f"the effect committed after cancellation of {old.operation_id}"
    if old is not None and old.state in OPERATION.terminal:
        return Invariant.ONE_TERMINAL, (
            f"{old.operation_id} ended {old.state.value} ({old.outcome.value if old.outcome else '?'}) "
            f"and was written again by {pending.actor}'s {pending.kind} -> {new.state.value}"
        )
    credential = pending.credential
    begins = pending.kind == "intent" or (pending.kind == "complete" and new.effect_class is o.EffectClass.ATOMIC)
    if begins and old is not None and before.now >= old.deadline:
        return Invariant.NO_EFFECT_AFTER_DEADLINE, (
            f"{pending.actor}'s {pending.kind} committed at tick {before.tick}, from the deadline "
            f"{_tick(old.deadline)} on: an effect began after it"
        )
    if credential is not None and old is not None:
        live = old.lease_expires_at is not None and before.now < old.lease_expires_at
        if credential.fence != old.fence or old.owner != credential.worker_id or not live:
            return Invariant.FENCED_WRITES, (
                f"{pending.actor} wrote {pending.kind} with fence {credential.fence}; the operation was at fence "
                f"{old.fence} owned by {old.owner}, lease until {_tick(old.lease_expires_at)}, now tick {before.tick}"
            )
    open_now = sorted(after.intents - after.answered)  # a "not applied" answer committing now counts
    ended_by_deadline = new.outcome is o.TerminalOutcome.DEADLINE_EXCEEDED and old is not None and old.outcome is None
    if ended_by_deadline and open_now:
        # Each open intent's call may have been applied, and nothing answered it: ending the Operation as a
        # missed deadline would say nothing happened (its only honest ends are a success or an unknown outcome).
        return Invariant.UNANSWERED_NOT_DEADLINE, (
            f"{pending.actor}'s {pending.kind} ended {new.operation_id} deadline_exceeded while the issues of "
            f"attempts {open_now} were unanswered: calls {[(f, a.value) for f, a in before.calls]}"
        )
    ended_failed = new.outcome in _FAILED_ENDINGS and old is not None and old.outcome is None
    if ended_failed and open_now:
        # The same for every other failed ending: a limit of Attempts, a denial, a failure that is not retryable, an
        # approval that authorizes nothing would each say the Operation stopped while a call the provider may have
        # applied is unanswered.
        assert new.outcome is not None
        return Invariant.UNANSWERED_NOT_FAILED, (
            f"{pending.actor}'s {pending.kind} ended {new.operation_id} {new.outcome.value} while the issues of "
            f"attempts {open_now} were unanswered: calls {[(f, a.value) for f, a in before.calls]}"
        )
    ended_unknown = new.outcome is o.TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN and old is not None and old.outcome is None
    if ended_unknown and pending.kind != "unknown" and not open_now:
        # A claim, a failure or a sweep that ends it unknown: only while some issue is unanswered.
        return Invariant.UNKNOWN_ONLY_IF_AMBIGUOUS, (
            f"{pending.actor}'s {pending.kind} ended {new.operation_id} external_outcome_unknown, but every issue "
            f"was answered not applied: intents {sorted(after.intents)}, calls {[(f, a.value) for f, a in before.calls]}"
        )
    if pending.kind == "unknown" and credential is not None and old is not None and old.state is OperationState.RUNNING:
        # Ambiguous: some committed intent (another Attempt's, or this one's once it called) has no committed
        # "not applied" answer, so its call may have been made and applied.
        called = any(f == credential.fence for f, _ in before.calls)
        open_intents = sorted(f for f in before.intents - before.answered if f != credential.fence or called)
        if not open_intents:
            return Invariant.UNKNOWN_ONLY_IF_AMBIGUOUS, (
                f"{pending.actor} ended {old.operation_id} external_outcome_unknown, but every issue was answered "
                f"not applied: intents {sorted(before.intents)}, calls {[(f, a.value) for f, a in before.calls]}"
            )
    if after.consumptions > 1:
        return Invariant.APPROVAL_ONCE, f"approval consumed {after.consumptions} times (by {pending.actor}'s {pending.kind})"
    if old is not None and old.state != new.state and not any(
        OPERATION.step(old.state, e) == new.state for e in OPERATION.events_from(old.state)
    ):
        return Invariant.TABLES, f"{old.state.value} -> {new.state.value} is in no row of the operation machine"
    return None


_FAILED_ENDINGS = frozenset(
    {
        o.TerminalOutcome.MAX_ATTEMPTS_EXCEEDED,
        o.TerminalOutcome.ACTION_FAILED,
        o.TerminalOutcome.NOT_AUTHORIZED,
        o.TerminalOutcome.APPROVAL_MISBOUND,
    }
)
"""The failed endings INV-OP-UNANSWERED-NOT-FAILED names (the deadline has its own invariant)."""


def _tick(moment: datetime | None) -> str:
    return "never" if moment is None else f"tick {(moment - EPOCH) // TICK}"


# --- the search --------------------------------------------------------------------


def explore(
    bounds: Bounds = Bounds(),
    proto: OpsProtocol = OpsProtocol(),
    progress: Callable[[int, int], Any] | None = None,
) -> Result:
    """Breadth-first search of every interleaving within ``bounds``; stops at the first violation."""
    start = initial_world(bounds)
    parents: dict[World, tuple[World | None, str]] = {start: (None, "start")}
    frontier: deque[tuple[World, int]] = deque([(start, 0)])
    transitions = 0
    depth_reached = 0
    complete = True

    def trace(world: World) -> tuple[str, ...]:
        steps: list[str] = []
        node: World | None = world
        while node is not None:
            parent, label = parents[node]
            if parent is not None:
                steps.append(label)
            node = parent
        return tuple(reversed(steps))

    while frontier:
        world, depth = frontier.popleft()
        depth_reached = max(depth_reached, depth)
        if bounds.max_depth is not None and depth >= bounds.max_depth:
            complete = False
            continue
        successors, decided = moves(world, bounds, proto)
        transitions += decided
        for move in successors:
            if move.broken is not None:
                path = (*trace(world), move.label)
                return Result(len(parents), transitions, depth + 1, False, Violation(*move.broken, path))
            if move.world in parents:
                continue
            parents[move.world] = (world, move.label)
            broken = check_state(move.world, proto)
            if broken is not None:
                return Result(len(parents), transitions, depth + 1, False, Violation(*broken, trace(move.world)))
            if len(parents) >= bounds.max_states:
                return Result(len(parents), transitions, depth + 1, False, None)
            frontier.append((move.world, depth + 1))
        if progress is not None and len(parents) % 50_000 < len(successors):
            progress(len(parents), depth)
    return Result(len(parents), transitions, depth_reached, complete, None)


__all__ = [
    "STANDARD",
    "Answer",
    "Bounds",
    "Invariant",
    "Move",
    "OpsProtocol",
    "Pending",
    "Result",
    "Violation",
    "WorkerEffect",
    "World",
    "check_state",
    "check_unauthorized_submission",
    "check_write",
    "explore",
    "initial_world",
    "moves",
    "worker_id",
]
