"""JSON punctuation, whitespace, keys and literal values as grammar IR, split into lexemes the
way every schema rule splits them.

Every lexeme is one whole JSON token (or a fixed piece of a number: sign, integer digits,
fraction, exponent), so llguidance's lexer never has to choose between a longer and a shorter
lexeme (see `JsonTokens.key`).
"""

from __future__ import annotations

import re

from agentspec_sdk.structure.schema.algebra import canonical_literal
from agentspec_sdk.structure.schema.grammar_ir import EMPTY, Node, chars, lit, opt, rep, seq, tok

__all__ = ["JsonTokens"]

_NUMBER_PARTS = re.compile(r"(-?)(\d+)(\.\d+)?([eE][+-]?\d+)?")


_KWARG_PUNCT = {"{": "(", "}": ")", ":": "=", ",": ","}  # an object written as keyword arguments


class JsonTokens:
    """The tokens of canonical JSON; `flexible`: 1-16 blanks allowed around punctuation; `spaced`:
    ``, `` and ``: `` (json.dumps's default separators); `python`: the values as Python literals
    (``None``, ``True``, ``False``; every other canonical JSON token is a Python token already)."""

    def __init__(self, flexible: bool, *, spaced: bool = False, python: bool = False):
        self.flexible = flexible
        self.spaced = spaced and not flexible
        self.python = python

    def constant(self, value: bool | None) -> Node:
        """``null``/``true``/``false`` in this flavour."""
        return lit(canonical_literal(value, python=self.python))

    def kwarg_punct(self, c: str) -> Node:
        """Punctuation of an object written as keyword arguments ``(a=1, b=2)``: ``(`` ``)`` ``=`` ``,``
        for ``{`` ``}`` ``:`` ``,``; `spaced` puts a blank after the comma only (PEP 8's ``a=1, b=2``)."""
        out = _KWARG_PUNCT[c]
        if self.flexible:
            return seq(lit(out), self.ws()) if c == "{" else seq(self.ws(), lit(out)) if c == "}" \
                else seq(self.ws(), lit(out), self.ws())
        return lit(", ") if self.spaced and c == "," else lit(out)

    def ws(self) -> Node:
        return (opt(tok(rep(chars([(0x20, 0x20), (0x09, 0x0A), (0x0D, 0x0D)]), 1, 16))) if self.flexible
                else EMPTY)

    def punct(self, c: str) -> Node:
        if self.spaced and c in ",:":
            return lit(c + " ")
        if not self.flexible:
            return lit(c)
        if c in "{[":
            return seq(lit(c), self.ws())
        if c in "}]":
            return seq(self.ws(), lit(c))
        return seq(self.ws(), lit(c), self.ws())

    def key(self, name: str) -> Node:
        """A declared key: the JSON string alone, one lexeme (its colon is a lexeme of its own).

        Every lexeme is one whole JSON token (or a fixed piece of a number: sign, integer digits,
        fraction, exponent), so a declared key and a generic key terminal at the same position match
        the same text and llguidance's lexer hands the parser both; a key lexeme that swallowed
        its colon would be a longer match the lexer commits to (`{"a":1}` against
        anyOf[{a: string}, any object] died at the `1`)."""
        return lit(canonical_literal(name))

    def value(self, value) -> Node:
        """A JSON value as the sequence of its tokens, split where every other rule splits them
        (see `key`): an enum/const `{"a":1}` next to an object rule, or `-5.5` next to a number rule,
        must not be one longer lexeme the lexer would commit to."""
        if isinstance(value, dict):
            if not value:
                return self.empty("{", "}")
            members = [seq(self.key(k), self.punct(":"), self.value(v)) for k, v in value.items()]
            body = [members[0], *(seq(self.punct(","), m) for m in members[1:])]
            return seq(self.punct("{"), *body, self.punct("}"))
        if isinstance(value, list):
            if not value:
                return self.empty("[", "]")
            body = [self.value(value[0]), *(seq(self.punct(","), self.value(v)) for v in value[1:])]
            return seq(self.punct("["), *body, self.punct("]"))
        text = canonical_literal(value, python=self.python)
        if isinstance(value, int | float) and not isinstance(value, bool):
            sign, digits, fraction, exponent = _NUMBER_PARTS.fullmatch(text).groups()
            return seq(*(lit(part) for part in (sign, digits, fraction, exponent) if part))
        return lit(text)

    def empty(self, open_: str, close: str) -> Node:
        return seq(lit(open_), self.ws(), lit(close)) if self.flexible else seq(lit(open_), lit(close))
