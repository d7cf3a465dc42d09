"""Conditions: the CEL that rules and standing grants are written in, bounded by construction.

Like ``actions.core`` this imports nothing from Django. A condition is written by a team member
(a rule, a grant's "allow the same where ...") and evaluated by the engine for every matching
interrupt, so its work must be bounded before it runs: the CEL evaluator (the Rust ``cel``
crate behind ``common-expression-language``) has no cost limit of its own and holds the GIL
while it evaluates. Two bounds, both from the parsed expression rather than its text:

- **Nesting.** Comprehensions (``all``, ``exists``, ``exists_one``, ``map``, ``filter``) nest
  at most ``MAX_MACRO_NESTING`` deep. Each level multiplies the work by a list's size.
- **Cost.** Before each evaluation, :meth:`Condition.cost` bounds the steps the condition can
  take over what it is given: every token costs one step per iteration of the comprehensions
  around it, an operation that walks a value (``in``, ``==``, ``+``, ``matches``, ...) costs
  the size of the largest value it could walk, and a list can be no larger than the largest
  one the condition is given or writes, times the concatenations it makes. Over the budget the
  condition is not run: it counts as failed, saying why. A condition whose own literals
  already exceed the budget can never run, and is refused where it is written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import cel

CONDITION_VARIABLES = ("data", "input", "action", "team", "requester")
MAX_CONDITION_CHARS = 2000
MAX_MACRO_NESTING = 2
# The slowest conditions measured take 40 to 60 ns a step (compiling a written pattern with a
# large repeated class; making a long list into Python's values), most 2 to 10 ns, on one core
# of the reference machine: 2,000,000 steps is at most about 0.1 s of evaluation, however the
# condition is written (python -m bench.conditions; bench/RESULTS.md).
CONDITION_BUDGET = 2_000_000

MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
# Operations whose work grows with the size of what they are given (a list, a map, a string).
_WALKS = frozenset(
    {"in", "==", "!=", "<", "<=", ">", ">=", "size", "string", "bytes", "int", "uint", "double"}
    | {"contains", "startsWith", "endsWith"}
)
# A string of this many characters costs about one step to read; "+" copies each character.
_CHARS_A_STEP = 64
_READS, _COPIES, _MATCHES, _MATCHES_WRITTEN, _NAMES, _PARSES = 1, 2, 3, 4, 5, 6
# Functions that parse a string character by character (about a step a character).
_PARSERS = frozenset({"duration", "timestamp"})
# Matching a string: a pattern's automaton (a repeated class is large) steps over each character.
_MATCH_STEPS_A_CHAR = 256
# "matches" compiles its pattern at each evaluation: one written in the condition (at most its
# 2,000 characters, a Unicode class repeated) takes up to 60 ms, whatever it is matched against;
# two in one budget at most.
MATCHES_STEPS = 1_000_000
# A pattern read from what the condition is given may be as long as its longest string, and
# compiling one takes time that grows with the square of its length (16,000 characters: 1 s;
# 240,000: 220 s): a step for each this many of that square.
_PATTERN_SQUARE_A_STEP = 10
# Making one value of the result into Python's: about four steps.
_BUILDS = 4

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<comment>//[^\n]*)
  | (?P<raw>(?:[bB]?[rR]|[rR][bB])(?:\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|"[^"\n]*"|'[^'\n]*'))
  | (?P<string>[bB]?(?:\"\"\"(?:\\[\s\S]|[^\\])*?\"\"\"|'''(?:\\[\s\S]|[^\\])*?'''
                     |"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))
  | (?P<number>0[xX][0-9a-fA-F]+[uU]?|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[uU]?)
  | (?P<name>[A-Za-z_]\w*)
  | (?P<op>==|!=|<=|>=|&&|\|\||[-+*/%<>!?:.,()\[\]{}])
    """,
    re.VERBOSE,
)
_WHERE = re.compile(r"<input>:(\d+):(\d+)")
_UNDEFINED = re.compile(r"Undefined variable or function: '([^']+)'")
_LITERALS = frozenset({"true", "false", "null", "in"})
_OPENS = {"(": ")", "[": "]", "{": "}"}


class ConditionError(ValueError):
    """A condition that is not CEL, names what a rule cannot see, or could never be evaluated
    within the budget; says where, or why."""

    def __init__(
        self, message: str, line: int | None = None, column: int | None = None, *, subject: str = ""
    ) -> None:
        where = f"line {line}, column {column}: " if line is not None else ""
        super().__init__(f"{subject}{where}{message}")
        self.reason, self.line, self.column = message, line, column


class ConditionTooCostly(Exception):  # noqa: N818 - says what happened, as ActionInterrupt does
    """The condition was not evaluated: over what it is given it could take more steps than the
    budget allows. It counts as failed."""

    def __init__(self, cost: int, budget: int) -> None:
        super().__init__(
            f"not evaluated: over what it was given it could take {cost:,} steps, more than the "
            f"{budget:,} left of the limit (a comprehension over a large list, or nested ones)"
        )
        self.cost, self.budget = cost, budget


@dataclass(frozen=True)
class _Token:
    kind: str  # "string", "number", "name" or "op"
    text: str


def _tokens(text: str) -> list[_Token]:
    """CEL's tokens, without spaces and comments. The text already compiled as CEL, so what is
    not recognised here (nothing should be) is kept as a one-character operator."""
    out: list[_Token] = []
    at = 0
    while at < len(text):
        found = _TOKEN.match(text, at)
        if found is None:
            out.append(_Token("op", text[at]))
            at += 1
            continue
        kind = found.lastgroup or "op"
        if kind == "raw":  # a raw string (no escapes in it): a string all the same
            kind = "string"
        if kind not in ("space", "comment"):
            out.append(_Token(kind, found.group()))
        at = found.end()
    return out


def _strings_are_strings(tokens: list[_Token]) -> bool:
    """Whether every token read as a string is one, as CEL reads it: a string's extent decides
    what the bounds see, so a misread one must refuse the condition rather than hide code."""
    for token in tokens:
        if token.kind == "string":
            try:
                value = cel.compile(token.text).execute({})
            except Exception:  # noqa: BLE001 - not a literal on its own: misread
                return False
            if not isinstance(value, (str, bytes)):
                return False
        elif token.kind == "op" and token.text in ('"', "'", "\\"):
            return False
    return True


@dataclass(frozen=True)
class Shape:
    """What bounds a condition's work, read from its tokens once, where it is compiled."""

    nesting: int  # how deep its comprehensions nest
    widest_literal: int  # the most elements of a list or map it writes
    joins: int  # how many "+" it has: each can make a list or string as long as two
    # Per token: how many comprehensions enclose it, and whether it reads (_READS), copies
    # (_COPIES) or matches a whole value (_MATCHES; _MATCHES_WRITTEN with a pattern written as a
    # string), or none of these (0).
    levels: tuple[tuple[int, int], ...] = field(repr=False)
    # Per map or filter: how many comprehensions enclose it, and whether what it makes of each
    # element may hold a whole variable (its body names data, input...), not a part of one.
    collects: tuple[tuple[int, bool], ...] = field(repr=False)
    bound_names: frozenset[str] = field(repr=False)  # the comprehensions' variables
    bare_names: tuple[str, ...] = field(repr=False)  # names read as variables

    @property
    def variable_refs(self) -> int:
        """How many times it names one of the variables it is given (data, input...)."""
        return sum(1 for name in self.bare_names if name in CONDITION_VARIABLES)


@dataclass
class _Open:
    closer: str
    macro: str  # the comprehension it opens, or ""
    elements: int
    start: int  # the index of its first token


def shape_of(text: str) -> Shape:
    tokens = _tokens(text)
    stack: list[_Open] = []
    levels: list[tuple[int, int]] = []
    collects: list[tuple[int, bool]] = []
    bound: set[str] = set()
    bare: list[tuple[int, str]] = []  # (token index, name)
    nesting = widest = joins = 0
    for index, token in enumerate(tokens):
        before = tokens[index - 1] if index else None
        after = tokens[index + 1] if index + 1 < len(tokens) else None
        depth = sum(1 for frame in stack if frame.macro)
        if token.kind == "op" and token.text in _OPENS:
            macro = ""
            if token.text == "(" and before is not None and before.kind == "name" and index >= 2:
                macro = before.text if before.text in MACROS and tokens[index - 2].text == "." else ""
            if macro and after is not None and after.kind == "name":
                bound.add(after.text)
            empty = after is not None and after.text == _OPENS[token.text]
            stack.append(_Open(_OPENS[token.text], macro, 0 if empty else 1, index + 1))
            nesting = max(nesting, depth + bool(macro))
        elif token.kind == "op" and token.text in (")", "]", "}"):
            if stack:
                closed = stack.pop()
                if closed.closer != ")":
                    widest = max(widest, closed.elements)
                if closed.macro in ("map", "filter"):
                    inside = {name for at, name in bare if at >= closed.start}
                    collects.append((depth - 1, bool(inside & set(CONDITION_VARIABLES))))
        elif token.text == "," and stack:
            stack[-1].elements += 1
        elif token.text == "+":
            joins += 1
        if (
            token.kind == "name"
            and (before is None or before.text != ".")
            and (after is None or after.text != "(")
        ):
            bare.append((index, token.text))
        work = 0
        if token.kind in ("op", "name"):
            if token.text == "matches":
                # A pattern written as a string, as the method's one argument: its own size.
                written = (
                    before is not None
                    and before.text == "."
                    and after is not None
                    and after.text == "("
                    and index + 3 < len(tokens)
                    and tokens[index + 2].kind == "string"
                    and tokens[index + 3].text == ")"
                )
                work = _MATCHES_WRITTEN if written else _MATCHES
            elif token.text == "+":
                work = _COPIES
            elif token.text in _WALKS:
                work = _READS
            elif token.text in _PARSERS and after is not None and after.text == "(":
                work = _PARSES
            elif (
                token.kind == "name"
                and token.text in CONDITION_VARIABLES
                and (before is None or before.text != ".")
            ):
                # The evaluator makes a list or map it reads anew at each reading (a comprehension
                # naming data in its body rebuilds what it reads of it at each step).
                work = _NAMES
        levels.append((depth, work))
    names = tuple(name for _, name in bare)
    return Shape(nesting, widest, joins, tuple(levels), tuple(collects), frozenset(bound), names)


@dataclass(frozen=True)
class Extent:
    """How large what a condition is given is: the most elements of one list or map, the
    longest string (or bytes), how many values there are in all, and the most values one
    element of a list holds."""

    widest: int = 0
    longest: int = 0
    total: int = 0
    element: int = 0


def extent_of(values: Any) -> Extent:
    """The extent of ``values`` (stored values nest at most 32 deep: recursion is bounded)."""
    widest = longest = element = 0

    def count(value: Any) -> int:
        nonlocal widest, longest, element
        if isinstance(value, (list, tuple, dict)):
            widest = max(widest, len(value))
            if isinstance(value, dict):  # a comprehension over a map gives its keys
                longest = max([longest, *(len(key) for key in value if isinstance(key, (str, bytes)))])
                return 1 + sum(count(item) for item in value.values())
            inner = 0
            for item in value:
                each = count(item)
                element = max(element, each)
                inner += each
            return 1 + inner
        if isinstance(value, (str, bytes)):
            longest = max(longest, len(value))
        return 1

    total = count(values)
    return Extent(widest, longest, total, element)


class ConditionInput:
    """What one interrupt's conditions read (``data``, ``input``, ``action``, ``team``,
    ``requester``), its extent, measured once for every condition evaluated over it, and the
    steps they may have taken so far: the budget is for all of them together."""

    __slots__ = ("context", "extent", "spent", "values")

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values
        self.context = cel.Context(values)
        self.extent = extent_of(values)
        self.spent = 0


@dataclass(frozen=True)
class Condition:
    """A compiled condition: evaluate it with :meth:`evaluate`, which is bounded."""

    text: str
    program: cel.Program = field(repr=False, compare=False)
    shape: Shape = field(repr=False, compare=False)

    def cost(self, extent: Extent = Extent()) -> int:
        """At most how many steps evaluating it takes over values of ``extent``.

        A list or string it reads is no larger than the largest it is given or writes, times
        the concatenations it makes. A token costs a step for each iteration of the
        comprehensions around it; one that reads or copies a value, that value's size. A map
        or filter copies what it has made so far at each step (as the evaluator does): the
        square of the list's size times what one element it makes can hold."""
        shape = self.shape
        grows = shape.joins + 1  # "a + a + a" is three times as long as a
        # Each time it names a variable, a value may hold all of it: "[input, input]" is twice
        # as large as input, and "input in [input, input, ...]" walks each copy.
        refs = max(shape.variable_refs, 1)
        size = max(extent.widest, shape.widest_literal, 1) * grows
        longest = extent.longest * grows
        values = (max(extent.total, 1) * refs + shape.widest_literal) * grows  # "==" may walk all
        chars = refs * (1 + longest // _CHARS_A_STEP)  # and read each copy's longest string
        matching = values + chars + MATCHES_STEPS + refs * longest * _MATCH_STEPS_A_CHAR
        each = {
            0: 1,
            _READS: values + chars,
            _COPIES: max(size, longest),
            _NAMES: max(extent.total, 1) * grows,
            _PARSES: values + refs * longest,
            _MATCHES_WRITTEN: matching,
            _MATCHES: matching + refs * longest**2 // _PATTERN_SQUARE_A_STEP,
        }
        steps = sum(int(size**depth) * each[work] for depth, work in shape.levels)
        whole, part = values, max(extent.element, shape.widest_literal, 1) * grows
        collected = sum(
            int(size ** (depth + 2)) * (whole if named else part) for depth, named in shape.collects
        )
        # The value it gives is made into Python's values, each a few steps' work: as large as
        # what it may build ("[input, input]" is not true or false, and fails only once made).
        return steps + collected + _BUILDS * (values + chars)

    def evaluate(self, given: ConditionInput, budget: int = CONDITION_BUDGET) -> Any:
        """The condition's value over ``given``; ConditionTooCostly (without evaluating) when it
        could take more steps than are left of ``budget`` for ``given``, and whatever CEL raises
        when it fails."""
        cost = self.cost(given.extent)
        if given.spent + cost > budget:
            raise ConditionTooCostly(cost, budget - given.spent)
        given.spent += cost
        return self.program.execute(given.context)


def _unknown_name(shape: Shape) -> str:
    """A variable the condition reads that is not one of the five (nor a comprehension's, nor
    a name CEL knows, such as a type). "" when there is none. Functions are not checked here:
    CEL tells an unknown one from a known one only by its arguments' types, so a misspelt
    function fails when evaluated (the dry run shows it, and the interrupt is left to people)."""
    known = shape.bound_names | _LITERALS | set(CONDITION_VARIABLES)
    context = cel.Context(dict.fromkeys(CONDITION_VARIABLES))
    for name in shape.bare_names:
        if name in known:
            continue
        try:
            cel.compile(name).execute(context)
        except RuntimeError as exc:
            if _UNDEFINED.search(str(exc)):
                return name
        except Exception:  # noqa: BLE001, S112 - known, and failing for its value
            continue
    return ""


def compile_condition(text: str, budget: int = CONDITION_BUDGET) -> Condition:
    """The compiled condition, or ConditionError naming the line and column of the mistake.
    A condition reads ``data`` (what the interrupt asks), ``input`` (what the paused call was
    given), ``action``, ``team`` (its slug) and ``requester`` (who started the run): another
    name is refused here rather than failing each time a rule is evaluated. So is one that
    nests comprehensions too deep, or whose own lists already take more than ``budget`` steps."""
    if not text or not text.strip():
        raise ConditionError("the condition is empty")
    if len(text) > MAX_CONDITION_CHARS:
        raise ConditionError(f"the condition is longer than {MAX_CONDITION_CHARS} characters")
    if "\x00" in text:
        raise ConditionError("the condition contains a NUL character")
    try:
        program = cel.compile(text)
    except ValueError as exc:
        detail = str(exc)
        found = _WHERE.search(detail)
        reason = detail.split("Syntax error: ", 1)[-1].split("\n", 1)[0].split(" expecting ", 1)[0]
        reason = reason.replace("mismatched input '<EOF>'", "the condition ends too early")
        if found:
            raise ConditionError(reason, int(found[1]), int(found[2])) from None
        raise ConditionError(reason) from None
    if not _strings_are_strings(_tokens(text)):
        raise ConditionError("the condition has a string this check cannot read; write it more plainly")
    shape = shape_of(text)
    if shape.nesting > MAX_MACRO_NESTING:
        raise ConditionError(
            f"comprehensions (all, exists, exists_one, map, filter) nest at most {MAX_MACRO_NESTING} deep"
        )
    if unknown := _unknown_name(shape):
        raise ConditionError(
            f"there is no variable {unknown!r}; a condition can read {', '.join(CONDITION_VARIABLES)}"
        )
    condition = Condition(text, program, shape)
    if (floor := condition.cost()) > budget:
        raise ConditionError(
            f"the condition could never be evaluated: its own lists already take {floor:,} steps, "
            f"more than the limit of {budget:,}"
        )
    return condition
