"""Replay's fast reader against the strict one: the same event or the same refusal, for any bytes.

``read_event`` recognises a plain transition record with one expression
and takes its request digest from the record's text; everything else goes
to ``decode_event``.  These tests hold the fast reader to the strict one:
equal events (digest included) where both accept, the strict reader's
code and message where either refuses, and a request digest equal to the
one the rebuilt command encodes.  A whole replay with the fast reader
switched off must end the same way, refusals included.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import attrs
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fencekeeper.kernel import journal as j
from fencekeeper.kernel import journal_codec
from fencekeeper.kernel.canonical import digest_bytes, parse_canonical, record_bytes
from fencekeeper.kernel.journal_codes import JournalError
from fencekeeper.kernel.machines import NodeEvent, NodeState

Outcome = tuple[str, object]


def _strict(data: bytes) -> Outcome:
    try:
        return ("event", _whole(j.decode_event(data, 5)))
    except JournalError as exc:
        return ("refused", (exc.reason, str(exc)))


def _fast(data: bytes) -> tuple[Outcome, str | None]:
    try:
        event, request = journal_codec.read_event(data, 5)
    except JournalError as exc:
        return ("refused", (exc.reason, str(exc))), None
    return ("event", _whole(event)), request


def _whole(event: j.Event) -> tuple[j.Event, str]:
    # Event equality leaves the digest out; the readers must agree on it too.
    return event, event.digest


def _agree(data: bytes) -> bool:
    """Both readers give the same outcome; True if the fast one recognised the record itself."""
    outcome, request = _fast(data)
    assert outcome == _strict(data)
    if request is not None:
        event = outcome[1][0]  # type: ignore[index]
        assert request == j.request_digest(j._command_of([event]))
    return journal_codec._read_plain_transition(data) is not None


def test_every_event_of_a_chain_reads_alike_and_plain_transitions_take_the_fast_reader(
    chain: tuple[j.Journal, bytes, list[bytes]],
) -> None:
    journal, _header, events = chain
    taken = [_agree(data) for data in events]
    # Plain: printable ASCII only (an escaped string has a backslash), no approvals, invalidation or successor.
    plain = [
        data.isascii() and b"\\" not in data and b"\x7f" not in data
        and not event.approvals and event.invalidation is None and event.successor is None
        for data, event in zip(events, journal.events, strict=True)
    ]  # fmt: skip
    assert taken == plain
    assert any(plain) and not all(plain)


# --- generated events: any strings, numbers and members, signed or not --------------------------

_plain_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters="\"\\\\"), max_size=12)
_any_text = _plain_text | st.text(max_size=8) | st.sampled_from(["a\nb", 'q"q', "b\\s", "é", "\x7f", "\U0001f600"])
_state = st.sampled_from([s.value for s in NodeState]) | _any_text
_event = st.sampled_from([e.value for e in NodeEvent]) | _any_text
_digest = st.builds(digest_bytes, st.binary(max_size=4)) | _any_text
_whole_number = st.integers(0, 2**53 + 2) | st.integers(-3, 3)
_time = st.sampled_from(["2026-01-01T00:00:00.000001Z", "2026-02-30T00:00:00.000000Z", "2026-01-01 00:00:00Z"])
_ref = st.fixed_dictionaries({"digest": _digest, "id": _any_text, "kind": _any_text})


_plain_digest = st.builds(digest_bytes, st.binary(max_size=4))
_plain_ref = st.fixed_dictionaries({"digest": _plain_digest, "id": _plain_text, "kind": _plain_text})


@st.composite
def _records(draw: st.DrawFn, plain: bool = False) -> dict[str, object]:
    """An event record's body: any members' values, or (``plain``) those of a plain transition the strict reader takes."""
    text = _plain_text if plain else _any_text
    ref = _plain_ref if plain else _ref
    digest = _plain_digest if plain else _digest
    number = st.integers(0, 2**53 - 1) if plain else _whole_number
    body: dict[str, object] = {
        "actor": draw(text),
        "approvals": draw(st.just([]) if plain else st.just([]) | st.lists(
            st.fixed_dictionaries({"actor": text, "record": ref, "role": text}), max_size=1)),
        "at": draw(st.just("2026-01-01T00:00:00.000001Z") if plain else _time),
        "attempt": draw(st.none() | st.fixed_dictionaries({"id": text, "sequence": number})),
        "error": draw(st.none() | text),
        "event": draw(st.sampled_from([e.value for e in NodeEvent]) if plain else _event),
        "execution": draw(text),
        "invalidation": draw(st.none() if plain else st.none() | st.fixed_dictionaries({"policy": text, "source": ref})),
        "node": draw(text),
        "ordinal": draw(number),
        "previous": draw(digest),
        "prior_state": draw(st.sampled_from([s.value for s in NodeState]) if plain else _state),
        "rationale": draw(text),
        "records": draw(st.lists(ref, max_size=3)),
        "request": {"digest": draw(digest), "id": draw(text)},
        "resulting_state": draw(st.sampled_from([s.value for s in NodeState]) if plain else _state),
        "role": draw(text),
        "successor": draw(st.none() if plain else st.none() | ref),
    }  # fmt: skip
    return body


def _sign(body: dict[str, object], how: str) -> bytes:
    """The record's bytes with its digest right, wrong, or the record reshaped."""
    digest = digest_bytes(record_bytes(body))  # type: ignore[arg-type]
    record: dict[str, object] = {**body, "digest": digest if how != "wrong" else digest_bytes(b"x")}
    if how == "extra":
        record["zz"] = 1
    if how == "missing":
        del record["role"]
    data = record_bytes(record)  # type: ignore[arg-type]
    if how == "spaced":
        data = data.replace(b",", b", ", 1)
    return data


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(_records() | _records(plain=True), st.sampled_from(["right", "right", "right", "wrong", "extra", "missing", "spaced"]))
def test_generated_records_read_alike(body: dict[str, object], how: str) -> None:
    try:
        data = _sign(body, how)
    except JournalError:
        assume(False)  # a lone surrogate: no bytes to read
        raise
    _agree(data)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_plain_records_with_any_one_byte_changed_read_alike(data: st.DataObject) -> None:
    record = _sign(data.draw(_records(plain=True)), "right")
    assert _agree(record)
    position = data.draw(st.integers(0, len(record) - 1))
    change = data.draw(st.sampled_from(["replace", "delete", "insert"]))
    byte = bytes([data.draw(st.integers(0, 255))])
    if change == "replace":
        record = record[:position] + byte + record[position + 1 :]
    elif change == "delete":
        record = record[:position] + record[position + 1 :]
    else:
        record = record[:position] + byte + record[position:]
    _agree(record)


# --- whole replays: the same journal or the same refusal with the fast reader off ------------------


def _replays(journal: j.Journal, header: bytes, events: list[bytes]) -> object:
    try:
        replayed = j.replay(header, events, journal.workflow, journal.policy)
    except JournalError as exc:
        return (exc.reason, exc.ordinal, str(exc))
    return (replayed.head, dict(replayed.states), dict(replayed.attempts), dict(replayed.workers), dict(replayed.requests))


def _both_ways(journal: j.Journal, header: bytes, events: list[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _replays(journal, header, events)
    with monkeypatch.context() as patched:
        patched.setattr(journal_codec, "_read_plain_transition", lambda data: None)
        strict = _replays(journal, header, events)
    assert fast == strict


def _replaced(index: int, record: bytes) -> Callable[[list[bytes]], list[bytes]]:
    return lambda events: [*events[:index], record, *events[index + 1 :]]


def _tamperings(events: list[bytes]) -> Iterator[Callable[[list[bytes]], list[bytes]]]:
    """Each event changed in one member, as it was stored and re-signed (so that a rule, not the digest, refuses it)."""
    for index, record in enumerate(events):
        for old, new in ((b'"worker"', b'"reviewer"'), (b'"work-started"', b'"work-completed"'), (b'"active"', b'"ready"'),
                         (b'"rationale":"', b'"rationale":"x'), (b'"sequence":1', b'"sequence":2'), (b'"records":[', b'"records":[{}')):  # fmt: skip
            if old not in record:
                continue
            changed = record.replace(old, new, 1)
            yield _replaced(index, changed)
            try:
                value = parse_canonical(changed)
            except JournalError:
                continue
            del value["digest"]
            body = record_bytes(value)  # type: ignore[arg-type]
            yield _replaced(index, record_bytes({**value, "digest": digest_bytes(body)}))  # type: ignore[dict-item]


def test_tampered_chains_end_alike_with_the_fast_reader_on_and_off(
    chain: tuple[j.Journal, bytes, list[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    journal, header, events = chain
    _both_ways(journal, header, events, monkeypatch)
    for tamper in _tamperings(events):
        _both_ways(journal, header, tamper(events), monkeypatch)
    for index in range(len(events)):
        _both_ways(journal, header, [*events[:index], *events[index + 1 :]], monkeypatch)
        _both_ways(journal, header, [*events[: index + 1], events[index], *events[index + 1 :]], monkeypatch)


def test_a_resigned_request_digest_is_refused_as_the_strict_reader_refuses_it(
    chain: tuple[j.Journal, bytes, list[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    journal, header, events = chain
    first = journal.events[0]
    forged = attrs.evolve(first, request_digest=digest_bytes(b"another request"))
    forged = attrs.evolve(forged, digest=digest_bytes(record_bytes(forged.body_json())))
    assert journal_codec._read_plain_transition(j.encode_event(forged)) is not None
    tampered = [j.encode_event(forged), *events[1:]]
    _both_ways(journal, header, tampered, monkeypatch)
    with pytest.raises(JournalError) as caught:
        j.replay(header, tampered, journal.workflow, journal.policy)
    assert (caught.value.reason, caught.value.ordinal) == (j.JournalCode.ALTERED_DIGEST, 1)
