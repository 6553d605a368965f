"""JSON-Schema-Test-Suite (draft 2020-12) against the compiled grammars, under three judges:
python lark, llguidance (LLMatcher fed SmolLM2's tokens: what vLLM enforces) and xgrammar (on the
EBNF rendering).

For every case the compiler accepts, each valid instance (in canonical form) must be accepted and
each invalid one rejected by every judge; cases it cannot express must raise SchemaNotSupported.
After prefixes of the valid instances, llguidance's and xgrammar's next-byte masks must be equal
(dottxt's mask-level comparison: a lexer that commits to the wrong lexeme shows up here). Formats are
annotations in 2020-12 (format.json expects "2962" to be a valid email), so the suite runs with
`formats="ignore"`; asserted formats are tested in test_schema_compiler.py.

An instance is judged by its canonical serialisations (`canonical_texts`: keys in the order the
grammar puts them, one text per way the schema's alternatives order them, numbers in the canonical
number form): a valid instance must have one that each judge accepts, an invalid one none that any
judge accepts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agentspec_sdk.coverage.grammar_checks import JUDGES
from agentspec_sdk.errors import SchemaNotSupported
from agentspec_sdk.structure.schema.compiler import canonical_texts, schema_rules


def data_root() -> Path:
    """The repository's test data (tests/data, see its README); AGENTSPEC_SHARED_DATA may name a larger
    local copy with the same layout."""
    env = os.environ.get("AGENTSPEC_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parent / "data"


SUITE = data_root() / "json-schema-test-suite"


# ---------------------------------------------------------------- the run


@pytest.fixture(scope="module")
def checker():
    transformers = pytest.importorskip("transformers", reason="extra: cpu (transformers not installed)")
    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.coverage.grammar_checks import GrammarChecker

    return GrammarChecker(transformers.AutoTokenizer.from_pretrained(str(resolve_model())))


MASK_PREFIXES = 6  # prefixes per valid instance whose next-byte masks are compared


def mask_positions(text: str, count: int) -> list[int]:
    """`count` prefix lengths spread over the text (the start, the end and between)."""
    if len(text) <= count:
        return list(range(len(text) + 1))
    return sorted({round(i * len(text) / (count - 1)) for i in range(count)})


def run_suite(checker, *, mask_prefixes: int = MASK_PREFIXES) -> dict:
    assert SUITE.is_dir(), f"JSON-Schema-Test-Suite not found at {SUITE} (tests/data/README.md)"
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
            judges = checker.judges(f"start: {rules.root}\n{rules.lark}",
                                    f"root ::= {rules.root}\n{rules.gbnf}")
            for name, error in judges.errors.items():
                if error is not None:
                    stats["wrong"].append(f"{where}: {name} rejects the grammar: {error[:300]}")
            for test in case["tests"]:
                stats["instances"] += 1
                texts = canonical_texts(schema, test["data"])
                verdicts = [judges.verdicts(text) for text in texts]
                for name in JUDGES:
                    seen = [v[name] for v in verdicts]
                    accepted = None if None in seen else any(seen)
                    if accepted == test["valid"]:
                        stats["correct"][name] += 1
                    elif accepted is not None:
                        stats["wrong"].append(f"{name}: {where} / {test['description']}: {texts} "
                                              f"valid={test['valid']}")
                if not test["valid"]:
                    continue
                text = next((t for t, v in zip(texts, verdicts, strict=True) if v["llguidance"]), texts[0])
                for n in mask_positions(text, mask_prefixes):
                    stats["prefixes"] += 1
                    masks = judges.next_bytes(text[:n])
                    if masks is None:
                        stats["mask_disagreements"].append(f"{where}: prefix {text[:n]!r} rejected")
                    elif masks["llguidance"] != masks["xgrammar"]:
                        diff = sorted(masks["llguidance"] ^ masks["xgrammar"])
                        stats["mask_disagreements"].append(f"{where}: after {text[:n]!r} the masks differ "
                                                           f"on bytes {diff[:12]}")
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
            + f"; masks (llguidance vs xgrammar) compared after {stats['prefixes']} prefixes of valid "
            f"instances, "
            f"{len(stats['mask_disagreements'])} disagree"
        )
    assert not stats["wrong"], "\n".join(stats["wrong"][:40])
    assert not stats["mask_disagreements"], "\n".join(stats["mask_disagreements"][:40])
    for name in JUDGES:
        assert stats["correct"][name] == stats["instances"]
    if SUITE == Path(__file__).resolve().parent / "data" / "json-schema-test-suite":  # the repository's copy
        assert (stats["cases"], stats["all_instances"]) == (383, 1299)
    assert stats["supported"] >= 215  # regression guard on coverage (215 supported when written)
    assert stats["supported_instances"] >= 783 and share >= 0.60  # 783/1299 (60.3%) when written
