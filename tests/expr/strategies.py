"""Hypothesis strategies for condition trees, bindings and source-like text.

Trees are built from the node constructors, so every generated tree is one a
caller could build; whether it is within the whole-tree limits is measured
by :func:`canonical_depth` and :func:`node_count`, written here without
reference to the parser or the renderer.
"""

from __future__ import annotations

from typing import cast

import attrs
from hypothesis import strategies as st

from fencekeeper.kernel.expr import (
    INTEGER_MAX,
    INTEGER_MIN,
    KEYWORDS,
    And,
    Compare,
    CompareOp,
    Expr,
    In,
    ListLiteral,
    Literal,
    LiteralValue,
    Name,
    Not,
    Or,
)

# --- literal values and names ------------------------------------------------------------

_STRING_CHARS = st.one_of(
    st.sampled_from(['"', "'", "\\", " ", "a"]),
    st.characters(exclude_categories=("Cc", "Cs")),
)
strings = st.text(_STRING_CHARS, max_size=24)
integers = st.integers(INTEGER_MIN, INTEGER_MAX)
decimals = st.floats(allow_nan=False, allow_infinity=False)
booleans = st.booleans()
literal_values: st.SearchStrategy[LiteralValue] = st.one_of(booleans, integers, decimals, strings)

_IDENT = st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True).filter(lambda word: word not in KEYWORDS)
names = st.lists(_IDENT, min_size=1, max_size=3).map(".".join)


def list_literals(values_of_kind: list[st.SearchStrategy[LiteralValue]]) -> st.SearchStrategy[ListLiteral]:
    # One kind per list, as the language requires (ints and floats are one kind: numbers).
    return st.one_of([st.lists(kind.map(Literal), max_size=5).map(tuple).map(ListLiteral) for kind in values_of_kind])


def exprs(
    name_strategy: st.SearchStrategy[str] = names,
    value_strategy: st.SearchStrategy[LiteralValue] = literal_values,
    list_kinds: list[st.SearchStrategy[LiteralValue]] | None = None,
    max_leaves: int = 12,
) -> st.SearchStrategy[Expr]:
    kinds = list_kinds if list_kinds is not None else [booleans, st.one_of(integers, decimals), strings]
    name_nodes = name_strategy.map(Name)
    leaves: st.SearchStrategy[Expr] = st.one_of(value_strategy.map(Literal), name_nodes)

    def extend(children: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
        chains = st.lists(children, min_size=2, max_size=4).map(tuple)
        return st.one_of(
            st.builds(Compare, st.sampled_from(CompareOp), children, children),
            st.builds(In, children, st.one_of(list_literals(kinds), name_nodes), st.booleans()),
            st.builds(Not, children),
            st.builds(And, chains),
            st.builds(Or, chains),
        )

    return st.recursive(leaves, extend, max_leaves=max_leaves)


# --- bindings ---------------------------------------------------------------------------

json_like = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.text(max_size=8),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=4), children, max_size=4),
    ),
    max_leaves=10,
)
"""Anything a caller might bind, including values outside the language (None, NaN, huge ints, dicts)."""


# --- measuring a tree, independently of parse and render -------------------------------------------


def walk(node: object) -> list[object]:
    """Every node of a tree, found through attrs fields (not the module's own dispatch)."""
    found: list[object] = []
    pending = [node]
    while pending:
        current = pending.pop()
        if attrs.has(type(current)):
            found.append(current)
            fields = attrs.fields(cast(type[attrs.AttrsInstance], type(current)))
            pending.extend(getattr(current, field.name) for field in fields)
        elif isinstance(current, tuple):
            pending.extend(current)
    return found


def node_count(expr: Expr) -> int:
    return len(walk(expr))


def canonical_depth(expr: Expr, level: int = 0) -> int:
    """Parentheses plus ``not`` around the deepest point of the tree's canonical source.

    Canonical source puts parentheses around: a comparison or membership
    operand that is not a literal or a name; the operand of ``not`` when it
    is an ``and``/``or`` chain; an ``and`` chain inside an ``and`` chain and
    any ``or`` chain inside an ``and`` or ``or`` chain.
    """
    if isinstance(expr, Literal | Name):
        return level
    if isinstance(expr, In):
        return _operand_depth(expr.item, level)
    if isinstance(expr, Not):
        return canonical_depth(expr.operand, level + 1 + isinstance(expr.operand, And | Or))
    if isinstance(expr, And):
        return max(canonical_depth(o, level + isinstance(o, And | Or)) for o in expr.operands)
    if isinstance(expr, Or):
        return max(canonical_depth(o, level + isinstance(o, Or)) for o in expr.operands)
    return max(_operand_depth(expr.left, level), _operand_depth(expr.right, level))


def _operand_depth(expr: Expr, level: int) -> int:
    return canonical_depth(expr, level + (not isinstance(expr, Literal | Name)))
