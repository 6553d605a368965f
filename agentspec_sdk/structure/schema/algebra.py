"""Schemas as sets of instances: the vocabulary the compiler reads, and sound reasoning on schemas.

`merge` (both hold: allOf, `$ref` siblings, a branch and its siblings), `satisfies` (a literal
passes a schema's scalar keywords), `forbids` / `distinguished` / `exclusive_required_branches`
(proofs that oneOf branches cannot both hold), `constants` (the finite values a schema allows),
and the value forms the grammar is written in (`canonical_literal`, `json_equal`, `identity`).
Pure functions over JSON values; the grammar compiler (`compiler.py`) builds on them.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from fractions import Fraction

from agentspec_sdk.errors import InvalidSchema, SchemaNotSupported

MAX_BRANCH_PRODUCT = 64


ANNOTATIONS = {
    "$schema", "$id", "id", "$comment", "title", "description", "default", "examples", "example",
    "deprecated", "readOnly", "writeOnly", "$anchor", "$defs", "definitions", "contentMediaType",
    "contentEncoding", "contentSchema", "$vocabulary", "$dynamicAnchor", "$recursiveAnchor",
}


HANDLED = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "anyOf", "oneOf",
    "allOf", "$ref", "items", "prefixItems", "additionalItems", "minItems", "maxItems", "minLength",
    "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "nullable", "patternProperties", "minProperties", "uniqueItems", "dependencies",
    "dependentRequired", "dependentSchemas", "unevaluatedProperties", "unevaluatedItems",
}


# Validation keywords of drafts 4 to 2020-12 the compiler does not express. Any other keyword is
# an annotation by the specification's rules and is ignored.
UNSUPPORTED = {
    "not", "if", "then", "else",
    "propertyNames", "maxProperties", "contains", "minContains", "maxContains", "multipleOf",
    "$dynamicRef", "$recursiveRef", "extends",
    "disallow", "divisibleBy",
}


TYPES = ("null", "boolean", "object", "array", "number", "integer", "string")


PYTHON_CONSTANTS = {None: "None", True: "True", False: "False"}


def canonical_literal(value, *, python: bool = False, spaced: bool = False) -> str:
    """Canonical JSON text of a value in its own key order: compact, `ensure_ascii=False`,
    numbers in positional notation with Python's shortest round-trip digits, integer-valued ones as
    integers (`1.0` -> `1`, `1e300` -> `1` and 300 zeros, `-0.0` -> `0`, `1e-05` -> `0.00001`).

    `python`: the same text as a Python literal (``None``/``True``/``False``; JSON's strings, numbers,
    lists and objects are already Python literals of the same value). `spaced`: ``, `` and ``: ``
    between items (`json.dumps`'s default separators, what chat templates' `tojson` writes)."""
    comma, colon = (", ", ": ") if spaced else (",", ":")
    if isinstance(value, dict):
        return "{" + comma.join(f"{json_string(k)}{colon}{canonical_literal(v, python=python, spaced=spaced)}"
                                for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + comma.join(canonical_literal(v, python=python, spaced=spaced) for v in value) + "]"
    if python and (value is None or isinstance(value, bool)):
        return PYTHON_CONSTANTS[value]
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a JSON number")
        if value == 0:
            return "0"
        exact = Decimal(repr(value))  # the shortest digits that round-trip
        return format(exact.to_integral_value() if value.is_integer() else exact, "f")
    if value is None or isinstance(value, bool | int | str):
        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def json_string(key) -> str:
    if not isinstance(key, str):
        raise TypeError(f"object key {key!r} is not a string")
    return json.dumps(key, ensure_ascii=False)


def json_equal(a, b) -> bool:
    """Equality of JSON values (key order aside; 1 == 1.0, true != 1)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and a == b


def ptr(pointer: str, *parts) -> str:
    for part in parts:
        pointer += "/" + str(part).replace("~", "~0").replace("/", "~1")
    return pointer


def json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    raise InvalidSchema(f"{type(value).__name__} is not a JSON value")


def types_of(schema: dict):
    t = schema.get("type")
    if t is None:
        return []
    if isinstance(t, str):
        return [t]
    if isinstance(t, list) and all(isinstance(x, str) for x in t):
        return t
    return None


def identity(value) -> str:
    """A text equal for equal JSON values whatever their key order (for sets of constants)."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{json_string(k)}:{identity(value[k])}" for k in sorted(value)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(identity(v) for v in value) + "]"
    return canonical_literal(value)


def satisfies(value, schema: dict, formats: dict | None = None) -> bool:
    """Whether an enum/const value passes the scalar keywords beside it."""
    kind = json_type(value)
    types = types_of(schema) or []
    if schema.get("nullable") is True and types:
        types = [*types, "null"]
    if types and not (kind in types or (kind == "integer" and "number" in types)):
        return False
    if kind == "string":
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", math.inf):
            return False
        if formats and isinstance(schema.get("format"), str) and schema["format"] in formats:
            if not re.search(formats[schema["format"]], value):
                return False
    if kind in ("integer", "number"):
        lower, upper = bounds(schema, "")
        v = Fraction(value)
        if lower is not None and (v < lower[0] or (v == lower[0] and not lower[1])):
            return False
        if upper is not None and (v > upper[0] or (v == upper[0] and not upper[1])):
            return False
    if kind == "array":
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", math.inf):
            return False
    if kind == "object" and any(r not in value for r in schema.get("required", [])):
        return False
    return True


def bounds(schema: dict, pointer: str):
    """((value, inclusive) | None, (value, inclusive) | None) as Fractions, drafts 4 to 2020-12."""

    def number(key):
        value = schema[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise InvalidSchema(f"{key} must be a number", ptr(pointer, key))
        return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)

    lower = upper = None
    if "minimum" in schema:
        lower = (number("minimum"), schema.get("exclusiveMinimum") is not True)
    if "maximum" in schema:
        upper = (number("maximum"), schema.get("exclusiveMaximum") is not True)
    for key, is_lower in (("exclusiveMinimum", True), ("exclusiveMaximum", False)):
        if key in schema and not isinstance(schema[key], bool):
            bound = (number(key), False)
            current = lower if is_lower else upper
            if current is None or (bound[0] >= current[0] if is_lower else bound[0] <= current[0]):
                if is_lower:
                    lower = bound
                else:
                    upper = bound
    return lower, upper


def distinguished(a: dict, b: dict) -> bool:
    """Two object schemas that cannot both match: a key required by one with disjoint constants in
    both, or a key required by one that the other's additionalProperties: false forbids."""
    props_a, props_b = a.get("properties") or {}, b.get("properties") or {}
    req_a, req_b = set(a.get("required") or []), set(b.get("required") or [])
    for key in req_a | req_b:
        sa, sb = props_a.get(key), props_b.get(key)
        if isinstance(sa, dict) and isinstance(sb, dict):
            va, vb = constants(sa), constants(sb)
            if va is not None and vb is not None and not (va & vb):
                return True
    return forbids(a, b) or forbids(b, a)


def forbids(this: dict, other: dict) -> bool:
    """`this` (as written) forbids, or pins to other constants, a key that `other` requires."""
    props = this.get("properties") or {}
    required = other.get("required") or []
    if any(props.get(k) is False for k in required):
        return True
    if this.get("additionalProperties") is False and not this.get("patternProperties"):
        if any(k not in props or props[k] is False for k in required):
            return True
    other_props = other.get("properties") or {}
    for k in required:
        mine, theirs = constants(props.get(k)), constants(other_props.get(k))
        if mine is not None and theirs is not None and not (mine & theirs):
            return True
    return False


def strip_annotations(schema) -> object:
    if isinstance(schema, dict):
        return {k: strip_annotations(v) for k, v in schema.items() if k not in ANNOTATIONS}
    return schema


def exclusive_required_branches(base: dict, branches: list[dict]) -> list[dict] | None:
    """oneOf whose branches only add `required` sets to an object base, made exclusive exactly:
    branch i holds and, for every other branch j, some key of R_j that is not in R_i is absent.
    None when the branches do more than that (or the expansion is too large)."""
    base_props = base.get("properties") or {}
    if types_of(base) not in ([], ["object"]) or not isinstance(base_props, dict):
        return None
    required_sets = []
    for branch in branches:
        if not isinstance(branch, dict):
            return None
        for key, value in branch.items():
            if key in ANNOTATIONS or key == "required" or key not in HANDLED | UNSUPPORTED:
                continue
            if key == "type" and types_of(branch) == ["object"]:
                continue
            if key == "properties" and isinstance(value, dict) and all(
                not strip_annotations(sub)
                or (name in base_props and same(strip_annotations(sub), strip_annotations(base_props[name])))
                for name, sub in value.items()
            ):
                continue
            return None
        required = branch.get("required") or []
        if not isinstance(required, list):
            return None
        required_sets.append(list(dict.fromkeys(required)))
    out: list[dict] = []
    for i, own in enumerate(required_sets):
        choices: list[list[str]] = [[]]
        for j, other in enumerate(required_sets):
            if j == i:
                continue
            absent = [k for k in other if k not in own]
            if not absent:
                choices = []
                break
            choices = [c + [k] for c in choices for k in absent]
            if len(choices) > MAX_BRANCH_PRODUCT:
                return None
        for forbidden in choices:
            schema = merge(dict(base), {"type": "object", "required": own}, "")
            if schema is False:
                continue
            props = dict(schema.get("properties") or {})
            for k in forbidden:
                props[k] = False
            schema["properties"] = props
            out.append(schema)
    return out


def constants(schema):
    """The finite set of values a schema allows (canonical texts), or None if not known finite."""
    if not isinstance(schema, dict):
        return None
    found = []
    if "const" in schema:
        found.append({identity(schema["const"])})
    if isinstance(schema.get("enum"), list):
        found.append({identity(v) for v in schema["enum"]})
    for member in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
        inner = constants(member)
        if inner is not None:
            found.append(inner)
    if not found:
        return None
    result = found[0]
    for other in found[1:]:
        result = result & other
    return result


ARRAY_KEYS = ("prefixItems", "items", "additionalItems")


def positional(schema: dict):
    """(per-index schemas, schema for the rest) of an array schema, drafts 4 to 2020-12."""
    items = schema.get("items", True)
    if "prefixItems" in schema:
        return list(schema["prefixItems"]), items
    if isinstance(items, list):
        return list(items), schema.get("additionalItems", True)
    return [], items


def _merge_arrays(a: dict, b: dict, out: dict, pointer: str) -> None:
    """Items of two schemas that both apply: element i must match both sides' schema for i."""
    if not any(k in a for k in ARRAY_KEYS) or not any(k in b for k in ARRAY_KEYS):
        return
    (pa, ra), (pb, rb) = positional(a), positional(b)
    if not isinstance(pa, list) or not isinstance(pb, list):
        raise InvalidSchema("prefixItems must be an array of schemas", ptr(pointer, "prefixItems"))
    prefix = []
    for i in range(max(len(pa), len(pb))):
        x = pa[i] if i < len(pa) else ra
        y = pb[i] if i < len(pb) else rb
        prefix.append(x if same(x, y) else {"allOf": [x, y]})
    for key in ARRAY_KEYS:
        out.pop(key, None)
    explicit = [r for r, side in ((ra, a), (rb, b)) if explicit_rest(side)]
    rest = explicit[0] if len(explicit) == 1 or (len(explicit) == 2 and same(*explicit)) else (
        {"allOf": explicit} if explicit else None)
    if "prefixItems" in a or "prefixItems" in b:  # 2020-12's form
        if prefix:
            out["prefixItems"] = prefix
        if rest is not None:
            out["items"] = rest
    elif prefix:  # the array form of drafts up to 2019-09 (which ignore prefixItems)
        out["items"] = prefix
        if rest is not None:
            out["additionalItems"] = rest
    elif rest is not None:
        out["items"] = rest


def explicit_rest(schema: dict) -> bool:
    """Whether the schema says what items after its positional ones must be."""
    if isinstance(schema.get("items"), list):
        return "additionalItems" in schema
    return "items" in schema


def merge(a: dict, b: dict, pointer: str):
    """Sound merge of two schemas (both must hold). False when nothing can satisfy both."""
    out = dict(a)
    _merge_arrays(a, b, out, pointer)
    for key, value in b.items():
        if key in ARRAY_KEYS and any(k in a for k in ARRAY_KEYS):
            continue
        if key not in out:
            out[key] = value
            continue
        mine = out[key]
        if key in ANNOTATIONS or key not in HANDLED | UNSUPPORTED or same(mine, value):
            continue
        if key == "type":
            ta, tb = types_of(a), types_of(b)
            if ta is None or tb is None:
                raise InvalidSchema("type must be a type name or an array of them", ptr(pointer, "type"))
            both = [t for t in ta if t in tb or (t == "integer" and "number" in tb)]
            both += [t for t in tb if t == "integer" and "number" in ta and t not in both]
            if not both:
                return False
            out[key] = both
        elif key == "properties":
            if not isinstance(mine, dict) or not isinstance(value, dict):
                raise InvalidSchema("properties must be an object", ptr(pointer, "properties"))
            props = dict(mine)
            for name, sub in value.items():
                props[name] = {"allOf": [props[name], sub]} if name in props else sub
            out[key] = props
        elif key == "required":
            out[key] = list(dict.fromkeys([*mine, *value]))
        elif key in ("minLength", "minItems", "minProperties"):
            out[key] = max(mine, value)
        elif key in ("maxLength", "maxItems", "maxProperties"):
            out[key] = min(mine, value)
        elif key in ("minimum", "exclusiveMinimum") and not isinstance(mine, bool) \
                and not isinstance(value, bool):
            out[key] = max(mine, value)
        elif key in ("maximum", "exclusiveMaximum") and not isinstance(mine, bool) \
                and not isinstance(value, bool):
            out[key] = min(mine, value)
        elif key == "enum":
            out[key] = [v for v in mine if any(json_equal(v, w) for w in value)]
        elif key == "const":
            if not json_equal(mine, value):
                return False
        elif key == "additionalProperties" and isinstance(mine, dict | bool) \
                and isinstance(value, dict | bool):
            out[key] = {"allOf": [mine, value]}
        elif key in ("anyOf", "oneOf"):
            product = [{"allOf": [x, y]} for x in mine for y in value]
            if len(product) > MAX_BRANCH_PRODUCT:
                raise SchemaNotSupported(f"allOf of two {key} lists is too large to expand",
                                         ptr(pointer, key))
            if key == "oneOf":
                raise SchemaNotSupported("allOf of two oneOf lists is not expressible", ptr(pointer, key))
            out[key] = product
        else:
            raise SchemaNotSupported(f"allOf with two different {key!r} values is not expressible",
                                     ptr(pointer, key))
    # additionalProperties of one side also constrains the other side's extra properties.
    for side, other in ((a, b), (b, a)):
        if "additionalProperties" in side and side["additionalProperties"] is not True:
            own = side.get("properties") or {}
            extra_names = [n for n in (other.get("properties") or {}) if n not in own]
            if extra_names and ("patternProperties" in side or "patternProperties" in other):
                raise SchemaNotSupported("allOf with additionalProperties and patternProperties", pointer)
            props = dict(out.get("properties") or {})
            for name in extra_names:
                props[name] = {"allOf": [props[name], side["additionalProperties"]]}
            if extra_names:
                out["properties"] = props
    return out


def same(x, y) -> bool:
    return json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True)
