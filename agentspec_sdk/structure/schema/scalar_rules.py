"""Grammar of the scalar types: numbers and integers within bounds, strings (length, pattern,
format)."""

from __future__ import annotations

from agentspec_sdk.errors import InvalidSchema, SchemaNotSupported
from agentspec_sdk.structure.schema import numbers
from agentspec_sdk.structure.schema.algebra import bounds, ptr
from agentspec_sdk.structure.schema.grammar_ir import NOTHING, Node, lit, seq, tok
from agentspec_sdk.structure.schema.keyword_values import non_negative_int
from agentspec_sdk.structure.schema.regex_translate import PatternNotSupported, string_content
from agentspec_sdk.structure.schema.string_formats import FORMATS, KNOWN_FORMATS

__all__ = ["number_rule", "string_rule"]


def number_rule(schema: dict, pointer: str, integer: bool) -> Node:
    lower, upper = bounds(schema, pointer)
    try:
        if integer:
            return numbers.integer_range(lower, upper)
        return numbers.number_range(lower, upper)
    except numbers.BoundNotExpressible as exc:
        raise SchemaNotSupported(str(exc), ptr(pointer, exc.keyword)) from exc


def string_rule(schema: dict, pointer: str, relax: frozenset, assert_formats: bool) -> Node:
    min_len = non_negative_int(schema, "minLength", pointer, 0)
    max_len = non_negative_int(schema, "maxLength", pointer, None)
    pattern = schema.get("pattern")
    if pattern is not None and not isinstance(pattern, str):
        raise InvalidSchema("pattern must be a string", ptr(pointer, "pattern"))
    fmt = schema.get("format")
    if fmt is not None and not isinstance(fmt, str):
        raise InvalidSchema("format must be a string", ptr(pointer, "format"))
    if fmt in FORMATS and assert_formats:
        if pattern is not None and pattern != FORMATS[fmt]:
            if "pattern" not in relax:
                raise SchemaNotSupported("format together with pattern is not expressible",
                                         ptr(pointer, "format"))
        pattern = FORMATS[fmt]
    elif fmt in KNOWN_FORMATS and assert_formats and "format" not in relax:
        raise SchemaNotSupported(f"format {fmt!r} is not supported", ptr(pointer, "format"))
    if max_len is not None and max_len < min_len:
        return NOTHING
    try:
        content = string_content(pattern, min_len, max_len)
    except PatternNotSupported as exc:
        if "pattern" not in relax:
            raise SchemaNotSupported(f"pattern: {exc}", ptr(pointer, "pattern")) from exc
        content = string_content(None, min_len, max_len)
    return tok(seq(lit('"'), content, lit('"')))
