"""The canonical codec and strict rehydration: bytes in, one record or one stable refusal out."""

from __future__ import annotations

import json

import attrs
import pytest
import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fencekeeper.kernel import journal as j
from fencekeeper.kernel.canonical import canonical_bytes, digest_bytes, parse_canonical, record_bytes
from fencekeeper.kernel.journal_codes import JournalCode as C
from fencekeeper.kernel.journal_codes import JournalError
from fencekeeper.kernel.machines import NodeEvent, NodeState

from .examples import Driver, fresh, reviewed, stored


def replay(journal: j.Journal, header: bytes, events: list[bytes]) -> j.Journal:
    return j.replay(header, events, journal.workflow, journal.policy)


def refusal(journal: j.Journal, header: bytes, events: list[bytes]) -> JournalError:
    with pytest.raises(JournalError) as caught:
        replay(journal, header, events)
    return caught.value


def test_records_are_rfc8785_bytes_and_digests_are_sha256_of_the_body(chain: tuple[j.Journal, bytes, list[bytes]]) -> None:
    journal, header, events = chain
    for data in (header, *events):
        value = json.loads(data)
        assert rfc8785.dumps(value) == data
        body = {k: v for k, v in value.items() if k != "digest"}
        assert value["digest"] == digest_bytes(rfc8785.dumps(body))
    assert json.loads(header)["digest"] == journal.header.digest
    assert json.loads(events[0])["previous"] == journal.header.digest


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b'{"a":1, "b":2}', C.NON_CANONICAL),
        (b'{"b":1,"a":2}', C.NON_CANONICAL),
        (b'{"a":"\\u0041"}', C.NON_CANONICAL),
        (b'{"a":1}\n', C.NON_CANONICAL),
        (b'{"a":1,"a":1}', C.NON_CANONICAL),
        (b'{"a":NaN}', C.NON_CANONICAL),
        (b'{"a":1.5}', C.MALFORMED_RECORD),
        (b'{"a":1e2}', C.MALFORMED_RECORD),
        (b"[1]", C.MALFORMED_RECORD),
        (b'{"a":"\xff"}', C.NON_CANONICAL),
        (b'{"a":9007199254740993}', C.MALFORMED_RECORD),
        (b"{", C.NON_CANONICAL),
        pytest.param(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", C.NON_CANONICAL, id="nested-too-deeply"),
    ],
)
def test_parse_canonical_refuses(data: bytes, code: C) -> None:
    with pytest.raises(JournalError) as caught:
        parse_canonical(data)
    assert caught.value.reason is code


def test_parse_canonical_accepts_exactly_the_canonical_form() -> None:
    value = {"b": [1, "é", None, True], "a": {"z": "\u2028", "y": -3}}
    data = canonical_bytes(value)
    assert parse_canonical(data) == value
    assert data == rfc8785.dumps(value)


def _resigned(data: bytes, change: dict[str, object]) -> bytes:
    """``data`` changed and digested again, as a forger with the algorithm would."""
    value = {**json.loads(data), **change}
    del value["digest"]
    value["digest"] = digest_bytes(rfc8785.dumps(value))
    return rfc8785.dumps(value)


def test_a_commands_fields_are_named_within_where_or_alone() -> None:
    partial = {"command": "transition", "request": "r2", "actor": "a", "role": "r", "node": 5}
    for where, missing, node in (
        ("command", "command: missing field 'event'", "command.node: must be a string"),
        ("commands[2]", "commands[2]: missing field 'event'", "commands[2].node: must be a string"),
        # The caller's message names the command: the field alone, never "command 1: command: ...".
        ("", "missing field 'event'", "node: must be a string"),
    ):
        with pytest.raises(JournalError) as caught:
            j.command_from_json(partial, "sha256:" + "0" * 64, where)
        assert (caught.value.reason, str(caught.value)) == (C.MISSING_FIELD, missing)
        full = {**partial, "event": "work-started", "prior_state": "ready"}
        with pytest.raises(JournalError) as caught:
            j.command_from_json(full, "sha256:" + "0" * 64, where)
        assert (caught.value.reason, str(caught.value)) == (C.MALFORMED_RECORD, node)


def test_a_null_expected_head_is_malformed_not_missing() -> None:
    # Before: "missing field 'expected_head'", for a field the command has.
    command = {
        "command": "transition", "request": "r1", "actor": "a", "role": "r", "node": "n",
        "event": "work-started", "prior_state": "ready", "expected_head": None,
    }  # fmt: skip
    for fallback in (None, "sha256:" + "0" * 64):
        with pytest.raises(JournalError) as caught:
            j.command_from_json(command, fallback)
        assert (caught.value.reason, str(caught.value)) == (C.MALFORMED_RECORD, "command.expected_head: must be a string")
    del command["expected_head"]
    with pytest.raises(JournalError) as caught:
        j.command_from_json(command)
    assert (caught.value.reason, str(caught.value)) == (C.MISSING_FIELD, "command: missing field 'expected_head'")
    assert j.command_from_json(command, "sha256:" + "0" * 64).expected_head == "sha256:" + "0" * 64


def test_unknown_and_missing_fields_are_refused(chain: tuple[j.Journal, bytes, list[bytes]]) -> None:
    journal, header, events = chain
    error = refusal(journal, header, [_resigned(events[0], {"comment": "hi"}), *events[1:]])
    assert (error.reason, error.ordinal) == (C.UNKNOWN_FIELD, 1)
    value = json.loads(events[0])
    del value["rationale"]
    error = refusal(journal, header, [rfc8785.dumps(value), *events[1:]])
    assert (error.reason, error.ordinal) == (C.MISSING_FIELD, 1)


def test_a_record_of_the_wrong_members_is_named_once(chain: tuple[j.Journal, bytes, list[bytes]]) -> None:
    journal, header, events = chain
    # The ordinal names the record ("header: ", "event 1: "); the detail names the member alone.
    for records, message in (
        ([events[0], *events[1:]], "header: unknown field 'actor'"),  # the header's line removed
        ([header, _resigned(events[0], {"comment": "hi"}), *events[1:]], "event 1: unknown field 'comment'"),
    ):
        assert str(refusal(journal, records[0], records[1:])) == message
    value = json.loads(header)
    del value["nodes"]
    error = refusal(journal, rfc8785.dumps(value), events)
    assert (error.reason, str(error)) == (C.MISSING_FIELD, "header: missing field 'nodes'")


def test_altered_digest_and_altered_content(chain: tuple[j.Journal, bytes, list[bytes]]) -> None:
    journal, header, events = chain
    value = json.loads(events[3])
    value["rationale"] = "rewritten"
    error = refusal(journal, header, [*events[:3], rfc8785.dumps(value), *events[4:]])
    assert (error.reason, error.ordinal) == (C.ALTERED_DIGEST, 4)
    value = json.loads(header)
    value["created_by"] = "alice"
    error = refusal(journal, rfc8785.dumps(value), events)
    assert (error.reason, error.ordinal) == (C.ALTERED_DIGEST, 0)


def test_structural_tampering_breaks_the_chain(chain: tuple[j.Journal, bytes, list[bytes]]) -> None:
    journal, header, events = chain
    cases = {
        "removal": [*events[:2], *events[3:]],
        "reordering": [*events[:2], events[3], events[2], *events[4:]],
        "duplication": [*events[:3], events[2], *events[3:]],
    }
    for name, tampered in cases.items():
        error = refusal(journal, header, tampered)
        assert (error.reason, error.ordinal) == (C.BROKEN_CHAIN, 3 if name != "duplication" else 4), name


def test_a_resigned_event_breaks_the_link_to_the_next(chain: tuple[j.Journal, bytes, list[bytes]]) -> None:
    journal, header, events = chain
    # Content changed and digest recomputed: the record itself is consistent,
    # but its request digest no longer matches its request.
    error = refusal(journal, header, [*events[:2], _resigned(events[2], {"rationale": "x"}), *events[3:]])
    assert (error.reason, error.ordinal) == (C.ALTERED_DIGEST, 3)


def test_a_gap_in_ordinals(chain: tuple[j.Journal, bytes, list[bytes]]) -> None:
    journal, header, events = chain
    error = refusal(journal, header, [*events[:2], _resigned(events[2], {"ordinal": 4}), *events[3:]])
    assert (error.reason, error.ordinal) == (C.ORDINAL_GAP, 3)


def test_a_record_of_another_execution_is_foreign(chain: tuple[j.Journal, bytes, list[bytes]]) -> None:
    journal, header, events = chain
    other = Driver(fresh("review-7"))
    reviewed(other)
    _, other_events = stored(other.journal)
    error = refusal(journal, header, [*events[:2], other_events[2], *events[3:]])
    assert (error.reason, error.ordinal) == (C.FOREIGN_RECORD, 3)


def test_a_truncated_invalidation_batch_is_partial(chain: tuple[j.Journal, bytes, list[bytes]]) -> None:
    journal, header, events = chain
    first = next(e.ordinal for e in journal.events if e.event.value == "work-invalidated")
    error = refusal(journal, header, events[: first + 2])
    assert (error.reason, error.ordinal) == (C.PARTIAL_INVALIDATION, first)


def test_a_bad_record_inside_a_batch_is_named_not_the_batch_it_cuts_short(
    chain: tuple[j.Journal, bytes, list[bytes]],
) -> None:
    # A batch read up to a record that cannot be read looks partial; that
    # record, which may be the batch's own, is the first bad one.
    journal, header, events = chain
    for kind in ("work-invalidated", "successor-bound"):
        batch = [e.ordinal for e in journal.events if e.event.value == kind]
        assert len(batch) == 5
        for ordinal in batch[1:]:
            index = ordinal - 1
            cases = {
                "rewritten": ([*events[:index], _rewritten(events[index]), *events[index + 1 :]], C.ALTERED_DIGEST),
                "re-encoded": ([*events[:index], events[index] + b" ", *events[index + 1 :]], C.NON_CANONICAL),
                "removed": ([*events[:index], *events[index + 1 :]], C.BROKEN_CHAIN),
            }
            if ordinal == len(events):
                # Nothing follows to be read: the chain ends inside the batch, which is short.
                short = C.PARTIAL_INVALIDATION if kind == "work-invalidated" else C.BAD_SUCCESSOR_BINDING
                error = refusal(journal, header, cases.pop("removed")[0])
                assert (error.reason, error.ordinal) == (short, batch[0])
            else:
                swapped = [*events[:index], events[index + 1], events[index], *events[index + 2 :]]
                cases["reordered"] = (swapped, C.BROKEN_CHAIN)
            for name, (tampered, code) in cases.items():
                error = refusal(journal, header, tampered)
                assert (error.reason, error.ordinal) == (code, ordinal), (kind, ordinal, name)
    # A batch that breaks a rule its own records show is named by its first
    # record, whole or cut short, whatever follows it.
    first = next(e.ordinal for e in journal.events if e.event.value == "work-invalidated")
    for length in (5, 3):
        forged = [_resigned(e, {"role": "screener"}) for e in events[first - 1 : first - 1 + length]]
        error = refusal(journal, header, [*events[: first - 1], *forged, b"not a record"])
        assert (error.reason, error.ordinal) == (C.FORGED_ROLE, first), length


def _rewritten(data: bytes) -> bytes:
    value = json.loads(data)
    value["rationale"] = "rewritten afterwards"
    return canonical_bytes(value)


def test_every_single_byte_change_of_the_header_and_first_event_is_detected(
    chain: tuple[j.Journal, bytes, list[bytes]],
) -> None:
    journal, header, events = chain
    records = [header, events[0]]
    for index, data in enumerate(records):
        for position in range(len(data)):
            for replacement in {data[position] ^ 0x01, data[position] ^ 0x20}:
                changed = data[:position] + bytes([replacement]) + data[position + 1 :]
                tampered = [*records]
                tampered[index] = changed
                with pytest.raises(JournalError):
                    replay(journal, tampered[0], tampered[1:2])


def test_another_executions_header_does_not_adopt_these_events(chain: tuple[j.Journal, bytes, list[bytes]]) -> None:
    journal, _header, events = chain
    other = fresh("review-2")
    assert other.header.digest != journal.header.digest
    error = refusal(journal, j.encode_header(other.header), events)
    # Another execution's header is a valid header; the events are not its.
    assert (error.reason, error.ordinal) == (C.FOREIGN_RECORD, 1)


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"execution": "review 1"}, C.MALFORMED_RECORD),
        ({"execution": ""}, C.MALFORMED_RECORD),
        ({"supersedes": "-review-0"}, C.MALFORMED_RECORD),
        ({"supersedes": "review-1"}, C.BAD_SUCCESSOR_BINDING),
    ],
    ids=["space", "empty", "supersedes", "supersedes-itself"],
)
def test_a_header_holds_what_create_header_would_have_refused_to_write(change: dict[str, object], code: C) -> None:
    # Digest recomputed: only the rules create_header applies can catch it.
    journal = fresh("review-1")
    header = _resigned(j.encode_header(journal.header), change)
    error = refusal(journal, header, [])
    assert (error.reason, error.ordinal) == (code, 0)
    assert next(iter(change)) in str(error)


# The journal's own records are encoded with the standard library (record_bytes);
# on their domain (ASCII member names, exact whole numbers, any string values)
# that must be byte-identical to the rfc8785 package.
_ascii_names = st.text(st.characters(max_codepoint=127), max_size=8)
_scalars = st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text()
_records = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_ascii_names, inner, max_size=5),
    max_leaves=10,
)


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_ascii_names, _records, max_size=5))
def test_record_bytes_are_rfc8785_bytes_on_the_records_domain(value: dict[str, object]) -> None:
    try:
        expected = rfc8785.dumps(value)
    except UnicodeEncodeError:
        # Lone surrogates: neither encoder can write them, and both refuse.
        with pytest.raises(JournalError):
            record_bytes(value)  # type: ignore[arg-type]
        return
    assert record_bytes(value) == expected  # type: ignore[arg-type]
    assert parse_canonical(expected) == value


@settings(max_examples=100)
@given(st.dictionaries(st.text(max_size=4), _scalars, max_size=6))
def test_parse_canonical_agrees_with_rfc8785_whatever_the_member_names(value: dict[str, object]) -> None:
    try:
        data = rfc8785.dumps(value)
    except UnicodeEncodeError:
        return
    assert parse_canonical(data) == value
    python_order = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    if python_order != data:
        # Names whose code-point order differs from their UTF-16 order: the
        # Python ordering is not canonical and must be refused.
        with pytest.raises(JournalError):
            parse_canonical(python_order)


def test_continuing_a_verified_journal_checks_the_new_events_as_replay_does(
    chain: tuple[j.Journal, bytes, list[bytes]],
) -> None:
    journal, header, events = chain
    for cut in (0, 7, 17, 22, len(events)):  # never inside a batch: a batch is appended whole
        prefix = replay(journal, header, events[:cut])
        continued = j.continue_replay(prefix, events[cut:])
        assert continued.head == journal.head
        assert dict(continued.states) == dict(journal.states)
        assert dict(continued.attempts) == dict(journal.attempts)
        assert dict(continued.requests) == dict(journal.requests)
    prefix = replay(journal, header, events[:7])
    with pytest.raises(JournalError) as caught:
        j.continue_replay(prefix, events[8:])  # event 8 is missing
    assert (caught.value.reason, caught.value.ordinal) == (C.BROKEN_CHAIN, 8)
    with pytest.raises(JournalError) as caught:
        j.continue_replay(prefix, [*events[7:10], _resigned(events[10], {"rationale": "x"})])
    assert (caught.value.reason, caught.value.ordinal) == (C.ALTERED_DIGEST, 11)


_texts = st.text(max_size=6).filter(lambda t: not any(0xD800 <= ord(c) <= 0xDFFF for c in t))
_refs = st.builds(j.RecordRef, _texts, _texts, _texts)


_events = st.builds(
    j.Event,
    execution_id=_texts, ordinal=st.integers(1, 2**53 - 1), previous=_texts, request_id=_texts,
    request_digest=_texts, node_id=_texts, event=st.sampled_from(list(NodeEvent)),
    prior_state=st.sampled_from(list(NodeState)), resulting_state=st.sampled_from(list(NodeState)),
    actor_id=_texts, role=_texts, at=_texts, rationale=_texts,
    attempt=st.none() | st.builds(j.AttemptRef, _texts, st.integers(1, 2**53 - 1)),
    records=st.lists(_refs, max_size=2).map(tuple),
    approvals=st.lists(st.builds(j.Approval, _texts, _texts, _refs), max_size=2).map(tuple),
    error=st.none() | _texts, invalidation=st.none() | st.builds(j.Invalidation, _refs, _texts),
    successor=st.none() | _refs,
)  # fmt: skip


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(_events)
def test_signing_writes_the_digest_and_record_bytes_that_encoding_the_whole_value_gives(event: j.Event) -> None:
    # Signing writes the members before "digest" and those after it apart, member by member, and joins them.
    signed, record = event.signed()
    assert signed == event
    assert signed.digest == digest_bytes(rfc8785.dumps(event.body_json()))
    assert record == rfc8785.dumps(signed.to_json()) == j.encode_event(signed)


_transitions = st.builds(
    j.Transition,
    request_id=_texts, expected_head=_texts, node_id=_texts, event=st.sampled_from(list(NodeEvent)),
    prior_state=st.sampled_from(list(NodeState)), actor_id=_texts, role=_texts, rationale=_texts,
    attempt=st.none() | st.builds(j.AttemptRef, _texts, st.integers(1, 2**53 - 1)),
    records=st.lists(_refs, max_size=2).map(tuple),
    approvals=st.lists(st.builds(j.Approval, _texts, _texts, _refs), max_size=2).map(tuple),
    error=st.none() | _texts,
)  # fmt: skip


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(_transitions)
def test_a_transitions_request_bytes_are_its_request_values_canonical_bytes(command: j.Transition) -> None:
    # Written member by member, as signing writes an event; the request digest is over these bytes.
    data = command.request_bytes()
    assert data == rfc8785.dumps(command.request_json()) == record_bytes(command.request_json())
    assert j.request_digest(command) == digest_bytes(data)


def test_a_text_that_is_not_unicode_is_refused_by_signing_as_by_encoding(
    chain: tuple[j.Journal, bytes, list[bytes]],
) -> None:
    # A lone surrogate has no UTF-8 bytes: written member by member or whole, it is malformed_record.
    journal = chain[0]
    event = attrs.evolve(journal.events[0], rationale="\ud800")
    command = j.Transition("r-1", journal.head, "search", NodeEvent.WORK_STARTED, NodeState.READY, "bot", "searcher",
                           rationale="\udfff")  # fmt: skip
    for write in (event.signed, lambda: j.encode_event(event), command.request_bytes, lambda: j.request_digest(command)):
        with pytest.raises(JournalError) as caught:
            write()
        assert caught.value.reason is C.MALFORMED_RECORD
