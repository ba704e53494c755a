"""An exhaustive bounded model checker for the lease and fencing protocol.

It explores, breadth first, every interleaving of a small world -- several
workers, several executions, a clock that ticks past lease expiry, external
wakes, cancellations and governed recovery commands -- applying each
decision the way a store does (all of it under the guard, or nothing), and
checks every invariant of ``specs/protocol.md`` in every reachable state and
on every committed write.  A violation comes back with the shortest trace
that reaches it, because breadth-first search finds shallow states first.

Rules of this module:

- It is pure and deterministic: the same :class:`Bounds` and
  :class:`Protocol` always explore the same states in the same order.  It
  reads no clock (time is the world's ``tick``) and makes no random choice
  (lease tokens are derived from execution, fence and worker, so every claim
  gets a token no earlier claim had).
- The decisions under test come in a :class:`Protocol` bundle, so a broken
  variant (the bug zoo in ``tests/protocol/zoo.py``) or another
  implementation's decisions can be checked by the same explorer.
- The checker is a store too: it applies a :class:`Decision` only if its
  :class:`Guard` holds on the current world.  ``Protocol.apply_guard`` can
  switch that off, which is how the zoo shows the guard is load-bearing.
- Bounds make the space finite: claims per execution (the fence), node
  steps, clock ticks and one in-flight decision (decided on one state and
  committed later, after other actors moved: the race that guards exist for).
  Within the bounds the search is complete unless ``max_depth`` cuts it,
  and the result says which.
- A composed transaction (``Protocol.compose``: a claim or a step and the
  holder's next decisions, steps and then a finalize, and after a finalize
  the same worker's claim of another execution and that claim's own chain,
  committed together) is one move made of them all, each decided on the world the one before
  it wrote, each applied under its own guard, every write checked; if one
  is not a decision or its guard fails, the chain ends before it (its
  prefixes are moves of their own).  :func:`check_refinement` proves
  composition reaches no world the uncomposed protocol does not.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs

from . import protocol as p
from . import recovery
from .definition import Definition, parse_definition
from .evidence import Evidence
from .machines import (
    EXECUTION,
    DispatchState,
    ExecutionState,
    dispatch_state_of,
)

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
TICK = timedelta(seconds=1)
EVENT_TYPE = "payment.received"
CORRELATION = (("order", "o-1"),)
WAKE_AT = EPOCH + 3 * TICK
"""The one-time UTC wake every waiter in the model registers (one value keeps the space small)."""
GOVERNOR = "ops"
"""The principal that issues governed recovery commands in the model."""


class Invariant(enum.Enum):
    """The invariants of specs/protocol.md, by stable id."""

    AGREE = "INV-AGREE"
    LEASE_IFF_CLAIMED = "INV-LEASE-IFF-CLAIMED"
    ONE_LIVE_LEASE = "INV-ONE-LIVE-LEASE"
    FENCED_WRITES = "INV-FENCED-WRITES"
    TERMINAL_ABSORBING = "INV-TERMINAL-ABSORBING"
    REVISION_PLUS_ONE = "INV-REVISION-PLUS-ONE"
    STEP_LIMIT = "INV-STEP-LIMIT"
    WAITING_REGISTERED = "INV-WAITING-REGISTERED"
    ONE_WAKE = "INV-ONE-WAKE"
    CANCEL_NOT_RUNNING = "INV-CANCEL-NOT-RUNNING"
    FINALIZE_TARGETS = "INV-FINALIZE-TARGETS"
    QUARANTINE_EXPIRED_ONLY = "INV-QUARANTINE-EXPIRED-ONLY"
    REVIEW_GOVERNED = "INV-REVIEW-GOVERNED"
    RECOVERY_IDEMPOTENT = "INV-RECOVERY-IDEMPOTENT"
    SAFE_RESUME_PROVEN = "INV-SAFE-RESUME-PROVEN"
    GOVERNED_EXIT = "INV-GOVERNED-EXIT"
    TABLES = "INV-TABLES"
    COMPOSED_REFINES = "INV-COMPOSED-REFINES"
    """Reported by :func:`check_refinement`, which compares whole explorations, not by :func:`explore`."""


@attrs.frozen(cache_hash=True)
class Protocol:
    """The decision functions under test.  Defaults are the real ones."""

    claim: Callable[..., p.Outcome] = p.claim
    renew: Callable[..., p.Outcome] = p.renew
    record_step: Callable[..., p.Outcome] = p.record_step
    release: Callable[..., p.Outcome] = p.release
    finalize: Callable[..., p.Outcome] = p.finalize
    wake: Callable[..., p.Outcome] = p.wake
    cancel: Callable[..., p.Outcome] = p.cancel
    recover: Callable[..., p.Outcome] = recovery.recover
    apply_guard: bool = True
    compose: bool = False
    """Whether the store also commits a claim or a step together with the holder's next decision, in one
    transaction (specs/protocol.md, Composed decisions).  Off by default: the uncomposed protocol is
    the one composition must refine."""
    compose_plans_on_written: bool = True
    """Whether a composed transaction's second decision is decided on the world the first one wrote
    (the rule) or on the world before the transaction (stale planning, for the zoo)."""
    compose_guards_each: bool = True
    """Whether the store checks the guard of every decision of a composed transaction, or only the first's."""


@attrs.frozen(cache_hash=True)
class Bounds:
    """How large a world the checker explores; the bounds are what make the search finite.

    ``claims_per_execution`` bounds the fence, ``steps_per_execution`` the
    node steps, ``max_tick`` the clock and ``race_window`` how long a
    decision may stay in flight.  Within them the search is complete unless
    ``max_depth`` or ``max_states`` cuts it, and :class:`Result` says which.
    """

    workers: int = 3
    executions: int = 2
    claims_per_execution: int = 2
    steps_per_execution: int = 1
    lease_ticks: int = 2
    max_tick: int = 4
    race_window: int = 2
    """How many other moves (clock ticks included) may happen between an in-flight decision and its commit."""
    max_depth: int | None = None
    max_states: int = 2_000_000


STANDARD: tuple[tuple[str, Bounds], ...] = (
    (
        "one execution, a holder and its replacement (complete)",
        Bounds(workers=3, executions=1, claims_per_execution=2, max_tick=4),
    ),
    (
        "two executions, three workers (every interleaving to depth 8)",
        Bounds(workers=3, executions=2, claims_per_execution=2, max_tick=4, max_depth=8),
    ),
)
"""The configurations ``fencekeeper modelcheck`` runs by default, and ``make test`` with it."""

COMPOSED: tuple[tuple[str, Bounds], ...] = (
    (
        "one execution, two steps, composed transactions (complete, refines the uncomposed protocol)",
        Bounds(workers=2, executions=1, claims_per_execution=2, steps_per_execution=2, max_tick=3),
    ),
    (
        "two executions, a claim after a finalize, composed transactions (complete, refines the uncomposed protocol)",
        Bounds(workers=2, executions=2, claims_per_execution=1, steps_per_execution=1, lease_ticks=1, max_tick=1),
    ),
)
"""The configurations ``fencekeeper modelcheck`` also runs with ``Protocol.compose`` (:func:`check_refinement`).

The first: two steps, so that a step composes with the next one as well as
with a finalize; a holder and its replacement, so that a zombie tries to
compose too.  The second: two executions, so that a finalize composes with
the same worker's claim of the other execution and that claim with its
visits, while another worker claims, and leases of one tick, so that they
expire into quarantine and recovery within the ticks the search can afford.
Both complete, so that the refinement is proved on every reachable world.
"""


@attrs.frozen(cache_hash=True)
class Holding:
    """What a worker remembers about an execution: the credential its claim gave it.

    Workers present the *current* revision with every request, as a
    worker that re-reads the row before writing would: a stale revision is
    refused by the revision check (covered by the unit tests), so a zombie
    that knows the latest revision is the stronger adversary, and leaving
    revisions out of worker memory keeps the state space small.
    """

    credential: p.LeaseCredential


@attrs.frozen(cache_hash=True)
class InFlight:
    """A decision made on an earlier world, not yet committed."""

    label: str
    actor: str
    credential: p.LeaseCredential | None
    decision: p.Decision
    kind: str
    age: int = 0
    """How many other moves have happened since the decision was made."""


@attrs.frozen(cache_hash=True)
class World:
    """One state of the model: the store's rows, the clock, what each worker holds, and a decision in flight.

    Hashable and compared by value, so the search visits each world once;
    it holds exactly what the invariants of specs/protocol.md are judged on.
    """

    tick: int
    executions: tuple[p.Execution, ...]
    dispatches: tuple[p.Dispatch, ...]
    registrations: tuple[p.WaitRegistration, ...]
    recoveries: tuple[p.RecoveryRecord, ...]
    holdings: tuple[tuple[Holding | None, ...], ...]
    """``holdings[worker][execution]``."""
    inflight: InFlight | None

    @property
    def now(self) -> datetime:
        """The world's time: ``EPOCH`` plus ``tick`` seconds, the only clock the model reads."""
        return EPOCH + self.tick * TICK


@attrs.frozen(cache_hash=True)
class Violation:
    """An invariant broken, what broke it, and the shortest sequence of moves from the initial world that does.

    Breadth first, the first violation found is at the least depth, so
    ``trace`` is as short as any trace to it.
    """

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
class _Action:
    label: str
    actor: str
    credential: p.LeaseCredential | None
    kind: str
    execution: int
    outcome: p.Outcome
    defer: bool = False
    facts: recovery.RecoveryFacts | None = None
    """The store's facts a recovery was decided on, for INV-SAFE-RESUME-PROVEN."""
    request: p.RecoveryRequest | None = None


def worker_id(index: int) -> str:
    """The id of the ``index``-th worker of a world (counted from 0): ``w1``, ``w2``, ..."""
    return f"w{index + 1}"


def execution_id(index: int) -> str:
    """The id of the ``index``-th execution of a world (counted from 0): ``e1``, ``e2``, ..."""
    return f"e{index + 1}"


def initial_world(bounds: Bounds) -> World:
    """The world a search starts from: tick 0, every execution admitted and eligible, nothing held or decided."""
    executions = tuple(
        p.Execution(
            execution_id=execution_id(i),
            business_id="b-1",
            state=ExecutionState.ELIGIBLE,
            revision=1,
            definition_id="d-1",
            definition_revision=1,
            current_node_id="start",
        )
        for i in range(bounds.executions)
    )
    dispatches = tuple(
        p.Dispatch(workflow_execution_id=execution_id(i), dispatch_state=DispatchState.ELIGIBLE, eligible_at=EPOCH)
        for i in range(bounds.executions)
    )
    return World(
        tick=0,
        executions=executions,
        dispatches=dispatches,
        registrations=(),
        recoveries=(),
        holdings=tuple((None,) * bounds.executions for _ in range(bounds.workers)),
        inflight=None,
    )


_GRANTED = p.Authority(True, GOVERNOR)
_SIXTH_TARGET = ExecutionState.CANCELLED
"""Not a permitted finalization target: the checker tries it to prove it is refused."""


_ActionCache = dict[tuple[object, ...], list[_Action]]


def _actions(world: World, bounds: Bounds, proto: Protocol, cache: _ActionCache) -> Iterator[_Action]:
    """Every action any actor can take in ``world``, each with the outcome its decision returns.

    An execution's actions depend only on its own rows, registrations,
    recovery records, the workers' credentials for it, the time and who may
    claim; they are computed once per such combination and reused across
    every world that shares it, which is what keeps the product of several
    executions affordable.
    """
    # Symmetry: workers that never claimed anything are interchangeable, so
    # only the first of them is tried as a claimant.
    claimants = {w for w, row in enumerate(world.holdings) if any(h is not None for h in row)}
    fresh = [w for w in range(bounds.workers) if w not in claimants]
    if fresh:
        claimants.add(fresh[0])
    frozen_claimants = frozenset(claimants)
    for e, execution in enumerate(world.executions):
        eid = execution.execution_id
        key = (
            e,
            execution,
            world.dispatches[e],
            tuple(r for r in world.registrations if r.key.execution_id == eid),
            tuple(r for r in world.recoveries if r.execution_id == eid),
            tuple(row[e] for row in world.holdings),
            world.tick,
            frozen_claimants,
        )
        found = cache.get(key)
        if found is None:
            found = cache[key] = list(_execution_actions(world, bounds, proto, e, frozen_claimants))
        yield from found
    if world.inflight is not None:
        flight = world.inflight
        yield _Action(
            f"commit in-flight: {flight.label}",
            flight.actor,
            flight.credential,
            "commit",
            -1,
            flight.decision,
        )


def _execution_actions(
    world: World, bounds: Bounds, proto: Protocol, e: int, claimants: frozenset[int]
) -> Iterator[_Action]:
    lease = bounds.lease_ticks * TICK
    execution = world.executions[e]
    eid = execution.execution_id
    for w in range(bounds.workers):
        wid = worker_id(w)
        if execution.fence < bounds.claims_per_execution and w in claimants:
            token = f"t.{eid}.{execution.fence + 1}.{wid}"
            yield _Action(
                f"{wid} claims {eid}",
                wid,
                None,
                "claim",
                e,
                proto.claim(execution, world.dispatches[e], p.ClaimRequest(wid, token, lease), world.now),
            )
        held = world.holdings[w][e]
        if held is not None:
            yield from _holder_actions(world, bounds, proto, e, held)
    yield from _external_actions(world, proto, e)


def _holder_actions(world: World, bounds: Bounds, proto: Protocol, e: int, held: Holding) -> Iterator[_Action]:
    cred = held.credential
    wid = cred.worker_id
    eid = execution_id(e)
    lease = bounds.lease_ticks * TICK
    yield _Action(
        f"{wid} renews {eid} (fence {cred.fence})",
        wid,
        cred,
        "renew",
        e,
        proto.renew(world.executions[e], world.dispatches[e], p.RenewRequest(cred, lease), world.now),
    )
    step = _step_action(world, bounds, proto, e, cred)
    if step is not None:
        yield step
    yield _Action(
        f"{wid} releases {eid} (fence {cred.fence})",
        wid,
        cred,
        "release",
        e,
        proto.release(
            world.executions[e], world.dispatches[e], p.ReleaseRequest(cred, world.executions[e].revision), world.now
        ),
    )
    for target in _FINALIZE_TRIED:
        for defer in (False, True) if target == ExecutionState.SUCCEEDED else (False,):
            yield _finalize_action(world, proto, e, cred, target, defer=defer)
    # A worker trying to quarantine the execution it holds (or held: once
    # replaced, it is just another actor, and INV-QUARANTINE-EXPIRED-ONLY
    # only forbids the current holder).
    yield _Action(
        f"{wid} (fence {cred.fence}) tries to quarantine {eid}",
        wid,
        cred,
        "recover",
        e,
        proto.recover(
            world.executions[e],
            world.dispatches[e],
            _prior(world, f"self.{wid}.{eid}"),
            p.RecoveryRequest(
                f"self.{wid}.{eid}",
                p.RecoveryKind.QUARANTINE_EXPIRED,
                eid,
                "b-1",
                world.executions[e].revision,
                wid,
                p.Authority(True, wid),
            ),
            world.now,
        ),
    )


_FINALIZE_TRIED = (*p.FINALIZE_TARGETS, _SIXTH_TARGET)


def _step_action(world: World, bounds: Bounds, proto: Protocol, e: int, cred: p.LeaseCredential) -> _Action | None:
    """The holder's record_step on ``world``, while the step bound allows one."""
    if world.executions[e].step_count >= bounds.steps_per_execution:
        return None
    wid = cred.worker_id
    step = p.StepRecord("n-1", f"a.{cred.fence}")
    return _Action(
        f"{wid} records a step on {execution_id(e)} (fence {cred.fence})",
        wid,
        cred,
        "record_step",
        e,
        proto.record_step(
            world.executions[e],
            world.dispatches[e],
            p.StepRequest(cred, world.executions[e].revision, step, p.Authority(True, wid)),
            world.now,
        ),
    )


def _finalize_action(
    world: World, proto: Protocol, e: int, cred: p.LeaseCredential, target: ExecutionState, *, defer: bool
) -> _Action:
    """The holder's finalize to ``target`` on ``world``, committed at once or (``defer``) decided only."""
    wid = cred.worker_id
    eid = execution_id(e)
    wait = (
        p.WaitSpec(
            node_id="n-wait",
            attempt_id=f"a.{cred.fence}",
            event_type=EVENT_TYPE,
            correlation=CORRELATION,
            wake_at=WAKE_AT,
            timeout=True,
        )
        if target == ExecutionState.WAITING
        else None
    )
    request = p.FinalizeRequest(
        execution_id=eid,
        dispatch_id=eid,
        worker_id=wid,
        lease_token=cred.lease_token,
        fence=cred.fence,
        target_state=target,
        business_id="b-1",
        expected_revision=world.executions[e].revision,
        authority=p.Authority(True, wid),
        wait=wait,
    )
    return _Action(
        f"{wid} {'decides' if defer else 'commits'} finalize {eid} -> {target.value} (fence {cred.fence})",
        wid,
        cred,
        "finalize",
        e,
        proto.finalize(world.executions[e], world.dispatches[e], request, world.now),
        defer=defer,
    )


def _next_visit(
    world: World, bounds: Bounds, proto: Protocol, e: int, cred: p.LeaseCredential
) -> Iterator[tuple[str, _Action]]:
    """The decisions of a holder's next visit that calls no handler, decided on ``world``, each with its phrase.

    They are what a composed transaction may commit after a claim or a step
    (specs/protocol.md, Composed decisions): a step, or a finalize to any
    target the checker tries (the sixth is refused, so it never composes).
    """
    step = _step_action(world, bounds, proto, e, cred)
    if step is not None:
        yield "records a step", step
    for target in _FINALIZE_TRIED:
        yield f"finalizes -> {target.value}", _finalize_action(world, proto, e, cred, target, defer=False)


def _prior(world: World, command_id: str) -> p.RecoveryRecord | None:
    for record in world.recoveries:
        if record.command_id == command_id:
            return record
    return None


def _registration(world: World, key: p.WaitKey | None) -> p.WaitRegistration | None:
    for registration in world.registrations:
        if registration.key == key:
            return registration
    return None


def _external_actions(world: World, proto: Protocol, e: int) -> Iterator[_Action]:
    execution = world.executions[e]
    eid = execution.execution_id
    # Wakes target the latest registration of this execution, even after it
    # was woken: that is how duplicates and racing wakes are exercised.
    keys = [r.key for r in world.registrations if r.key.execution_id == eid]
    if keys:
        key = keys[-1]
        wakes: list[tuple[str, p.WakeReason, tuple[tuple[str, str], ...]]] = [
            ("ev-1", p.WakeReason.EVENT, CORRELATION),
            ("ev-2", p.WakeReason.EVENT, CORRELATION),
            ("ev-x", p.WakeReason.EVENT, (("order", "o-2"),)),
            ("timer", p.WakeReason.TIMEOUT, ()),
        ]
        for source, reason, correlation in wakes:
            request = p.WakeRequest(
                key=key,
                reason=reason,
                source_id=f"{source}.{key.attempt_id}",
                business_id="b-1",
                authority=_GRANTED,
                event_type=EVENT_TYPE if reason == p.WakeReason.EVENT else None,
                correlation=correlation,
            )
            for defer in (False, True) if source == "ev-1" else (False,):
                yield _Action(
                    f"{source} {'decides' if defer else 'commits'} wake of {eid} ({key.attempt_id})",
                    GOVERNOR,
                    None,
                    "wake",
                    e,
                    proto.wake(
                        world.executions[e], world.dispatches[e], _registration(world, request.key), request, world.now
                    ),
                    defer=defer,
                )
    for defer in (False, True):
        yield _Action(
            f"ops {'decides' if defer else 'commits'} cancel of {eid}",
            GOVERNOR,
            None,
            "cancel",
            e,
            proto.cancel(
                world.executions[e],
                world.dispatches[e],
                p.CancelRequest(eid, "b-1", world.executions[e].revision, _GRANTED),
                world.now,
            ),
            defer=defer,
        )
    execution = world.executions[e]
    # A fresh command identity per revision, and an old one reused (a conflict
    # or an idempotent repeat): the governor can always decide something new.
    fresh = f"r{execution.revision}.{eid}"
    settled = any(r.kind == p.RecoveryKind.RECONCILE_COMMAND for r in world.recoveries if r.execution_id == eid)
    # What the store holds: an execution that entered reconciliation_required
    # has an unknown Command until a reconcile_command settles it.
    held = (
        _FACTS_UNRESOLVED
        if execution.state == ExecutionState.RECONCILIATION_REQUIRED and not settled
        else _FACTS_SETTLED
    )
    for command in dict.fromkeys((fresh, f"r1.{eid}")):
        for kind, variant, label, node in _RECOVERY_CHOICES if command == fresh else _RECOVERY_CHOICES[:3]:
            facts = held if variant is None else variant
            if variant is _FACTS_SETTLING and held is not _FACTS_UNRESOLVED:
                # A settlement of a Command the store already holds as settled.
                facts = attrs.evolve(held, submitted=_SETTLEMENT)
            governed = p.RecoveryRequest(
                command,
                kind,
                eid,
                "b-1",
                execution.revision,
                GOVERNOR,
                _GRANTED,
                command_to_reconcile="cmd-1" if kind == p.RecoveryKind.RECONCILE_COMMAND else None,
                next_node_id=node,
                rationale="" if label.endswith("without a reason") else "idempotent by command identity",
            )
            yield _Action(
                f"ops {label} {eid} by {command}",
                GOVERNOR,
                None,
                "recover",
                e,
                proto.recover(execution, world.dispatches[e], _prior(world, command), governed, world.now, facts=facts),
                facts=facts,
                request=governed,
            )
    for record in world.recoveries:
        if record.execution_id != eid:
            continue
        # The identical command again, as a retrying client would send it.
        governed = p.RecoveryRequest(
            record.command_id,
            record.kind,
            eid,
            "b-1",
            record.expected_revision,
            GOVERNOR,
            _GRANTED,
            command_to_reconcile="cmd-1" if record.kind == p.RecoveryKind.RECONCILE_COMMAND else None,
            next_node_id=None if record.proof is None else record.proof.continuation,
            rationale="idempotent by command identity",
        )
        yield _Action(
            f"ops repeats {record.command_id} ({record.kind.value})",
            GOVERNOR,
            None,
            "recover",
            e,
            proto.recover(
                execution, world.dispatches[e], _prior(world, record.command_id), governed, world.now, facts=held
            ),
            facts=held,
            request=governed,
        )


# The store's facts a recovery may be decided on, in the shapes that matter:
# everything settled; a Command still unknown (with and without a submitted
# settlement); the pinned definition missing.  The model's executions all
# pin d-1 revision 1 and sit at node "start".
_MODEL_DEFINITION: Definition = parse_definition(
    'id = "d-1"\nrevision = 1\nstart = "start"\n'
    '[[nodes]]\nid = "start"\nkind = "end"\nrevision = 1\noutcome = "succeeded"\n',
    source="the model's definition",
)
_UNKNOWN_COMMAND = Evidence("cmd-1", recovery.COMMAND_KIND, {"attempt_id": "a-1"}, 2, "unknown")
_QUARANTINED_ATTEMPT = Evidence(
    "a-1", "StepAttempt", {"node_id": "start", "node_kind": "local_command", "command_id": "cmd-1"}, 3,
    "reconciliation_required",
)
_SETTLEMENT = (
    Evidence("cmd-1", recovery.COMMAND_KIND, {"attempt_id": "a-1"}, 3, "rejected"),
    Evidence("a-1", "StepAttempt", {"node_id": "start", "node_kind": "local_command", "next_node_id": "start"}, 4,
             "failed"),
)
_FACTS_UNRESOLVED = recovery.RecoveryFacts((_QUARANTINED_ATTEMPT, _UNKNOWN_COMMAND), _MODEL_DEFINITION, ())
_FACTS_SETTLED = recovery.RecoveryFacts(_SETTLEMENT, _MODEL_DEFINITION, ())
_FACTS_SETTLING = recovery.RecoveryFacts((_QUARANTINED_ATTEMPT, _UNKNOWN_COMMAND), _MODEL_DEFINITION, _SETTLEMENT)
_FACTS_NO_DEFINITION = recovery.RecoveryFacts(_SETTLEMENT, None, ())
_RECOVERY_CHOICES: tuple[tuple[p.RecoveryKind, recovery.RecoveryFacts | None, str, str | None], ...] = (
    # None: the facts the store holds now.  The rest are deliberate
    # mismatches the kernel must refuse, whatever the world looks like.
    (p.RecoveryKind.QUARANTINE_EXPIRED, None, "quarantine", None),
    (p.RecoveryKind.FAIL, None, "fail", None),
    (p.RecoveryKind.RESUME_SAFE, None, "resume_safe", "start"),
    (p.RecoveryKind.RESUME_SAFE, None, "resume_safe without a reason", "start"),
    (p.RecoveryKind.RESUME_SAFE, None, "resume_safe at an unpermitted node", "elsewhere"),
    (p.RecoveryKind.RESUME_SAFE, _FACTS_UNRESOLVED, "resume_safe over an unknown Command", "start"),
    (p.RecoveryKind.RESUME_SAFE, _FACTS_NO_DEFINITION, "resume_safe without its definition", "start"),
    (p.RecoveryKind.RECONCILE_COMMAND, _FACTS_SETTLING, "reconcile_command", None),
    (p.RecoveryKind.RECONCILE_COMMAND, None, "reconcile_command without a settlement", None),
    (p.RecoveryKind.RESUME_SUSPENDED, None, "resume_suspended", "start"),
    (p.RecoveryKind.RESUME_SUSPENDED, _FACTS_UNRESOLVED, "resume_suspended over an unknown Command", "start"),
)


def _proof_holds(facts: recovery.RecoveryFacts | None, request: p.RecoveryRequest | None) -> bool:
    """The safe-resume proof, checked independently of the kernel's derivation, on the model's facts."""
    if facts is None or request is None or not request.rationale.strip():
        return False
    unsettled = [
        item for item in facts.evidence
        if (item.kind == recovery.COMMAND_KIND and item.state in ("issued", "unknown"))
        or (item.kind == "StepAttempt" and item.state not in ("completed", "failed"))
    ]
    definition = facts.definition
    # In the model no attempt settles at "start", so the evidence permits
    # re-entering it and nothing else.
    return (
        not unsettled
        and definition is not None
        and (definition.definition_id, definition.revision) == ("d-1", 1)
        and request.next_node_id == "start"
        and definition.node("start") is not None
    )


# --- applying decisions ----------------------------------------------------------


def _guard_holds(world: World, guard: p.Guard) -> bool:
    index = _index(world, guard.execution_id)
    if index is None:
        return guard.holds(None, None, world.now)
    return guard.holds(world.executions[index], world.dispatches[index], world.now)


def _index(world: World, eid: str) -> int | None:
    for i, execution in enumerate(world.executions):
        if execution.execution_id == eid:
            return i
    return None


def _apply(world: World, decision: p.Decision, actor: str, credential: p.LeaseCredential | None) -> World:
    e = _index(world, decision.guard.execution_id)
    assert e is not None, "the model admits every execution up front"
    executions = list(world.executions)
    dispatches = list(world.dispatches)
    if decision.execution is not None:
        executions[e] = decision.execution
    if decision.dispatch is not None:
        dispatches[e] = decision.dispatch
    registrations = world.registrations
    if decision.registration is not None:
        others = tuple(r for r in registrations if r.key != decision.registration.key)
        registrations = (*others, decision.registration)
    recoveries = world.recoveries
    if decision.recovery is not None:
        recoveries = (*recoveries, decision.recovery)
    holdings = [list(row) for row in world.holdings]
    if decision.lease is not None:
        w = int(decision.lease.worker_id[1:]) - 1
        holdings[w][e] = Holding(decision.lease)
    return attrs.evolve(
        world,
        executions=tuple(executions),
        dispatches=tuple(dispatches),
        registrations=registrations,
        recoveries=recoveries,
        holdings=tuple(tuple(row) for row in holdings),
    )


# --- invariants -------------------------------------------------------------------


def check_state(world: World, bounds: Bounds) -> tuple[Invariant, str] | None:
    """The state invariants of specs/protocol.md, in every reachable world."""
    for execution, dispatch in zip(world.executions, world.dispatches, strict=True):
        eid = execution.execution_id
        if dispatch.dispatch_state != dispatch_state_of(execution.state):
            return Invariant.AGREE, (
                f"{eid}: execution {execution.state.value} but dispatch {dispatch.dispatch_state.value}"
            )
        lease_fields = (dispatch.lease_token, dispatch.leased_by, dispatch.lease_expires_at)
        claimed = dispatch.dispatch_state == DispatchState.CLAIMED
        if claimed != all(f is not None for f in lease_fields) or (
            not claimed and any(f is not None for f in lease_fields)
        ):
            return Invariant.LEASE_IFF_CLAIMED, f"{eid}: dispatch {dispatch.dispatch_state.value} with lease {lease_fields}"
        if execution.step_count > p.STEP_LIMIT or execution.step_count != dispatch.step_count:
            return Invariant.STEP_LIMIT, (
                f"{eid}: step_count {execution.step_count} (dispatch {dispatch.step_count}), limit {p.STEP_LIMIT}"
            )
        if execution.state == ExecutionState.WAITING:
            registration = _registration(world, execution.wait)
            if registration is None or registration.woken_by is not None:
                return Invariant.WAITING_REGISTERED, f"{eid}: waiting without an open wait registration"
        live = [
            h.credential.worker_id
            for row in world.holdings
            for h in row
            if h is not None
            and h.credential.lease_token == dispatch.lease_token
            and h.credential.worker_id == dispatch.leased_by
            and h.credential.fence == execution.fence
            and claimed
            and dispatch.lease_expires_at is not None
            and world.now < dispatch.lease_expires_at
        ]
        if len(live) > 1:
            return Invariant.ONE_LIVE_LEASE, f"{eid}: live leases held by {live}"
    return None


_HOLDER_KINDS = frozenset({"renew", "record_step", "release", "finalize"})


def check_write(
    before: World, after: World, action: _Action, decision: p.Decision, kind: str
) -> tuple[Invariant, str] | None:
    """The invariants of one committed write (what may change, and who may change it).

    The invariants about *who* may write come first, so that a broken
    decision is named by the rule it breaks rather than by a consequence.
    """
    e = _index(before, decision.guard.execution_id)
    assert e is not None
    old, new = before.executions[e], after.executions[e]
    old_d = before.dispatches[e]
    eid = old.execution_id
    if kind in _HOLDER_KINDS:
        cred = action.credential
        assert cred is not None
        live = (
            old_d.dispatch_state == DispatchState.CLAIMED
            and old_d.lease_token == cred.lease_token
            and old_d.leased_by == cred.worker_id
            and old.fence == cred.fence
            and old_d.lease_expires_at is not None
            and before.now < old_d.lease_expires_at
        )
        if not live:
            return Invariant.FENCED_WRITES, (
                f"{eid}: {action.label} wrote with a stale, expired or foreign lease "
                f"(row token {old_d.lease_token}, fence {old.fence}, expires {_tick(old_d.lease_expires_at)}, "
                f"now {_tick(before.now)})"
            )
    if kind == "finalize" and new.state not in p.FINALIZE_TARGETS:
        return Invariant.FINALIZE_TARGETS, f"{eid}: finalized to {new.state.value}"
    if kind == "cancel" and old.state == ExecutionState.RUNNING:
        return Invariant.CANCEL_NOT_RUNNING, f"{eid}: running work was cancelled"
    if kind == "wake":
        registration = decision.registration
        prior = _registration(before, registration.key if registration else None)
        if (
            prior is None
            or prior.woken_by is not None
            or old.state != ExecutionState.WAITING
            or old.wait != prior.key
        ):
            return Invariant.ONE_WAKE, f"{eid}: a second wake continuation ({action.label})"
    record = decision.recovery
    if kind == "recover" and record is not None:
        if _prior(before, record.command_id) is not None:
            return Invariant.RECOVERY_IDEMPOTENT, (
                f"{eid}: recovery command {record.command_id} wrote twice ({action.label})"
            )
        if record.kind == p.RecoveryKind.QUARANTINE_EXPIRED:
            expired = old_d.lease_expires_at is not None and old_d.lease_expires_at <= before.now
            if not expired or action.actor == old_d.leased_by:
                return Invariant.QUARANTINE_EXPIRED_ONLY, (
                    f"{eid}: quarantine by {action.actor} of a lease held by {old_d.leased_by} "
                    f"expiring {_tick(old_d.lease_expires_at)} at {_tick(before.now)}"
                )
        if record.kind in (p.RecoveryKind.RESUME_SAFE, p.RecoveryKind.RESUME_SUSPENDED) and not _proof_holds(
            action.facts, action.request
        ):
            return Invariant.SAFE_RESUME_PROVEN, f"{eid}: resumed without the safe-resume proof ({action.label})"
    if old.state in _TERMINAL and (old != new or old_d != after.dispatches[e]):
        return Invariant.TERMINAL_ABSORBING, f"{eid}: {old.state.value} was rewritten by {action.label}"
    if old.state in _REVIEW and old.state != new.state and (kind != "recover" or action.actor != GOVERNOR):
        return Invariant.REVIEW_GOVERNED, f"{eid}: {old.state.value} left by {action.label}"
    if decision.execution is not None and new.revision != old.revision + 1:
        return Invariant.REVISION_PLUS_ONE, f"{eid}: revision {old.revision} -> {new.revision}"
    if decision.execution is None and new.revision != old.revision:
        return Invariant.REVISION_PLUS_ONE, f"{eid}: revision changed without an execution write"
    if old.state != new.state and not any(
        EXECUTION.step(old.state, event) == new.state for event in EXECUTION.events_from(old.state)
    ):
        return Invariant.TABLES, f"{eid}: {old.state.value} -> {new.state.value} is in no table row"
    return None


def _tick(moment: datetime | None) -> str:
    return "never" if moment is None else f"tick {(moment - EPOCH) // TICK}"


_TERMINAL = frozenset({ExecutionState.SUCCEEDED, ExecutionState.FAILED, ExecutionState.CANCELLED})
_REVIEW = frozenset({ExecutionState.SUSPENDED, ExecutionState.RECONCILIATION_REQUIRED})


# --- the search -------------------------------------------------------------------


@attrs.frozen(cache_hash=True)
class Move:
    """One successor of a world: what happened, and the world after it.

    ``broken`` is set (and ``world`` is the world the bad write produced)
    when the move committed a write that breaks an invariant.
    """

    label: str
    world: World
    broken: tuple[Invariant, str] | None = None
    length: int = 1
    """How many uncomposed moves it stands for: two for a composed transaction, which ages a decision in
    flight by two, as its two commits would, so that composition widens no race window."""


def moves(
    world: World, bounds: Bounds, proto: Protocol, cache: _ActionCache | None = None
) -> tuple[list[Move], int]:
    """Every move possible from ``world``, and how many decisions were considered to find them.

    Pass the same ``cache`` to every call of one exploration (and only of
    one: it is specific to ``bounds`` and ``proto``).
    """
    found: list[Move] = []
    decided = 0
    forced = world.inflight is not None and world.inflight.age >= bounds.race_window
    if world.tick < bounds.max_tick and not forced:
        found.append(Move(f"clock ticks to {world.tick + 1}", attrs.evolve(world, tick=world.tick + 1)))
    for action in _actions(world, bounds, proto, {} if cache is None else cache):
        if forced and action.kind != "commit":
            continue
        outcome = action.outcome
        decided += 1
        if not isinstance(outcome, p.Decision):
            continue
        if action.defer:
            if world.inflight is None:
                flight = InFlight(action.label, action.actor, action.credential, outcome, action.kind)
                found.append(Move(action.label, attrs.evolve(world, inflight=flight)))
            continue
        base, kind = world, action.kind
        if kind == "commit":
            assert world.inflight is not None
            base, kind = attrs.evolve(world, inflight=None), world.inflight.kind
        if proto.apply_guard and not _guard_holds(base, outcome.guard):
            if action.kind == "commit":  # a failed commit still retires the in-flight decision
                found.append(Move(f"{action.label}: guard fails, nothing written", base))
            continue
        after = _apply(base, outcome, action.actor, action.credential)
        broken = check_write(base, after, action, outcome, kind)
        found.append(Move(action.label, after, broken))
        # A composed transaction needs room for all its commits in the race window of a decision in flight;
        # without one, a chain is bounded by the steps (each composed step is one), a finalize, and a claim,
        # steps and finalize of each other execution.
        room = (
            bounds.steps_per_execution + 1 + (bounds.executions - 1) * (bounds.steps_per_execution + 2)
            if world.inflight is None
            else bounds.race_window - world.inflight.age - 1
        )
        if proto.compose and action.kind in _COMPOSABLE and room > 0:
            composed, considered = _composed(
                base, after, action, outcome, broken, bounds=bounds, proto=proto, room=room
            )
            found.extend(composed)
            decided += considered
    if world.inflight is not None:
        # Every other move ages the decision still in flight, by each commit it stands for.
        flight = world.inflight
        found = [
            attrs.evolve(m, world=attrs.evolve(m.world, inflight=attrs.evolve(flight, age=flight.age + m.length)))
            if m.world.inflight == flight
            else m
            for m in found
        ]
    return found, decided


_COMPOSABLE = frozenset({"claim", "record_step"})
"""The decisions whose transaction may also commit the holder's next decision."""


def _composed(
    before: World,
    written: World,
    first: _Action,
    decision: p.Decision,
    broken: tuple[Invariant, str] | None,
    *,
    bounds: Bounds,
    proto: Protocol,
    room: int = 1,
) -> tuple[list[Move], int]:
    """The composed moves that begin with ``first``, whose ``decision`` turned ``before`` into ``written``.

    Each next decision is the holder's own (the credential the claim just
    gave, or the step's), or after a finalize the same worker's claim of
    another execution (:func:`_chained`), decided on the world the decision
    before it wrote and guarded on it; a refusal, an idempotent repeat or a failed guard
    ends the chain there (the transaction commits what came before, which is
    a shorter chain, or the first decision's own move).  After a step the
    chain may go on, as a store's does (``MAX_COMPOSED``), while ``room``
    allows: how many more commits the race window of a decision in flight
    has left.  A write invariant an earlier write broke is reported on every
    longer move too, and otherwise the last write's.  Also returns how many
    next decisions were considered.
    """
    credential = decision.lease if first.kind == "claim" else first.credential
    assert credential is not None, "a claim's decision carries the credential it hands out"
    wid, eid = credential.worker_id, execution_id(first.execution)
    opening = f"claims {eid}" if first.kind == "claim" else f"records a step on {eid}"
    found: list[Move] = []
    considered = 0
    # (the world before the last write, the world after it, its kind, the phrases so far, what broke,
    # the execution the chain is on and the credential it holds there)
    chains = [(before, written, first.kind, [opening], broken, first.execution, credential)]
    for length in range(2, 2 + room):
        longer = []
        for last_before, last_written, last_kind, phrases, was_broken, e, held in chains:
            planned_on = last_written if proto.compose_plans_on_written else last_before
            for phrase, then in _chained(
                planned_on, bounds, proto, last_kind=last_kind, e=e, held=held, first=first.execution
            ):
                considered += 1
                outcome = then.outcome
                if not isinstance(outcome, p.Decision):
                    continue
                if proto.apply_guard and proto.compose_guards_each and not _guard_holds(last_written, outcome.guard):
                    continue
                said = "records another step" if last_kind == then.kind == "record_step" else phrase
                label = f"{wid} {' and '.join([*phrases, said])} (fence {credential.fence}), in one transaction"
                step = attrs.evolve(then, label=label)
                after = _apply(last_written, outcome, step.actor, step.credential)
                now_broken = was_broken or check_write(last_written, after, step, outcome, step.kind)
                found.append(Move(label, after, now_broken, length=length))
                if then.kind in _CHAIN_GOES_ON:
                    # A claim hands the chain the credential it gave; a step or a finalize keeps the one held.
                    going = outcome.lease if then.kind == "claim" else held
                    assert going is not None
                    longer.append((last_written, after, then.kind, [*phrases, said], now_broken, then.execution, going))
        chains = longer
    return found, considered


_CHAIN_GOES_ON = frozenset({"record_step", "finalize", "claim"})
"""After these a composed chain may go on: a step with the next visit, a finalize with a claim of another execution,
a claim with that execution's visits.  (A finalize is followed only by a claim, :func:`_chained`.)"""


def _chained(
    world: World, bounds: Bounds, proto: Protocol, *, last_kind: str, e: int, held: p.LeaseCredential, first: int
) -> Iterator[tuple[str, _Action]]:
    """What a composed chain may commit next, after a ``last_kind`` decision on execution ``e`` under ``held``.

    After a finalize, the holder's lease has ended with it: the same worker
    may claim another execution in the same transaction, one the claim
    bound allows, with the token a claim of it would carry (specs/protocol.md,
    Composed decisions).  Otherwise the holder's next visit on ``e``.  A
    phrase on an execution other than the chain's first names it.
    """
    wid = held.worker_id
    if last_kind == "finalize":
        lease = bounds.lease_ticks * TICK
        for other, execution in enumerate(world.executions):
            if other == e or execution.fence >= bounds.claims_per_execution:
                continue
            eid = execution.execution_id
            token = f"t.{eid}.{execution.fence + 1}.{wid}"
            outcome = proto.claim(execution, world.dispatches[other], p.ClaimRequest(wid, token, lease), world.now)
            yield f"claims {eid}", _Action(f"{wid} claims {eid}", wid, None, "claim", other, outcome)
        return
    for phrase, then in _next_visit(world, bounds, proto, e, held):
        yield (phrase if e == first else f"{phrase} on {execution_id(e)}"), then


def without_exit(world: World, bounds: Bounds, successors: list[Move]) -> tuple[Invariant, str] | None:
    """INV-GOVERNED-EXIT: every execution that is not terminal can be moved on from here.

    A running execution may also wait for its lease to expire; every other
    state needs a decision some actor may take now (a claim or cancel, a
    wake, a governed recovery).  A world whose in-flight decision must commit
    next is skipped: only that commit may move there.
    """
    if world.inflight is not None and world.inflight.age >= bounds.race_window:
        return None
    ticks = any(m.world.tick != world.tick for m in successors)
    for e, execution in enumerate(world.executions):
        if execution.state in _TERMINAL:
            continue
        if execution.state == ExecutionState.RUNNING and ticks:
            continue
        if not any(m.world.executions[e].state != execution.state for m in successors):
            return Invariant.GOVERNED_EXIT, (
                f"{execution.execution_id}: {execution.state.value} at tick {world.tick} and no decision moves it on"
            )
    return None


def explore(
    bounds: Bounds = Bounds(),
    proto: Protocol = Protocol(),
    progress: Callable[[int, int], Any] | None = None,
) -> Result:
    """Breadth-first search of every interleaving within ``bounds``; stops at the first violation."""
    return _search(bounds, proto, progress).result


def _trace(parents: dict[World, tuple[World | None, str]], world: World) -> tuple[str, ...]:
    steps: list[str] = []
    node: World | None = world
    while node is not None:
        parent, label = parents[node]
        if parent is not None:
            steps.append(label)
        node = parent
    return tuple(reversed(steps))


@attrs.frozen
class _Search:
    result: Result
    parents: dict[World, tuple[World | None, str]]
    """Every world reached, with the world and move it was first reached by (breadth first: a shortest trace)."""


def _search(bounds: Bounds, proto: Protocol, progress: Callable[[int, int], Any] | None = None) -> _Search:
    start = initial_world(bounds)
    parents: dict[World, tuple[World | None, str]] = {start: (None, "start")}
    frontier: deque[tuple[World, int]] = deque([(start, 0)])
    transitions = 0
    depth_reached = 0
    complete = True
    cache: _ActionCache = {}

    def finished(result: Result) -> _Search:
        return _Search(result, parents)

    def violated(world: World, broken: tuple[Invariant, str], last: str | None, depth: int) -> _Search:
        path = _trace(parents, world) + ((last,) if last is not None else ())
        return finished(Result(len(parents), transitions, depth, False, Violation(broken[0], broken[1], path)))

    found = check_state(start, bounds)
    if found is not None:
        return violated(start, found, None, 0)
    while frontier:
        world, depth = frontier.popleft()
        depth_reached = max(depth_reached, depth)
        if bounds.max_depth is not None and depth >= bounds.max_depth:
            complete = False
            continue
        successors, decided = moves(world, bounds, proto, cache)
        transitions += decided
        stuck = without_exit(world, bounds, successors)
        if stuck is not None:
            return violated(world, stuck, None, depth)
        for move in successors:
            if move.broken is not None:
                return violated(world, move.broken, move.label, depth + 1)
            if move.world in parents:
                continue
            parents[move.world] = (world, move.label)
            broken_state = check_state(move.world, bounds)
            if broken_state is not None:
                return violated(move.world, broken_state, None, depth + 1)
            if len(parents) >= bounds.max_states:
                return finished(Result(len(parents), transitions, depth + 1, False, None))
            frontier.append((move.world, depth + 1))
        if progress is not None and len(parents) % 50_000 < len(successors):
            progress(len(parents), depth)
    return finished(Result(len(parents), transitions, depth_reached, complete, None))


def reachable(bounds: Bounds, proto: Protocol = Protocol()) -> tuple[Result, frozenset[World]]:
    """The worlds :func:`explore` visits within ``bounds``, with its result.

    The set is every reachable world only when the result is complete and
    has no violation (the search stops at a broken invariant or a cut); the
    caller checks.
    """
    search = _search(bounds, proto)
    return search.result, frozenset(search.parents)


@attrs.frozen(cache_hash=True)
class Refinement:
    """What :func:`check_refinement` found: both searches, and the first violation, if any."""

    composed: Result
    plain: Result
    violation: Violation | None
    """The composed search's own violation if it found one, else an INV-COMPOSED-REFINES one, else None."""

    @property
    def complete(self) -> bool:
        """True when both searches were complete: only then does no violation prove the refinement."""
        return self.composed.complete and self.plain.complete


def check_refinement(bounds: Bounds, proto: Protocol = Protocol(), baseline: Protocol | None = None) -> Refinement:
    """INV-COMPOSED-REFINES: every world reachable with composed transactions is reachable without them.

    A composed move is two commits with nothing between them, so its world
    must be one the uncomposed protocol (``baseline``; by default ``proto``
    without composition) reaches too.  The composed search checks every
    invariant on every component write as :func:`explore` does; the
    refinement is then checked only when both searches were complete and
    clean (a cut search may miss, in the uncomposed one, a world composition
    reaches in fewer moves), and the violation names the shallowest world
    reachable only with composition, with its trace.
    """
    composed = _search(bounds, attrs.evolve(proto, compose=True))
    plain_result, plain = reachable(bounds, attrs.evolve(proto, compose=False) if baseline is None else baseline)
    if composed.result.violation is not None:
        return Refinement(composed.result, plain_result, composed.result.violation)
    if not (composed.result.complete and plain_result.complete) or plain_result.violation is not None:
        return Refinement(composed.result, plain_result, None)
    extra = [world for world in composed.parents if world not in plain]
    if not extra:
        return Refinement(composed.result, plain_result, None)
    # The parents dict is in breadth-first order, so the first extra world is a shallowest one.
    violation = Violation(
        Invariant.COMPOSED_REFINES,
        f"{len(extra):,} of {len(composed.parents):,} worlds are reachable only with composed transactions",
        _trace(composed.parents, extra[0]),
    )
    return Refinement(composed.result, plain_result, violation)


__all__ = [
    "COMPOSED",
    "CORRELATION",
    "EPOCH",
    "EVENT_TYPE",
    "GOVERNOR",
    "STANDARD",
    "TICK",
    "WAKE_AT",
    "Bounds",
    "Holding",
    "InFlight",
    "Invariant",
    "Move",
    "Protocol",
    "Refinement",
    "Result",
    "Violation",
    "World",
    "check_refinement",
    "check_state",
    "check_write",
    "execution_id",
    "explore",
    "initial_world",
    "moves",
    "reachable",
    "without_exit",
    "worker_id",
]
