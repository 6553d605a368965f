"""Real tool schemas for the native-format tests, and one valid instance of each tool's arguments.

The tools: BFCL's function docs (`bfcl.function_tool`, first entries of BFCL_v4_simple_python) and the
tools of the bundled multi-turn traces. `instance(schema)` writes one value the schema accepts (every
property set, checked with jsonschema by the caller), so the tests feed real argument shapes: nested
objects, arrays, enums, integers with bounds, nullable values, booleans.
"""

from __future__ import annotations

import re

import pytest

from agentspec_sdk.replay.trace import bundled_traces, load_traces
from agentspec_sdk.structure.tools import ToolRegistry

PY_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
TEXT = 'a "quoted" [x] {y} ü\n'  # quotes, brackets, braces, non-ASCII and a newline in one string


def validator(schema):
    import jsonschema

    return jsonschema.validators.validator_for(schema)(schema)


def bfcl_registry(limit: int = 12, python_names: bool = False) -> ToolRegistry:
    pytest.importorskip("bfcl_eval", reason="bfcl-eval missing: scripts/setup.sh installs it")
    from agentspec_sdk import bfcl

    reg, seen = ToolRegistry(), set()
    for entry in bfcl.read_jsonl("BFCL_v4_simple_python.json"):
        for doc in entry["function"]:
            if doc["name"] in seen or (python_names and not PY_NAME.fullmatch(doc["name"])):
                continue
            seen.add(doc["name"])
            reg.add(bfcl.function_tool(doc))
        if len(reg) >= limit:
            return reg
    return reg


def trace_registry(limit: int = 17) -> ToolRegistry:
    episode = load_traces(bundled_traces("tool_calls"), limit=1)[0]
    reg = ToolRegistry()
    for tool in episode.tools[:limit]:
        reg.add(tool)
    return reg


def instance(schema, depth: int = 0):
    """One value `schema` accepts (simple JSON Schema: what tool parameters use)."""
    if not isinstance(schema, dict) or depth > 6:
        return TEXT
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return instance(schema[key][0], depth + 1)
    if "enum" in schema:
        return schema["enum"][-1]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties", {})
        return {k: instance(v, depth + 1) for k, v in props.items()}
    if kind == "array":
        n = max(2, schema.get("minItems", 0))
        n = min(n, schema.get("maxItems", n))
        return [instance(schema.get("items", {"type": "string"}), depth + 1) for _ in range(n)]
    if kind == "integer":
        lo = schema.get("minimum", -3)
        return max(lo, min(-3, schema.get("maximum", -3)))
    if kind == "number":
        return max(schema.get("minimum", -2.5), min(2.5, schema.get("maximum", 2.5)))
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return TEXT


def calls_for(registry: ToolRegistry, validator) -> list[tuple[str, dict]]:
    """(name, arguments) for every tool whose instance its schema accepts (asserted: most do)."""
    out = []
    for tool in registry.tools:
        args = instance(tool.parameters)
        if validator(tool.parameters).is_valid(args):
            out.append((tool.name, args))
    assert len(out) >= 0.8 * len(registry), f"only {len(out)} of {len(registry)} instances valid"
    return out
