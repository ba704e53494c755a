"""Properties of the condition language, over generated trees, text and bindings.

- Round trip: for every tree, ``parse(render(tree)) == tree`` exactly when
  the tree is within the limits (depth, nodes, source length, measured here
  independently), and otherwise parse refuses naming the limit.
- Parsing arbitrary text (random, grammar-flavoured, and thousands of '(' or
  'not ') raises nothing but :class:`ExpressionError`, with a position inside
  the source, and whatever it accepts renders and re-parses to itself.
- Evaluation never raises on any bindings (json-like values, NaN, huge ints,
  dicts, tuples), and a missing input can never decide a result: if a
  condition is decided without some binding, it is decided the same way
  with it (Kleene logic is monotone in information).
- ``names`` is exactly the set of :class:`Name` nodes, found by walking attrs
  fields rather than by the module's own dispatch.
- Differential: the kernel's evaluator agrees with the independent oracle in
  ``oracle.py`` on every tree and binding, TRUE, FALSE and UNKNOWN alike.
"""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fencekeeper.kernel.expr import (
    MAX_DEPTH,
    MAX_NODES,
    MAX_SOURCE_LENGTH,
    Expr,
    ExpressionError,
    In,
    Literal,
    LiteralValue,
    Name,
    Truth,
    evaluate,
    names,
    parse,
    render,
)

from .oracle import oracle
from .strategies import canonical_depth, exprs, json_like, node_count, walk

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

LIMIT_PROBLEMS = ("nested deeper than", "more than 200 nodes", "longer than 1000 characters")


def _is_control(char: str) -> bool:
    return ord(char) < 0x20 or 0x7F <= ord(char) <= 0x9F


def _within_limits(tree: Expr, source: str) -> bool:
    return canonical_depth(tree) <= MAX_DEPTH and node_count(tree) <= MAX_NODES and len(source) <= MAX_SOURCE_LENGTH


# --- round trip ---------------------------------------------------------------------------


@FAST
@given(exprs())
def test_render_parse_round_trip(tree: Expr) -> None:
    source = render(tree)
    if _within_limits(tree, source):
        assert parse(source) == tree
        assert render(parse(source)) == source
        assert not any(_is_control(char) for char in source), "canonical source is one line without control characters"
    else:
        try:
            parse(source)
        except ExpressionError as error:
            assert any(limit in error.problem for limit in LIMIT_PROBLEMS), error.message
        else:
            raise AssertionError(f"accepted a tree beyond the limits: {source[:80]!r}")


@settings(max_examples=60, deadline=None)
@given(exprs(max_leaves=60))
def test_round_trip_of_large_trees(tree: Expr) -> None:
    # Larger trees cross the limits more often; the boundary must be exact.
    source = render(tree)
    try:
        parsed: Expr | None = parse(source)
    except ExpressionError as error:
        assert any(limit in error.problem for limit in LIMIT_PROBLEMS), error.message
        parsed = None
    assert (parsed == tree) is _within_limits(tree, source)


# --- parsing arbitrary text ------------------------------------------------------------------

GRAMMAR_TOKENS = [
    "(", ")", "[", "]", ",", " ", "not ", " and ", " or ", " in ", " not in ", "==", "!=", "<", "<=", ">", ">=",
    "a", "b.c", "_x", "true", "false", "1", "-2", "3.5", "1.0e5", "'s'", '"t"', "'\\''", "=", "!", "&", ".",
    "'", '"', "\\", "-", "0", "e", "\n", "\x00", "é", "A",
]  # fmt: skip
grammar_text = st.lists(st.sampled_from(GRAMMAR_TOKENS), max_size=40).map("".join)
deep_text = st.builds(
    lambda prefix, count, middle, closing: prefix * count + middle + ")" * closing,
    st.sampled_from(["(", "not ", "not (", "((", "( not "]),
    st.integers(0, 3000),
    grammar_text,
    st.integers(0, 40),
)


def _check_parse(source: str) -> None:
    try:
        tree = parse(source)
    except ExpressionError as error:
        assert 0 <= error.position <= len(source)
        assert error.message == f"at {error.position}: {error.problem}"
        assert error.problem.isprintable()
    else:
        assert parse(render(tree)) == tree
        assert isinstance(evaluate(tree, {}), Truth)


@settings(max_examples=500, deadline=None)
@given(st.text())
def test_parse_arbitrary_text(source: str) -> None:
    _check_parse(source)


@settings(max_examples=500, deadline=None)
@given(grammar_text)
def test_parse_grammar_flavoured_text(source: str) -> None:
    _check_parse(source)


@settings(max_examples=150, deadline=None)
@given(deep_text)
def test_parse_deep_nesting(source: str) -> None:
    _check_parse(source)


# --- evaluation ---------------------------------------------------------------------------------

POOL = ["a", "b", "c", "input.amount", "step.ok"]
pool_names = st.sampled_from(POOL)
pool_trees = exprs(name_strategy=pool_names, max_leaves=10)


@st.composite
def tree_and_bindings(draw: st.DrawFn) -> tuple[Expr, dict[str, object]]:
    tree = draw(pool_trees)
    keys = st.sampled_from([*sorted(names(tree)), "unrelated"])
    bindings = draw(st.dictionaries(keys, json_like, max_size=6))
    return tree, bindings


@settings(max_examples=200, deadline=None)
@given(tree_and_bindings())
def test_evaluate_never_raises(case: tuple[Expr, dict[str, object]]) -> None:
    tree, bindings = case
    assert evaluate(tree, bindings) in set(Truth)


@settings(max_examples=150, deadline=None)
@given(tree_and_bindings(), st.data())
def test_a_missing_input_never_decides(case: tuple[Expr, dict[str, object]], data: st.DataObject) -> None:
    tree, bindings = case
    assume(bindings)
    dropped = data.draw(st.sampled_from(sorted(bindings)))
    without = {k: v for k, v in bindings.items() if k != dropped}
    partial = evaluate(tree, without)
    if partial is not Truth.UNKNOWN:
        assert evaluate(tree, bindings) is partial


# Values from small pools, so that equalities, orderings and type clashes all happen often.
_SCALARS: list[LiteralValue] = [True, False, -1, 0, 1, 2, 0.0, -0.0, 1.0, 1.5, "", "a", "b", "B"]
scalars = st.sampled_from(_SCALARS)
small_values = st.one_of(
    scalars,
    st.lists(scalars, max_size=4),
    st.sampled_from([None, float("nan"), float("inf"), 2**64, [1, None], [None], ["a", 1.5, None], {"a": 1}, "ab"]),
)
small_kinds: list[st.SearchStrategy[LiteralValue]] = [
    st.booleans(),
    st.sampled_from([-1, 0, 1, 2, 0.0, 1.5]),
    st.sampled_from(["", "a", "b", "B"]),
]


@settings(max_examples=500, deadline=None)
@given(
    exprs(name_strategy=pool_names, value_strategy=scalars, list_kinds=small_kinds, max_leaves=8),
    st.dictionaries(pool_names, small_values, max_size=len(POOL)),
)
def test_evaluate_agrees_with_the_oracle(tree: Expr, bindings: dict[str, object]) -> None:
    assert evaluate(tree, bindings) is oracle(tree, bindings)


@settings(max_examples=300, deadline=None)
@given(
    exprs(name_strategy=pool_names, value_strategy=scalars, list_kinds=small_kinds, max_leaves=6),
    st.fixed_dictionaries(dict.fromkeys(POOL, scalars)),
)
def test_oracle_agreement_with_every_name_bound(tree: Expr, bindings: dict[str, object]) -> None:
    # With every name bound to a value the decided outcomes dominate, so TRUE
    # and FALSE are checked as often as UNKNOWN.
    assert evaluate(tree, bindings) is oracle(tree, bindings)


# Membership in a bound list is rare in random trees; this draws it directly,
# with lists that mix values, values of other types and non-values.
_ODD_ELEMENTS = st.sampled_from([None, float("nan"), 2**64, [1], "1"])
bound_lists = st.lists(st.one_of(scalars, _ODD_ELEMENTS), max_size=4)
memberships = st.builds(
    In,
    st.one_of(scalars.map(Literal), pool_names.map(Name)),
    pool_names.map(Name),
    st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(memberships, st.dictionaries(pool_names, st.one_of(bound_lists, small_values), max_size=len(POOL)))
def test_membership_in_a_bound_list_agrees_with_the_oracle(tree: In, bindings: dict[str, object]) -> None:
    assert evaluate(tree, bindings) is oracle(tree, bindings)


# --- names ---------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(exprs())
def test_names_are_exactly_the_name_nodes(tree: Expr) -> None:
    assert names(tree) == frozenset(node.name for node in walk(tree) if isinstance(node, Name))
