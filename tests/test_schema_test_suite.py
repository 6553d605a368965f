"""JSON-Schema-Test-Suite (draft 2020-12) against the compiled grammars, parsed with python lark.

For every case the compiler accepts, each valid instance (in canonical form) must parse and each
invalid one must not; cases it cannot express must raise SchemaNotSupported. Formats are
annotations in 2020-12 (format.json expects "2962" to be a valid email), so the suite runs with
`formats="ignore"`; asserted formats are tested in test_schema_compiler.py.

Canonical form of an instance: integer-valued floats written as integers (1.0 → 1; the grammar's
`integer` accepts integer literals only), object keys reordered as the compiler orders them
(declared properties in schema order, then undeclared required keys in the order they are
required, a dependency's key before its dependents, then the rest).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import lark
import pytest

from agentspec_sdk.errors import SchemaNotSupported
from agentspec_sdk.structure.schema_compiler import compile_schema


def shared_data() -> Path:
    env = os.environ.get("AGENTSPEC_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[1].parent / "shared" / "data"


SUITE = shared_data() / "json-schema-test-suite"
pytestmark = pytest.mark.skipif(not SUITE.is_dir(), reason=f"JSON-Schema-Test-Suite not found at {SUITE}")


# ---------------------------------------------------------------- canonical instances


def _expand(schema, root, seen=()) -> list[dict]:
    """The schema and everything it applies in place ($ref, allOf, anyOf, oneOf), in merge order."""
    if not isinstance(schema, dict):
        return []
    out = [schema]
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#") and ref not in seen:
        target = _resolve(root, ref)
        out += _expand(target, root, (*seen, ref))
    for key in ("allOf", "anyOf", "oneOf"):
        for member in schema.get(key, []) if isinstance(schema.get(key), list) else []:
            out += _expand(member, root, seen)
    return out


def _resolve(root, ref: str):
    from urllib.parse import unquote

    fragment = ref[1:]
    node = root
    if fragment and not fragment.startswith("/"):
        return None
    for raw in fragment.split("/")[1:] if fragment else []:
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def canonical(value, schemas: list, root):
    if isinstance(value, float) and value.is_integer():
        return int(value)
    applied = [s for schema in schemas for s in _expand(schema, root)]
    if isinstance(value, list):
        result = []
        for i, item in enumerate(value):
            subs = []
            for s in applied:
                prefix = s.get("prefixItems") or (s.get("items") if isinstance(s.get("items"), list) else [])
                if i < len(prefix):
                    subs.append(prefix[i])
                elif "items" in s and not isinstance(s["items"], list):
                    subs.append(s["items"])
            for s in applied:
                for v in ([s["const"]] if "const" in s else s.get("enum", []) if isinstance(s.get("enum"), list) else []):
                    if isinstance(v, list) and i < len(v):
                        subs.append({"const": v[i]})
            result.append(canonical(item, subs, root))
        return result
    if isinstance(value, dict):
        declared, required, shapes = [], [], []
        for s in list(applied):
            for keyword in ("dependencies", "dependentRequired", "dependentSchemas"):
                for key, dep in (s.get(keyword) or {}).items() if isinstance(s.get(keyword), dict) else ():
                    if key in value:  # the compiler requires a dependency's key, then its dependents
                        applied.append({"required": [key, *dep]} if isinstance(dep, list) else {"required": [key]})
                        if isinstance(dep, dict):
                            applied.extend(_expand(dep, root))
        for s in applied:
            declared += list(s.get("properties", {}) or {})
            required += [r for r in s.get("required", []) if isinstance(r, str)]
            for v in ([s["const"]] if "const" in s else s.get("enum", []) if isinstance(s.get("enum"), list) else []):
                if isinstance(v, dict):
                    shapes.append(v)
        order = list(dict.fromkeys([*declared, *required, *(k for shape in shapes for k in shape)]))
        keys = sorted(value, key=lambda k: (order.index(k) if k in order else len(order)))
        out = {}
        for k in keys:
            subs = []
            for s in applied:
                props = s.get("properties", {}) or {}
                if k in props:
                    subs.append(props[k])
                else:
                    for pattern, sub in (s.get("patternProperties") or {}).items():
                        if re.search(pattern, k):
                            subs.append(sub)
                    if isinstance(s.get("additionalProperties"), dict):
                        subs.append(s["additionalProperties"])
            subs += [{"const": shape[k]} for shape in shapes if k in shape]
            out[k] = canonical(value[k], subs, root)
        return out
    return value


def dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# ---------------------------------------------------------------- the run


def run_suite() -> dict:
    stats = {"cases": 0, "supported": 0, "unsupported": 0, "instances": 0, "wrong": []}
    for path in sorted(SUITE.glob("*.json")):
        for case in json.loads(path.read_text()):
            stats["cases"] += 1
            schema = case["schema"]
            where = f"{path.name}: {case['description']}"
            try:
                grammar = compile_schema(schema, formats="ignore")
            except SchemaNotSupported:
                stats["unsupported"] += 1
                continue
            except Exception as exc:  # anything else is a bug: record it
                stats["wrong"].append(f"{where}: compiler crashed: {exc!r}")
                continue
            stats["supported"] += 1
            try:
                parser = lark.Lark(grammar)
            except Exception as exc:
                stats["wrong"].append(f"{where}: lark rejects the grammar: {exc!r}")
                continue
            for test in case["tests"]:
                stats["instances"] += 1
                text = dumps(canonical(test["data"], [schema], schema))
                try:
                    parser.parse(text)
                    accepted = True
                except lark.exceptions.LarkError:
                    accepted = False
                if accepted != test["valid"]:
                    stats["wrong"].append(f"{where} / {test['description']}: {text} valid={test['valid']}")
    return stats


def test_suite_is_fully_correct_on_supported_cases(capsys):
    stats = run_suite()
    with capsys.disabled():
        print(
            f"\nJSON-Schema-Test-Suite 2020-12: {stats['cases']} cases, {stats['supported']} supported, "
            f"{stats['unsupported']} unsupported (SchemaNotSupported), {stats['instances']} instances checked, "
            f"{len(stats['wrong'])} wrong"
        )
    assert not stats["wrong"], "\n".join(stats["wrong"][:40])
    assert stats["supported"] >= 170  # regression guard on coverage (178 supported when written)
