"""`agentspec coverage`: counts per dataset on a small real sample (compile; lark, llguidance and
xgrammar; exactness: completeness, soundness, disagreements)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentspec_sdk.coverage.cli import coverage_report


def data_root() -> Path:
    """The repository's test data (tests/data, see its README); AGENTSPEC_SHARED_DATA may name a larger
    local copy with the same layout."""
    env = os.environ.get("AGENTSPEC_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parent / "data"


BENCH = data_root() / "jsonschemabench"


@pytest.fixture(scope="module")
def checker():
    transformers = pytest.importorskip("transformers", reason="extra: cpu (transformers not installed)")
    pytest.importorskip("hypothesis_jsonschema", reason="extra: dev (hypothesis-jsonschema not installed)")
    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.coverage.grammar_checks import GrammarChecker

    return GrammarChecker(transformers.AutoTokenizer.from_pretrained(str(resolve_model())))


@pytest.fixture
def sample(tmp_path):
    """Two real Glaive schemas, one real GitHub schema, and one the compiler must refuse."""
    assert BENCH.is_dir(), f"JSONSchemaBench not found at {BENCH} (tests/data/README.md)"
    glaive = sorted((BENCH / "Glaiveai2K").glob("*.json"))[:2]
    github = sorted((BENCH / "Github_easy").glob("*.json"))[:1]
    for folder, files in (("Glaiveai2K", glaive), ("Github_easy", github)):
        (tmp_path / folder).mkdir()
        for f in files:
            shutil.copy(f, tmp_path / folder / f.name)
    unsupported = {"type": "array", "contains": {"type": "integer"}}
    (tmp_path / "Github_easy" / "zz_unsupported.json").write_text(json.dumps(unsupported))
    return tmp_path


COUNTS = {"total", "compiled", "lark_ok", "llguidance_ok", "xgrammar_ok", "exact", "completeness_failures",
          "soundness_failures", "completeness_unchecked", "soundness_unchecked", "disagreements", "examples",
          "seconds"}


def test_coverage_counts_on_a_sample(sample, checker):
    # a bound, not a speed goal: the checks stop once done
    datasets, reasons = coverage_report(sample, checker, seconds=20.0)
    glaive = datasets["Glaiveai2K"]
    assert set(glaive) == COUNTS
    assert ({k: glaive[k] for k in ("total", "compiled", "lark_ok", "llguidance_ok", "xgrammar_ok")}
            == dict.fromkeys(("total", "compiled", "lark_ok", "llguidance_ok", "xgrammar_ok"), 2))
    assert glaive["exact"] == 2 and glaive["completeness_failures"] == glaive["soundness_failures"] == 0
    assert glaive["disagreements"] == 0 and glaive["examples"] == {}
    assert datasets["Github_easy"]["total"] == 2
    assert datasets["Github_easy"]["compiled"] == 1
    assert any("contains" in reason for reason in reasons)


def test_exactness_failures_are_counted_with_an_example(tmp_path, checker):
    """A relaxation makes the grammar a superset (uniqueItems ignored): the soundness walk finds an
    array with repeated items that jsonschema rejects, and the dataset counts it with its text."""
    (tmp_path / "mine").mkdir()
    schema = {"type": "array", "items": {"enum": [1, 2]}, "minItems": 2, "maxItems": 2, "uniqueItems": True}
    (tmp_path / "mine" / "repeats.json").write_text(json.dumps(schema))
    datasets, _ = coverage_report(tmp_path, checker, relax=("uniqueItems",), seconds=20.0)
    counts = datasets["mine"]
    assert counts["compiled"] == 1 and counts["exact"] == 0 and counts["soundness_failures"] == 1
    failure = counts["examples"]["soundness_failures"]
    assert failure["schema"] == "repeats.json" and json.loads(failure["text"]) in ([1, 1], [2, 2])


def test_no_exactness_checks_with_zero_seconds(sample, checker):
    datasets, _ = coverage_report(sample, checker, limit=1, seconds=0)
    assert datasets["Glaiveai2K"]["exact"] is None and datasets["Glaiveai2K"]["compiled"] == 1


def test_coverage_command_prints_the_json_contract(sample, checker):  # checker: the extras it needs
    from agentspec_sdk.cli import app

    result = CliRunner().invoke(app, ["coverage", str(sample), "--json", "--limit", "1", "--seconds", "1"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert set(report) == {"datasets"}
    assert set(report["datasets"]) == {"Glaiveai2K", "Github_easy"}
    for counts in report["datasets"].values():
        assert set(counts) == COUNTS
        assert counts["total"] == 1


def test_coverage_command_defaults_to_the_repository_sample(checker):
    """Without DIR the command reads tests/data/jsonschemabench: five datasets of 100 schemas, the
    first (by name) of each read with --limit 1."""
    from agentspec_sdk.cli import app
    from agentspec_sdk.coverage.cli import SAMPLE

    sample = Path(__file__).resolve().parent / "data" / "jsonschemabench"
    assert SAMPLE == sample
    assert {p.name: len(list(p.glob("*.json"))) for p in sample.iterdir() if p.is_dir()} == dict.fromkeys(
        ("Github_easy", "Github_hard", "Github_medium", "Github_trivial", "Glaiveai2K"), 100)
    result = CliRunner().invoke(app, ["coverage", "--json", "--limit", "1", "--seconds", "0"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])["datasets"]
    assert sorted(report) == sorted(p.name for p in sample.iterdir() if p.is_dir())
    assert {name: c["total"] for name, c in report.items()} == dict.fromkeys(report, 1)
    assert report["Glaiveai2K"]["compiled"] == report["Glaiveai2K"]["xgrammar_ok"] == 1
    assert report["Glaiveai2K"]["exact"] is None  # --seconds 0: no exactness checks


SAMPLE_COMPILED = {"Glaiveai2K": 99, "Github_trivial": 92, "Github_easy": 95, "Github_medium": 93,
                   "Github_hard": 77}


def test_the_repository_sample_compiles_as_measured():
    """The compiled counts of docs/schema_coverage.md's table (100 schemas per dataset, the files of
    tests/data/jsonschemabench): a change of the compiler that moves one updates the table with it."""
    from agentspec_sdk.errors import SchemaNotSupported
    from agentspec_sdk.structure.schema.compiler import schema_rules

    compiled = {}
    for folder in sorted((Path(__file__).resolve().parent / "data" / "jsonschemabench").iterdir()):
        compiled[folder.name] = 0
        for path in sorted(folder.glob("*.json")):
            try:
                schema_rules(json.loads(path.read_text(encoding="utf-8")), "s")
            except SchemaNotSupported:
                continue
            compiled[folder.name] += 1
    assert compiled == SAMPLE_COMPILED


def test_coverage_rejects_a_folder_without_datasets(tmp_path, checker):
    import typer

    with pytest.raises(typer.BadParameter):
        coverage_report(tmp_path, checker)


def test_completeness_finds_valid_instances_a_restricted_grammar_rejects(checker):
    """`closed=True` admits no undeclared keys, JSON Schema does: hypothesis-jsonschema's instances
    with extra keys are valid, llguidance rejects them, and the check reports one."""
    from agentspec_sdk.coverage.exactness import check_exactness
    from agentspec_sdk.structure.schema.compiler import schema_rules

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    rules = schema_rules(schema, "s", closed=True)
    judges = checker.judges(f"start: {rules.root}\n{rules.lark}", f"root ::= {rules.root}\n{rules.gbnf}")
    # generous: CI may be loaded
    result = check_exactness(schema, judges, seconds=10.0, examples=20, closed=True)
    assert result.completeness_checked > 0 and not result.exact
    extra = json.loads(result.completeness_failure)
    assert set(extra) - {"a"}, extra
    assert result.soundness_checked > 0 and result.soundness_failure is None  # a restriction stays sound


def test_the_reference_reads_patterns_as_ecma_262():
    """hypothesis-jsonschema and jsonschema use Python's `re`, whose `\\d` matches "\u0966"; JSON
    Schema patterns are ECMA-262, where it does not (nor does the grammar)."""
    from agentspec_sdk.coverage.exactness import ascii_classes, ecma_reference, validator_for

    assert ascii_classes(r"^\d[\w.]\\d\.$") == r"^[\x30-\x39][\x30-\x39\x41-\x5a\x5f\x61-\x7a.]\\d\.\Z"
    schema = {"type": "object", "properties": {"d": {"type": "string", "pattern": r"^\d+$"}},
              "patternProperties": {r"^x\d$": {"enum": [r"\d"]}}}
    reference = ecma_reference(schema)
    assert reference["properties"]["d"]["pattern"] == r"^[\x30-\x39]+\Z"
    assert reference["patternProperties"] == {r"^x[\x30-\x39]\Z": {"enum": [r"\d"]}}  # values are data, kept
    assert validator_for(schema).is_valid({"d": "\u0966"})  # Python's reading
    assert not validator_for(reference).is_valid({"d": "\u0966"})  # ECMA's reading


TREE = {"type": "object", "properties": {"value": {"type": "integer"},
                                         "children": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["value"], "additionalProperties": False}


def judges_of(checker, schema):
    from agentspec_sdk.structure.schema.compiler import schema_rules

    rules = schema_rules(schema, "s")
    return checker.judges(f"start: {rules.root}\n{rules.lark}", f"root ::= {rules.root}\n{rules.gbnf}")


def test_recursion_is_unrolled_to_instances_valid_under_the_original():
    """hypothesis-jsonschema refuses a recursive $ref; the bounded unrolling gives it a schema with
    no $ref whose instances the ORIGINAL schema's validator accepts (cut refs become `false`)."""
    import warnings

    pytest.importorskip("hypothesis_jsonschema", reason="extra: dev (hypothesis-jsonschema not installed)")
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis_jsonschema import from_schema

    from agentspec_sdk.coverage.exactness import _hypothesis_compat, bounded_refs, validator_for

    _hypothesis_compat()
    assert bounded_refs({"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}},
                         "$defs": {"a": {"type": "integer"}}}) is None  # no recursion: nothing to unroll
    unrolled = bounded_refs(TREE)
    assert "$ref" not in json.dumps(unrolled)
    assert unrolled["properties"]["children"]["items"]["properties"]["children"]["items"] is False
    original = validator_for(TREE)
    seen = []

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # hypothesis: characters that do not round-trip

        @settings(max_examples=30, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck), derandomize=True)
        @given(from_schema(unrolled))
        def check(value):
            assert original.is_valid(value), value
            seen.append(value)

        check()
    assert any(v.get("children") for v in seen)  # nested instances, not only the base case


def test_completeness_runs_on_a_recursive_schema_and_can_fail(checker):
    """The unrolled instances are judged like any other: the tree's own grammar accepts them (exact);
    the grammar of a tree whose values must be 0 (a wrong grammar for TREE) rejects some."""
    from agentspec_sdk.coverage.exactness import check_exactness

    result = check_exactness(TREE, judges_of(checker, TREE), seconds=10.0)
    assert result.completeness_unchecked is None and result.completeness_checked > 0
    assert result.exact and result.disagreement is None
    zero = {**TREE, "properties": {**TREE["properties"], "value": {"const": 0}}}
    wrong = check_exactness(TREE, judges_of(checker, zero), seconds=10.0, examples=30)
    assert wrong.completeness_failure is not None and not wrong.exact
    assert json.loads(wrong.completeness_failure)["value"] != 0 or "children" in wrong.completeness_failure


def nested_object(depth: int, width: int) -> dict:
    """Objects `width` optional properties wide (strings, integers, one nested object), `depth` deep."""
    if depth == 0:
        return {"type": "string"}
    props = {f"p{i}": ({"type": "integer"} if i % 2 else {"type": "string", "maxLength": 40})
             for i in range(width)}
    props["nested"] = nested_object(depth - 1, width)
    return {"type": "object", "properties": props, "required": ["nested"]}


def test_walks_finish_on_a_large_nested_object(checker):
    """Eight levels of required nesting, 12 optional properties each: the walks settle (close strings
    and objects, skip optional keys) and finish within the time; every finished one validates."""
    from agentspec_sdk.coverage.exactness import Exactness, _soundness, validator_for

    schema = nested_object(8, 12)
    result = Exactness()
    _soundness(judges_of(checker, schema), validator_for(schema), result, 5.0, 8, 4096, 0)
    assert result.soundness_walks >= 4 and result.soundness_checked == result.soundness_walks
    assert result.soundness_failure is None and result.disagreement is None
    assert result.soundness_bytes > 100  # the later walks explore before settling


def test_walks_find_texts_a_wrong_grammar_allows(checker):
    """A grammar for any integer, judged against `maximum: 3`: the walks (which only follow the
    mask) produce integers above 3, and soundness fails with one of them."""
    from agentspec_sdk.coverage.exactness import Exactness, _soundness, validator_for

    schema = {"type": "object", "properties": {"a": {"type": "integer", "maximum": 3}}, "required": ["a"],
              "additionalProperties": False}
    loose = {**schema, "properties": {"a": {"type": "integer"}}}
    result = Exactness()
    _soundness(judges_of(checker, loose), validator_for(schema), result, 5.0, 8, 4096, 0)
    assert result.soundness_failure is not None and json.loads(result.soundness_failure)["a"] > 3


@pytest.mark.parametrize("pattern, ecma_yes, ecma_no", [
    (r"^[\w\s-]+$", ["a b", "a\u3000b", "a\u2005b", "a\n"], ["a\x1cb", "a\x85b"]),  # ECMA white space
    (r"^\S\W\D$", ["a-\u0966"], ["\u3000-x", "aa1"]),
    (r"^a.b$", ["a\x1cb", "a\u0085b"], ["a\rb", "a\u2028b", "a\nb"]),  # `.`: no line terminator
    (r"^ab$", ["ab"], ["ab\n"]),  # `$`: the end, not before a final newline
])
def test_the_reference_reads_classes_dot_and_end_as_ecma_262(pattern, ecma_yes, ecma_no):
    """Python's `re` reads `\\s` with `\\x1c-\\x1f`, `.` with `\\r`, `$` before a final newline;
    ECMA-262 (JSON Schema's patterns, and the grammar) does not. A Github_medium schema's
    `^[\\w\\s-]+$` had hypothesis-jsonschema generate `\\x1c` as a "valid" instance."""
    import re

    from agentspec_sdk.coverage.exactness import ascii_classes

    ecma = ascii_classes(pattern)
    assert [bool(re.search(ecma, t)) for t in ecma_yes] == [True] * len(ecma_yes)
    assert [bool(re.search(ecma, t)) for t in ecma_no] == [False] * len(ecma_no)
