"""Grammar of objects: declared keys in canonical order (the schema's `properties`, then the
undeclared `required` ones), optional members, `patternProperties` key classes, the undeclared
keys of `additionalProperties` / `unevaluatedProperties`, `minProperties` up to 1."""

from __future__ import annotations

import keyword
import re

from agentspec_sdk.errors import InvalidSchema, SchemaNotSupported
from agentspec_sdk.structure.schema.algebra import ptr
from agentspec_sdk.structure.schema.grammar_ir import EMPTY, NOTHING, Node, alt, lit, opt, rep, seq, tok
from agentspec_sdk.structure.schema.key_exclusion import string_not_in
from agentspec_sdk.structure.schema.keyword_values import non_negative_int
from agentspec_sdk.structure.schema.regex_translate import (
    PatternNotSupported,
    classify_keys,
    encode,
    parse_pattern,
)
from agentspec_sdk.structure.schema.rule_context import RuleContext

__all__ = ["object_rule"]


def object_rule(g: RuleContext, schema: dict, pointer: str, depth: int) -> Node:
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        raise InvalidSchema("properties must be an object", ptr(pointer, "properties"))
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise InvalidSchema("required must be an array of strings", ptr(pointer, "required"))
    extra = schema.get("additionalProperties", schema.get("unevaluatedProperties", not g.closed))
    if not isinstance(extra, dict | bool):
        raise InvalidSchema("additionalProperties must be a schema", ptr(pointer, "additionalProperties"))
    min_props = non_negative_int(schema, "minProperties", pointer, 0)
    if min_props > 1:
        raise SchemaNotSupported("minProperties above 1 is not supported", ptr(pointer, "minProperties"))
    pattern_props = schema.get("patternProperties") or {}
    if not isinstance(pattern_props, dict):
        raise InvalidSchema("patternProperties must be an object", ptr(pointer, "patternProperties"))
    kwargs = g.kwargs and depth == 0  # the root object of a Python call: `(a=1, b=2)`
    punct = g.tokens.kwarg_punct if kwargs else g.tokens.punct
    colon = punct(":")
    members: list[tuple[Node, bool]] = []
    declared = list(dict.fromkeys([*props, *required]))
    for name in declared:
        matching = _patterns_matching(name, pattern_props, pointer)
        if name in props:
            sub, sub_pointer = props[name], ptr(pointer, "properties", name)
        elif matching:
            sub, sub_pointer = True, ptr(pointer, "patternProperties")
        else:
            sub, sub_pointer = extra, ptr(pointer, "additionalProperties")
        if matching:
            sub = {"allOf": [sub, *matching]}
        value = g.node(sub, sub_pointer, depth + 1)
        if value == NOTHING:
            if name in required:
                return NOTHING
            continue
        key = _kwarg_name(name, ptr(pointer, "properties", name)) if kwargs else g.tokens.key(name)
        members.append((seq(key, colon, value), name in required))
    extras = []
    if pattern_props:
        extras = _pattern_extras(g, pattern_props, extra, declared, pointer, depth)
    elif extra is not False:
        value = g.node(extra, ptr(pointer, "additionalProperties"), depth + 1)
        if value != NOTHING:
            extras = [(tok(seq(lit('"'), string_not_in(declared), lit('"'))), value)]
    if kwargs and extras:
        raise SchemaNotSupported("a Python call takes its declared keyword arguments only (undeclared "
                                 "properties are allowed here)", ptr(pointer, "additionalProperties"))
    extra_member = alt(*(seq(key, colon, value) for key, value in extras)) if extras else None
    body = _members(g, members, extra_member, min_props, punct(","))
    if body == NOTHING:
        return NOTHING
    if g.tokens.flexible and body == EMPTY:
        return seq(lit("(" if kwargs else "{"), g.tokens.ws(), lit(")" if kwargs else "}"))
    return seq(punct("{"), body, punct("}"))


def _kwarg_name(name: str, pointer: str) -> Node:
    """A property as a keyword argument: a Python identifier that is not a keyword (`f(from=1)` does
    not parse), ASCII letters first as vLLM's pythonic parser requires."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name) or keyword.iskeyword(name):
        raise SchemaNotSupported(f"property {name!r} is not a Python keyword-argument name", pointer)
    return lit(name)


def _patterns_matching(name: str, pattern_props: dict, pointer: str) -> list:
    """Schemas of the patternProperties whose pattern matches a declared name."""
    matching = []
    for pattern, pschema in pattern_props.items():
        try:
            languages = classify_keys([parse_pattern(pattern), lit(name)])
        except PatternNotSupported as exc:
            raise SchemaNotSupported(f"patternProperties: {exc}",
                                     ptr(pointer, "patternProperties")) from exc
        if any(tags == frozenset({0, 1}) for tags, _ in languages):
            matching.append(pschema)
    return matching


def _pattern_extras(g: RuleContext, pattern_props: dict, extra, declared: list[str], pointer: str,
                    depth: int):
    """(key lexeme, value) for undeclared keys: keys are split into classes by the set of patterns
    they match (exactly, via a DFA); each class gets the allOf of those patterns' schemas, the
    class matching none gets additionalProperties."""
    where = ptr(pointer, "patternProperties")
    patterns = list(pattern_props)
    try:
        languages = [parse_pattern(p) for p in patterns]
        if declared:
            languages.append(alt(*(lit(n) for n in declared)))
        classes = classify_keys(languages)
    except PatternNotSupported as exc:
        raise SchemaNotSupported(f"patternProperties: {exc}", where) from exc
    out = []
    for tags, keys in classes:
        if declared and len(patterns) in tags:
            continue
        if tags:
            schemas = [pattern_props[patterns[i]] for i in sorted(tags)]
            sub = schemas[0] if len(schemas) == 1 else {"allOf": schemas}
            value = g.node(sub, ptr(where, patterns[min(tags)]), depth + 1)
        else:
            value = g.node(extra, ptr(pointer, "additionalProperties"), depth + 1)
        if value != NOTHING:
            out.append((tok(seq(lit('"'), encode(keys), lit('"'))), value))
    return out


def _members(g: RuleContext, members: list[tuple[Node, bool]], extra: Node | None,
             min_props: int, comma: Node) -> Node:
    extras_after = rep(seq(comma, extra), 0, None) if extra is not None else EMPTY
    first_required = next((i for i, (_, req) in enumerate(members) if req), None)
    if first_required is not None:
        parts = [opt(seq(m, comma)) for m, _ in members[:first_required]]
        parts.append(members[first_required][0])
        for m, req in members[first_required + 1 :]:
            parts.append(seq(comma, m) if req else opt(seq(comma, m)))
        parts.append(extras_after)
        return seq(*parts)
    # All optional: choose the first present member; the rest follow with commas.
    tail = extras_after
    shared = len(members) > 4
    options = [seq(extra, extras_after)] if extra is not None else []
    for m, _ in reversed(members):
        options.append(seq(m, tail))
        tail = seq(opt(seq(comma, m)), tail)
        if shared:
            tail = g.define("tail", tail)
    body = alt(*reversed(options)) if options else EMPTY
    if min_props == 0:
        body = opt(body) if options else EMPTY
    elif not options:
        return NOTHING
    return body

