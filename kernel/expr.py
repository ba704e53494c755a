r"""The bounded condition language: parsed into a tree, evaluated in three values.

The workflow execution contract (seed 000, Node Semantics, ``condition``) says a
condition node resolves only declared bindings and is evaluated without
eval, arbitrary code or AI; ``true`` selects ``true_next``, ``false`` selects
``false_next``, and an unknown result or a missing input is *not* false: the
execution is suspended for review.  This module is that language, and the
only one in the kernel.  ``specs/expressions.md`` states it for other
implementations.

Rules of this module:

- :func:`parse` is the only way from text to a tree, and it refuses at
  definition time everything outside this grammar (EBNF; keywords are
  lower case and reserved, whitespace is space, tab, CR and LF)::

      expr       = or_expr ;
      or_expr    = and_expr , { "or" , and_expr } ;
      and_expr   = not_expr , { "and" , not_expr } ;
      not_expr   = "not" , not_expr | comparison ;
      comparison = operand , [ cmp_op , operand
                             | "in" , collection
                             | "not" , "in" , collection ] ;
      cmp_op     = "==" | "!=" | "<" | "<=" | ">" | ">=" ;
      operand    = literal | name | "(" , expr , ")" ;
      collection = list | name ;
      list       = "[" , [ literal , { "," , literal } ] , "]" ;
      literal    = integer | decimal | string | "true" | "false" ;

  and the tokens, as regular expressions::

      name     [a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*   no part a keyword, no spaces at the dots
      integer  -?(0|[1-9][0-9]*)                       64-bit signed
      decimal  -?(0|[1-9][0-9]*)\.[0-9]+(e-?[0-9]+)?   finite binary64
      string   "..." or '...'                          escapes \\ \" \' only; no control
                                                       characters; at most 256 characters

  A number must not run into a letter, digit, ``_`` or ``.`` (``1e5``,
  ``1.`` and ``2x`` are refused).

  It never calls ``eval``, ``exec``, ``compile`` or :mod:`ast`: a hand-written
  lexer and a recursive-descent parser build the tree.

- Every limit is checked while parsing, so no input, however long or deep,
  can exhaust the parser (it uses about seven frames per level, and refuses
  level ``MAX_DEPTH + 1`` before descending into it):

  * the source is at most :data:`MAX_SOURCE_LENGTH` characters;
  * the *depth* of a position in the source is the number of open
    parentheses around it plus the number of prefix ``not`` operators whose
    operand contains it; no position may be deeper than :data:`MAX_DEPTH`.
    ``and`` and ``or`` nest inside themselves only through parentheses, so
    their nesting is counted there (``a and b or c`` is depth 0,
    ``not (a or (b and c))`` reaches depth 3);
  * the tree has at most :data:`MAX_NODES` nodes (every :class:`Literal`,
    :class:`Name`, :class:`ListLiteral`, list item, and operator node; a
    chain ``a and b and c`` is one :class:`And` node);
  * a list literal has at most :data:`MAX_LIST_ITEMS` items, all of one type
    (numbers, strings or booleans); a string at most
    :data:`MAX_STRING_LENGTH` characters, none of them a control character;
    an integer fits in 64 signed bits and a decimal is a finite binary64.

  A refusal is an :class:`ExpressionError` with the 0-based character
  ``position`` of the culprit and a one-line ``problem``; its message reads
  ``at 12: expected a value after '==', found the end of the expression``.

- :func:`evaluate` never raises, whatever the bindings hold, and returns a
  :class:`Truth`.  Anything it cannot decide is ``UNKNOWN``, never ``FALSE``:
  a missing binding, a value that is not a string, a 64-bit integer, a
  finite float or a boolean (``None``, NaN, objects, subclasses), a
  comparison between different types (a boolean is not a number), an
  ordering of booleans, or a non-boolean where a truth value is needed.
  ``and``, ``or`` and ``not`` are Kleene's strong three-valued connectives.
  Names are looked up whole (``"input.amount"`` is one key): a dot never
  means attribute access.
- The tree is plain data (attrs frozen classes: hashable, equal when they
  mean the same source).  A literal's type is part of its identity, so
  ``Literal(1) != Literal(True) != Literal(1.0)``.  Node constructors check
  what a single node can check; the whole-tree limits belong to
  :func:`parse`.  :func:`render` prints the canonical source of a tree, and
  ``parse(render(e)) == e`` for every tree within the limits.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Mapping
from typing import Final, TypeAlias

import attrs

from .errors import KernelError

MAX_SOURCE_LENGTH: Final = 1000
"""The longest source :func:`parse` accepts, in characters."""

MAX_DEPTH: Final = 16
"""The deepest nesting of parentheses and ``not`` operators (see the module docstring)."""

MAX_NODES: Final = 200
"""The most nodes a parsed tree may have."""

MAX_LIST_ITEMS: Final = 64
"""The most items a list literal may have."""

MAX_STRING_LENGTH: Final = 256
"""The longest string literal, in characters (after escapes are resolved)."""

INTEGER_MIN: Final = -(2**63)
INTEGER_MAX: Final = 2**63 - 1
"""Integers, literal or bound, are 64-bit signed so that every implementation agrees on them."""

KEYWORDS: Final = frozenset({"and", "or", "not", "in", "true", "false"})
"""Reserved words: never a name, nor a part of a dotted name."""


class ExpressionError(KernelError):
    """A condition source that is not in the language or exceeds a limit."""

    code = "invalid_expression"

    def __init__(self, position: int, problem: str) -> None:
        super().__init__(f"at {position}: {problem}")
        self.position = position
        self.problem = problem


class Truth(enum.Enum):
    """The result of a condition.  ``UNKNOWN`` is never to be read as ``FALSE``."""

    TRUE = "true"
    FALSE = "false"
    UNKNOWN = "unknown"


class CompareOp(enum.Enum):
    """The six comparison operators, valued by their spelling in the source."""

    EQ = "=="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="


# --- the tree ------------------------------------------------------------------------------

LiteralValue: TypeAlias = str | int | float | bool

_NAME = re.compile(r"[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*")


def _is_forbidden_in_string(char: str) -> bool:
    # C0 and C1 control characters (so canonical source is one printable
    # line) and lone surrogates (not characters at all).
    code = ord(char)
    return code < 0x20 or 0x7F <= code <= 0x9F or 0xD800 <= code <= 0xDFFF


def _type_name(value: LiteralValue) -> str:
    # bool first: in Python it is a subclass of int, in this language it is its own type.
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, str):
        return "string"
    return "number"


def _literal_problem(value: object) -> str | None:
    kind = type(value)
    if kind is bool:
        return None
    if kind is int:
        assert isinstance(value, int)
        return None if INTEGER_MIN <= value <= INTEGER_MAX else "integer out of the 64-bit signed range"
    if kind is float:
        assert isinstance(value, float)
        return None if math.isfinite(value) else "decimal is not finite"
    if kind is str:
        assert isinstance(value, str)
        if len(value) > MAX_STRING_LENGTH:
            return f"string longer than {MAX_STRING_LENGTH} characters"
        if any(_is_forbidden_in_string(c) for c in value):
            return "string holds a control character or a surrogate"
        return None
    return f"a literal is a str, int, float or bool, not {kind.__name__}"


def _check_literal(_instance: object, _attribute: attrs.Attribute[LiteralValue], value: LiteralValue) -> None:
    problem = _literal_problem(value)
    if problem is not None:
        raise ValueError(problem)


def _literal_key(value: LiteralValue) -> tuple[object, ...]:
    # The type is part of a literal's identity (1, 1.0 and true differ), and
    # so is the sign of a zero decimal (render prints -0.0 and 0.0 apart).
    if isinstance(value, float):
        return ("decimal", value, math.copysign(1.0, value))
    return (type(value).__name__, value)


def _check_name(_instance: object, _attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or _NAME.fullmatch(value) is None:
        raise ValueError(f"not a name: {value!r}")
    reserved = [part for part in value.split(".") if part in KEYWORDS]
    if reserved:
        raise ValueError(f"{reserved[0]!r} is reserved and cannot be part of a name")


def _check_operands(_instance: object, _attribute: attrs.Attribute[tuple[Expr, ...]], value: tuple[Expr, ...]) -> None:
    if len(value) < 2:
        raise ValueError("'and' and 'or' take at least two operands")


def _check_items(
    _instance: object, _attribute: attrs.Attribute[tuple[Literal, ...]], value: tuple[Literal, ...]
) -> None:
    if len(value) > MAX_LIST_ITEMS:
        raise ValueError(f"a list has at most {MAX_LIST_ITEMS} items")
    kinds = {_type_name(item.value) for item in value}
    if len(kinds) > 1:
        raise ValueError(f"a list holds values of one type, not {' and '.join(sorted(kinds))}")


@attrs.frozen
class Literal:
    """A string, integer, decimal or boolean written in the source."""

    value: LiteralValue = attrs.field(eq=_literal_key, validator=_check_literal)


@attrs.frozen
class Name:
    """A declared binding, looked up whole: ``input.amount`` is one key."""

    name: str = attrs.field(validator=_check_name)


@attrs.frozen
class ListLiteral:
    """``[1, 2, 3]``: only ever the collection of an :class:`In`."""

    items: tuple[Literal, ...] = attrs.field(validator=_check_items)


@attrs.frozen
class Compare:
    """``left op right``; comparisons do not chain."""

    op: CompareOp
    left: Expr
    right: Expr


@attrs.frozen
class In:
    """``item in collection``, or ``item not in collection`` when ``negated``."""

    item: Expr
    collection: ListLiteral | Name
    negated: bool = False


@attrs.frozen
class Not:
    """``not operand``: ``not unknown`` is unknown."""

    operand: Expr


@attrs.frozen
class And:
    """A chain ``a and b and ...`` of two or more operands."""

    operands: tuple[Expr, ...] = attrs.field(validator=_check_operands)


@attrs.frozen
class Or:
    """A chain ``a or b or ...`` of two or more operands."""

    operands: tuple[Expr, ...] = attrs.field(validator=_check_operands)


Expr: TypeAlias = Literal | Name | Compare | In | Not | And | Or
"""A condition: any node except a :class:`ListLiteral`, which is only a collection."""


# --- lexing ---------------------------------------------------------------------------------


class _Kind(enum.Enum):
    NAME = "name"
    KEYWORD = "keyword"
    INTEGER = "integer"
    DECIMAL = "decimal"
    STRING = "string"
    OPERATOR = "operator"
    LPAREN = "("
    RPAREN = ")"
    LBRACKET = "["
    RBRACKET = "]"
    COMMA = ","
    END = "end"


_LITERAL_KINDS = frozenset({_Kind.INTEGER, _Kind.DECIMAL, _Kind.STRING})


@attrs.frozen
class _Token:
    kind: _Kind
    text: str
    position: int
    value: LiteralValue | None = None

    def describe(self) -> str:
        if self.kind is _Kind.END:
            return "the end of the expression"
        if self.kind is _Kind.NAME:
            return f"name {self.text!r}"
        if self.kind in (_Kind.INTEGER, _Kind.DECIMAL):
            return f"number {self.text}"
        if self.kind is _Kind.STRING:
            return "a string"
        return repr(self.text)

    def is_keyword(self, word: str) -> bool:
        return self.kind is _Kind.KEYWORD and self.text == word


_WHITESPACE = frozenset(" \t\r\n")
_PUNCTUATION = {"(": _Kind.LPAREN, ")": _Kind.RPAREN, "[": _Kind.LBRACKET, "]": _Kind.RBRACKET, ",": _Kind.COMMA}
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"-?([0-9]+)(\.[0-9]+(?:e-?[0-9]+)?)?")
_NUMBER_TAIL = re.compile(r"[A-Za-z0-9_.]*")
_UPPER = re.compile(r"[A-Z]")
# Characters that are operators elsewhere; the hint says what to write here.
_HINTS = {
    "&": "use 'and'",
    "|": "use 'or'",
    "+": "there is no arithmetic",
    "*": "there is no arithmetic",
    "/": "there is no arithmetic",
    "%": "there is no arithmetic",
    "^": "there is no arithmetic",
    "~": "use 'not'",
}


def _show(char: str) -> str:
    # Keeps every message on one printable line.
    return repr(char) if char.isprintable() else f"U+{ord(char):04X}"


class _Lexer:
    """Produces tokens on demand, so the first problem in reading order is the one reported."""

    def __init__(self, source: str) -> None:
        self._source = source
        self._position = 0

    def next(self) -> _Token:
        source, i = self._source, self._position
        while i < len(source) and source[i] in _WHITESPACE:
            i += 1
        if i == len(source):
            self._position = i
            return _Token(_Kind.END, "", i)
        char = source[i]
        if char in _PUNCTUATION:
            token = _Token(_PUNCTUATION[char], char, i)
        elif char in "=!<>":
            token = self._operator(i)
        elif char in "\"'":
            token = self._string(i)
        elif char == "-" or "0" <= char <= "9":
            token = self._number(i)
        elif char == "_" or "a" <= char <= "z" or "A" <= char <= "Z":
            token = self._word(i)
        elif char in _HINTS:
            raise ExpressionError(i, f"unexpected character {char!r}: {_HINTS[char]}")
        else:
            raise ExpressionError(i, f"unexpected character {_show(char)}")
        self._position = token.position + len(token.text)
        return token

    def _operator(self, i: int) -> _Token:
        two = self._source[i : i + 2]
        if two in ("==", "!=", "<=", ">="):
            return _Token(_Kind.OPERATOR, two, i)
        char = self._source[i]
        if char == "=":
            raise ExpressionError(i, "'=' is not an operator: use '==' to compare")
        if char == "!":
            raise ExpressionError(i, "'!' is not an operator: use 'not', or '!=' to compare")
        return _Token(_Kind.OPERATOR, char, i)

    def _string(self, start: int) -> _Token:
        source, quote = self._source, self._source[start]
        chars: list[str] = []
        i = start + 1
        while True:
            if i >= len(source) or source[i] in "\r\n":
                raise ExpressionError(start, "unterminated string")
            char = source[i]
            if char == quote:
                break
            if char == "\\":
                escaped = source[i + 1] if i + 1 < len(source) else ""
                if escaped in ("", "\r", "\n"):
                    raise ExpressionError(start, "unterminated string")
                if escaped not in ("\\", '"', "'"):
                    raise ExpressionError(
                        i, f"unknown escape: backslash before {_show(escaped)} (only \\\\, \\\" and \\' are allowed)"
                    )
                chars.append(escaped)
                i += 2
            else:
                if _is_forbidden_in_string(char):
                    raise ExpressionError(i, f"control character {_show(char)} in a string")
                chars.append(char)
                i += 1
            if len(chars) > MAX_STRING_LENGTH:
                raise ExpressionError(start, f"string longer than {MAX_STRING_LENGTH} characters")
        return _Token(_Kind.STRING, source[start : i + 1], start, "".join(chars))

    def _number(self, start: int) -> _Token:
        source = self._source
        match = _NUMBER.match(source, start)
        if match is None:
            raise ExpressionError(start, "'-' must be followed by a digit: there is no arithmetic")
        end = match.end()
        tail = _NUMBER_TAIL.match(source, end)
        assert tail is not None  # the pattern matches the empty string
        if tail.end() > end:
            raise ExpressionError(start, f"malformed number {source[start : tail.end()]!r}")
        text = match.group()
        digits = match.group(1)
        if len(digits) > 1 and digits.startswith("0"):
            raise ExpressionError(start, f"leading zeros are not allowed: {text!r}")
        if match.group(2) is None:
            integer = int(text)
            if not INTEGER_MIN <= integer <= INTEGER_MAX:
                raise ExpressionError(start, f"integer {text} is out of the 64-bit signed range")
            return _Token(_Kind.INTEGER, text, start, integer)
        decimal = float(text)
        if not math.isfinite(decimal):
            raise ExpressionError(start, f"decimal {text} is out of range")
        return _Token(_Kind.DECIMAL, text, start, decimal)

    def _word(self, start: int) -> _Token:
        source = self._source
        parts: list[tuple[str, int]] = []
        i = start
        while True:
            match = _WORD.match(source, i)
            if match is None:
                raise ExpressionError(i, "expected a name after '.'")
            word = match.group()
            if _UPPER.search(word):
                if word.lower() in KEYWORDS:
                    raise ExpressionError(i, f"{word!r} is not a keyword: keywords are lower case ({word.lower()!r})")
                raise ExpressionError(i, f"names are lower case: {word!r}")
            parts.append((word, i))
            i = match.end()
            if i < len(source) and source[i] == ".":
                i += 1
                continue
            break
        text = source[start:i]
        if len(parts) == 1 and text in KEYWORDS:
            if text in ("true", "false"):
                return _Token(_Kind.KEYWORD, text, start, text == "true")
            return _Token(_Kind.KEYWORD, text, start)
        for word, position in parts:
            if word in KEYWORDS:
                raise ExpressionError(position, f"{word!r} is reserved and cannot be part of a name")
        return _Token(_Kind.NAME, text, start)


# --- parsing --------------------------------------------------------------------------------


class _Parser:
    """Recursive descent over the grammar; recursion happens only at '(' and is bounded by MAX_DEPTH."""

    def __init__(self, source: str) -> None:
        self._lexer = _Lexer(source)
        self._lookahead: list[_Token] = []
        self._previous: _Token | None = None
        self._level = 0
        self._nodes = 0

    # tokens

    def _peek(self, ahead: int = 0) -> _Token:
        while len(self._lookahead) <= ahead:
            self._lookahead.append(self._lexer.next())
        return self._lookahead[ahead]

    def _advance(self) -> _Token:
        token = self._peek()
        self._lookahead.pop(0)
        self._previous = token
        return token

    def _at_not_in(self) -> bool:
        return self._peek().is_keyword("not") and self._peek(1).is_keyword("in")

    # limits

    def _count(self, at: _Token, nodes: int = 1) -> None:
        self._nodes += nodes
        if self._nodes > MAX_NODES:
            raise ExpressionError(at.position, f"expression has more than {MAX_NODES} nodes")

    def _enter(self, at: _Token) -> None:
        self._level += 1
        if self._level > MAX_DEPTH:
            raise ExpressionError(at.position, f"expression is nested deeper than {MAX_DEPTH} levels")

    # errors

    def _expected(self, what: str, found: _Token, hint: str = "") -> ExpressionError:
        after = f" after {self._previous.describe()}" if self._previous is not None else ""
        if not hint and found.kind is _Kind.KEYWORD and found.text in ("and", "or", "in"):
            hint = f"{found.text!r} is a reserved word"
        if not hint and found.kind is _Kind.LBRACKET:
            hint = "a list is only the collection of 'in'"
        problem = f"expected {what}{after}, found {found.describe()}"
        return ExpressionError(found.position, f"{problem}: {hint}" if hint else problem)

    # grammar

    def expression(self) -> Expr:
        return self._chain("or", self._and, Or)

    def _and(self) -> Expr:
        return self._chain("and", self._not, And)

    def _chain(self, word: str, operand: Callable[[], Expr], node: type[And] | type[Or]) -> Expr:
        first = operand()
        if not self._peek().is_keyword(word):
            return first
        self._count(self._peek())
        operands = [first]
        while self._peek().is_keyword(word):
            self._advance()
            operands.append(operand())
        return node(tuple(operands))

    def _not(self) -> Expr:
        # Iterative, so a run of 'not' costs no recursion; each one is a level.
        nots = 0
        while self._peek().is_keyword("not"):
            token = self._advance()
            self._enter(token)
            self._count(token)
            nots += 1
        expr = self._comparison()
        for _ in range(nots):
            expr = Not(expr)
        self._level -= nots
        return expr

    def _comparison(self) -> Expr:
        left = self._operand()
        token = self._peek()
        expr: Expr
        if token.kind is _Kind.OPERATOR:
            self._advance()
            self._count(token)
            expr = Compare(CompareOp(token.text), left, self._operand())
        elif token.is_keyword("in") or self._at_not_in():
            negated = token.is_keyword("not")
            self._advance()
            if negated:
                self._advance()
            self._count(token)
            expr = In(left, self._collection(), negated)
        else:
            return left
        following = self._peek()
        if following.kind is _Kind.OPERATOR or following.is_keyword("in") or self._at_not_in():
            raise ExpressionError(
                following.position, f"comparisons do not chain: combine them with 'and' (found {following.describe()})"
            )
        return expr

    def _operand(self) -> Expr:
        token = self._peek()
        if token.kind is _Kind.LPAREN:
            self._advance()
            self._enter(token)
            inner = self.expression()
            close = self._peek()
            if close.kind is not _Kind.RPAREN:
                raise ExpressionError(
                    close.position, f"expected ')' to close the '(' at {token.position}, found {close.describe()}"
                )
            self._advance()
            self._level -= 1
            return inner
        if token.kind in _LITERAL_KINDS or token.is_keyword("true") or token.is_keyword("false"):
            self._advance()
            self._count(token)
            assert token.value is not None
            return Literal(token.value)
        if token.kind is _Kind.NAME:
            return self._name()
        raise self._expected("a value", token)

    def _name(self) -> Name:
        token = self._advance()
        self._count(token)
        following = self._peek()
        if following.kind is _Kind.LPAREN:
            raise ExpressionError(following.position, f"unexpected '(' after name {token.text!r}: there are no calls")
        if following.kind is _Kind.LBRACKET:
            raise ExpressionError(following.position, f"unexpected '[' after name {token.text!r}: there is no indexing")
        return Name(token.text)

    def _collection(self) -> ListLiteral | Name:
        token = self._peek()
        if token.kind is _Kind.NAME:
            return self._name()
        if token.kind is not _Kind.LBRACKET:
            raise self._expected("a list or a name", token)
        opening = self._advance()
        self._count(opening)
        items: list[Literal] = []
        if self._peek().kind is _Kind.RBRACKET:
            self._advance()
            return ListLiteral(())
        while True:
            item = self._peek()
            if not (item.kind in _LITERAL_KINDS or item.is_keyword("true") or item.is_keyword("false")):
                raise self._expected("a literal", item, "a list holds only literals")
            assert item.value is not None
            if len(items) == MAX_LIST_ITEMS:
                raise ExpressionError(item.position, f"a list has more than {MAX_LIST_ITEMS} items")
            if items and _type_name(item.value) != _type_name(items[0].value):
                raise ExpressionError(
                    item.position,
                    f"a list holds values of one type: {_type_name(item.value)} among {_type_name(items[0].value)}s",
                )
            self._advance()
            self._count(item)
            items.append(Literal(item.value))
            separator = self._peek()
            if separator.kind is _Kind.COMMA:
                self._advance()
            elif separator.kind is _Kind.RBRACKET:
                self._advance()
                return ListLiteral(tuple(items))
            else:
                raise ExpressionError(
                    separator.position,
                    f"expected ',' or ']' in the list opened at {opening.position}, found {separator.describe()}",
                )


def parse(source: str) -> Expr:
    """The tree of ``source``, or :class:`ExpressionError` naming the first problem."""
    if not isinstance(source, str):
        raise ExpressionError(0, f"an expression is a string, not {type(source).__name__}")
    if len(source) > MAX_SOURCE_LENGTH:
        raise ExpressionError(MAX_SOURCE_LENGTH, f"expression is longer than {MAX_SOURCE_LENGTH} characters")
    if all(char in _WHITESPACE for char in source):
        raise ExpressionError(0, "the expression is empty")
    parser = _Parser(source)
    expr = parser.expression()
    following = parser._peek()
    if following.kind is _Kind.RPAREN:
        raise ExpressionError(following.position, "unmatched ')'")
    if following.kind is not _Kind.END:
        raise ExpressionError(
            following.position, f"expected an operator or the end of the expression, found {following.describe()}"
        )
    return expr


# --- reading a tree -----------------------------------------------------------------------------


def names(expr: Expr) -> frozenset[str]:
    """Every binding name ``expr`` reads, as a comparison operand, a truth value or a collection."""
    found: set[str] = set()
    pending: list[Expr | ListLiteral] = [expr]
    while pending:
        node = pending.pop()
        if isinstance(node, Name):
            found.add(node.name)
        elif isinstance(node, Compare):
            pending += (node.left, node.right)
        elif isinstance(node, In):
            pending += (node.item, node.collection)
        elif isinstance(node, Not):
            pending.append(node.operand)
        elif isinstance(node, And | Or):
            pending += node.operands
    return frozenset(found)


def render(expr: Expr) -> str:
    """Canonical source: one line, single spaces, double quotes, only the parentheses the tree needs."""
    if isinstance(expr, Literal):
        return _render_literal(expr.value)
    if isinstance(expr, Name):
        return expr.name
    if isinstance(expr, Compare):
        return f"{_render_operand(expr.left)} {expr.op.value} {_render_operand(expr.right)}"
    if isinstance(expr, In):
        word = "not in" if expr.negated else "in"
        collection = expr.collection
        if isinstance(collection, Name):
            rendered = collection.name
        else:
            rendered = "[" + ", ".join(_render_literal(item.value) for item in collection.items) + "]"
        return f"{_render_operand(expr.item)} {word} {rendered}"
    if isinstance(expr, Not):
        inner = render(expr.operand)
        return "not " + (f"({inner})" if isinstance(expr.operand, And | Or) else inner)
    # An operand of 'and' that is itself a chain needs parentheses (else it
    # would merge into this chain, or bind looser); in 'or' only an 'or' does.
    grouped: tuple[type, ...] = (And, Or) if isinstance(expr, And) else (Or,)
    word = " and " if isinstance(expr, And) else " or "
    return word.join(f"({render(o)})" if isinstance(o, grouped) else render(o) for o in expr.operands)


def _render_operand(expr: Expr) -> str:
    return render(expr) if isinstance(expr, Literal | Name) else f"({render(expr)})"


def _render_literal(value: LiteralValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        # repr is the shortest text that reads back as the same float; only
        # its exponent form needs reshaping into the grammar's (1e+16 -> 1.0e16).
        text = repr(value)
        if "e" not in text:
            return text
        mantissa, exponent = text.split("e")
        if "." not in mantissa:
            mantissa += ".0"
        return f"{mantissa}e{int(exponent)}"
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


# --- evaluation ----------------------------------------------------------------------------------


class _Unknown(enum.Enum):
    # The value of an operand that cannot be decided.
    UNKNOWN = "unknown"


_UNKNOWN: Final = _Unknown.UNKNOWN
_Value: TypeAlias = LiteralValue | _Unknown


def _scalar(value: object) -> _Value:
    # Exact types only: a subclass may redefine equality, and 'bool' must not pass for 'int'.
    kind = type(value)
    if kind is bool or kind is str:
        assert isinstance(value, bool | str)
        return value
    if kind is int:
        assert isinstance(value, int)
        return value if INTEGER_MIN <= value <= INTEGER_MAX else _UNKNOWN
    if kind is float:
        assert isinstance(value, float)
        return value if math.isfinite(value) else _UNKNOWN
    return _UNKNOWN


def _truth(value: bool) -> Truth:
    return Truth.TRUE if value else Truth.FALSE


def _compare(op: CompareOp, left: LiteralValue, right: LiteralValue) -> Truth:
    kind = _type_name(left)
    if kind != _type_name(right):
        return Truth.UNKNOWN
    if op is CompareOp.EQ:
        return _truth(left == right)
    if op is CompareOp.NE:
        return _truth(left != right)
    if kind == "boolean":
        return Truth.UNKNOWN
    # Same kind, not boolean: two strings (code-point order) or two numbers
    # (exact: Python compares int with float by mathematical value).
    if isinstance(left, str) or isinstance(right, str):
        assert isinstance(left, str) and isinstance(right, str)
        sign = (left > right) - (left < right)
    else:
        sign = (left > right) - (left < right)
    if op is CompareOp.LT:
        return _truth(sign < 0)
    if op is CompareOp.LE:
        return _truth(sign <= 0)
    if op is CompareOp.GT:
        return _truth(sign > 0)
    return _truth(sign >= 0)


class _Evaluator:
    def __init__(self, bindings: Mapping[str, object]) -> None:
        self._bindings = bindings

    def _lookup(self, name: str) -> object:
        return self._bindings.get(name, _UNKNOWN)

    def value(self, expr: Expr) -> _Value:
        if isinstance(expr, Literal):
            return expr.value
        if isinstance(expr, Name):
            return _scalar(self._lookup(expr.name))
        truth = self.truth(expr)
        return _UNKNOWN if truth is Truth.UNKNOWN else truth is Truth.TRUE

    def collection(self, collection: ListLiteral | Name) -> list[LiteralValue] | _Unknown:
        if isinstance(collection, ListLiteral):
            return [item.value for item in collection.items]
        bound = self._lookup(collection.name)
        if type(bound) is not list and type(bound) is not tuple:
            return _UNKNOWN
        assert isinstance(bound, list | tuple)
        items: list[LiteralValue] = []
        for element in bound:
            scalar = _scalar(element)
            if scalar is _UNKNOWN:
                return _UNKNOWN
            assert not isinstance(scalar, _Unknown)
            items.append(scalar)
        return items

    def truth(self, expr: Expr) -> Truth:
        if isinstance(expr, Literal | Name):
            value = self.value(expr)
            return _truth(value) if isinstance(value, bool) else Truth.UNKNOWN
        if isinstance(expr, Compare):
            left, right = self.value(expr.left), self.value(expr.right)
            if isinstance(left, _Unknown) or isinstance(right, _Unknown):
                return Truth.UNKNOWN
            return _compare(expr.op, left, right)
        if isinstance(expr, In):
            result = self._membership(expr)
            return _negate(result) if expr.negated else result
        if isinstance(expr, Not):
            return _negate(self.truth(expr.operand))
        # Kleene: in 'and' FALSE dominates, in 'or' TRUE does; otherwise any UNKNOWN makes UNKNOWN.
        dominant = Truth.FALSE if isinstance(expr, And) else Truth.TRUE
        result = Truth.FALSE if dominant is Truth.TRUE else Truth.TRUE
        for operand in expr.operands:
            truth = self.truth(operand)
            if truth is dominant:
                return dominant
            if truth is Truth.UNKNOWN:
                result = Truth.UNKNOWN
        return result

    def _membership(self, expr: In) -> Truth:
        item = self.value(expr.item)
        items = self.collection(expr.collection)
        if isinstance(item, _Unknown) or isinstance(items, _Unknown):
            return Truth.UNKNOWN
        result = Truth.FALSE
        for element in items:
            equal = _compare(CompareOp.EQ, item, element)
            if equal is Truth.TRUE:
                return Truth.TRUE
            if equal is Truth.UNKNOWN:
                result = Truth.UNKNOWN
        return result


def _negate(truth: Truth) -> Truth:
    if truth is Truth.UNKNOWN:
        return truth
    return Truth.FALSE if truth is Truth.TRUE else Truth.TRUE


def evaluate(expr: Expr, bindings: Mapping[str, object]) -> Truth:
    """The truth of ``expr`` under ``bindings`` (keys are whole dotted names); never raises.

    Like :func:`render`, it recurses along the tree's height, which
    :func:`parse` bounds; a tree built by hand is the builder's to keep shallow.
    """
    return _Evaluator(bindings).truth(expr)


__all__ = [
    "INTEGER_MAX",
    "INTEGER_MIN",
    "KEYWORDS",
    "MAX_DEPTH",
    "MAX_LIST_ITEMS",
    "MAX_NODES",
    "MAX_SOURCE_LENGTH",
    "MAX_STRING_LENGTH",
    "And",
    "Compare",
    "CompareOp",
    "Expr",
    "ExpressionError",
    "In",
    "ListLiteral",
    "Literal",
    "LiteralValue",
    "Name",
    "Not",
    "Or",
    "Truth",
    "evaluate",
    "names",
    "parse",
    "render",
]
