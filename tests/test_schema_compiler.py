"""JSON Schema → grammar: language exactness under the three judges (python lark, llguidance with
SmolLM2's tokenizer, xgrammar on the EBNF rendering), drafts (`$schema`), canonical forms,
prefixing/composition, policies, bad input."""

from __future__ import annotations

import json
import time

import lark
import pytest

from agentspec_sdk.bfcl import normalise_bfcl_schema
from agentspec_sdk.errors import InvalidSchema, SchemaNotSupported
from agentspec_sdk.structure.schema.algebra import canonical_literal
from agentspec_sdk.structure.schema.compiler import (
    canonical_texts,
    compile_schema,
    compile_schema_gbnf,
    schema_rules,
)


def accepts(grammar: str, text: str) -> bool:
    try:
        lark.Lark(grammar).parse(text)
        return True
    except lark.exceptions.LarkError:
        return False


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 5},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", 'b"c', 1.0, None]}, "maxItems": 2},
        "score": {"type": "number", "exclusiveMinimum": 0},
    },
    "required": ["age"],
    "additionalProperties": False,
}

CASES = [
    (PERSON,
     ['{"age":3}', '{"name":"bob","age":150,"tags":["a",1],"score":0.5}', '{"age":0,"tags":[]}',
      '{"name":"b\\"\\\\","age":1}', '{"age":1,"score":1e3}' if False else '{"age":1,"score":10}'],
     ['{"age":151}', '{"age":-1}', '{"name":"","age":1}', '{"name":"bobbie","age":1}', '{"age":1,"score":0}',
      '{"age":1,"tags":["a","a","a"]}', '{"age":1,"x":1}', '{"age":1,"name":"bob"}', '{"age": 1}',
      '{"age":01}']),
    ({"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "null"}], "items": False},
     ["[]", "[true]", "[false,null]"], ["[null]", "[true,null,1]", "[true,]"]),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3},
     ["[1,2]", "[1,2,-3]"], ["[]", "[1]", "[1,2,3,4]", "[1.5,2]"]),
    ({"enum": ["x", 2, {"a": [1, True]}, None]},
     ['"x"', "2", '{"a":[1,true]}', "null"], ['"y"', "2.5", '{"a":[1]}', "true"]),
    ({"const": "Observation: x"}, ['"Observation: x"'], ['"Observation: y"']),
    ({"type": ["string", "null"], "pattern": "^[a-z]+\\d?$"},
     ['"abc"', '"ab1"', "null"], ['"ab12"', '"Abc"', '""', "1"]),
    ({"type": "string", "pattern": 'a"b'}, ['"a\\"b"', '"xxa\\"byy"'], ['"ab"', '"a\\\\b"']),
    ({"type": "string", "pattern": "^[a-z][a-z0-9_]*$", "maxLength": 4}, ['"a"', '"ab_1"'],
     ['"ab_12"', '"1a"']),
    ({"type": "object", "properties": {"a": {"type": "integer"}}},
     ["{}", '{"a":1}', '{"a":1,"b":"x"}', '{"b":[{}]}', '{"ab":1}'],
     ['{"a":"x"}', '{"b":1,"a":1}', '{"a":1,"a":2}']),
    ({"type": "object",
      "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
      "additionalProperties": False},
     ["{}", '{"b":1}', '{"a":1,"c":2}', '{"a":1,"b":2,"c":3}'], ['{"c":1,"a":2}', '{,"b":1}', '{"a":1,}']),
    ({"type": "object", "required": ["z"], "additionalProperties": {"type": "boolean"}},
     ['{"z":true}', '{"z":false,"y":true}'], ["{}", '{"z":1}', '{"y":true,"z":true}']),
    ({"$defs": {"node": {"type": "object",
                         "properties": {"next": {"$ref": "#/$defs/node"}, "v": {"type": "integer"}},
                         "required": ["v"], "additionalProperties": False}},
      "$ref": "#/$defs/node"},
     ['{"next":{"v":2},"v":1}', '{"next":{"next":{"v":3},"v":2},"v":1}'], ['{"next":{},"v":1}']),
    ({"type": "object", "properties": {"a": {}, "b": {}}, "additionalProperties": False,
      "allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"a": {"minimum": 5}, "b": {"type": "string"}}}]},
     ['{"a":5}', '{"a":9,"b":"x"}'], ['{"a":4}', '{"b":"x"}', '{"a":5,"c":1}', "[]"]),
    ({"allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]}],
      "additionalProperties": False},
     ["[]", "1"], ['{"a":5}', "{}"]),
    ({"anyOf": [{"type": "integer", "maximum": 3}, {"type": "string", "format": "date"}]},
     ["3", "-7", '"2024-02-29"'], ["4", '"2024-13-01"', '"2024-1-01"']),
    ({"oneOf": [{"type": "integer"}, {"type": "boolean"}]}, ["1", "true"], ['"x"']),
    ({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
      "additionalProperties": False,
      "oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
     ['{"a":1}', '{"b":2}'], ["{}", '{"a":1,"b":2}']),
    ({"type": "number", "minimum": 0.25, "exclusiveMaximum": 1.5},
     ["0.25", "0.5", "1", "1.4999"], ["0.2499", "1.5", "2", "-0.3"]),
    ({"type": "integer", "exclusiveMinimum": -20, "maximum": 1234},
     ["-19", "0", "999", "1234"], ["-20", "1235", "-0", "1.0"]),
    ({"type": "string", "format": "date-time"}, ['"2024-05-01T12:30:00Z"', '"2024-05-01T12:30:00.5+02:00"'],
     ['"2024-05-01 12:30:00"']),
    ({"type": "string", "format": "uuid"}, ['"123e4567-e89b-12d3-a456-426614174000"'], ['"123e4567"']),
    ({"type": "string", "format": "email"}, ['"a.b@example.com"'], ['"ab@"', '"a b@x.org"']),
    ({"type": "string", "format": "ipv4"}, ['"192.168.0.255"'], ['"256.1.1.1"', '"1.2.3"']),
    ({"type": "string", "format": "uri"}, ['"https://x.org/a?b=c"'], ['"no scheme"']),
    ({"type": "string", "format": "time"}, ['"23:59:60Z"'], ['"24:00:00Z"']),
    ({"type": "object", "patternProperties": {"^x-[a-z]+$": {"type": "integer"}},
      "additionalProperties": False},
     ["{}", '{"x-a":1,"x-bc":2}'], ['{"y":1}', '{"x-a":"1"}']),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "minProperties": 1,
      "additionalProperties": False},
     ['{"a":1}'], ["{}"]),
    ({"type": "string", "nullable": True, "minLength": 2}, ['"ab"', "null"], ['"a"']),
    ({"type": "string", "maxLength": 3}, ['"é日本"', '"\\n\\t\\u0001"'], ['"abcd"', '"\\u0041"', '"\\/"']),
    ({"type": "object",
      "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
      "dependencies": {"a": ["b"], "c": {"required": ["a"]}}, "additionalProperties": False},
     ["{}", '{"b":1}', '{"a":1,"b":2}', '{"a":1,"b":1,"c":1}'], ['{"a":1}', '{"c":1}', '{"b":1,"c":1}']),
    ({"type": "string", "format": "hostname"}, ['"api.example-1.com"'], ['"-bad.com"', '"a..b"']),
]


@pytest.fixture(scope="module")
def checker():
    transformers = pytest.importorskip("transformers", reason="extra: cpu (transformers not installed)")
    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.coverage.grammar_checks import GrammarChecker

    return GrammarChecker(transformers.AutoTokenizer.from_pretrained(str(resolve_model())))


def verdicts_of(checker, schema, texts, **options) -> dict[str, dict[str, bool | None]]:
    """Each text under the three judges (lark, llguidance, xgrammar) of the schema's grammar."""
    from agentspec_sdk.coverage.grammar_checks import JUDGES

    rules = schema_rules(schema, "s", **options)
    judges = checker.judges(f"start: {rules.root}\n{rules.lark}", f"root ::= {rules.root}\n{rules.gbnf}")
    assert judges.errors == dict.fromkeys(JUDGES), judges.errors
    return {text: judges.verdicts(text) for text in texts}


@pytest.mark.parametrize("schema, valid, invalid", CASES, ids=[str(i) for i in range(len(CASES))])
def test_grammar_matches_exactly_the_canonical_instances(checker, schema, valid, invalid):
    """Under every judge: python lark, llguidance (SmolLM2's tokens), xgrammar (EBNF rendering)."""
    for text, verdicts in verdicts_of(checker, schema, valid + invalid).items():
        expected = text in valid
        assert set(verdicts.values()) == {expected}, \
            f"{text} should be {'accepted' if expected else 'rejected'}: {verdicts}"


def test_property_order_is_deterministic_and_follows_the_schema():
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}},
              "required": ["a", "b"]}
    assert compile_schema(schema) == compile_schema(json.loads(json.dumps(schema)))
    grammar = compile_schema(schema)
    assert accepts(grammar, '{"b":1,"a":2}') and not accepts(grammar, '{"a":2,"b":1}')


def test_flexible_whitespace_policy():
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}},
              "required": ["a"]}
    grammar = compile_schema(schema, whitespace="flexible")
    assert (accepts(grammar, '{ "a" : [ 1 , 2 ] }') and accepts(grammar, '{"a":[]}')
            and accepts(grammar, '{\n  "a": [1]\n}'))
    assert not accepts(compile_schema(schema), '{ "a":[1]}')
    with pytest.raises(ValueError, match="whitespace"):
        compile_schema(schema, whitespace="pretty")


def test_closed_objects_forbid_undeclared_keys():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert accepts(compile_schema(schema), '{"a":1,"b":2}')
    assert not accepts(compile_schema(schema, closed=True), '{"a":1,"b":2}')


def test_relaxations_are_opt_in_and_named():
    overlapping = {"oneOf": [{"type": "integer"}, {"type": "number"}]}
    with pytest.raises(SchemaNotSupported) as info:
        compile_schema(overlapping)
    assert info.value.pointer == "/oneOf"
    assert accepts(compile_schema(overlapping, relax=["oneOf"]), "1.5")
    unique = {"type": "array", "uniqueItems": True}
    with pytest.raises(SchemaNotSupported):
        compile_schema(unique)
    assert accepts(compile_schema(unique, relax=["uniqueItems"]), "[1,1]")
    with pytest.raises(ValueError, match="unknown relaxations"):
        compile_schema(unique, relax=["everything"])


def test_unsupported_keywords_name_their_pointer():
    schema = {"type": "object", "properties": {"a": {"type": "array", "contains": {"type": "integer"}}}}
    with pytest.raises(SchemaNotSupported) as info:
        compile_schema(schema)
    assert info.value.pointer == "/properties/a/contains"
    with pytest.raises(SchemaNotSupported) as info:
        compile_schema({"type": "string", "pattern": "(?=a)b"})
    assert info.value.pointer == "/pattern"
    with pytest.raises(SchemaNotSupported) as info:
        compile_schema({"type": "string", "format": "ipv6"})
    assert info.value.pointer == "/format"


def test_annotations_and_unknown_keywords_are_ignored():
    schema = {"type": "integer", "title": "t", "description": "d", "default": 1, "examples": [1],
              "x-vendor": {"a": 1}}
    assert compile_schema(schema) == compile_schema({"type": "integer"})


def test_canonical_literal():
    assert canonical_literal({"b": 1.0, "a": ["é", None]}) == '{"b":1,"a":["é",null]}'


# ---------------------------------------------------------------- composition (schema_rules)


def test_schema_rules_are_prefixed_and_compose_in_one_grammar():
    first = schema_rules({"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
                         "tool_a")
    second = schema_rules({"type": "object", "properties": {"y": {"type": "integer"}}, "required": ["y"]},
                          "tool_b")
    for rules, prefix in ((first, "tool_a"), (second, "tool_b")):
        assert rules.root.startswith(prefix)
        for line in rules.lark.splitlines() + rules.gbnf.splitlines():
            assert line.lower().startswith(prefix)
    grammar = f'start: "A" {first.root} | "B" {second.root}\n{first.lark}{second.lark}'
    assert accepts(grammar, 'A{"x":"1"}') and accepts(grammar, 'B{"y":1}')
    assert not accepts(grammar, 'A{"y":1}')
    with pytest.raises(ValueError, match="prefix"):
        schema_rules({}, "Bad-Prefix")


# ---------------------------------------------------------------- the real engines


def test_flexible_whitespace_compiles_in_both_engines(checker):
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}},
              "required": ["a"]}
    lark_text = compile_schema(schema, whitespace="flexible")
    gbnf_text = compile_schema_gbnf(schema, whitespace="flexible")
    judges = checker.judges(lark_text, gbnf_text)
    assert judges.errors == {"lark": None, "llguidance": None, "xgrammar": None}, judges.errors
    assert judges.verdicts('{ "a": [1, 2] }') == {"lark": True, "llguidance": True, "xgrammar": True}
    assert judges.verdicts('{ "a": [1, 2.5] }') == {"lark": False, "llguidance": False, "xgrammar": False}


# ---------------------------------------------------------------- BFCL normaliser


def test_normalise_bfcl_schema():
    bfcl = {"type": "dict", "properties": {
        "x": {"type": "float", "description": "d"}, "t": {"type": "tuple", "items": {"type": "integer"}},
        "any": {"type": "any"}, "m": {"type": "HashMap"}, "opt": {"type": "String", "optional": True}},
        "required": ["x"]}
    out = normalise_bfcl_schema(bfcl)
    assert out["type"] == "object" and out["properties"]["x"]["type"] == "number"
    assert out["properties"]["t"] == {"type": "array", "items": {"type": "integer"}}
    assert "type" not in out["properties"]["any"] and out["properties"]["opt"] == {"type": "string"}
    assert accepts(compile_schema(out), '{"x":1.5,"any":[1]}')
    with pytest.raises(InvalidSchema) as info:
        normalise_bfcl_schema({"type": "dict", "properties": {"q": {"type": "quaternion"}}})
    assert info.value.pointer == "/properties/q/type"


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("schema, pointer", [
    ({"type": 5}, "/type"),
    ({"type": "integer", "minimum": "zero"}, "/minimum"),
    ({"properties": []}, "/properties"),
    ({"type": "object", "required": "a"}, "/required"),
    ({"type": "string", "maxLength": -1}, "/maxLength"),
    ({"type": "wat"}, "/type"),
    ({"items": 3}, "/items"),
    ({"$ref": "#/$defs/missing"}, "/$ref"),
    ({"properties": {"a": {"$ref": "#/definitions/nope"}}}, "/properties/a/$ref"),
    ({"anyOf": []}, "/anyOf"),
])
def test_malformed_schemas_raise_invalid_schema_with_pointer(schema, pointer):
    with pytest.raises(InvalidSchema) as info:
        compile_schema(schema)
    assert info.value.pointer == pointer, str(info.value)


def test_recursion_without_finite_instance_is_an_error():
    schema = {"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}},
                              "required": ["next"]}},
              "$ref": "#/$defs/n"}
    with pytest.raises(InvalidSchema, match="no instance"):
        compile_schema(schema)
    with pytest.raises(SchemaNotSupported, match="cycle"):
        compile_schema({"$defs": {"a": {"$ref": "#/$defs/b", "type": "object"},
                                  "b": {"$ref": "#/$defs/a", "type": "object"}},
                        "$ref": "#/$defs/a", "minimum": 1})


def test_depth_above_64_is_refused_with_pointer():
    schema: dict = {"type": "integer"}
    for _ in range(70):
        schema = {"type": "array", "items": schema}
    with pytest.raises(SchemaNotSupported, match="deeper than 64") as info:
        compile_schema(schema)
    assert info.value.pointer.startswith("/items/items")
    deep: dict = {"type": "integer"}
    for _ in range(5000):  # far beyond Python's recursion limit: still a clear error
        deep = {"items": deep}
    with pytest.raises(SchemaNotSupported):
        compile_schema(deep)


def test_huge_enum_is_refused_quickly():
    start = time.perf_counter()
    with pytest.raises(SchemaNotSupported, match="10000") as info:
        compile_schema({"enum": list(range(100_000))})
    assert info.value.pointer == "/enum"
    assert time.perf_counter() - start < 5  # bounded, not a benchmark: a hang would be minutes


def test_ten_thousand_properties_compile_in_bounded_time():
    props = {f"p{i}": {"type": "integer"} for i in range(10_000)}
    start = time.perf_counter()
    rules = schema_rules({"type": "object", "properties": props, "required": ["p0"],
                          "additionalProperties": False}, "big")
    assert time.perf_counter() - start < 60
    assert rules.lark.count('"\\"p') == 10_000
    optional_only = schema_rules({"type": "object", "properties": props, "additionalProperties": False},
                                 "big")
    # shared tail rules: linear (a few lines per key), not quadratic
    assert optional_only.lark.count("\n") < 60_000


def test_bool_schemas():
    assert accepts(compile_schema(True), '{"a":[1,"x",null]}')
    with pytest.raises(InvalidSchema):
        compile_schema(False)


# ---------------------------------------------------------------- drafts ($schema)

D4 = "http://json-schema.org/draft-04/schema#"
D6 = "http://json-schema.org/draft-06/schema#"
D7 = "http://json-schema.org/draft-07/schema#"
D2019 = "https://json-schema.org/draft/2019-09/schema"
D2020 = "https://json-schema.org/draft/2020-12/schema"

DIALECT_CASES = [
    # $ref siblings: ignored before 2019-09, applied from 2019-09 on
    ({"$schema": D7, "definitions": {"r": {"type": "array"}},
      "properties": {"foo": {"$ref": "#/definitions/r", "maxItems": 2}}},
     ['{"foo":[1,2,3]}', '{"foo":[]}', '{"foo":1}']),
    ({"$schema": D2019, "$defs": {"r": {"type": "array"}},
      "properties": {"foo": {"$ref": "#/$defs/r", "maxItems": 2}}},
     ['{"foo":[1,2,3]}', '{"foo":[]}', '{"foo":1}']),
    ({"$schema": D4, "definitions": {"r": {"type": "integer"}}, "$ref": "#/definitions/r", "minimum": 5},
     ["1", "7", '"x"']),
    # dependencies: drafts 4 to 7; 2019-09 and 2020-12 ignore it
    ({"$schema": D7, "dependencies": {"bar": ["foo"]}}, ['{"bar":1}', '{"bar":1,"foo":2}', '{"foo":2}']),
    ({"$schema": D2020, "dependencies": {"bar": ["foo"]}}, ['{"bar":1}', '{"bar":1,"foo":2}']),
    # dependentRequired: 2019-09 on; draft 7 ignores it
    ({"$schema": D7, "dependentRequired": {"bar": ["foo"]}}, ['{"bar":1}']),
    ({"$schema": D2019, "dependentRequired": {"bar": ["foo"]}}, ['{"bar":1}', '{"bar":1,"foo":2}']),
    # items: the array form (with additionalItems) up to 2019-09; prefixItems from 2020-12
    ({"$schema": D2019, "items": [{"type": "integer"}], "additionalItems": False},
     ["[1]", "[1,2]", '["x"]', "[]"]),
    ({"$schema": D2019, "prefixItems": [{"type": "integer"}]}, ['["x"]', "[1]"]),
    ({"$schema": D2020, "prefixItems": [{"type": "integer"}], "additionalItems": False},
     ['["x"]', "[1]", "[1,2]"]),
    # const from draft 6; if/then/else from draft 7 (before: annotations)
    ({"$schema": D4, "const": 1}, ["1", "2"]),
    ({"$schema": D6, "const": 1}, ["1", "2"]),
    ({"$schema": D6, "type": "integer", "if": {"minimum": 3}, "then": {"maximum": 2}}, ["1", "5"]),
]


@pytest.mark.parametrize("schema, texts", DIALECT_CASES, ids=[str(i) for i in range(len(DIALECT_CASES))])
def test_schema_keyword_decides_the_draft_semantics(checker, schema, texts):
    """Each verdict equals the `jsonschema` validator of the draft the schema declares."""
    import jsonschema

    validator = jsonschema.validators.validator_for(schema)(schema)
    for text, verdicts in verdicts_of(checker, schema, texts).items():
        expected = validator.is_valid(json.loads(text))
        assert set(verdicts.values()) == {expected}, \
            f"{text}: valid={expected} under {validator.__class__.__name__}, judges {verdicts}"


def test_draft_specific_refusals_name_their_pointer():
    with pytest.raises(InvalidSchema, match="prefixItems") as info:
        compile_schema({"$schema": D2020, "items": [{"type": "integer"}]})
    assert info.value.pointer == "/items"
    with pytest.raises(SchemaNotSupported, match="draft-03") as info:
        compile_schema({"$schema": "http://json-schema.org/draft-03/schema#", "type": "integer"})
    assert info.value.pointer == "/$schema"
    with pytest.raises(SchemaNotSupported, match="custom meta-schema") as info:
        compile_schema({"$schema": "https://example.com/my-meta", "type": "integer"})
    assert info.value.pointer == "/$schema"
    with pytest.raises(SchemaNotSupported) as info:  # if/then/else is a keyword from draft 7 on
        compile_schema({"$schema": D7, "if": {"minimum": 3}, "then": {"maximum": 2}})
    assert info.value.pointer == "/if"


def test_no_schema_keyword_reads_2020_12_and_the_keywords_it_dropped():
    """Without `$schema`: $ref siblings apply (2020-12), `dependencies` and `items: [...]` keep
    their draft-7 meaning (2020-12 would ignore or refuse them)."""
    sibling = {"$defs": {"r": {"type": "array"}}, "properties": {"foo": {"$ref": "#/$defs/r", "maxItems": 2}}}
    assert not accepts(compile_schema(sibling), '{"foo":[1,2,3]}')
    assert not accepts(compile_schema({"dependencies": {"bar": ["foo"]}}), '{"bar":1}')
    assert not accepts(compile_schema({"items": [{"type": "integer"}], "additionalItems": False}), "[1,2]")


# ---------------------------------------------------------------- canonical forms


def test_canonical_literal_number_and_string_forms():
    assert canonical_literal(1.0) == "1" and canonical_literal(-0.0) == "0"
    assert canonical_literal(1e300) == "1" + "0" * 300
    assert canonical_literal(1e-05) == "0.00001" and canonical_literal(-2.5e-7) == "-0.00000025"
    assert canonical_literal(0.1) == "0.1" and canonical_literal(123456.789) == "123456.789"
    assert canonical_literal('a/"é\n\x01') == '"a/\\"é\\n\\u0001"'
    with pytest.raises(ValueError):
        canonical_literal(float("nan"))


CANONICAL_SCHEMA = {
    "type": "object",
    "properties": {"b": {"type": "number", "minimum": 0}, "a": {"type": "number"}, "s": {"type": "string"}},
    "required": ["z"],
    "allOf": [{"properties": {"c": {"type": "integer"}}}],
    "additionalProperties": {"type": "integer"},
}


@pytest.mark.parametrize("value, canonical, non_canonical", [
    ({"z": 1, "b": 1e-05, "a": 2.0}, '{"b":0.00001,"a":2,"z":1}',
     ['{"b":1e-05,"a":2,"z":1}', '{"b":0.00001,"a":2,"z":1.0}', '{"a":2,"b":0.00001,"z":1}',
      '{"b":0.00001, "a":2,"z":1}']),
    ({"q": 3, "z": 1, "c": 2}, '{"c":2,"z":1,"q":3}', ['{"z":1,"c":2,"q":3}', '{"c":2,"q":3,"z":1}']),
    ({"s": "x/\u00e9", "z": 1}, '{"s":"x/\u00e9","z":1}',
     ['{"s":"x\\/\u00e9","z":1}', '{"s":"x/\\u00e9","z":1}']),
])
def test_canonical_texts_are_the_forms_the_grammar_accepts(checker, value, canonical, non_canonical):
    """Each documented canonical form (key order: properties, merged allOf members, required, the
    rest; numbers: integers, positional decimals; strings: json.dumps escapes) is accepted by every
    judge, and the same instance written otherwise is not (the unbounded `a` alone takes any form)."""
    assert canonical_texts(CANONICAL_SCHEMA, value) == [canonical]
    verdicts = verdicts_of(checker, CANONICAL_SCHEMA, [canonical, *non_canonical])
    assert set(verdicts.pop(canonical).values()) == {True}
    for text, by_judge in verdicts.items():
        assert set(by_judge.values()) == {False}, text
    assert accepts(compile_schema(CANONICAL_SCHEMA), '{"b":1,"a":2e-5,"z":1}')  # unbounded number: any form


def test_canonical_texts_give_one_text_per_branch_order():
    schema = {"anyOf": [{"properties": {"b": {}, "a": {}}},
                        {"properties": {"a": {}, "b": {}}, "required": ["a"]}]}
    texts = canonical_texts(schema, {"a": 1, "b": 2})
    assert texts == ['{"b":2,"a":1}', '{"a":1,"b":2}']
    assert canonical_texts({"dependencies": {"bar": ["foo"]}}, {"foo": 1, "bar": 2}) == ['{"bar":2,"foo":1}']
    assert canonical_texts({"enum": [{"y": 1, "x": 2}]}, {"x": 2, "y": 1.0}) == ['{"y":1,"x":2}']


def test_oneof_literal_against_a_typed_branch_is_exclusive_only_when_provably_so():
    """`{"const": 1}` and `{"type": "integer"}` share 1 (oneOf rejects it): not provably exclusive.
    Against `minimum: 5` they are. Constants compare as JSON values, key order aside."""
    with pytest.raises(SchemaNotSupported, match="oneOf"):
        compile_schema({"oneOf": [{"const": 1}, {"type": "integer"}]})
    with pytest.raises(SchemaNotSupported, match="oneOf"):
        compile_schema({"oneOf": [{"const": {"a": 1, "b": 2}}, {"enum": [{"b": 2, "a": 1}]}]})
    grammar = compile_schema({"oneOf": [{"const": 1}, {"type": "integer", "minimum": 5}]})
    assert accepts(grammar, "1") and accepts(grammar, "5") and not accepts(grammar, "2")


def test_oneof_told_apart_by_keys_holds_for_objects_only(checker):
    """Branches without `type`, told apart by a required key's constants (JSONSchemaBench
    Github_hard o17700, found by the soundness walks): the proof speaks of objects; a string or a
    number matches every branch, so oneOf rejects it. Two branches that constrain only objects:
    the oneOf is objects only. One such branch beside a typed one: not provably exclusive."""
    from agentspec_sdk.coverage.exactness import validator_for

    schema = {"oneOf": [{"required": ["name"], "properties": {"name": {"enum": ["a"]}}},
                        {"required": ["name"],
                         "properties": {"name": {"enum": ["b"]}, "code": {"type": "integer"}}}]}
    valid, invalid = ['{"name":"a"}', '{"name":"b","code":1}'], ['"x"', "3", "null", "[]", '{"name":"c"}']
    reference = validator_for(schema)
    assert all(reference.is_valid(json.loads(t)) for t in valid)
    assert not any(reference.is_valid(json.loads(t)) for t in invalid)
    for text, by_judge in verdicts_of(checker, schema, valid + invalid).items():
        assert set(by_judge.values()) == {text in valid}, (text, by_judge)
    with pytest.raises(SchemaNotSupported, match="oneOf"):
        compile_schema({"oneOf": [schema["oneOf"][0], {**schema["oneOf"][1], "type": ["object", "string"]}]})


# ---------------------------------------------------------------- unevaluated*

UNEVALUATED_CASES = [
    ({"properties": {"foo": {"type": "string"}}, "allOf": [{"properties": {"bar": {"type": "string"}}}],
      "unevaluatedProperties": False},
     ['{"foo":"a","bar":"b"}', '{"foo":"a","bar":"b","baz":"c"}', '{"foo":"a"}']),
    ({"properties": {"foo": {"type": "string"}}, "allOf": [{"additionalProperties": True}],
      "unevaluatedProperties": False},
     ['{"foo":"a","bar":1}']),
    ({"$defs": {"b": {"properties": {"bar": {"type": "string"}}}}, "$ref": "#/$defs/b",
      "properties": {"foo": {"type": "string"}}, "unevaluatedProperties": {"type": "integer"}},
     ['{"foo":"a","bar":"b"}', '{"foo":"a","x":1}', '{"foo":"a","x":"1"}']),
    ({"properties": {"foo": {"type": "string"}}, "oneOf": [
        {"properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind"]},
        {"properties": {"kind": {"const": "b"}, "y": {"type": "integer"}}, "required": ["kind"]}],
      "unevaluatedProperties": False},
     ['{"foo":"a","kind":"a","x":1}', '{"kind":"b","y":2}', '{"kind":"a","y":2}',
      '{"kind":"b","x":1,"q":1}']),
    ({"properties": {"foo2": {}}, "dependentSchemas": {"foo": {}, "foo2": {"properties": {"bar": {}}}},
      "unevaluatedProperties": False},
     ['{"foo":""}', '{"foo2":"","bar":""}', '{"bar":""}']),
    ({"prefixItems": [{"type": "string"}], "allOf": [{"prefixItems": [True, {"type": "number"}]}],
      "unevaluatedItems": False},
     ['["a",1]', '["a",1,true]', '["a"]']),
    ({"items": {"type": "number"}, "unevaluatedItems": {"type": "string"}}, ["[1,2]", '[1,"x"]']),
    ({"prefixItems": [{"const": "foo"}], "unevaluatedItems": {"type": "boolean"}},
     ['["foo",true]', '["foo",1]']),
]


@pytest.mark.parametrize("schema, texts", UNEVALUATED_CASES,
                         ids=[str(i) for i in range(len(UNEVALUATED_CASES))])
def test_unevaluated_keywords_where_the_merged_scope_is_exact(checker, schema, texts):
    """unevaluated* as additionalProperties/items of the merged schema, where the merge keeps the
    evaluated set (allOf, $ref siblings, exclusive branches): verdicts equal jsonschema's 2020-12."""
    import jsonschema

    schema = {"$schema": D2020, **schema}
    validator = jsonschema.Draft202012Validator(schema)
    for text, verdicts in verdicts_of(checker, schema, texts).items():
        expected = validator.is_valid(json.loads(text))
        assert set(verdicts.values()) == {expected}, f"{text}: valid={expected}, judges {verdicts}"


@pytest.mark.parametrize("schema, pointer", [
    ({"allOf": [{"properties": {"foo": True}}, {"unevaluatedProperties": False}]}, "/unevaluatedProperties"),
    ({"anyOf": [{"properties": {"a": True}}, {"properties": {"b": True}}], "unevaluatedProperties": False},
     "/unevaluatedProperties"),
    ({"prefixItems": [True],
      "anyOf": [{"prefixItems": [True, True]}, {"prefixItems": [True, {"type": "string"}]}],
      "unevaluatedItems": False}, "/unevaluatedItems"),
])
def test_unevaluated_keywords_the_merge_cannot_express_are_refused(schema, pointer):
    with pytest.raises(SchemaNotSupported, match="unevaluated") as info:
        compile_schema(schema)
    assert info.value.pointer == pointer
