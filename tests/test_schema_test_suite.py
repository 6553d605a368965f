"""JSON-Schema-Test-Suite (draft 2020-12) against the compiled grammars, under three judges:
python lark, llguidance (LLMatcher fed SmolLM2's tokens: what vLLM enforces) and xgrammar (on the
EBNF rendering).

For every case the compiler accepts, each valid instance (in canonical form) must be accepted and
each invalid one rejected by every judge; cases it cannot express must raise SchemaNotSupported.
After prefixes of the valid instances, llguidance's and xgrammar's next-byte masks must be equal
(dottxt's mask-level comparison: a lexer that commits to the wrong lexeme shows up here). Formats are
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

import pytest

from agentspec_sdk.errors import SchemaNotSupported
from agentspec_sdk.structure.grammar_checks import JUDGES
from agentspec_sdk.structure.schema_compiler import schema_rules


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


@pytest.fixture(scope="module")
def checker():
    transformers = pytest.importorskip("transformers")
    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.structure.grammar_checks import GrammarChecker

    return GrammarChecker(transformers.AutoTokenizer.from_pretrained(str(resolve_model())))


MASK_PREFIXES = 6  # prefixes per valid instance whose next-byte masks are compared


def mask_positions(text: str, count: int) -> list[int]:
    """`count` prefix lengths spread over the text (the start, the end and between)."""
    if len(text) <= count:
        return list(range(len(text) + 1))
    return sorted({round(i * len(text) / (count - 1)) for i in range(count)})


def run_suite(checker, *, mask_prefixes: int = MASK_PREFIXES) -> dict:
    stats = {"cases": 0, "supported": 0, "unsupported": 0, "instances": 0, "supported_instances": 0,
             "all_instances": 0, "correct": dict.fromkeys(JUDGES, 0), "wrong": [],
             "prefixes": 0, "mask_disagreements": []}
    for path in sorted(SUITE.glob("*.json")):
        for case in json.loads(path.read_text()):
            stats["cases"] += 1
            stats["all_instances"] += len(case["tests"])
            schema = case["schema"]
            where = f"{path.name}: {case['description']}"
            try:
                rules = schema_rules(schema, "s", formats="ignore")
            except SchemaNotSupported:
                stats["unsupported"] += 1
                continue
            except Exception as exc:  # anything else is a bug: record it
                stats["wrong"].append(f"{where}: compiler crashed: {exc!r}")
                continue
            stats["supported"] += 1
            stats["supported_instances"] += len(case["tests"])
            judges = checker.judges(f"start: {rules.root}\n{rules.lark}", f"root ::= {rules.root}\n{rules.gbnf}")
            for name, error in judges.errors.items():
                if error is not None:
                    stats["wrong"].append(f"{where}: {name} rejects the grammar: {error[:300]}")
            for test in case["tests"]:
                stats["instances"] += 1
                text = dumps(canonical(test["data"], [schema], schema))
                for name, accepted in judges.verdicts(text).items():
                    if accepted == test["valid"]:
                        stats["correct"][name] += 1
                    elif accepted is not None:
                        stats["wrong"].append(f"{name}: {where} / {test['description']}: {text} valid={test['valid']}")
                if not test["valid"]:
                    continue
                for n in mask_positions(text, mask_prefixes):
                    stats["prefixes"] += 1
                    masks = judges.next_bytes(text[:n])
                    if masks is None:
                        stats["mask_disagreements"].append(f"{where}: prefix {text[:n]!r} rejected")
                    elif masks["llguidance"] != masks["xgrammar"]:
                        diff = sorted(masks["llguidance"] ^ masks["xgrammar"])
                        stats["mask_disagreements"].append(f"{where}: after {text[:n]!r} the masks differ on bytes {diff[:12]}")
    return stats


def test_suite_is_fully_correct_on_supported_cases_under_every_judge(checker, capsys):
    stats = run_suite(checker)
    share = stats["supported_instances"] / stats["all_instances"]
    with capsys.disabled():
        print(
            f"\nJSON-Schema-Test-Suite 2020-12: {stats['cases']} cases, {stats['supported']} supported, "
            f"{stats['unsupported']} unsupported (SchemaNotSupported); instances in supported cases "
            f"{stats['supported_instances']}/{stats['all_instances']} ({share:.1%}); "
            + ", ".join(f"{name} {stats['correct'][name]}/{stats['instances']} correct" for name in JUDGES)
            + f"; masks (llguidance vs xgrammar) compared after {stats['prefixes']} prefixes of valid instances, "
            f"{len(stats['mask_disagreements'])} disagree"
        )
    assert not stats["wrong"], "\n".join(stats["wrong"][:40])
    assert not stats["mask_disagreements"], "\n".join(stats["mask_disagreements"][:40])
    for name in JUDGES:
        assert stats["correct"][name] == stats["instances"]
    assert stats["supported"] >= 170  # regression guard on coverage (178 supported when written)
