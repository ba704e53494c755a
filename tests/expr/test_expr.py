"""The condition language by example: what it accepts, what it means, what it refuses.

- Evaluation: a table of (source, bindings, expected truth) covering every
  operator, every type pairing, missing and malformed bindings and
  membership; the three-valued truth tables of ``and``, ``or`` and ``not``
  exhaustively, with each way an operand can be unknown.
- Refusals: a table of bad sources, each with the exact position and a
  substring of the problem (lexical errors, grammar errors, python-isms,
  injection attempts, every limit), and the exact limit boundaries accepted.
- The tree: precedence, canonical rendering, node validation, equality by
  type, and the names an expression reads.
- Safety: the module never calls eval/exec/compile or imports ast, and the
  parser stays within a small recursion budget on any nesting.
"""

from __future__ import annotations

import ast
import enum
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fencekeeper.kernel.errors import KernelError
from fencekeeper.kernel.expr import (
    MAX_DEPTH,
    MAX_LIST_ITEMS,
    MAX_NODES,
    MAX_SOURCE_LENGTH,
    MAX_STRING_LENGTH,
    And,
    Compare,
    CompareOp,
    Expr,
    ExpressionError,
    In,
    ListLiteral,
    Literal,
    Name,
    Not,
    Or,
    Truth,
    evaluate,
    names,
    parse,
    render,
)

T, F, U = Truth.TRUE, Truth.FALSE, Truth.UNKNOWN


class _Text(str):
    pass


class _Number(enum.IntEnum):
    ONE = 1


EXPR_MODULE = Path(__file__).resolve().parents[2] / "kernel" / "expr.py"


def test_public_constants() -> None:
    # Published in specs/expressions.md; another implementation relies on them.
    assert (MAX_SOURCE_LENGTH, MAX_DEPTH, MAX_NODES, MAX_LIST_ITEMS, MAX_STRING_LENGTH) == (1000, 16, 200, 64, 256)
    assert [t.value for t in Truth] == ["true", "false", "unknown"]


# --- evaluation ---------------------------------------------------------------------------

EVALUATIONS: list[tuple[str, dict[str, object], Truth]] = [
    # numbers, every operator, int and float mixed
    ("a == 1", {"a": 1}, T),
    ("a == 1", {"a": 2}, F),
    ("a == 1", {"a": 1.0}, T),
    ("a == 1.5", {"a": 1.5}, T),
    ("a != 1", {"a": 2}, T),
    ("a != 1", {"a": 1}, F),
    ("a < 2", {"a": 1}, T),
    ("a < 2", {"a": 2}, F),
    ("a <= 2", {"a": 2}, T),
    ("a <= 2", {"a": 2.5}, F),
    ("a > 2", {"a": 3}, T),
    ("a > 2", {"a": 2}, F),
    ("a >= 2", {"a": 2.0}, T),
    ("a >= 2", {"a": 1.999}, F),
    ("a > -1", {"a": 0}, T),
    ("a == -0.0", {"a": 0}, T),
    ("a < 1.0e16", {"a": 10**15}, T),
    ("a == 9007199254740993", {"a": 9007199254740992.0}, F),  # exact, not via float
    ("a == 9223372036854775807", {"a": 2**63 - 1}, T),
    ("a == -9223372036854775808", {"a": -(2**63)}, T),
    ("a == b", {"a": 3, "b": 3}, T),
    ("1 < 2", {}, T),
    # strings: equality and code-point order
    ("a == 'x'", {"a": "x"}, T),
    ('a == "x"', {"a": "y"}, F),
    ("a != 'x'", {"a": "y"}, T),
    ("a < 'b'", {"a": "a"}, T),
    ("a < 'a'", {"a": "Z"}, T),  # 'Z' (U+005A) sorts before 'a' (U+0061)
    ("a >= 'ab'", {"a": "b"}, T),
    ("a <= ''", {"a": "x"}, F),
    ("a == 'it\\'s'", {"a": "it's"}, T),
    ('a == "\\\\"', {"a": "\\"}, T),
    # booleans: equality only
    ("a == true", {"a": True}, T),
    ("a == false", {"a": True}, F),
    ("a != true", {"a": False}, T),
    ("a < true", {"a": False}, U),
    ("a >= false", {"a": True}, U),
    ("true", {}, T),
    ("false", {}, F),
    ("a", {"a": True}, T),
    ("a", {"a": False}, F),
    # a truth value compared as a value
    ("(a > 1) == true", {"a": 2}, T),
    ("(a > 1) == b", {"a": 0, "b": False}, T),
    ("(a > 1) == true", {}, U),
    ("(a and b) != (a or b)", {"a": True, "b": False}, T),
    # type mismatches are unknown, never false
    ("a == 1", {"a": "1"}, U),
    ("a == 'x'", {"a": 1}, U),
    ("a == 1", {"a": True}, U),  # a boolean is not a number here
    ("a == true", {"a": 1}, U),
    ("a < 1", {"a": "0"}, U),
    ("a == b", {"a": 1, "b": "1"}, U),
    ("a != 1", {"a": "x"}, U),
    # missing or malformed bindings are unknown
    ("a == 1", {}, U),
    ("a != 1", {}, U),
    ("a == 1", {"a": None}, U),
    ("a != 1", {"a": None}, U),
    ("a == 1", {"a": float("nan")}, U),
    ("a != 1", {"a": float("nan")}, U),
    ("a > 1", {"a": float("inf")}, U),
    ("a == 1", {"a": 2**63}, U),  # outside the 64-bit integers
    ("a == 1", {"a": [1]}, U),
    ("a == 1", {"a": {"b": 1}}, U),
    ("a == 1", {"a": object()}, U),
    ("a == 'x'", {"a": _Text("x")}, U),  # exact types only: a subclass may redefine equality
    ("a == 1", {"a": _Number.ONE}, U),
    ("a.b == 1", {"a": {"b": 1}}, U),  # names are whole keys, never paths
    ("a.b == 1", {"a.b": 1}, T),
    ("x.__class__", {"x": 1}, U),  # no attribute access
    ("x.__class__", {"x.__class__": True}, T),
    # a non-boolean where a truth value is needed
    ("1", {}, U),
    ("'yes'", {}, U),
    ("a", {"a": 1}, U),
    ("a", {"a": "true"}, U),
    ("a", {}, U),
    ("not a", {"a": 0}, U),
    ("a and true", {"a": "x"}, U),
    ("a or false", {"a": None}, U),
    # membership in a list literal
    ("a in [1, 2]", {"a": 2}, T),
    ("a in [1, 2]", {"a": 3}, F),
    ("a in [1, 2.5]", {"a": 2.5}, T),
    ("a in [1, 2]", {"a": 1.0}, T),
    ("a in ['x', 'y']", {"a": "y"}, T),
    ("a in ['x', 'y']", {"a": "z"}, F),
    ("a in [true]", {"a": True}, T),
    ("a in [true]", {"a": False}, F),
    ("a in []", {"a": 1}, F),
    ("a in []", {}, U),  # a missing item is unknown even against nothing
    ("a in [1, 2]", {"a": "1"}, U),  # no element decidable
    ("a in [1, 2]", {"a": True}, U),
    ("a in [1, 2]", {}, U),
    ("a not in [1, 2]", {"a": 3}, T),
    ("a not in [1, 2]", {"a": 1}, F),
    ("a not in [1, 2]", {"a": "1"}, U),
    ("a not in [1, 2]", {}, U),
    # membership in a bound list
    ("a in b", {"a": 1, "b": [0, 1]}, T),
    ("a in b", {"a": 1, "b": (0, 1)}, T),
    ("a in b", {"a": 2, "b": [0, 1]}, F),
    ("a in b", {"a": 2, "b": []}, F),
    ("a in b", {"a": 1, "b": [1, "x"]}, T),  # found before the undecidable element matters
    ("a in b", {"a": 2, "b": [1, "x"]}, U),  # 2 vs "x" is undecidable
    ("a in b", {"a": 1, "b": [1, None]}, U),  # not a list of values at all
    ("a in b", {"a": 1, "b": [1, [1]]}, U),
    ("a in b", {"a": 1, "b": [1, float("nan")]}, U),
    ("a in b", {"a": "a", "b": "abc"}, U),  # a string is not a collection
    ("a in b", {"a": 1, "b": {1: 1}}, U),
    ("a in b", {"a": 1, "b": 1}, U),
    ("a in b", {"a": 1}, U),
    ("a not in b", {"a": 2, "b": [0, 1]}, T),
    ("a not in b", {"a": 1, "b": [0, 1]}, F),
    ("a not in b", {"a": 1}, U),
    # precedence decides the meaning
    ("not a == 1", {"a": 1}, F),
    ("not a in [1]", {"a": 2}, T),
    ("a or b and c", {"a": True, "b": False, "c": False}, T),
    ("(a or b) and c", {"a": True, "b": False, "c": False}, F),
    ("not a or b", {"a": True, "b": True}, T),
    ("not (a or b)", {"a": False, "b": True}, F),
    # a realistic condition
    (
        "input.amount >= 100 and input.currency in ['EUR', 'USD'] and not await_payment.refunded",
        {"input.amount": 250, "input.currency": "EUR", "await_payment.refunded": False},
        T,
    ),
    (
        "input.amount >= 100 and input.currency in ['EUR', 'USD'] and not await_payment.refunded",
        {"input.amount": 250, "input.currency": "EUR"},
        U,
    ),
    (
        "input.amount >= 100 and input.currency in ['EUR', 'USD'] and not await_payment.refunded",
        {"input.amount": 50, "input.currency": "EUR"},
        F,  # decided false whatever the missing input would be
    ),
]


@pytest.mark.parametrize(("source", "bindings", "expected"), EVALUATIONS)
def test_evaluate(source: str, bindings: dict[str, object], expected: Truth) -> None:
    assert evaluate(parse(source), bindings) is expected


def test_evaluation_table_covers_every_operator_and_outcome() -> None:
    # Guards the table: dropping rows must not silently drop an operator or an outcome.
    trees = [parse(source) for source, _b, _e in EVALUATIONS]
    ops = {node.op for tree in trees for node in _nodes(tree) if isinstance(node, Compare)}
    assert ops == set(CompareOp)
    kinds = {type(node) for tree in trees for node in _nodes(tree)}
    assert {Literal, Name, Compare, In, Not, And, Or, ListLiteral} <= kinds
    assert {True, False} == {node.negated for tree in trees for node in _nodes(tree) if isinstance(node, In)}
    assert {e for _s, _b, e in EVALUATIONS} == set(Truth)


def _nodes(node: object) -> Iterator[object]:
    yield node
    for child in getattr(node, "__attrs_attrs__", ()):
        value = getattr(node, child.name)
        for item in value if isinstance(value, tuple) else (value,):
            if hasattr(item, "__attrs_attrs__"):
                yield from _nodes(item)


# --- the three-valued truth tables ------------------------------------------------------

# Written out by hand (Kleene's strong logic), not computed.
AND = {
    (T, T): T, (T, F): F, (T, U): U,
    (F, T): F, (F, F): F, (F, U): F,
    (U, T): U, (U, F): F, (U, U): U,
}  # fmt: skip
OR = {
    (T, T): T, (T, F): T, (T, U): T,
    (F, T): T, (F, F): F, (F, U): U,
    (U, T): T, (U, F): U, (U, U): U,
}  # fmt: skip
NOT = {T: F, F: T, U: U}

# Each way an operand can be unknown: missing, None, the wrong type, an undecidable comparison.
UNKNOWN_BINDINGS: list[Callable[[str], dict[str, object]]] = [
    lambda _name: {},
    lambda name: {name: None},
    lambda name: {name: 1},
    lambda name: {name: float("nan")},
]


def _bind(name: str, truth: Truth, unknown: Callable[[str], dict[str, object]]) -> dict[str, object]:
    if truth is U:
        return unknown(name)
    return {name: truth is T}


@pytest.mark.parametrize("unknown", UNKNOWN_BINDINGS, ids=["missing", "none", "number", "nan"])
@pytest.mark.parametrize(("p", "q"), list(AND))
def test_and_or_truth_tables(p: Truth, q: Truth, unknown: Callable[[str], dict[str, object]]) -> None:
    bindings = _bind("p", p, unknown) | _bind("q", q, unknown)
    assert evaluate(parse("p and q"), bindings) is AND[p, q]
    assert evaluate(parse("p or q"), bindings) is OR[p, q]
    # The same operands as comparisons rather than bare names.
    assert evaluate(parse("p == true and q == true"), bindings) is AND[p, q]
    assert evaluate(parse("p == true or q == true"), bindings) is OR[p, q]


@pytest.mark.parametrize("unknown", UNKNOWN_BINDINGS, ids=["missing", "none", "number", "nan"])
@pytest.mark.parametrize("p", list(NOT))
def test_not_truth_table(p: Truth, unknown: Callable[[str], dict[str, object]]) -> None:
    bindings = _bind("p", p, unknown)
    assert evaluate(parse("not p"), bindings) is NOT[p]
    assert evaluate(parse("not not p"), bindings) is NOT[NOT[p]]


@pytest.mark.parametrize(("p", "q", "r"), [(p, q, r) for p in Truth for q in Truth for r in Truth])
def test_chains_fold_the_truth_tables(p: Truth, q: Truth, r: Truth) -> None:
    bindings = (
        _bind("p", p, UNKNOWN_BINDINGS[0]) | _bind("q", q, UNKNOWN_BINDINGS[0]) | _bind("r", r, UNKNOWN_BINDINGS[0])
    )
    assert evaluate(parse("p and q and r"), bindings) is AND[AND[p, q], r]
    assert evaluate(parse("p or q or r"), bindings) is OR[OR[p, q], r]


# --- refusals ---------------------------------------------------------------------------------

REFUSALS: list[tuple[str, int, str]] = [
    # empty and overlong
    ("", 0, "the expression is empty"),
    (" \t\n", 0, "the expression is empty"),
    ("a" * (MAX_SOURCE_LENGTH + 1), 1000, "longer than 1000 characters"),
    ("(" * 5000, 1000, "longer than 1000 characters"),
    # characters and tokens
    ("a # b", 2, "unexpected character '#'"),
    ("é == 1", 0, "unexpected character 'é'"),
    ("a\u00a0== 1", 1, "unexpected character U+00A0"),
    ("a == b c", 7, "expected an operator or the end of the expression, found name 'c'"),
    ("a b", 2, "found name 'b'"),
    ("a not b", 2, "found 'not'"),
    ("a)", 1, "unmatched ')'"),
    ("(a", 2, "expected ')' to close the '(' at 0, found the end of the expression"),
    ("((a) == 1", 9, "expected ')' to close the '(' at 0"),
    ("()", 1, "expected a value after '(', found ')'"),
    ("a ==", 4, "expected a value after '==', found the end of the expression"),
    ("a == == b", 5, "expected a value after '==', found '=='"),
    ("a and", 5, "expected a value after 'and'"),
    ("a or or b", 5, "expected a value after 'or', found 'or'"),
    ("not", 3, "expected a value after 'not'"),
    ("a in", 4, "expected a list or a name after 'in'"),
    ("a in 1", 5, "expected a list or a name after 'in', found number 1"),
    ("a not in (b)", 9, "expected a list or a name"),
    # comparisons do not chain
    ("a < b < c", 6, "comparisons do not chain"),
    ("1 == a == 1", 7, "comparisons do not chain"),
    ("a == b in c", 7, "comparisons do not chain"),
    ("a in b == c", 7, "comparisons do not chain"),
    ("a in b not in c", 7, "comparisons do not chain"),
    # strings
    ("x == 'abc", 5, "unterminated string"),
    ("x == \"abc'", 5, "unterminated string"),
    ("x == 'ab\\'", 5, "unterminated string"),
    ("x == 'ab\ncd'", 5, "unterminated string"),
    ("'a\\nb'", 2, "unknown escape: backslash before 'n'"),
    ("'a\\x41'", 2, "unknown escape"),
    ("'a\x00'", 2, "control character U+0000 in a string"),
    ("'\x7f'", 1, "control character U+007F"),
    ("'" + "x" * (MAX_STRING_LENGTH + 1) + "'", 0, "string longer than 256 characters"),
    # numbers
    ("007 == a", 0, "leading zeros are not allowed: '007'"),
    ("a == 1e5", 5, "malformed number '1e5'"),
    ("a == 1.", 5, "malformed number '1.'"),
    ("a == .5", 5, "unexpected character '.'"),
    ("a == 1.5.2", 5, "malformed number '1.5.2'"),
    ("a == 1.0E5", 5, "malformed number '1.0E5'"),
    ("a == 1x", 5, "malformed number '1x'"),
    ("a == 9223372036854775808", 5, "out of the 64-bit signed range"),
    ("a == -9223372036854775809", 5, "out of the 64-bit signed range"),
    ("a == 1.0e309", 5, "decimal 1.0e309 is out of range"),
    ("a == - 1", 5, "'-' must be followed by a digit"),
    ("-a", 0, "'-' must be followed by a digit"),
    ("a == 1 + 1", 7, "there is no arithmetic"),
    ("a * 2 > 1", 2, "there is no arithmetic"),
    # names and reserved words
    ("in == 1", 0, "expected a value, found 'in': 'in' is a reserved word"),
    ("a == and", 5, "'and' is a reserved word"),
    ("x.not.y == 1", 2, "'not' is reserved and cannot be part of a name"),
    ("true.x", 0, "'true' is reserved"),
    ("a. b", 2, "expected a name after '.'"),
    ("a..b", 2, "expected a name after '.'"),
    ("a.1", 2, "expected a name after '.'"),
    ("Amount > 1", 0, "names are lower case: 'Amount'"),
    ("a.Amount > 1", 2, "names are lower case: 'Amount'"),
    # python-isms
    ("a = 1", 2, "'=' is not an operator: use '=='"),
    ("a === 1", 4, "'=' is not an operator"),
    ("a && b", 2, "unexpected character '&': use 'and'"),
    ("a || b", 2, "unexpected character '|': use 'or'"),
    ("!a", 0, "'!' is not an operator: use 'not'"),
    ("~a", 0, "use 'not'"),
    ("True", 0, "'True' is not a keyword: keywords are lower case ('true')"),
    ("a AND b", 2, "'AND' is not a keyword"),
    ("a == None", 5, "names are lower case: 'None'"),
    ("a is b", 2, "found name 'is'"),
    ("a if b else c", 2, "found name 'if'"),
    ("[1] == a", 0, "expected a value, found '[': a list is only the collection of 'in'"),
    ("a in (1, 2)", 5, "expected a list or a name after 'in', found '('"),
    # no calls, no indexing, no lambdas: nothing that could run code
    ("__import__('os')", 10, "unexpected '(' after name '__import__': there are no calls"),
    ("__import__('os').system('ls')", 10, "there are no calls"),
    ("a == len(b)", 8, "there are no calls"),
    ("x.__class__.__bases__[0]", 21, "unexpected '[' after name 'x.__class__.__bases__': there is no indexing"),
    ("a in b[0]", 6, "there is no indexing"),
    ("lambda: 1", 6, "unexpected character ':'"),
    ("a == f'{x}'", 6, "expected an operator or the end of the expression, found a string"),
    ("a; b", 1, "unexpected character ';'"),
    ("a == `ls`", 5, "unexpected character '`'"),
    # lists
    ("a in [1,]", 8, "expected a literal after ',', found ']': a list holds only literals"),
    ("a in [1 2]", 8, "expected ',' or ']' in the list opened at 5, found number 2"),
    ("a in [1", 7, "expected ',' or ']' in the list opened at 5, found the end"),
    ("a in [b]", 6, "expected a literal after '[', found name 'b': a list holds only literals"),
    ("a in [[1]]", 6, "a list holds only literals"),
    ("a in [1, 'x']", 9, "a list holds values of one type: string among numbers"),
    ("a in [true, 1]", 12, "number among booleans"),
    ("a in [" + "1, " * MAX_LIST_ITEMS + "1]", 6 + 3 * MAX_LIST_ITEMS, "a list has more than 64 items"),
    # nesting and size
    ("(" * (MAX_DEPTH + 1) + "a" + ")" * (MAX_DEPTH + 1), MAX_DEPTH, "nested deeper than 16 levels"),
    ("not " * (MAX_DEPTH + 1) + "a", 4 * MAX_DEPTH, "nested deeper than 16 levels"),
    ("not (" * 8 + "not a" + ")" * 8, 40, "nested deeper than 16 levels"),
    ("(" * 500, 16, "nested deeper than 16 levels"),
    ("not " * 250, 64, "nested deeper than 16 levels"),
    (" or ".join(["a"] * 200), 995, "more than 200 nodes"),
    ("a in [" + ", ".join(["1"] * 64) + "] or " + " or ".join(["a"] * 134), 861, "more than 200 nodes"),
]


@pytest.mark.parametrize(("source", "position", "problem"), REFUSALS, ids=[repr(s[:40]) for s, _p, _m in REFUSALS])
def test_refusal(source: str, position: int, problem: str) -> None:
    with pytest.raises(ExpressionError) as caught:
        parse(source)
    error = caught.value
    assert problem in error.problem
    assert error.position == position, error.message
    assert error.message == f"at {position}: {error.problem}"
    assert error.code == "invalid_expression"
    assert isinstance(error, KernelError)
    assert error.problem.isprintable(), "a problem is one printable line"


def test_refusal_of_a_non_string() -> None:
    with pytest.raises(ExpressionError, match="an expression is a string, not int"):
        parse(1)  # type: ignore[arg-type]


def test_the_first_problem_in_reading_order_is_reported() -> None:
    # Tokens are read on demand: a grammar error before a lexical one wins.
    with pytest.raises(ExpressionError) as caught:
        parse("a b && c")
    assert caught.value.position == 2


BOUNDARIES: list[str] = [
    "a" * MAX_SOURCE_LENGTH,
    "(" * MAX_DEPTH + "a" + ")" * MAX_DEPTH,
    "not " * MAX_DEPTH + "a",
    "not (" * 8 + "a" + ")" * 8,
    "not a and " + "(" * MAX_DEPTH + "b" + ")" * MAX_DEPTH,  # a 'not' reaches only its operand
    "(not a) == " + "(" * MAX_DEPTH + "b" + ")" * MAX_DEPTH,
    " or ".join(["a"] * 199),  # 199 names and one Or: 200 nodes
    "a in [" + ", ".join(["1"] * MAX_LIST_ITEMS) + "]",
    "a == '" + "x" * MAX_STRING_LENGTH + "'",
    "a == '" + "\\'" * MAX_STRING_LENGTH + "'",  # the limit counts characters, not source
    "a == 9223372036854775807",
    "a == -9223372036854775808",
    "a == 1.7976931348623157e308",
]


@pytest.mark.parametrize("source", BOUNDARIES, ids=[repr(s[:30]) for s in BOUNDARIES])
def test_limits_are_inclusive(source: str) -> None:
    assert parse(render(parse(source))) == parse(source)


def test_node_count_boundary_is_exact() -> None:
    assert len(list(_nodes(parse(" or ".join(["a"] * 199))))) == MAX_NODES


# --- the tree ----------------------------------------------------------------------------------

a, b, c = Name("a"), Name("b"), Name("c")

TREES: list[tuple[str, Expr]] = [
    ("a", a),
    ("input.amount", Name("input.amount")),
    ("_x.y_1", Name("_x.y_1")),
    ("1", Literal(1)),
    ("-12", Literal(-12)),
    ("-0", Literal(0)),
    ("0.5", Literal(0.5)),
    ("-0.0", Literal(-0.0)),
    ("1.5e-3", Literal(0.0015)),
    ("2.0e10", Literal(2e10)),
    ("'x'", Literal("x")),
    ('"it\'s"', Literal("it's")),
    ("'say \\\"hi\\\"'", Literal('say "hi"')),
    ("''", Literal("")),
    ("true", Literal(True)),
    ("false", Literal(False)),
    ("a==b", Compare(CompareOp.EQ, a, b)),
    ("a\t!=\n1", Compare(CompareOp.NE, a, Literal(1))),
    ("a<=b", Compare(CompareOp.LE, a, b)),
    ("a in [1, 2.5]", In(a, ListLiteral((Literal(1), Literal(2.5))))),
    ("a in []", In(a, ListLiteral(()))),
    ("a not in b", In(a, b, negated=True)),
    ("not a in b", Not(In(a, b))),
    ("not a == b", Not(Compare(CompareOp.EQ, a, b))),
    ("(not a) == b", Compare(CompareOp.EQ, Not(a), b)),
    ("not not a", Not(Not(a))),
    ("a and b and c", And((a, b, c))),
    ("a or b or c", Or((a, b, c))),
    ("a or b and c", Or((a, And((b, c))))),
    ("a and b or c", Or((And((a, b)), c))),
    ("(a or b) and c", And((Or((a, b)), c))),
    ("(a and b) and c", And((And((a, b)), c))),
    ("a and (b and c)", And((a, And((b, c))))),
    ("not a and b", And((Not(a), b))),
    ("not (a and b)", Not(And((a, b)))),
    ("((a))", a),
    (
        "(a == 1) == (b in [true])",
        Compare(CompareOp.EQ, Compare(CompareOp.EQ, a, Literal(1)), In(b, ListLiteral((Literal(True),)))),
    ),
]


@pytest.mark.parametrize(("source", "tree"), TREES, ids=[s for s, _t in TREES])
def test_parse_builds_the_tree(source: str, tree: Expr) -> None:
    assert parse(source) == tree
    assert parse(render(tree)) == tree


CANONICAL: list[tuple[str, str]] = [
    ("a  ==1", "a == 1"),
    ("'x'", '"x"'),
    ("'a\"b\\\\'", '"a\\"b\\\\"'),
    ("((a))", "a"),
    ("((a and b)) or (c)", "a and b or c"),
    ("(a or b) or c", "(a or b) or c"),
    ("a and (b or c)", "a and (b or c)"),
    ("not (a)", "not a"),
    ("not (a == 1)", "not a == 1"),
    ("a in [ 1 ,2 ]", "a in [1, 2]"),
    ("a not  in b", "a not in b"),
    ("100000000000000000.0", "1.0e17"),
    ("0.0001", "0.0001"),
    ("0.00001", "1.0e-5"),
    ("1.50", "1.5"),
    ("2.5e0", "2.5"),
    ("-0.0", "-0.0"),
    ("-0", "0"),
]


@pytest.mark.parametrize(("source", "canonical"), CANONICAL)
def test_render_is_canonical(source: str, canonical: str) -> None:
    assert render(parse(source)) == canonical
    assert render(parse(canonical)) == canonical


def test_literals_differ_by_type() -> None:
    assert Literal(1) != Literal(True)
    assert Literal(1) != Literal(1.0)
    assert Literal(0.0) != Literal(-0.0)
    assert Literal("1") != Literal(1)
    assert Literal(1) == Literal(1)
    assert len({Literal(1), Literal(True), Literal(1.0), Literal(1)}) == 3
    assert parse("a == 1") != parse("a == 1.0") != parse("a == true")
    assert hash(parse("a in [1] and not b")) == hash(parse("a in [1] and not b"))


@pytest.mark.parametrize(
    ("build", "problem"),
    [
        (lambda: Literal(None), "not NoneType"),  # type: ignore[arg-type]
        (lambda: Literal(float("nan")), "not finite"),
        (lambda: Literal(float("inf")), "not finite"),
        (lambda: Literal(2**63), "64-bit"),
        (lambda: Literal("x" * 257), "longer than 256"),
        (lambda: Literal("a\nb"), "control character"),
        (lambda: Literal([1]), "not list"),  # type: ignore[arg-type]
        (lambda: Name("A"), "not a name"),
        (lambda: Name(""), "not a name"),
        (lambda: Name("a b"), "not a name"),
        (lambda: Name("a.in"), "'in' is reserved"),
        (lambda: Name("true"), "'true' is reserved"),
        (lambda: And((Name("a"),)), "at least two"),
        (lambda: Or(()), "at least two"),
        (lambda: ListLiteral((Literal(1), Literal("1"))), "one type"),
        (lambda: ListLiteral((Literal(1),) * 65), "at most 64"),
    ],
)
def test_node_constructors_refuse_what_no_source_can_say(build: Callable[[], object], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        build()


NAMES: list[tuple[str, set[str]]] = [
    ("true", set()),
    ("1 == 1", set()),
    ("a", {"a"}),
    ("input.amount > 1", {"input.amount"}),
    ("a in b", {"a", "b"}),
    ("a not in [1, 2]", {"a"}),
    ("not (a == b) and (c or d.e) or a", {"a", "b", "c", "d.e"}),
    ("(x == 1) == y.z", {"x", "y.z"}),
]


@pytest.mark.parametrize(("source", "expected"), NAMES)
def test_names(source: str, expected: set[str]) -> None:
    assert names(parse(source)) == frozenset(expected)


# --- safety --------------------------------------------------------------------------------------


def test_module_never_evaluates_code() -> None:
    tree = ast.parse(EXPR_MODULE.read_text(encoding="utf-8"))
    calls = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert not calls & {"eval", "exec", "compile", "__import__", "getattr", "setattr", "globals", "locals", "vars"}
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "enum", "math", "re", "collections.abc", "typing", "attrs", "errors"}, imported


@contextmanager
def _recursion_budget(frames: int) -> Iterator[None]:
    # Lets the parser use at most ``frames`` frames above this one.
    depth = 0
    frame = sys._getframe()
    while frame is not None:
        depth += 1
        frame = frame.f_back  # type: ignore[assignment]
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + frames)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


@pytest.mark.parametrize(
    "source",
    [
        "(" * MAX_DEPTH + "a" + ")" * MAX_DEPTH,
        "not (" * 8 + "a or b and not c" + ")" * 8,
        "(" * MAX_DEPTH + "not " * MAX_DEPTH + "a",
        "(" * 999,
        "not " * 249,
        "((((" * 200,
    ],
    ids=["deepest parens", "deepest mixed", "parens then nots", "999 parens", "249 nots", "800 parens"],
)
def test_parser_stack_is_bounded(source: str) -> None:
    # About seven frames per level: 16 levels fit in 150 frames; 999 would not.
    with _recursion_budget(150):
        try:
            tree: Expr | None = parse(source)
        except ExpressionError as error:
            assert "nested deeper" in error.problem or "expected" in error.problem
            tree = None
        if tree is not None:
            assert isinstance(evaluate(tree, {}), Truth)
            assert render(tree)


def test_deepest_accepted_tree_evaluates() -> None:
    # Six 'not (' (12 levels) around four more parentheses: exactly MAX_DEPTH.
    source = "not (" * 6 + "a and (b or (c and (d or (e))))" + ")" * 6
    tree = parse(source)
    bindings: dict[str, object] = {"a": True, "b": False, "c": True, "d": False, "e": True}
    assert evaluate(tree, bindings) is Truth.TRUE
    assert evaluate(tree, bindings | {"a": False}) is Truth.FALSE
    del bindings["e"]
    assert evaluate(tree, bindings) is Truth.UNKNOWN
    with pytest.raises(ExpressionError, match="nested deeper than 16"):
        parse(source.replace("(e)", "((e))"))
