"""Whether `anyOf`/`oneOf` branches may share an instance: the proofs a `oneOf` needs to be compiled
as an alternative (exactly one branch holds), and an `anyOf` beside `unevaluated*`."""

from __future__ import annotations

from agentspec_sdk.structure.schema.algebra import (
    ANNOTATIONS,
    HANDLED,
    TYPES,
    UNSUPPORTED,
    distinguished,
    forbids,
    identity,
    merge,
    satisfies,
    types_of,
)
from agentspec_sdk.structure.schema.string_formats import FORMATS

__all__ = ["OBJECT_KEYWORDS", "disjoint", "objects_only"]

# keywords that constrain objects only: a schema made of these (and annotations) holds for every
# value of another type
OBJECT_KEYWORDS = frozenset({
    "properties", "required", "additionalProperties", "patternProperties", "minProperties",
    "maxProperties", "dependencies", "dependentRequired", "dependentSchemas", "propertyNames",
    "unevaluatedProperties",
})


def disjoint(schemas: list[dict], raw: list[dict], matters: set | None = None) -> bool:
    """Whether no instance can match two branches (merged with their siblings; `raw`: as
    written, whose additionalProperties speaks of the branch's own properties only). The
    proofs by keys (`distinguished`, `forbids`) speak of objects only: they count where the
    two branches share no other kind of value (`{"required": ["a"]}` holds for every string),
    or none that `matters` (the kinds of value on which an overlap would matter; None: all)."""
    sets = [_value_kinds(s) for s in schemas]
    for a in range(len(sets)):
        for b in range(a + 1, len(sets)):
            if not _kinds_overlap(sets[a], sets[b], schemas[a], schemas[b]):
                continue
            if _objects_at_most(sets[a], sets[b], matters) and (
                    distinguished(schemas[a], schemas[b]) or forbids(raw[a], schemas[b])
                    or forbids(raw[b], schemas[a])):
                continue
            return False
    return True


def objects_only(merged: list, pointer: str) -> list | None:
    """oneOf branches restricted to objects, when that is what the oneOf means: two branches
    (merged with their siblings) that constrain nothing but objects both hold for every
    non-object value, so no non-object value matches exactly one branch. None otherwise."""
    free = [m for _, m in merged
            if all(k in ANNOTATIONS or k in OBJECT_KEYWORDS or k not in HANDLED | UNSUPPORTED
                   for k in m)]
    if len(free) < 2:
        return None
    out = []
    for i, m in merged:
        restricted = merge(m, {"type": "object"}, pointer)
        if restricted is not False:
            out.append((i, restricted))
    return out


def _objects_at_most(x: set, y: set, matters: set | None = None) -> bool:
    """Whether the values two branches' kinds share (of those that matter) can only be objects."""
    if matters is not None:
        return not ((x & y) - {"object"}) & matters
    if any(isinstance(k, tuple) for k in x | y):  # literals: the keys' proofs do not apply
        return False
    return x & y <= {"object"}


def _kinds_overlap(x: set, y: set, schema_x: dict, schema_y: dict) -> bool:
    """Whether two branches' value kinds may share an instance: literals against literals by
    value, a literal against a typed branch by whether it passes that branch's scalar keywords
    (`{"const": 1}` overlaps `{"type": "integer"}`, not `{"type": "integer", "minimum": 5}`)."""
    lits_x = [k for k in x if isinstance(k, tuple)]
    lits_y = [k for k in y if isinstance(k, tuple)]
    if lits_x and lits_y:
        return bool(x & y)
    if lits_x or lits_y:
        literal_schema, other = (schema_x, schema_y) if lits_x else (schema_y, schema_x)
        values = literal_schema["enum"] if "enum" in literal_schema else [literal_schema["const"]]
        return any(satisfies(v, other, FORMATS) for v in values)
    return bool(x & y)


def _value_kinds(schema: dict) -> set[str]:
    if "enum" in schema or "const" in schema:
        values = schema.get("enum", []) if "enum" in schema else [schema["const"]]
        if not isinstance(values, list):
            return set(TYPES)
        return {("lit", identity(v)) for v in values}
    types = types_of(schema)
    kinds = set(types or TYPES)
    if "integer" in kinds:
        kinds.add("number")
    if schema.get("nullable") is True:
        kinds.add("null")
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return set(TYPES)
    return kinds
