"""Grammars for JSON integers and numbers within bounds.

Integers: canonical decimal (no leading zeros, no `-0`), any bounds, exactly (digit-range
construction). Numbers: without bounds any JSON number form; with bounds, written without exponent
(`-?int(.digits)?`), exactly, for decimal bounds (compared digit by digit). Raises
`BoundNotExpressible` for bounds with more than 40 decimals. `-0`/`-0.0` are not produced.

Every alternative is its own lexical unit (`Tok`), so alternatives live at rule level: python
lark's regex matching is leftmost-first, not longest, so `[0-9]|[1-9][0-9]+` inside one regex would
stop after the first digit. Each unit here is fixed-length or a greedy repetition.
"""

from __future__ import annotations

import math
from fractions import Fraction

from agentspec_sdk.errors import BoundNotExpressible
from agentspec_sdk.structure.schema.grammar_ir import (
    EMPTY,
    NOTHING,
    Node,
    alt,
    chars,
    lit,
    opt,
    rep,
    seq,
    tok,
)

DIGIT = chars([(0x30, 0x39)])
NONZERO = chars([(0x31, 0x39)])
Bound = tuple[Fraction, bool] | None  # (value, inclusive)


def _digits_same_length(x: str, y: str) -> Node:
    """Decimal strings of len(x) digits between x and y (inclusive), leading zeros allowed."""
    n = len(x)
    if x == y:
        return lit(x)
    if n == 1:
        return chars([(ord(x), ord(y))])
    if x[0] == y[0]:
        return seq(lit(x[0]), _digits_same_length(x[1:], y[1:]))
    low_full, high_full = x[1:] == "0" * (n - 1), y[1:] == "9" * (n - 1)
    first_mid = ord(x[0]) + (0 if low_full else 1)
    last_mid = ord(y[0]) - (0 if high_full else 1)
    options = []
    if not low_full:
        options.append(seq(lit(x[0]), _digits_same_length(x[1:], "9" * (n - 1))))
    if first_mid <= last_mid:
        options.append(seq(chars([(first_mid, last_mid)]), rep(DIGIT, n - 1, n - 1)))
    if not high_full:
        options.append(seq(lit(y[0]), _digits_same_length("0" * (n - 1), y[1:])))
    return alt(*options)


def natural_range(lo: int, hi: int | None) -> Node:
    """Canonical decimal naturals in [lo, hi] (hi None: unbounded); lo >= 0."""
    if hi is not None and hi < lo:
        return NOTHING
    low_len = len(str(lo))
    if hi is None:
        return alt(
            tok(_digits_same_length(str(lo), "9" * low_len)),
            tok(seq(NONZERO, rep(DIGIT, low_len, None))),
        )
    options = []
    for length in range(low_len, len(str(hi)) + 1):
        a = lo if length == low_len else 10 ** (length - 1)
        b = hi if length == len(str(hi)) else 10**length - 1
        options.append(tok(_digits_same_length(str(a), str(b))))
    return alt(*options)


def integer_range(lower: Bound, upper: Bound) -> Node:
    lo = None if lower is None else (math.ceil(lower[0]) if lower[1] else math.floor(lower[0]) + 1)
    hi = None if upper is None else (math.floor(upper[0]) if upper[1] else math.ceil(upper[0]) - 1)
    if lo is not None and hi is not None and hi < lo:
        return NOTHING
    options = []
    if lo is None or lo < 0:
        magnitude_lo = 1 if hi is None or hi >= 0 else -hi
        magnitude_hi = None if lo is None else -lo
        options.append(seq(lit("-"), natural_range(magnitude_lo, magnitude_hi)))
    if hi is None or hi >= 0:
        options.append(natural_range(max(lo, 0) if lo is not None else 0, hi))
    return alt(*options)


_FRACTION_ANY = opt(tok(seq(lit("."), rep(DIGIT, 1, None))))
_EXPONENT = opt(tok(seq(chars([(0x45, 0x45), (0x65, 0x65)]), opt(chars([(0x2B, 0x2B), (0x2D, 0x2D)])),
                        rep(DIGIT, 1, None))))


def _digits(lo: int, hi: int) -> Node:
    return chars([(0x30 + lo, 0x30 + hi)]) if lo <= hi else NOTHING


_ANY_DIGITS = rep(DIGIT, 0, None)


def _fractions(low: tuple[str, str] | None, high: tuple[str, str] | None) -> tuple[bool, Node]:
    """Fraction digit strings s with 0.s above `low` and below `high`, each (digits, op) with op in
    ge/gt (low) or le/lt (high): (whether the empty string qualifies, the non-empty ones)."""
    if low is not None and low == ("", "ge"):
        low = None
    if low is None and high is None:
        return True, rep(DIGIT, 1, None)
    if high is None and low == ("", "gt"):
        return False, seq(rep(lit("0"), 0, None), NONZERO, _ANY_DIGITS)
    if low is None and high == ("", "le"):
        return True, rep(lit("0"), 1, None)
    if high is not None and high[0] == "" and (high[1] == "lt" or low is not None):
        return False, NOTHING  # below 0, or above something positive and at most 0
    empty_ok = (low is None) and (high is None or high[1] == "le" or high[0] != "")
    l0, l_rest = (int(low[0][0]), low[0][1:]) if low is not None and low[0] else (0, "")
    h0, h_rest = (int(high[0][0]), high[0][1:]) if high is not None and high[0] else (9, None)
    options = []
    free_lo = l0 + 1 if low is not None else 0
    free_hi = h0 - 1 if high is not None else 9
    options.append(seq(_digits(free_lo, free_hi), _ANY_DIGITS))
    for c in sorted({l0 if low is not None else -1, h0 if high is not None else -1} - {-1}):
        if c < (l0 if low is not None else 0) or c > (h0 if high is not None else 9):
            continue
        next_low = (l_rest, low[1]) if low is not None and c == l0 else None
        next_high = (h_rest, high[1]) if high is not None and c == h0 and h_rest is not None else None
        if low is not None and c == l0 and not low[0]:
            next_low = low  # the lower bound is 0: still owed a non-zero digit (gt)
        empty, tail = _fractions(next_low, next_high)
        options.append(seq(lit(str(c)), alt(EMPTY, tail) if empty else tail))
    return empty_ok, alt(*(o for o in options if o != NOTHING))


def _fraction_part(low: tuple[str, str] | None, high: tuple[str, str] | None) -> Node:
    empty, body = _fractions(low, high)
    written = tok(seq(lit("."), body)) if body != NOTHING else NOTHING
    return alt(EMPTY, written) if empty else written


def _split(value: Fraction) -> tuple[int, str]:
    """Integer part and fraction digits of a non-negative terminating decimal."""
    whole = math.floor(value)
    rest, digits = value - whole, ""
    while rest:
        rest *= 10
        digit = math.floor(rest)
        digits += str(digit)
        rest -= digit
        if len(digits) > 40:
            raise BoundNotExpressible("a bound with more than 40 decimals is not expressible", "minimum")
    return whole, digits


def _non_negative_decimal(low: Fraction, low_inclusive: bool, high: Fraction | None,
                          high_inclusive: bool) -> Node:
    """Decimals y >= 0 (no exponent) with low <(=) y <(=) high, 0 <= low."""
    low_int, low_digits = _split(low)
    low_op = "ge" if low_inclusive else "gt"
    if high is None:
        return alt(
            seq(natural_range(low_int + 1, None), _FRACTION_ANY),
            seq(lit(str(low_int)), _fraction_part((low_digits, low_op), None)),
        )
    high_int, high_digits = _split(high)
    high_op = "le" if high_inclusive else "lt"
    if high_int > low_int:
        return alt(
            seq(natural_range(low_int + 1, high_int - 1), _FRACTION_ANY),
            seq(lit(str(low_int)), _fraction_part((low_digits, low_op), None)),
            seq(lit(str(high_int)), _fraction_part(None, (high_digits, high_op))),
        )
    return seq(lit(str(low_int)), _fraction_part((low_digits, low_op), (high_digits, high_op)))


def number_range(lower: Bound, upper: Bound) -> Node:
    if lower is None and upper is None:
        return seq(opt(lit("-")), natural_range(0, None), _FRACTION_ANY, _EXPONENT)
    if lower is not None and upper is not None and (upper[0] < lower[0]
                                                    or (upper[0] == lower[0]
                                                        and not (lower[1] and upper[1]))):
        return NOTHING
    options = []
    if lower is None or lower[0] < 0:
        # x = -y with y > 0
        y_low = (-upper[0], upper[1]) if upper is not None and upper[0] < 0 else (Fraction(0), False)
        y_high = (-lower[0], lower[1]) if lower is not None else (None, True)
        options.append(seq(lit("-"), _non_negative_decimal(y_low[0], y_low[1], y_high[0], y_high[1])))
    if upper is None or upper[0] > 0 or (upper[0] == 0 and upper[1]):
        low = lower if lower is not None and lower[0] >= 0 else (Fraction(0), True)
        high = upper if upper is not None else (None, True)
        options.append(_non_negative_decimal(low[0], low[1], high[0], high[1]))
    return alt(*options)
