"""Schema grammars under the three judges (python lark, llguidance with SmolLM2's tokens, xgrammar
on the EBNF rendering): one regression case per class of lexer ambiguity, masks compared after
every prefix, and the lexeme invariant that fixes the class (every Lark literal is one JSON token)."""

from __future__ import annotations

import json
import re

import pytest

from agentspec_sdk.coverage.grammar_checks import JUDGES
from agentspec_sdk.structure.schema.compiler import schema_rules


@pytest.fixture(scope="module")
def checker():
    transformers = pytest.importorskip("transformers", reason="extra: cpu (transformers not installed)")
    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.coverage.grammar_checks import GrammarChecker

    return GrammarChecker(transformers.AutoTokenizer.from_pretrained(str(resolve_model())))


def judges_for(checker, schema, **options):
    rules = schema_rules(schema, "s", **options)
    judges = checker.judges(f"start: {rules.root}\n{rules.lark}", f"root ::= {rules.root}\n{rules.gbnf}")
    assert judges.errors == dict.fromkeys(JUDGES), judges.errors
    return judges, rules


OBJ_A = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}

# (class, schema, options, valid, invalid): in each, a declared key (or a literal value) and a
# generic terminal can stand at the same position.
CLASSES = [
    ("anyOf: declared key vs any key (the issue's minimal case)",
     {"anyOf": [OBJ_A, {"type": "object", "additionalProperties": True}]}, {},
     ['{"a":1}', '{"a":"x"}', '{"b":1}', "{}", '{"a":[1,{"a":2}]}'], ["[]", '{"a":1,}', '{"a" 1}']),
    ("oneOf (relaxed): closed declared key vs typed extra keys",
     {"oneOf": [{**OBJ_A, "additionalProperties": False},
                {"type": "object", "additionalProperties": {"type": "integer"}}]},
     {"relax": ["oneOf"]}, ['{"a":1}', '{"a":"x"}', '{"zz":2}'], ['{"a":true}', '{"a":"x","b":1}']),
    ("dependentSchemas: no dependency (generic key) vs dependency present (declared keys)",
     {"dependentSchemas": {"bar": {"properties": {"foo": {"type": "integer"}, "bar": {"type": "integer"}}}}},
     {},
     ['{"foo":"quux"}', '{"foo":2,"bar":1}', "{}", '{"bar":1}'],
     ['{"foo":"quux","bar":2}', '{"foo":2,"bar":"x"}']),
    ("dependencies (array form): key absent vs key with its dependents",
     {"dependencies": {"bar": ["foo"]}}, {},
     ['{"foo":1}', '{"bar":2,"foo":1}', '{"baz":1}'], ['{"bar":2}', '{"bar":2,"baz":1}']),
    ("additionalProperties schema in one branch, declared key in another",
     {"anyOf": [{"properties": {"a": {"type": "integer"}}, "additionalProperties": False},
                {"additionalProperties": {"type": "string"}}]}, {},
     ['{"a":"x"}', '{"a":1}', '{"q":"x"}'], ['{"a":true}', '{"q":1}']),
    ("patternProperties key class vs a declared key",
     {"anyOf": [{"patternProperties": {"^a": {"type": "integer"}}, "additionalProperties": False},
                {"properties": {"ab": {"type": "string"}}, "required": ["ab"]}]}, {},
     ['{"ab":1}', '{"ab":"x"}', '{"ax":1,"ab":2}'], ['{"ab":true}', '{"b":1}']),
    ("const object vs an object rule",
     {"anyOf": [{"const": {"a": 1}}, {"type": "object", "properties": {"a": {"type": "string"}}}]}, {},
     ['{"a":1}', '{"a":"x"}', "{}"], ['{"a":2}', '{"a":true}']),
    ("const array vs an array rule",
     {"anyOf": [{"const": [1, 2]}, {"type": "array", "items": {"type": "string"}}]}, {},
     ["[1,2]", '["x"]', "[]"], ["[1]", "[1,2,3]"]),
    ("enum numbers vs a number rule (sign, fraction)",
     {"anyOf": [{"enum": [-5, 1.5, 2e-7]}, {"type": "integer", "minimum": -100}]}, {},
     ["-50", "-5", "1.5", "0.0000002", "7"], ["1.55", "-500", "2e-7", "2e-07"]),
    ("const number vs a bounded number rule",
     {"anyOf": [{"const": 1.5}, {"type": "number", "maximum": 2}]}, {},
     ["1.55", "1.5", "-3"], ["2.5"]),
    ("enum string vs a string rule",
     {"anyOf": [{"enum": ["ab"]}, {"type": "string", "pattern": "^a+$"}]}, {},
     ['"ab"', '"aaa"'], ['"abb"', '"b"']),
    ("flexible whitespace: enum object vs an object rule",
     {"anyOf": [{"const": {"a": [1, 2]}}, {"type": "object", "properties": {"a": {"type": "string"}}}]},
     {"whitespace": "flexible"},
     ['{"a":[1,2]}', '{ "a": [1, 2] }', '{"a": "x"}'], ['{"a":[1]}', '{ "a": [1, 2, 3] }']),
]


@pytest.mark.parametrize("schema, options, valid, invalid", [c[1:] for c in CLASSES],
                         ids=[c[0] for c in CLASSES])
def test_every_judge_agrees_and_masks_match_on_each_prefix(checker, schema, options, valid, invalid):
    judges, _ = judges_for(checker, schema, **options)
    for text in valid:
        assert judges.verdicts(text) == dict.fromkeys(JUDGES, True), text
        for n in range(len(text) + 1):
            masks = judges.next_bytes(text[:n])
            assert masks is not None and masks["llguidance"] == masks["xgrammar"], (text[:n], masks)
    for text in invalid:
        assert judges.verdicts(text) == dict.fromkeys(JUDGES, False), text


_JSON_TOKEN = re.compile(
    r'[{}\[\],:]|true|false|null|-|\d+|\.\d+|[eE][+-]?\d+|"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"'
)
_LARK_LITERAL = re.compile(r'(?<![/\\])"((?:[^"\\]|\\.)*)"')


@pytest.mark.parametrize("schema, options", [c[1:3] for c in CLASSES] + [
    ({"type": "object",
      "properties": {"x": {"enum": [{"k": [None, True, -1.25e3]}, "s"]}, "y": {"const": -0.5}}}, {}),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
      "additionalProperties": False}, {}),
], ids=[c[0] for c in CLASSES] + ["nested enum values", "closed object"])
def test_every_lark_literal_is_one_json_token(schema, options):
    """The invariant behind the fix: lexemes are whole JSON tokens (numbers split at sign, integer
    digits, fraction, exponent, as every number rule splits them), so two terminals at one position
    either match the same text or end where JSON tokenisation ends."""
    rules = schema_rules(schema, "s", **options)
    for line in rules.lark.splitlines():
        body = line.split(":", 1)[1]
        if body.strip().startswith("/"):
            continue  # a regex terminal: one Tok (a string, a number piece, blanks)
        for raw in _LARK_LITERAL.findall(body):
            text = json.loads(f'"{raw}"')
            assert _JSON_TOKEN.fullmatch(text), f"literal {text!r} in {line!r} is not one JSON token"


def test_the_judges_can_disagree(checker):
    """The pre-fix rendering (key and colon glued into one lexeme, beside the generic key terminal):
    lark and xgrammar accept {"a":1}, llguidance's lexer commits to the glued key and rejects it."""
    lark_text = '''start: "{" ("\\"a\\":" STR | KEY ":" NUM) "}"
KEY: /\\x22[a-z]*\\x22/
STR: /\\x22[a-z]*\\x22/
NUM: /[0-9]+/
'''
    gbnf_text = ('root ::= "{" ("\\"a\\":" str | key ":" num) "}"\nkey ::= "\\"" [a-z]* "\\""\n'
                 'str ::= "\\"" [a-z]* "\\""\nnum ::= [0-9]+\n')
    judges = checker.judges(lark_text, gbnf_text)
    assert judges.errors == dict.fromkeys(JUDGES)
    assert judges.verdicts('{"a":"x"}') == dict.fromkeys(JUDGES, True)
    assert judges.verdicts('{"a":1}') == {"lark": True, "llguidance": False, "xgrammar": True}
    masks = judges.next_bytes('{"a":')
    assert masks["llguidance"] != masks["xgrammar"]  # the mask comparison sees it before any rejection


def test_a_grammar_a_judge_cannot_compile_is_reported_not_judged(checker):
    judges = checker.judges("start: undefined_rule\n", "root ::= undefined_rule\n")
    assert all(judges.errors[name] for name in JUDGES), judges.errors
    assert judges.verdicts("x") == dict.fromkeys(JUDGES)
    assert judges.next_bytes("") is None
