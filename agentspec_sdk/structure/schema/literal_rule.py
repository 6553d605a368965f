"""Grammar of `enum` / `const`: each allowed value as the tokens of its canonical text."""

from __future__ import annotations

from agentspec_sdk.errors import InvalidSchema, SchemaNotSupported
from agentspec_sdk.structure.schema.algebra import HANDLED, UNSUPPORTED, json_equal, ptr, satisfies
from agentspec_sdk.structure.schema.grammar_ir import NOTHING, Node, alt
from agentspec_sdk.structure.schema.json_tokens import JsonTokens
from agentspec_sdk.structure.schema.string_formats import FORMATS

__all__ = ["MAX_ENUM", "literal_rule"]

MAX_ENUM = 10_000
# keywords a literal is checked against (`satisfies`) rather than refused beside enum/const
_SCALAR_CHECKS = {
    "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "minItems", "maxItems", "required", "format",
}


def literal_rule(schema: dict, pointer: str, tokens: JsonTokens) -> Node:
    if "const" in schema:
        values, where = [schema["const"]], ptr(pointer, "const")
    else:
        values, where = schema["enum"], ptr(pointer, "enum")
        if not isinstance(values, list):
            raise InvalidSchema("enum must be an array", where)
        if len(values) > MAX_ENUM:
            raise SchemaNotSupported(f"enum has {len(values)} values, above the limit of {MAX_ENUM}",
                                     where)
    if "const" in schema and "enum" in schema:
        values = ([v for v in values if any(json_equal(v, e) for e in schema["enum"])]
                  if isinstance(schema["enum"], list) else values)
    others = ((set(schema) & (HANDLED | UNSUPPORTED)) - {"enum", "const", "type", "nullable"}
              - _SCALAR_CHECKS)
    if others:
        raise SchemaNotSupported(f"enum/const combined with {sorted(others)} is not supported", where)
    kept = []
    for value in values:
        try:
            if satisfies(value, schema, FORMATS):
                kept.append(tokens.value(value))
        except (ValueError, TypeError) as exc:
            raise InvalidSchema(f"enum/const value is not JSON: {exc}", where) from exc
    null = tokens.constant(None)
    if schema.get("nullable") is True and null not in kept:
        if any(v is None for v in values):
            kept.append(null)
    return alt(*kept) if kept else NOTHING
