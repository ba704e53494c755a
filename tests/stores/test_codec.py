"""The row codec both database stores share: what it writes, and that its shortcuts change nothing.

What these tests prove:

- ``dumps`` writes exactly what ``json.dumps(sort_keys=True, separators=(",", ":"))``
  writes, for any JSON value: the shared encoder is only a faster way to the
  same canonical text;
- times are written as UTC with microseconds and a ``+00:00`` offset whatever
  zone they come in, naive times are refused, and reading gives the same
  instant back, in UTC;
- an execution revision is written as exactly the canonical JSON the
  generic encoder writes (keys sorted, no spaces, non-ASCII escaped), and
  reads back equal to what was written, and the
  revision cache answers exactly what parsing the text afresh answers, both
  for a revision this process wrote and for one it has only read;
- the cache is bounded, least recently used first out;
- ``nests_deeper`` answers for JSON text what its nesting is, without
  decoding it: brackets inside strings are not nesting, and text with a
  quote left open is answered at once.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fencekeeper.adapters import codec
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import ExecutionState

ids = st.text(min_size=1, max_size=20) | st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_:/", min_size=1)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=12,
)

executions = st.builds(
    p.Execution,
    execution_id=ids,
    business_id=ids,
    state=st.sampled_from(list(ExecutionState)),
    revision=st.integers(min_value=1, max_value=10**6),
    definition_id=ids,
    definition_revision=st.integers(min_value=1, max_value=1000),
    step_count=st.integers(min_value=0, max_value=p.STEP_LIMIT),
    fence=st.integers(min_value=0, max_value=10**6),
    wait=st.none() | st.builds(p.WaitKey, ids, ids, ids),
    current_node_id=st.none() | ids,
)

moments = st.datetimes(
    min_value=datetime(2000, 1, 1),
    max_value=datetime(2100, 1, 1),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]),
)


@given(json_values)
def test_dumps_is_canonical_json(value: object) -> None:
    assert codec.dumps(value) == json.dumps(value, sort_keys=True, separators=(",", ":"))


@given(moments)
def test_times_are_written_in_utc_and_read_back_as_the_same_instant(moment: datetime) -> None:
    text = codec.encode_time(moment)
    assert text == moment.astimezone(UTC).isoformat(timespec="microseconds")
    assert text.endswith("+00:00") and len(text) == len("2026-01-01T00:00:00.000000+00:00")
    back = codec.decode_time(text)
    assert back == moment and back.tzinfo is UTC


@given(st.lists(moments, min_size=1, max_size=6), st.lists(st.integers(0, 5), max_size=12))
def test_a_time_encoded_again_is_written_the_same_whatever_came_between(
    times: list[datetime], picks: list[int]
) -> None:
    # The last time encoded is remembered by identity: any sequence, repeats included, writes each one's own text.
    for n in [*range(len(times)), *picks]:
        moment = times[n % len(times)]
        assert codec.encode_time(moment) == moment.astimezone(UTC).isoformat(timespec="microseconds")


def test_a_naive_time_is_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        codec.encode_time(datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="no offset"):
        codec.decode_time("2026-01-01T00:00:00")


def test_a_stored_time_in_another_zone_reads_back_in_utc() -> None:
    back = codec.decode_time("2026-01-01T05:30:00.000000+05:30")
    assert back == datetime(2026, 1, 1, tzinfo=UTC) and back.tzinfo is UTC


def _read_with_a_cold_cache(text: str) -> tuple[p.Execution, p.Execution]:
    """``text`` decoded by parsing it (nothing cached), then again (from what that first read cached)."""
    cache = codec._REVISIONS
    codec._REVISIONS = codec._Revisions(cache.size)
    try:
        return codec.decode_execution(text), codec.decode_execution(text)
    finally:
        codec._REVISIONS = cache


@given(executions)
def test_an_execution_revision_is_written_as_canonical_json(execution: p.Execution) -> None:
    wait = execution.wait
    generic = json.dumps(
        {
            "execution_id": execution.execution_id,
            "business_id": execution.business_id,
            "state": execution.state.value,
            "revision": execution.revision,
            "definition_id": execution.definition_id,
            "definition_revision": execution.definition_revision,
            "current_node_id": execution.current_node_id,
            "step_count": execution.step_count,
            "fence": execution.fence,
            "wait": None if wait is None else [wait.execution_id, wait.node_id, wait.attempt_id],
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    assert codec.encode_execution(execution) == generic


@given(executions)
def test_an_execution_revision_reads_back_equal_cached_or_not(execution: p.Execution) -> None:
    text = codec.encode_execution(execution)
    assert json.loads(text)["revision"] == execution.revision
    parsed, read_again = _read_with_a_cold_cache(text)
    assert parsed == execution and read_again == execution
    assert codec.decode_execution(text) == execution  # cached when this process wrote it


def test_the_revision_cache_is_bounded_least_recently_used_first_out() -> None:
    cache = codec._Revisions(2)
    first, second, third = (
        p.Execution(f"e-{n}", "b", ExecutionState.ELIGIBLE, 1, "d", 1, "start") for n in range(3)
    )
    cache.put("1", first)
    cache.put("2", second)
    assert cache.get("1") is first  # now the most recently used
    cache.put("3", third)
    assert cache.get("2") is None
    assert cache.get("1") is first and cache.get("3") is third


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


_NESTED = st.recursive(
    st.one_of(st.none(), st.integers(), st.text(alphabet='ab{}[]"\\ ')),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(alphabet='k{["\\', max_size=3), inner, max_size=3)),
    max_leaves=20,
)


@given(value=_NESTED, levels=st.integers(min_value=0, max_value=8))
def test_nests_deeper_is_the_depth_of_the_value_the_text_holds(value: object, levels: int) -> None:
    assert codec.nests_deeper(json.dumps(value), levels) == (_depth(value) > levels)
    assert codec.nests_deeper(codec.dumps(value), levels) == (_depth(value) > levels)


def test_nests_deeper_answers_text_nested_past_the_recursion_limit_and_text_with_a_quote_left_open() -> None:
    assert codec.nests_deeper('{"d":' * 100_000 + "{}" + "}" * 100_000, 32)
    assert not codec.nests_deeper('{"d":' * 31 + "{}" + "}" * 31, 32)
    # Backtracking through every split of the characters after the open quote took longer than any test run.
    assert codec.nests_deeper('{"a":"' + "ab\\x" * 40 + "c" * 40 + "{{{{", 1)
