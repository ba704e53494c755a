"""The journal's fixture pack: valid and adversarial chains another implementation can replay.

``fencekeeper journal fixtures DIRECTORY`` writes the pack; the committed
copy is ``specs/journal/fixtures`` (specs/journal.md, "Fixture pack"), and
a test fails if regenerating it changes a byte.  Rules of this module:

- Every chain is produced by the kernel itself (``kernel/journal.py``), from
  the systematic review of docs/journal.md, with fixed times and ids, so the
  pack is the same bytes on every run.  One valid chain holds a record the
  kernel no longer appends (free text over the append-time bound, which
  replay does not apply): that record is written as a forged one is, every
  digest right, and the kernel's replay accepts it.
- An adversarial chain is a valid chain changed the way an attacker or a
  faulty store would change it: bytes tampered (removed, reordered,
  inserted, duplicated, spliced from another execution, a digest altered, a
  field added, the bytes re-encoded), or an event forged with every digest
  recomputed so that only a rule of the journal can catch it (a forged
  role, automation claiming human authority, a missing artifact, a partial
  invalidation, an invalidation by a role or under a policy the authority
  policy does not admit, a successor binding to work never invalidated or
  to a header that is not this execution's successor).  Each names the
  refusal code and the ordinal of the first bad record it expects, and the
  other executions' headers (``headers/``) a runner's successor lookup
  finds.
- The pack is data only: JSON and JSON lines, one canonical record a line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, overload

import attrs

from fencekeeper.kernel import journal as j
from fencekeeper.kernel.canonical import Json, canonical_bytes, digest_bytes, digest_of
from fencekeeper.kernel.common import MAX_RATIONALE
from fencekeeper.kernel.dag import (
    ApprovalRequirement,
    Artifact,
    NodeDefinition,
    NodeKind,
    VerifiedWorkflow,
    WorkflowDefinition,
    verify_workflow,
)
from fencekeeper.kernel.journal_codes import JournalCode, JournalError
from fencekeeper.kernel.machines import NodeEvent, NodeState

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)

REVIEW = WorkflowDefinition(
    workflow_id="systematic-review",
    nodes=(
        NodeDefinition("search", NodeKind.AUTOMATED, (), ("searcher",), (Artifact("search-results", "search-results"),)),
        NodeDefinition("screen-a", NodeKind.HUMAN, ("search",), ("screener",), (Artifact("screening", "screening-a"),)),
        NodeDefinition(
            "screen-b",
            NodeKind.HUMAN,
            ("search",),
            ("screener",),
            (Artifact("screening", "screening-b"),),
            independent_of=("screen-a",),
        ),
        NodeDefinition(
            "extraction",
            NodeKind.HYBRID,
            ("screen-a", "screen-b"),
            ("extractor",),
            (Artifact("extraction", "extraction-table"),),
        ),
        NodeDefinition("synthesis", NodeKind.HUMAN, ("extraction",), ("synthesist",), (Artifact("synthesis", "report"),)),
        NodeDefinition(
            "sign-off",
            NodeKind.APPROVAL,
            ("synthesis",),
            ("reviewer", "coordinator"),
            (),
            ApprovalRequirement(minimum=2, roles=("reviewer",), distinct_actors=True, human_only=True),
        ),
    ),
)
"""search -> two independent human screenings -> extraction -> synthesis -> a two-reviewer sign-off.

The screenings are independent: whoever works on one may not work on the other."""


def review_policy(workflow: VerifiedWorkflow) -> j.AuthorityPolicy:
    return j.AuthorityPolicy(
        policy_id="review-policy",
        scope="review-2026-03",
        workflow_digest=workflow.digest,
        protocol="protocol-v1",
        assignments=(
            j.Assignment("bot:search", j.ActorKind.AUTOMATION, ("searcher", "scheduler")),
            j.Assignment("bot:extract", j.ActorKind.AUTOMATION, ("extractor", "screener", "reviewer")),
            j.Assignment("alice", j.ActorKind.HUMAN, ("screener", "reviewer")),
            j.Assignment("bob", j.ActorKind.HUMAN, ("screener", "reviewer")),
            j.Assignment("carol", j.ActorKind.HUMAN, ("extractor", "synthesist", "coordinator", "scheduler")),
        ),
        approved_by="carol",
        invalidation_policies=(
            # A retraction of an included study: the coordinator decides.
            j.InvalidationPolicy("retraction-policy", ("coordinator",)),
            # A search index withdrawing records: the scheduler role may
            # invalidate, but its automation may not undo work humans did.
            j.InvalidationPolicy("index-withdrawal", ("scheduler",)),
        ),
    )


def sha(text: str) -> str:
    return digest_bytes(text.encode())


def ref(kind: str, ref_id: str) -> j.RecordRef:
    """A record reference whose digest stands for the record's content (the pack holds no records)."""
    return j.RecordRef(kind, ref_id, sha(f"{kind}/{ref_id}"))


RETRACTION = ref("retraction-notice", "doi-10.1000-retracted-42")
DOWNSTREAM = ("screen-a", "screen-b", "extraction", "synthesis", "sign-off")


class Script:
    """Appends commands one second apart and fails loudly on anything but an append."""

    def __init__(self, journal: j.Journal, start: datetime = T0) -> None:
        self.journal = journal
        self.clock = start
        self.count = 0
        self.headers: dict[str, j.Header] = {}
        """The executions a successor binding may name (the kernel's header lookup)."""

    def send(self, command: j.Command) -> j.Appended:
        self.clock += timedelta(seconds=1)
        outcome = j.preview(self.journal, command, self.clock, headers=self.headers.get)
        if not isinstance(outcome, j.Appended):
            raise AssertionError(f"the example's own command was not appended: {outcome}")
        self.journal = outcome.journal
        return outcome

    def transition(self, node_id: str, event: NodeEvent, actor: str, role: str, **fields: Any) -> j.Transition:
        self.count += 1
        return j.Transition(
            request_id=f"{self.journal.execution_id}-r{self.count}",
            expected_head=self.journal.head,
            node_id=node_id,
            event=event,
            prior_state=self.journal.states[node_id],
            actor_id=actor,
            role=role,
            **fields,
        )

    def do(self, node_id: str, event: NodeEvent, actor: str, role: str, **fields: Any) -> j.Appended:
        return self.send(self.transition(node_id, event, actor, role, **fields))

    def work(self, node_id: str, actor: str, role: str, records: tuple[j.RecordRef, ...]) -> None:
        if self.journal.states[node_id] is NodeState.PENDING:
            self.do(node_id, NodeEvent.DEPENDENCIES_SATISFIED, "bot:search", "scheduler")
        sequence = len(self.journal.attempts.get(node_id, ())) + 1
        attempt = j.AttemptRef(f"{node_id}-{sequence}", sequence)
        self.do(node_id, NodeEvent.WORK_STARTED, actor, role, attempt=attempt)
        self.do(node_id, NodeEvent.WORK_COMPLETED, actor, role, attempt=attempt, records=records)


def verified() -> tuple[VerifiedWorkflow, j.VerifiedPolicy]:
    workflow = verify_workflow(REVIEW)
    return workflow, j.verify_policy(review_policy(workflow), workflow)


def new(execution_id: str, supersedes: str | None = None, start: datetime = T0) -> Script:
    workflow, policy = verified()
    header = j.create_header(execution_id, workflow, policy, created_by="carol", now=start, supersedes=supersedes)
    return Script(j.new_journal(header, workflow, policy), start)


SIGN_OFF = (
    j.Approval("alice", "reviewer", ref("approval", "alice-sign-off")),
    j.Approval("bob", "reviewer", ref("approval", "bob-sign-off")),
)


def review(script: Script) -> Script:
    """The whole review: the search fails once and is retried, everything else succeeds first time."""
    attempt = j.AttemptRef("search-1", 1)
    script.do("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=attempt)
    script.do("search", NodeEvent.WORK_FAILED, "bot:search", "searcher", attempt=attempt, error="index timed out")
    retry = j.AttemptRef("search-2", 2)
    script.do("search", NodeEvent.RETRY_AUTHORIZED, "bot:search", "searcher", attempt=retry)
    script.do("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=retry)
    script.do("search", NodeEvent.WORK_COMPLETED, "bot:search", "searcher", attempt=retry,
              records=(ref("search-results", "search-results"),))  # fmt: skip
    script.work("screen-a", "alice", "screener", (ref("screening", "screening-a"),))
    script.work("screen-b", "bob", "screener", (ref("screening", "screening-b"),))
    script.work("extraction", "carol", "extractor", (ref("extraction", "extraction-table"),))
    script.work("synthesis", "carol", "synthesist", (ref("synthesis", "report"),))
    script.do("sign-off", NodeEvent.DEPENDENCIES_SATISFIED, "bot:search", "scheduler")
    sign_off = j.AttemptRef("sign-off-1", 1)
    script.do("sign-off", NodeEvent.WORK_STARTED, "carol", "coordinator", attempt=sign_off)
    script.do("sign-off", NodeEvent.WORK_COMPLETED, "carol", "coordinator", attempt=sign_off, approvals=SIGN_OFF)
    return script


def invalidation(script: Script) -> j.Invalidate:
    journal = script.journal
    return j.Invalidate(
        request_id=f"{journal.execution_id}-retraction-42",
        expected_head=journal.head,
        source=RETRACTION,
        policy="retraction-policy",
        nodes=tuple(j.NodeExpectation(n, journal.states[n]) for n in DOWNSTREAM),
        actor_id="carol",
        role="coordinator",
        rationale="a study included by both screenings was retracted",
    )


def binding(script: Script, successor: j.Journal) -> j.BindSuccessor:
    journal = script.journal
    return j.BindSuccessor(
        request_id=f"{journal.execution_id}-bind-successor",
        expected_head=journal.head,
        successor=j.RecordRef(j.SUCCESSOR_KIND, successor.execution_id, successor.header.digest),
        nodes=tuple(j.NodeExpectation(n, NodeState.INVALIDATED) for n in DOWNSTREAM),
        actor_id="carol",
        role="coordinator",
        rationale=f"{successor.execution_id} takes over from the screening onwards",
    )


def successor_journal() -> Script:
    """review-2, created after the retraction, taking over from review-1."""
    return new("review-2", supersedes="review-1", start=T0 + timedelta(days=1))


def superseded() -> tuple[Script, Script]:
    """review-1 reviewed, invalidated by the retraction and superseded by review-2; review-2 redone."""
    first = review(new("review-1"))
    first.send(invalidation(first))
    second = successor_journal()
    first.headers[second.journal.execution_id] = second.journal.header
    first.send(binding(first, second.journal))
    # The successor redoes the work without the retracted study: same declared
    # artifacts, new content, so new digests.
    second.work("search", "bot:search", "searcher", (ref("search-results", "search-results"),))
    second.work("screen-a", "alice", "screener", (j.RecordRef("screening", "screening-a", sha("screening-a without 42")),))
    return first, second


def interrupted() -> Script:
    """review-1 invalidated by the retraction while the screenings are under way.

    screen-a failed once and its retry is authorized, screen-b is blocked:
    the invalidation ends both open attempts as ``invalidated``.
    """
    script = new("review-1")
    script.work("search", "bot:search", "searcher", (ref("search-results", "search-results"),))
    script.do("screen-a", NodeEvent.DEPENDENCIES_SATISFIED, "bot:search", "scheduler")
    first = j.AttemptRef("screen-a-1", 1)
    script.do("screen-a", NodeEvent.WORK_STARTED, "alice", "screener", attempt=first)
    script.do("screen-a", NodeEvent.WORK_FAILED, "alice", "screener", attempt=first, error="full text unreadable")
    script.do("screen-a", NodeEvent.RETRY_AUTHORIZED, "alice", "screener", attempt=j.AttemptRef("screen-a-2", 2))
    script.do("screen-b", NodeEvent.DEPENDENCIES_SATISFIED, "bot:search", "scheduler")
    screening = j.AttemptRef("screen-b-1", 1)
    script.do("screen-b", NodeEvent.WORK_STARTED, "bob", "screener", attempt=screening)
    script.do("screen-b", NodeEvent.WORK_BLOCKED, "bob", "screener", attempt=screening)
    script.send(invalidation(script))
    return script


INDEX_WITHDRAWAL = ref("index-withdrawal-notice", "index-2026-03-02")


def invalidated_after_binding() -> tuple[Script, Script]:
    """review-1 superseded from the screening onwards, then its search, still completed, invalidated and bound too.

    A successor binding supersedes the invalidated nodes it names and no
    other: the search, completed and current, may still be found wrong and
    invalidated, its descendants being superseded already, and bound to
    the successor in its turn (specs/journal.md, section 6, rule 6).
    """
    first, second = superseded()
    journal = first.journal
    first.send(
        j.Invalidate(
            request_id=f"{journal.execution_id}-index-withdrawal",
            expected_head=journal.head,
            source=INDEX_WITHDRAWAL,
            policy="index-withdrawal",
            nodes=(j.NodeExpectation("search", NodeState.COMPLETED),),
            actor_id="bot:search",
            role="scheduler",
            rationale="the search index withdrew records the search returned",
        )
    )
    journal = first.journal
    first.send(
        j.BindSuccessor(
            request_id=f"{journal.execution_id}-bind-search",
            expected_head=journal.head,
            successor=j.RecordRef(j.SUCCESSOR_KIND, second.journal.execution_id, second.journal.header.digest),
            nodes=(j.NodeExpectation("search", NodeState.INVALIDATED),),
            actor_id="carol",
            role="coordinator",
            rationale=f"{second.journal.execution_id}, which searched again, takes over the search too",
        )
    )
    return first, second


LONG_ERROR = "index timed out; the shards that did not answer:\n" + "\n".join(
    f"  shard {number:03d}: no answer within 30 s" for number in range(1, 71)
)
LONG_RATIONALE = "the search gave up after 30 s on every shard; " * 50


def written_before_the_bound() -> Script:
    """review-1 whose search failed with an error and a rationale longer than an append now admits.

    An append refuses free text over ``MAX_RATIONALE`` characters
    (specs/journal.md, section 6, rule 2), but a chain stored before the
    bound keeps what it holds and replays: the failure is written here as
    it was appended then, every digest right, and the search is retried
    and completed by the rules of now.
    """
    assert min(len(LONG_ERROR), len(LONG_RATIONALE)) > MAX_RATIONALE
    script = new("review-1")
    attempt = j.AttemptRef("search-1", 1)
    script.do("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=attempt)
    failure = script.transition("search", NodeEvent.WORK_FAILED, "bot:search", "searcher", attempt=attempt,
                                error=LONG_ERROR, rationale=LONG_RATIONALE)  # fmt: skip
    script.clock += timedelta(seconds=1)
    written = forge(script.journal, failure, script.clock, (("search", NodeEvent.WORK_FAILED, NodeState.FAILED),))
    script.journal = j.continue_replay(script.journal, written)
    retry = j.AttemptRef("search-2", 2)
    script.do("search", NodeEvent.RETRY_AUTHORIZED, "bot:search", "searcher", attempt=retry)
    script.do("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=retry)
    script.do("search", NodeEvent.WORK_COMPLETED, "bot:search", "searcher", attempt=retry,
              records=(ref("search-results", "search-results"),))  # fmt: skip
    return script


def untouched_human_work() -> Script:
    """review-1 invalidated by automation after its search alone: no human has worked on any node (section 3)."""
    script = new("review-1")
    script.work("search", "bot:search", "searcher", (ref("search-results", "search-results"),))
    journal = script.journal
    script.send(
        j.Invalidate(
            request_id=f"{journal.execution_id}-index-withdrawal",
            expected_head=journal.head,
            source=INDEX_WITHDRAWAL,
            policy="index-withdrawal",
            nodes=tuple(j.NodeExpectation(n, journal.states[n]) for n in journal.workflow.order),
            actor_id="bot:search",
            role="scheduler",
            rationale="the search index withdrew records the search returned",
        )
    )
    return script


def clock_set_back() -> Script:
    """review-1 whose second event's time is an hour before its first's (specs/journal.md, section 6)."""
    script = new("review-1")
    attempt = j.AttemptRef("search-1", 1)
    script.do("search", NodeEvent.WORK_STARTED, "bot:search", "searcher", attempt=attempt)
    script.clock -= timedelta(hours=1)
    script.do("search", NodeEvent.WORK_FAILED, "bot:search", "searcher", attempt=attempt, error="index timed out")
    script.do("search", NodeEvent.RETRY_AUTHORIZED, "bot:search", "searcher", attempt=j.AttemptRef("search-2", 2))
    return script


# --- forging and tampering ---------------------------------------------------------------------


def lines(journal: j.Journal) -> list[bytes]:
    return [j.encode_header(journal.header), *(j.encode_event(e) for e in journal.events)]


def forge(journal: j.Journal, command: j.Command, at: datetime, nodes: tuple[tuple[str, NodeEvent, NodeState], ...] = ()) -> list[bytes]:
    """Events recording ``command`` with every digest right, whether or not the rules admit it.

    For a Transition the event is the one the rules would produce; ``nodes``
    (node, event, resulting state) lists a batch's events explicitly.
    """
    out: list[bytes] = []
    previous = journal.head
    digest = j.request_digest(command)
    rows = nodes or ((command.node_id, command.event, NodeState.ACTIVE),) if isinstance(command, j.Transition) else nodes
    for number, (node_id, event, resulting) in enumerate(rows, start=len(journal.events) + 1):
        fields: dict[str, Any] = {
            "execution_id": journal.execution_id, "ordinal": number, "previous": previous,
            "request_id": command.request_id, "request_digest": digest, "node_id": node_id, "event": event,
            "prior_state": command.prior_state if isinstance(command, j.Transition) else journal.states[node_id],
            "resulting_state": resulting, "actor_id": command.actor_id,
            "role": command.role, "at": j.format_time(at), "rationale": command.rationale, "attempt": None,
            "records": (), "approvals": (), "error": None, "invalidation": None, "successor": None,
        }  # fmt: skip
        if isinstance(command, j.Transition):
            fields.update(attempt=command.attempt, records=command.records, approvals=command.approvals, error=command.error)
        elif isinstance(command, j.Invalidate):
            fields["invalidation"] = j.Invalidation(command.source, command.policy)
        else:
            fields["successor"] = command.successor
        event_value = j.Event(**fields)
        event_value = attrs.evolve(event_value, digest=digest_of(event_value.body_json()))
        out.append(j.encode_event(event_value))
        previous = event_value.digest
    return out


def resign(line: bytes, **changes: Json) -> bytes:
    value = {**json.loads(line), **changes}
    del value["digest"]
    value["digest"] = digest_of(value)
    return canonical_bytes(value)


@attrs.frozen
class Case:
    name: str
    description: str
    lines: list[bytes]
    code: str | None = None
    ordinal: int | None = None
    expect: dict[str, Json] | None = None
    headers: tuple[j.Header, ...] = ()
    """The other executions' headers a runner's header lookup finds (the successors the chain may bind)."""


def _valid(name: str, description: str, journal: j.Journal) -> Case:
    expect: dict[str, Json] = {
        "head": journal.head,
        "events": len(journal.events),
        "states": {n: journal.states[n].value for n in journal.workflow.order},
        "attempts": {
            n: [{"id": a.attempt_id, "sequence": a.sequence, "status": a.status.value} for a in attempts]
            for n, attempts in sorted(journal.attempts.items())
        },
    }
    return Case(name, description, lines(journal), expect=expect)


def cases() -> list[Case]:
    complete = review(new("review-1"))
    first, second = superseded()
    good = lines(complete.journal)
    header, events = good[0], good[1:]
    found: list[Case] = [
        _valid("valid-review", "the whole review, with one failed and retried search attempt", complete.journal),
        attrs.evolve(
            _valid("valid-superseded", "the review invalidated by a retraction and superseded by review-2", first.journal),
            headers=(second.journal.header,),
        ),
        _valid("valid-successor", "review-2, which supersedes review-1, partly redone", second.journal),
        _valid(
            "valid-interrupted",
            "the retraction arrives while screen-a's retry is authorized and screen-b is blocked: "
            "both attempts end invalidated",
            interrupted().journal,
        ),
        _valid("valid-empty", "a header and no events", new("review-1").journal),
        attrs.evolve(
            _valid(
                "valid-invalidated-after-binding",
                "review-1 superseded by review-2 from the screening onwards; then its search, still completed, "
                "invalidated by an index withdrawal and bound to review-2 too",
                invalidated_after_binding()[0].journal,
            ),
            headers=(second.journal.header,),
        ),
        _valid(
            "valid-untouched-human-work",
            "bot:search, automation, invalidates the search and everything after it, human screenings included, "
            "before any human has worked on them",
            untouched_human_work().journal,
        ),
        _valid(
            "valid-clock-back",
            "the search's failure recorded by an appender whose clock was an hour behind: the ordinal, not the "
            "time, orders a journal",
            clock_set_back().journal,
        ),
        _valid(
            "valid-long-text",
            f"the search's failure carries an error and a rationale longer than the {MAX_RATIONALE} characters an "
            "append now admits: replay reads what was appended",
            written_before_the_bound().journal,
        ),
    ]

    def bad(name: str, description: str, chain: list[bytes], code: str, ordinal: int) -> None:
        found.append(Case(name, description, chain, code, ordinal))

    # Tampering with bytes.
    bad("removal", "event 3 removed", [header, *events[:2], *events[3:]], "broken_chain", 3)
    bad("reordering", "events 3 and 4 swapped", [header, *events[:2], events[3], events[2], *events[4:]], "broken_chain", 3)
    inserted = forge(
        _prefix(complete.journal, 2),
        j.Transition("inserted", _prefix(complete.journal, 2).head, "search", NodeEvent.RETRY_AUTHORIZED,
                     NodeState.FAILED, "bot:search", "searcher", attempt=j.AttemptRef("search-x", 2)),
        T0 + timedelta(seconds=2, milliseconds=500),
        (("search", NodeEvent.RETRY_AUTHORIZED, NodeState.READY),),
    )  # fmt: skip
    bad("insertion", "a well-formed event inserted after event 2", [header, *events[:2], *inserted, *events[2:]],
        "broken_chain", 4)  # fmt: skip
    bad("duplication", "event 3 recorded twice", [header, *events[:3], events[2], *events[3:]], "broken_chain", 4)
    other = lines(review(new("review-9")).journal)
    bad("cross-execution-splice", "event 3 of another execution spliced in", [header, *events[:2], other[3], *events[3:]],
        "foreign_record", 3)  # fmt: skip
    altered = json.loads(events[4])
    altered["digest"] = sha("something else")
    bad("altered-digest", "event 5's digest replaced", [header, *events[:4], canonical_bytes(altered), *events[5:]],
        "altered_digest", 5)  # fmt: skip
    rewritten = json.loads(events[4])
    rewritten["rationale"] = "rewritten afterwards"
    bad("altered-content", "event 5's rationale rewritten, digest kept", [header, *events[:4], canonical_bytes(rewritten), *events[5:]],
        "altered_digest", 5)  # fmt: skip
    bad("altered-header", "the header's creator rewritten, digest kept",
        [canonical_bytes({**json.loads(header), "created_by": "alice"}), *events], "altered_digest", 0)  # fmt: skip
    bad("unknown-field", "event 2 with an extra field, digest recomputed", [header, events[0], resign(events[1], note="x"), *events[2:]],
        "unknown_field", 2)  # fmt: skip
    spaced = json.dumps(json.loads(events[1]), sort_keys=True).encode()
    bad("non-canonical", "event 2 re-encoded with spaces after separators", [header, events[0], spaced, *events[2:]],
        "non_canonical", 2)  # fmt: skip
    # JSON can spell a lone surrogate (\ud800) that no UTF-8 text holds, so
    # the record has no canonical bytes; a reader that swaps it for U+FFFD
    # would call it non_canonical or altered_digest instead.
    surrogate = events[1].replace(b'"rationale":"', b'"rationale":"\\ud800', 1)
    bad("lone-surrogate", "event 2's rationale holds an escaped unpaired surrogate", [header, events[0], surrogate, *events[2:]],
        "malformed_record", 2)  # fmt: skip
    without_role = {k: v for k, v in json.loads(events[1]).items() if k not in ("role", "digest")}
    bad("missing-field", "event 2 without its role, digest recomputed",
        [header, events[0], canonical_bytes({**without_role, "digest": digest_of(without_role)}), *events[2:]],
        "missing_field", 2)  # fmt: skip
    bad("time-spelling", "event 2's time written without its fraction, digest recomputed",
        [header, events[0], resign(events[1], at="2026-03-01T09:00:02Z"), *events[2:]], "malformed_record", 2)  # fmt: skip
    request = json.loads(events[1])["request"]
    shouted = {**request, "digest": "sha256:" + request["digest"].removeprefix("sha256:").upper()}
    bad("digest-spelling", "event 2's request digest in capital hexadecimal digits, digest recomputed",
        [header, events[0], resign(events[1], request=shouted), *events[2:]], "malformed_record", 2)  # fmt: skip
    # Numbers JCS could write but the format refuses: a fraction, and a whole number past 2^53 - 1.
    bad("number-fraction", "event 2's ordinal written 2.5",
        [header, events[0], events[1].replace(b'"ordinal":2,', b'"ordinal":2.5,', 1), *events[2:]],
        "malformed_record", 2)  # fmt: skip
    bad("number-range", "event 2's ordinal written 2^53",
        [header, events[0], events[1].replace(b'"ordinal":2,', b'"ordinal":9007199254740992,', 1), *events[2:]],
        "malformed_record", 2)  # fmt: skip
    # A stored event's identifiers and attempt sequence are its request's (section 6, rule 1).
    bad("event-identifier", "event 2's actor written 'bot search', which is no identifier, digest recomputed",
        [header, events[0], resign(events[1], actor="bot search"), *events[2:]], "invalid_request", 2)  # fmt: skip
    bad("attempt-sequence-zero", "event 2's attempt numbered 0, digest recomputed",
        [header, events[0], resign(events[1], attempt={"id": "search-1", "sequence": 0}), *events[2:]],
        "invalid_request", 2)  # fmt: skip
    # Cases 4.3.0.  A JSON parser may read 2.0 as the integer 2 and see only bytes that are not canonical; the
    # record holds a float, which no record may, and that is checked on the value before its bytes (section 1).
    bad("number-integral-fraction", "event 2's ordinal written 2.0",
        [header, events[0], events[1].replace(b'"ordinal":2,', b'"ordinal":2.0,', 1), *events[2:]],
        "malformed_record", 2)  # fmt: skip
    # Below 0 a sequence is no whole number a record takes (section 7, step 2); only 0 is left to rule 1.
    bad("attempt-sequence-negative", "event 2's attempt numbered -1, digest recomputed",
        [header, events[0], resign(events[1], attempt={"id": "search-1", "sequence": -1}), *events[2:]],
        "malformed_record", 2)  # fmt: skip
    bad("ordinal-gap", "event 2 renumbered 3, digest recomputed", [header, events[0], resign(events[1], ordinal=3), *events[2:]],
        "ordinal_gap", 2)  # fmt: skip
    bad("request-digest", "event 2's content changed and its digest recomputed, its request digest not",
        [header, events[0], resign(events[1], rationale="x"), *events[2:]], "altered_digest", 2)  # fmt: skip

    # Inside a batch: the record is named, not the batch it leaves short.
    superseded_lines = lines(first.journal)
    batch = [e.ordinal for e in first.journal.events if e.event is NodeEvent.WORK_INVALIDATED]
    bad("batch-removal", f"event {batch[2]}, the third of the retraction's batch, removed",
        [*superseded_lines[: batch[2]], *superseded_lines[batch[2] + 1 :]], "broken_chain", batch[2])  # fmt: skip
    # Cases 4.3.0.  A batch read as far as it can be is checked before the record that cut it short is named,
    # and a rule checked before the batch's nodes are counted names its first record (section 7).
    forged = _rechained(superseded_lines, batch[0], batch[0] + 2, actor="alice", role="reviewer")
    bad("batch-cut-short-after-forged-role", f"events {batch[0]} and {batch[0] + 1} of the retraction's batch "
        "rewritten to alice as reviewer, a role the retraction policy does not admit, digests recomputed; event "
        f"{batch[2]} left as it was, so it no longer names the head before it",
        forged, "forged_role", batch[0])  # fmt: skip
    # An invalidation's event without its invalidation records no command to rebuild (section 7, step 3).
    bare = _rechained(superseded_lines, batch[0], len(superseded_lines), invalidation=None, only=batch[0])
    bad("invalidation-missing", f"event {batch[0]}, the first of the retraction's batch, without its invalidation "
        "(null), every digest after it recomputed", bare, "malformed_record", batch[0])  # fmt: skip

    # Forged events: every digest right, a rule broken.
    found.extend(_forged(complete))
    found.extend(_forged_batches(first))
    found.extend(_forged_successors(first, second))
    found.extend(_forged_rules(complete, first, second))
    # A header that does not bind the workflow and policy it is replayed with, one member at a time.
    for name, description, change in (
        ("header-other-workflow", "the header's workflow digest rewritten", {"workflow_digest": sha("another workflow")}),
        ("header-other-policy", "the header's policy digest rewritten", {"policy_digest": sha("another policy")}),
        ("header-other-protocol", "the header's protocol rewritten", {"protocol": "protocol-v2"}),
        ("header-node-order", "the header's nodes listed in reverse", {"nodes": list(reversed(json.loads(header)["nodes"]))}),
        ("header-automation-creator", "the header's creator rewritten to bot:search, an automation actor",
         {"created_by": "bot:search"}),
    ):
        bad(name, f"{description}, digest recomputed", [resign(header, **change), *events], "unverified_authority", 0)
    return found


def _rechained(chain: list[bytes], start: int, stop: int, *, only: int | None = None, **changes: Json) -> list[bytes]:
    """``chain`` with ``changes`` made to its records ``start`` to ``stop`` (or to record ``only`` alone), each of
    them re-signed and naming the digest of the one before it; the records after ``stop`` are left as they were."""
    out = list(chain)
    for ordinal in range(start, stop):
        value = json.loads(out[ordinal])
        if only is None or ordinal == only:
            value.update(changes)
        value["previous"] = json.loads(out[ordinal - 1])["digest"]
        out[ordinal] = resign(canonical_bytes(value))
    return out


def _prefix(journal: j.Journal, count: int) -> j.Journal:
    workflow, policy = journal.workflow, journal.policy
    chain = lines(journal)
    return j.replay(chain[0], chain[1 : count + 1], workflow, policy)


def _forged(complete: Script) -> list[Case]:
    journal = complete.journal
    found: list[Case] = []
    # Up to screen-a's dependencies (after the search's five events and screen-a's dependencies-satisfied).
    at_screening = _prefix(journal, 6)
    chain = lines(at_screening)
    at = T0 + timedelta(seconds=6, milliseconds=500)

    def forged(name: str, description: str, command: j.Command, code: str, rows: tuple[tuple[str, NodeEvent, NodeState], ...] = ()) -> None:
        found.append(Case(name, description, [*chain, *forge(at_screening, command, at, rows)], code, len(chain)))

    start = j.AttemptRef("screen-a-1", 1)
    head = at_screening.head
    forged("forged-role", "mallory, who has no assignment, starts screen-a as a screener",
           j.Transition("f1", head, "screen-a", NodeEvent.WORK_STARTED, NodeState.READY, "mallory", "screener", attempt=start),
           "forged_role")  # fmt: skip
    forged("automation-claims-human", "bot:extract starts the human screening screen-a",
           j.Transition("f2", head, "screen-a", NodeEvent.WORK_STARTED, NodeState.READY, "bot:extract", "screener", attempt=start),
           "automation_claims_human")  # fmt: skip
    # Missing artifact: screen-a started by alice, then completed without its screening record.
    started = forge(at_screening, j.Transition("f3", head, "screen-a", NodeEvent.WORK_STARTED, NodeState.READY, "alice",
                                               "screener", attempt=start), at)  # fmt: skip
    after = j.replay(chain[0], [*chain[1:], *started], journal.workflow, journal.policy)
    completion = forge(
        after,
        j.Transition("f4", after.head, "screen-a", NodeEvent.WORK_COMPLETED, NodeState.ACTIVE, "alice", "screener",
                     attempt=start, records=(ref("screening", "some-other-record"),)),
        at + timedelta(seconds=1),
        (("screen-a", NodeEvent.WORK_COMPLETED, NodeState.COMPLETED),),
    )  # fmt: skip
    found.append(Case("missing-artifact", "screen-a completed without referencing its declared screening-a",
                      [*chain, *started, *completion], "missing_declared_output", len(chain) + 1))  # fmt: skip
    forged("dependency-gap", "extraction made ready while both screenings are pending",
           j.Transition("f5", head, "extraction", NodeEvent.DEPENDENCIES_SATISFIED, NodeState.PENDING, "bot:search", "scheduler"),
           "dependency_gap", (("extraction", NodeEvent.DEPENDENCIES_SATISFIED, NodeState.READY),))  # fmt: skip
    # alice screened screen-a; she may not also start screen-b.
    at_second = _prefix(journal, 9)
    found.append(Case("not-independent", "alice, who did screen-a, starts screen-b",
                      [*lines(at_second), *forge(at_second, j.Transition(
                          "f10", at_second.head, "screen-b", NodeEvent.WORK_STARTED, NodeState.READY, "alice",
                          "screener", attempt=j.AttemptRef("screen-b-1", 1)), at)],
                      "not_independent", len(at_second.events) + 1))  # fmt: skip
    forged("invalid-transition", "search, completed, started again",
           j.Transition("f6", head, "search", NodeEvent.WORK_STARTED, NodeState.COMPLETED, "bot:search", "searcher",
                        attempt=j.AttemptRef("search-3", 3)),
           "invalid_transition")  # fmt: skip
    # Sign-off with one approval: forged at the end of the complete review, replacing its completion.
    before_sign_off = _prefix(journal, len(journal.events) - 1)
    one = forge(
        before_sign_off,
        j.Transition("f7", before_sign_off.head, "sign-off", NodeEvent.WORK_COMPLETED, NodeState.ACTIVE, "carol",
                     "coordinator", attempt=j.AttemptRef("sign-off-1", 1), approvals=SIGN_OFF[:1]),
        T0 + timedelta(hours=1),
        (("sign-off", NodeEvent.WORK_COMPLETED, NodeState.COMPLETED),),
    )  # fmt: skip
    found.append(Case("invalid-approval", "the sign-off completed with one approval where two are required",
                      [*lines(before_sign_off), *one], "invalid_approval", len(before_sign_off.events) + 1))  # fmt: skip
    shared = ref("approval", "one-sign-off")
    counted_twice = forge(
        before_sign_off,
        j.Transition("f11", before_sign_off.head, "sign-off", NodeEvent.WORK_COMPLETED, NodeState.ACTIVE, "carol",
                     "coordinator", attempt=j.AttemptRef("sign-off-1", 1),
                     approvals=(j.Approval("alice", "reviewer", shared), j.Approval("bob", "reviewer", shared))),
        T0 + timedelta(hours=1),
        (("sign-off", NodeEvent.WORK_COMPLETED, NodeState.COMPLETED),),
    )  # fmt: skip
    found.append(Case("approval-record-shared", "the sign-off completed with alice and bob citing one approval record",
                      [*lines(before_sign_off), *counted_twice], "invalid_approval",
                      len(before_sign_off.events) + 1))  # fmt: skip
    return found


def _forged_batches(first: Script) -> list[Case]:
    journal = first.journal
    found: list[Case] = []
    batch_start = next(e.ordinal for e in journal.events if e.event is NodeEvent.WORK_INVALIDATED)
    reviewed = _prefix(journal, batch_start - 1)
    chain = lines(reviewed)
    at = T0 + timedelta(hours=2)
    partial = j.Invalidate(
        request_id="f8", expected_head=reviewed.head, source=RETRACTION, policy="retraction-policy",
        nodes=(j.NodeExpectation("screen-a", NodeState.COMPLETED), j.NodeExpectation("screen-b", NodeState.COMPLETED),
               j.NodeExpectation("extraction", NodeState.COMPLETED)),
        actor_id="carol", role="coordinator",
    )  # fmt: skip
    rows = tuple((n.node_id, NodeEvent.WORK_INVALIDATED, NodeState.INVALIDATED) for n in partial.nodes)
    found.append(Case("partial-invalidation", "the retraction invalidates the screenings and extraction but leaves "
                      "synthesis and sign-off appearing current", [*chain, *forge(reviewed, partial, at, rows)],
                      "partial_invalidation", len(chain)))  # fmt: skip
    bind = j.BindSuccessor(
        request_id="f9", expected_head=reviewed.head,
        successor=j.RecordRef(j.SUCCESSOR_KIND, "review-2", sha("review-2")),
        nodes=(j.NodeExpectation("synthesis", NodeState.COMPLETED),), actor_id="carol", role="coordinator",
    )  # fmt: skip
    found.append(Case("bad-successor", "a successor bound to completed work that was never invalidated",
                      [*chain, *forge(reviewed, bind, at, (("synthesis", NodeEvent.SUCCESSOR_BOUND, NodeState.SUPERSEDED),))],
                      "bad_successor_binding", len(chain)))  # fmt: skip

    def invalidated_by(name: str, description: str, actor: str, role: str, *, policy: str, code: str) -> None:
        command = attrs.evolve(invalidation(Script(reviewed)), request_id=name, actor_id=actor, role=role, policy=policy)
        rows = tuple((n.node_id, NodeEvent.WORK_INVALIDATED, NodeState.INVALIDATED) for n in command.nodes)
        # forge writes a batch in the order given; the kernel's is topological.
        rows = tuple(sorted(rows, key=lambda r: journal.workflow.order.index(r[0])))
        found.append(Case(name, description, [*chain, *forge(reviewed, command, at, rows)], code, len(chain)))

    invalidated_by("unauthorized-invalidation", "bot:search, as searcher, invalidates the five nodes humans completed "
                   "under the retraction policy, which admits only the coordinator", "bot:search", "searcher",
                   policy="retraction-policy", code="forged_role")  # fmt: skip
    invalidated_by("undeclared-invalidation-policy", "carol invalidates the screenings onwards under a policy the "
                   "authority policy does not declare", "carol", "coordinator",
                   policy="anything-at-all", code="unverified_authority")  # fmt: skip
    invalidated_by("automation-invalidates-human-work", "bot:search, as scheduler, invalidates human-completed work "
                   "under the index-withdrawal policy, which admits its role but not automation over human work",
                   "bot:search", "scheduler", policy="index-withdrawal", code="automation_claims_human")  # fmt: skip
    return found


OTHER_REVIEW = attrs.evolve(REVIEW, workflow_id="systematic-review-2")
"""Another workflow: the same nodes under another id, so another digest."""


def _forged_successors(first: Script, second: Script) -> list[Case]:
    """Successor bindings forged after the retraction: each names a header that is not a successor of review-1."""
    journal = first.journal
    binding_start = next(e.ordinal for e in journal.events if e.event is NodeEvent.SUCCESSOR_BOUND)
    invalidated = _prefix(journal, binding_start - 1)
    chain = lines(invalidated)
    at = T0 + timedelta(days=1, hours=1)
    later = T0 + timedelta(days=1)
    workflow, policy = verified()
    unrelated = j.create_header("review-3", workflow, policy, created_by="carol", now=later)
    other_workflow = verify_workflow(OTHER_REVIEW)
    other_policy = j.verify_policy(review_policy(other_workflow), other_workflow)
    elsewhere = j.create_header("review-4", other_workflow, other_policy, created_by="carol", now=later,
                                supersedes="review-1")  # fmt: skip
    known = (second.journal.header, unrelated, elsewhere)
    found: list[Case] = []

    def bound(name: str, description: str, successor: j.RecordRef) -> None:
        command = attrs.evolve(binding(Script(invalidated), second.journal), request_id=name, successor=successor)
        rows = tuple((n, NodeEvent.SUCCESSOR_BOUND, NodeState.SUPERSEDED) for n in DOWNSTREAM)
        found.append(Case(name, description, [*chain, *forge(invalidated, command, at, rows)], "bad_successor_binding",
                          len(chain), headers=known))  # fmt: skip

    def named(header: j.Header) -> j.RecordRef:
        return j.RecordRef(j.SUCCESSOR_KIND, header.execution_id, header.digest)

    bound("successor-not-superseding", "review-1 bound to review-3, whose header supersedes nothing", named(unrelated))
    bound("successor-other-workflow", "review-1 bound to review-4, which supersedes review-1 but runs another workflow",
          named(elsewhere))  # fmt: skip
    bound("successor-unknown", "review-1 bound to ghost-9, an execution no header names, with an invented digest",
          j.RecordRef(j.SUCCESSOR_KIND, "ghost-9", sha("ghost-9")))  # fmt: skip
    bound("successor-digest", "review-1 bound to review-2 under a digest that is not its header's",
          j.RecordRef(j.SUCCESSOR_KIND, "review-2", sha("review-2")))  # fmt: skip
    bound("successor-self", "review-1 bound to itself, under its own header's digest", named(journal.header))
    bound("successor-not-execution", "review-1 bound to review-2's header named as a record of kind 'header'",
          j.RecordRef("header", "review-2", second.journal.header.digest))  # fmt: skip
    short = attrs.evolve(binding(Script(invalidated), second.journal), request_id="successor-partial",
                         nodes=tuple(j.NodeExpectation(n, NodeState.INVALIDATED) for n in DOWNSTREAM[:-1]))  # fmt: skip
    rows = tuple((n, NodeEvent.SUCCESSOR_BOUND, NodeState.SUPERSEDED) for n in DOWNSTREAM[:-1])
    found.append(Case("successor-partial", "review-2 bound to four of the five invalidated nodes, sign-off left out",
                      [*chain, *forge(invalidated, short, at, rows)], "bad_successor_binding", len(chain),
                      headers=known))  # fmt: skip
    return found


def _forged_rules(complete: Script, first: Script, second: Script) -> list[Case]:
    """A case for each rule of specs/journal.md, section 6, that the cases above leave unchecked.

    Each breaks one rule in a record whose digests are all right, so that a
    reader passes it only by checking that rule (and gives the rule's code).
    """
    journal = complete.journal
    found: list[Case] = []
    at_screening = _prefix(journal, 6)
    chain = lines(at_screening)
    head = at_screening.head
    at = T0 + timedelta(seconds=6, milliseconds=500)
    start = j.AttemptRef("screen-a-1", 1)

    def forged(name: str, description: str, command: j.Command, code: str,
               rows: tuple[tuple[str, NodeEvent, NodeState], ...] = ()) -> None:  # fmt: skip
        found.append(Case(name, description, [*chain, *forge(at_screening, command, at, rows)], code, len(chain)))

    def screen_a(request: str, event: NodeEvent = NodeEvent.WORK_STARTED, **fields: Any) -> j.Transition:
        values: dict[str, Any] = {"attempt": start, **fields}
        return j.Transition(request, head, "screen-a", event, NodeState.READY, "alice", "screener", **values)

    forged("request-id-reused", "alice starts screen-a under review-1-r1, the request id of event 1",
           screen_a("review-1-r1"), "conflicting_request")  # fmt: skip
    forged("unknown-node", "alice starts screen-z, a node the workflow does not have",
           attrs.evolve(screen_a("f12"), node_id="screen-z"), "unknown_node")  # fmt: skip
    forged("prior-state-mismatch", "alice starts screen-b, recording it ready while it is still pending",
           attrs.evolve(screen_a("f13"), node_id="screen-b", attempt=j.AttemptRef("screen-b-1", 1)),
           "prior_state_mismatch")  # fmt: skip
    forged("attempt-out-of-sequence", "alice starts screen-a's first attempt numbered 2",
           screen_a("f14", attempt=j.AttemptRef("screen-a-1", 2)), "invalid_attempt")  # fmt: skip
    forged("attempt-on-dependencies", "the scheduler makes screen-b ready binding an attempt",
           j.Transition("f15", head, "screen-b", NodeEvent.DEPENDENCIES_SATISFIED, NodeState.PENDING, "bot:search",
                        "scheduler", attempt=j.AttemptRef("screen-b-1", 1)),
           "invalid_attempt", (("screen-b", NodeEvent.DEPENDENCIES_SATISFIED, NodeState.READY),))  # fmt: skip
    forged("error-without-failure", "alice starts screen-a with an error", screen_a("f16", error="nothing went wrong"),
           "invalid_request")  # fmt: skip
    started = forge(at_screening, screen_a("f17"), at)
    after = j.continue_replay(at_screening, started)

    def then(name: str, description: str, command: j.Transition, code: str, resulting: NodeState) -> None:
        rows = ((command.node_id, command.event, resulting),)
        found.append(Case(name, description, [*chain, *started, *forge(after, command, at + timedelta(seconds=1), rows)],
                          code, len(chain) + 1))  # fmt: skip

    def screen_a_active(request: str, event: NodeEvent, **fields: Any) -> j.Transition:
        values: dict[str, Any] = {"attempt": start, **fields}
        return j.Transition(request, after.head, "screen-a", event, NodeState.ACTIVE, "alice", "screener", **values)

    then("attempt-not-current", "alice completes screen-a binding an attempt id that is not the one she started",
         screen_a_active("f18", NodeEvent.WORK_COMPLETED, attempt=j.AttemptRef("screen-a-x", 1),
                         records=(ref("screening", "screening-a"),)),
         "invalid_attempt", NodeState.COMPLETED)  # fmt: skip
    then("records-repeated", "alice completes screen-a referencing screening-a twice",
         screen_a_active("f32", NodeEvent.WORK_COMPLETED, records=(ref("screening", "screening-a"),) * 2),
         "invalid_request", NodeState.COMPLETED)  # fmt: skip
    then("failure-without-error", "alice fails screen-a with an empty error",
         screen_a_active("f19", NodeEvent.WORK_FAILED, error=""), "invalid_request", NodeState.FAILED)  # fmt: skip

    # Roles: one the policy does not give the actor, one the node does not admit.
    forged("role-not-assigned", "carol, who is no screener, starts screen-a as a screener",
           attrs.evolve(screen_a("f23"), actor_id="carol"), "forged_role")  # fmt: skip
    forged("role-not-admitted", "alice starts screen-a as a reviewer, a role she holds that screen-a does not admit",
           attrs.evolve(screen_a("f24"), role="reviewer"), "forged_role")  # fmt: skip
    then("approvals-off-approval-node", "alice completes screen-a citing an approval",
         screen_a_active("f25", NodeEvent.WORK_COMPLETED, records=(ref("screening", "screening-a"),),
                         approvals=SIGN_OFF[:1]),
         "invalid_approval", NodeState.COMPLETED)  # fmt: skip

    # Attempts: a retry's attempt id reused, and a start that is not of the authorized attempt.
    failed = _prefix(journal, 2)
    reused = j.Transition("f26", failed.head, "search", NodeEvent.RETRY_AUTHORIZED, NodeState.FAILED, "bot:search",
                          "searcher", attempt=j.AttemptRef("search-1", 2))  # fmt: skip
    found.append(Case("attempt-id-reused", "the search's retry authorized under search-1, the failed attempt's id",
                      [*lines(failed), *forge(failed, reused, at, (("search", NodeEvent.RETRY_AUTHORIZED, NodeState.READY),))],
                      "invalid_attempt", 3))  # fmt: skip
    authorized = _prefix(journal, 3)
    other = j.Transition("f27", authorized.head, "search", NodeEvent.WORK_STARTED, NodeState.READY, "bot:search",
                         "searcher", attempt=j.AttemptRef("search-3", 3))  # fmt: skip
    found.append(Case("attempt-not-authorized", "the search started as search-3 #3 where the retry authorized search-2 #2",
                      [*lines(authorized), *forge(authorized, other, at)], "invalid_attempt", 4))  # fmt: skip

    # The hybrid extraction, worked by automation, which may do it but not complete it or authorize a retry.
    ready = next(e.ordinal for e in journal.events if e.node_id == "extraction")
    extraction = _prefix(journal, ready)
    attempt = j.AttemptRef("extraction-1", 1)
    begun = forge(extraction, j.Transition("f28", extraction.head, "extraction", NodeEvent.WORK_STARTED,
                                           NodeState.READY, "bot:extract", "extractor", attempt=attempt), at)  # fmt: skip
    working = j.continue_replay(extraction, begun)

    def automated(name: str, description: str, command: j.Transition, resulting: NodeState, *,
               before: tuple[bytes, ...] = (), base: j.Journal = working) -> None:  # fmt: skip
        rows = ((command.node_id, command.event, resulting),)
        body = forge(base, command, at + timedelta(seconds=2), rows)
        found.append(Case(name, description, [*lines(extraction), *begun, *before, *body], "automation_claims_human",
                          len(extraction.events) + 2 + len(before)))  # fmt: skip

    automated("hybrid-completed-by-automation", "bot:extract completes the hybrid extraction it started",
           j.Transition("f29", working.head, "extraction", NodeEvent.WORK_COMPLETED, NodeState.ACTIVE, "bot:extract",
                        "extractor", attempt=attempt, records=(ref("extraction", "extraction-table"),)),
           NodeState.COMPLETED)  # fmt: skip
    broke = forge(working, j.Transition("f30", working.head, "extraction", NodeEvent.WORK_FAILED, NodeState.ACTIVE,
                                        "bot:extract", "extractor", attempt=attempt, error="table parser crashed"),
                  at + timedelta(seconds=1), (("extraction", NodeEvent.WORK_FAILED, NodeState.FAILED),))  # fmt: skip
    broken = j.continue_replay(working, broke)
    automated("hybrid-retry-by-automation", "bot:extract authorizes a retry of the hybrid extraction it failed",
           j.Transition("f31", broken.head, "extraction", NodeEvent.RETRY_AUTHORIZED, NodeState.FAILED, "bot:extract",
                        "extractor", attempt=j.AttemptRef("extraction-2", 2)),
           NodeState.READY, before=tuple(broke), base=broken)  # fmt: skip

    # The sign-off's approvals, each breaking one rule of its requirement (two human reviewers, distinct).
    signing = _prefix(journal, len(journal.events) - 1)
    sign_off = j.AttemptRef("sign-off-1", 1)

    def signed(name: str, description: str, approvals: tuple[j.Approval, ...], code: str) -> None:
        command = j.Transition(name, signing.head, "sign-off", NodeEvent.WORK_COMPLETED, NodeState.ACTIVE, "carol",
                               "coordinator", attempt=sign_off, approvals=approvals)  # fmt: skip
        rows = (("sign-off", NodeEvent.WORK_COMPLETED, NodeState.COMPLETED),)
        found.append(Case(name, description, [*lines(signing), *forge(signing, command, T0 + timedelta(hours=1), rows)],
                          code, len(signing.events) + 1))  # fmt: skip

    def approval(actor: str, role: str) -> j.Approval:
        return j.Approval(actor, role, ref("approval", f"{actor}-as-{role}"))

    signed("approval-forged-role", "alice and carol approve as reviewers; carol is no reviewer",
           (approval("alice", "reviewer"), approval("carol", "reviewer")), "forged_role")  # fmt: skip
    signed("approval-other-role", "alice approves as a reviewer, bob as a screener, a role the sign-off does not take",
           (approval("alice", "reviewer"), approval("bob", "screener")), "invalid_approval")  # fmt: skip
    signed("approval-by-automation", "alice and bot:extract approve as reviewers; the sign-off takes humans only",
           (approval("alice", "reviewer"), approval("bot:extract", "reviewer")), "invalid_approval")  # fmt: skip
    signed("approval-same-actor", "alice approves twice, with two records; the sign-off needs distinct approvers",
           (approval("alice", "reviewer"), j.Approval("alice", "reviewer", ref("approval", "alice-again"))),
           "invalid_approval")  # fmt: skip
    signed("approval-order", "bob approves as a screener, then carol as a reviewer she is not: the first "
           "approval's rule is broken first", (approval("bob", "screener"), approval("carol", "reviewer")),
           "invalid_approval")  # fmt: skip
    starting = _prefix(journal, len(journal.events) - 2)
    early = j.Transition("approvals-on-start", starting.head, "sign-off", NodeEvent.WORK_STARTED, NodeState.READY,
                         "carol", "coordinator", attempt=sign_off, approvals=SIGN_OFF)  # fmt: skip
    found.append(Case("approvals-on-start", "the sign-off started with its two approvals, which belong to its completion",
                      [*lines(starting), *forge(starting, early, T0 + timedelta(hours=1))], "invalid_approval",
                      len(starting.events) + 1))  # fmt: skip

    # The retraction's batch written in review order rather than topological order.
    batch = [e for e in first.journal.events if e.event is NodeEvent.WORK_INVALIDATED]
    reviewed = _prefix(first.journal, batch[0].ordinal - 1)
    command = invalidation(Script(reviewed))
    order = ("screen-b", "screen-a", "extraction", "synthesis", "sign-off")
    rows = tuple((n, NodeEvent.WORK_INVALIDATED, NodeState.INVALIDATED) for n in order)
    found.append(Case("batch-out-of-order", "the retraction's batch, digests right, with screen-b's event before "
                      "screen-a's, which the topological order puts first",
                      [*lines(reviewed), *forge(reviewed, command, T0 + timedelta(hours=2), rows)],
                      "malformed_record", batch[0].ordinal))  # fmt: skip

    twice = attrs.evolve(command, request_id="f33", nodes=(*command.nodes, command.nodes[0]))
    rows = tuple((n.node_id, NodeEvent.WORK_INVALIDATED, NodeState.INVALIDATED) for n in twice.nodes)
    rows = tuple(sorted(rows, key=lambda r: reviewed.workflow.order.index(r[0])))
    found.append(Case("batch-node-repeated", "the retraction's batch with two events for screen-a",
                      [*lines(reviewed), *forge(reviewed, twice, T0 + timedelta(hours=2), rows)],
                      "invalid_request", batch[0].ordinal))  # fmt: skip

    # After review-2 superseded the screening onwards.
    done = first.journal
    after_binding = T0 + timedelta(days=2)
    again = j.BindSuccessor(
        request_id="f20", expected_head=done.head,
        successor=j.RecordRef(j.SUCCESSOR_KIND, "review-2", second.journal.header.digest),
        nodes=(j.NodeExpectation("screen-a", NodeState.SUPERSEDED),), actor_id="carol", role="coordinator",
    )  # fmt: skip
    found.append(Case("superseded-bound-again", "screen-a, superseded, bound to review-2 a second time",
                      [*lines(done), *forge(done, again, after_binding,
                                            (("screen-a", NodeEvent.SUCCESSOR_BOUND, NodeState.SUPERSEDED),))],
                      "bad_successor_binding", len(done.events) + 1, headers=(second.journal.header,)))  # fmt: skip
    undo = j.Invalidate(
        request_id="f21", expected_head=done.head, source=RETRACTION, policy="retraction-policy",
        nodes=(j.NodeExpectation("screen-a", NodeState.SUPERSEDED),), actor_id="carol", role="coordinator",
    )  # fmt: skip
    found.append(Case("superseded-invalidated", "screen-a, superseded, invalidated again",
                      [*lines(done), *forge(done, undo, after_binding,
                                            (("screen-a", NodeEvent.WORK_INVALIDATED, NodeState.INVALIDATED),))],
                      "invalid_transition", len(done.events) + 1, headers=(second.journal.header,)))  # fmt: skip
    bound = next(e.ordinal for e in done.events if e.event is NodeEvent.SUCCESSOR_BOUND)
    invalidated = _prefix(done, bound - 1)
    by_bot = attrs.evolve(binding(Script(invalidated), second.journal), request_id="f22", actor_id="bot:search",
                          role="scheduler")  # fmt: skip
    rows = tuple((n, NodeEvent.SUCCESSOR_BOUND, NodeState.SUPERSEDED) for n in DOWNSTREAM)
    found.append(Case("successor-by-automation", "bot:search, automation, binds review-2 to review-1's invalidated work",
                      [*lines(invalidated), *forge(invalidated, by_bot, T0 + timedelta(days=1, hours=1), rows)],
                      "automation_claims_human", bound, headers=(second.journal.header,)))  # fmt: skip
    return found


def write_pack(directory: Path) -> list[Path]:
    """Write the pack into ``directory`` (which must exist); returns the files written, sorted."""
    workflow, policy = verified()
    written: list[Path] = []

    def put(relative: str, data: bytes) -> None:
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written.append(path)

    put("workflow.json", canonical_bytes(REVIEW.to_json()) + b"\n")
    put("policy.json", canonical_bytes(policy.policy.to_json()) + b"\n")
    manifest: list[Json] = []
    written_names: set[str] = set()
    for case in cases():
        chain = f"chains/{case.name}.jsonl"
        put(chain, b"".join(line + b"\n" for line in case.lines))
        entry: dict[str, Json] = {"name": case.name, "description": case.description, "chain": chain}
        if case.headers:
            names = []
            for header in case.headers:
                name = f"headers/{header.execution_id}.json"
                if name not in written_names:
                    put(name, j.encode_header(header) + b"\n")
                    written_names.add(name)
                names.append(name)
            entry["headers"] = names
        if case.code is None:
            entry["valid"] = True
            entry["expect"] = case.expect
        else:
            entry["valid"] = False
            entry["expect"] = {"code": case.code, "ordinal": case.ordinal}
        manifest.append(entry)
    document: dict[str, Json] = {
        "format": j.FORMAT,
        "workflow": "workflow.json",
        "workflow_digest": workflow.digest,
        "policy": "policy.json",
        "policy_digest": policy.digest,
        "cases": manifest,
    }
    put("manifest.json", json.dumps(document, indent=2, ensure_ascii=False).encode() + b"\n")
    return sorted(written)


def read_chain(path: Path) -> tuple[bytes, Sequence[bytes]]:
    """A JSON-lines chain file: the header line, then one event a line (each line's final newline removed).

    Every line ends with a newline (specs/journal.md, section 9), the last
    one too.  A last line without one is a framing fault of its record,
    refused ``non_canonical`` as a carriage return or a blank line is: at
    once if it is the header, else when replay reaches it (:class:`ChainLines`),
    so that a bad record before it is still the one named.  An empty file
    is a ValueError.
    """
    data = path.read_bytes()
    records = data.split(b"\n")
    terminated = records[-1] == b""
    if terminated:
        records.pop()
    if not records:
        raise ValueError(f"{path}: empty; the first line must be the header")
    if not terminated and len(records) == 1:
        raise _unterminated(0)
    return records[0], ChainLines(records[1:], terminated=terminated)


def _unterminated(ordinal: int) -> JournalError:
    """The refusal of a record whose line is the file's last and has no newline."""
    return JournalError(
        JournalCode.NON_CANONICAL,
        "the file's last line does not end with a newline (specs/journal.md, section 9: every line does)",
        ordinal,
    )


class ChainLines(Sequence[bytes]):
    """A chain file's event lines; reading the last raises its refusal if the file did not end it with a newline.

    Replay reads the records in order and checks each as it reads it, so a
    record that cannot be read is reported where it stands: after every
    record before it, and as the record that cuts a batch short
    (specs/journal.md, section 7), exactly as an unreadable record is.
    """

    __slots__ = ("_lines", "_terminated")

    def __init__(self, lines: Sequence[bytes], *, terminated: bool) -> None:
        self._lines = tuple(lines)
        self._terminated = terminated

    def __len__(self) -> int:
        return len(self._lines)

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self._lines))[index]]
        line = self._lines[index]
        if not self._terminated and index in (-1, len(self._lines) - 1):
            # Event ordinals start at 1, after the header's line.
            raise _unterminated(len(self._lines))
        return line


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fencekeeper.adapters.journal_fixtures DIRECTORY``: write the pack there."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or not Path(args[0]).is_dir():
        print("usage: python -m fencekeeper.adapters.journal_fixtures DIRECTORY (an existing directory)", file=sys.stderr)
        return 2
    for path in write_pack(Path(args[0])):
        print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
