"""BFCL function docs use their own type names ("dict", "float", "tuple", "any", Java/JS names);
`normalise_bfcl_schema` maps a BFCL `parameters` object to standard JSON Schema."""

from __future__ import annotations

from agentspec_sdk.errors import InvalidSchema

BFCL_TYPES = {
    "dict": "object", "hashmap": "object", "object": "object",
    "float": "number", "double": "number", "number": "number",
    "integer": "integer", "int": "integer", "long": "integer", "short": "integer", "byte": "integer",
    "tuple": "array", "array": "array", "arraylist": "array", "list": "array",
    "string": "string", "char": "string", "str": "string",
    "boolean": "boolean", "bool": "boolean",
    "null": "null",
}
UNTYPED = {"any", ""}
NON_STANDARD_KEYS = {"optional"}  # BFCL marks optional parameters; `required` already says it


def normalise_bfcl_schema(schema, pointer: str = ""):
    """A copy of a BFCL parameter schema in standard JSON Schema (recursively)."""
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict):
        raise InvalidSchema(f"a BFCL schema must be an object, got {type(schema).__name__}", pointer)
    out = {}
    for key, value in schema.items():
        if key in NON_STANDARD_KEYS:
            continue
        if key == "type":
            mapped = _type(value, pointer)
            if mapped is not None:
                out["type"] = mapped
        elif key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(value, dict):
            out[key] = {name: normalise_bfcl_schema(sub, f"{pointer}/{key}/{name}") for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "additionalItems", "not") and isinstance(value, dict | bool):
            out[key] = normalise_bfcl_schema(value, f"{pointer}/{key}")
        elif key in ("items", "prefixItems", "anyOf", "oneOf", "allOf") and isinstance(value, list):
            out[key] = [normalise_bfcl_schema(sub, f"{pointer}/{key}/{i}") for i, sub in enumerate(value)]
        else:
            out[key] = value
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["properties"] = {}
    return out


def _type(value, pointer: str):
    names = value if isinstance(value, list) else [value]
    mapped = []
    for name in names:
        if not isinstance(name, str):
            raise InvalidSchema(f"type must be a string, got {name!r}", f"{pointer}/type")
        if name.strip().lower() in UNTYPED:
            return None
        standard = BFCL_TYPES.get(name.strip().lower())
        if standard is None:
            raise InvalidSchema(f"unknown BFCL type {name!r}", f"{pointer}/type")
        mapped.append(standard)
    return mapped[0] if len(mapped) == 1 else mapped
