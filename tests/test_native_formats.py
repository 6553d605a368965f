"""Native tool-call formats (hermes, llama3_json, mistral, pythonic, gemma_tool_code): their turn
grammars under python lark, llguidance (SmolLM2's real tokens) and xgrammar, on real tool schemas
(BFCL docs and the bundled traces' tools); `parse_calls`; the segmenter; tool_choice and single_call."""

import json

import lark
import pytest

from agentspec_sdk.errors import FormatError, SchemaNotSupported, ToolRegistryError, TurnParseError
from agentspec_sdk.structure.call_syntax import write_calls
from agentspec_sdk.structure.formats import (
    GEMMA_TOOL_CODE,
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    NATIVE_FORMATS,
    PYTHONIC,
    AgentFormat,
    get_format,
)
from agentspec_sdk.structure.segmenter import Segmenter, segment
from agentspec_sdk.structure.tools import ToolRegistry
from agentspec_sdk.structure.turn_grammar import turn_grammar, turn_grammar_gbnf
from agentspec_sdk.structure.turns import ToolCall, parse_calls, parse_turn
from tests.native_tools import bfcl_registry, calls_for, trace_registry, validator

PYTHON = {"pythonic", "gemma_tool_code"}
NAMES = [f.name for f in NATIVE_FORMATS]


@pytest.fixture(scope="module")
def judges(hf_tokenizer):
    from agentspec_sdk.coverage.grammar_checks import GrammarChecker

    return GrammarChecker(hf_tokenizer)


def _registries(name):
    python = name in PYTHON
    return {"bfcl": bfcl_registry(12, python_names=python), "traces": trace_registry()}


def _bad_turns(fmt, good: str, one: str, name: str) -> list[str]:
    """Turns the grammar must refuse: a wrong tool name, an undeclared argument, the wrong spacing,
    text after the calls, the environment's segment."""
    out = [good + " and more", one.replace(name, "no_such_tool", 1), good + fmt.stop[0]]
    if fmt.name in PYTHON:
        out += [one.replace("(", '(zz_extra="1", ', 1), one.replace("=", " = ", 1)]
    else:
        extra = one.replace('"arguments": {', '"arguments": {"zz_extra": 1, ', 1)
        out += [one.replace('{"name": ', '{"name":', 1),
                extra.replace('"parameters": {', '"parameters": {"zz_extra": 1, ', 1)]
    return out


@pytest.mark.parametrize("name", NAMES)
def test_grammars_accept_valid_calls_and_refuse_invalid_ones_on_real_tools(judges, name):
    fmt = get_format(name)
    for source, registry in _registries(name).items():
        calls = calls_for(registry, validator)
        good_turns = [write_calls(fmt, calls[i:i + 2], registry) for i in range(0, len(calls), 2)]
        good_turns.append("I have no tool for that; the answer is 4.")
        one = write_calls(fmt, calls[:1], registry)
        bad_turns = _bad_turns(fmt, good_turns[0], one, calls[0][0])
        verdicts = _three_judges(judges, fmt, registry)
        for text in good_turns:
            assert set(verdicts(text).values()) == {True}, (source, text, verdicts(text))
            parsed = parse_calls(fmt, text)
            if text.startswith("I have"):
                assert parsed == []
        for text in bad_turns:
            assert set(verdicts(text).values()) == {False}, (source, text, verdicts(text))


def _three_judges(checker, fmt, registry):
    """python lark (the `lark` dialect), llguidance (the Lark vLLM gets, fed SmolLM2's tokens) and
    xgrammar (the EBNF rendering): each text's verdict under each."""
    j = checker.judges(turn_grammar(fmt, registry), turn_grammar_gbnf(fmt, registry))
    assert j.errors["llguidance"] is None and j.errors["xgrammar"] is None, j.errors
    parser = _lark(fmt, registry)
    return lambda text: {"lark": _accepts(parser, text), "llguidance": j.llguidance_accepts(text),
                         "xgrammar": j.xgrammar_accepts(text)}


@pytest.mark.parametrize("name", NAMES)
def test_parse_calls_reads_what_the_writer_writes(name):
    fmt = get_format(name)
    registry = trace_registry()
    calls = calls_for(registry, validator)
    text = write_calls(fmt, calls, registry)
    assert parse_calls(fmt, text) == [ToolCall(n, a) for n, a in calls]
    assert parse_calls(fmt, "Just words, [1] and {2}.") == []


CALLS = [("cd", {"folder": "docs"}), ("ls", {"a": True})]
EXAMPLES = {
    # what each family's model writes (upstream template style), and the calls in it
    "hermes": ('Let me look.\n<tool_call>\n{"name": "cd", "arguments": {"folder": "docs"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "ls", "arguments": {"a": true}}\n</tool_call>', CALLS),
    "llama3_json": ('<|python_tag|>{"name": "cd", "parameters": {"folder": "docs"}}; '
                    '{"name": "ls", "parameters": {"a": true}}', CALLS),
    "mistral": ('[TOOL_CALLS][{"name": "cd", "arguments": {"folder": "docs"}}, {"name": "ls", "arguments": '
                '{"a": true}}]', CALLS),
    "pythonic": ('[cd(folder="docs"), ls(a=True)]', CALLS),
    "gemma_tool_code": ('I will list it.\n```tool_code\ncd(folder="docs")\n```\n'
                        '```tool_code\nls(a=True)\n```', CALLS),
}


@pytest.mark.parametrize("name", NAMES)
def test_family_examples_parse_segment_and_match_the_grammar(name):
    fmt = get_format(name)
    text, calls = EXAMPLES[name]
    assert parse_calls(fmt, text) == [ToolCall(n, a) for n, a in calls]
    spans = segment(fmt, text)
    assert {s.kind for s in spans} <= {"reasoning", "tool_call"}
    call_spans = [s for s in spans if s.kind == "tool_call"]
    assert call_spans and all(s.law_class == "S" for s in call_spans)
    assert all(s.law_class == "R" for s in spans if s.kind == "reasoning")
    for cut in (1, 2, 3, 7):  # any chunking gives the same spans (anchored kinds hold their prefix)
        seg = Segmenter(fmt)
        for i in range(0, len(text), cut):
            seg.feed(text[i:i + cut])
        assert seg.all_spans() == spans
    registry = trace_registry()
    parser = lark.Lark(turn_grammar(fmt, registry, dialect="lark"), parser="earley", lexer="dynamic")
    parser.parse(text)


def test_anchored_kinds_open_at_the_turn_start_only():
    assert [s.kind for s in segment(PYTHONIC, "See [1] and f().")] == ["reasoning"]
    assert [s.kind for s in segment(LLAMA3_JSON, 'x {"name": "f"}')] == ["reasoning"]
    assert [s.kind for s in segment(LLAMA3_JSON, '<|python_tag|>{"name": "f"}')] == ["tool_call"]
    seg = Segmenter(PYTHONIC)
    assert seg.boundary_in("[f()]") == 0  # a draft at the turn start that opens the call list
    seg.feed("Hi")
    assert seg.boundary_in(" [f()]") is None
    # the environment's marker still ends a reasoning turn
    kinds = [s.kind for s in segment(LLAMA3_JSON, "ok<|start_header_id|>ipython<|end_header_id|>r<|eot_id|>")]
    assert kinds == ["reasoning", "ipython"]


def _lark(fmt, registry, **kw):
    return lark.Lark(turn_grammar(fmt, registry, dialect="lark", **kw), parser="earley", lexer="dynamic")


def _accepts(parser, text):
    try:
        parser.parse(text)
        return True
    except lark.exceptions.LarkError:
        return False


@pytest.mark.parametrize("name", NAMES)
def test_tool_choice_and_single_call(name):
    fmt = get_format(name)
    registry = trace_registry()
    calls = calls_for(registry, validator)
    one, two = write_calls(fmt, calls[:1], registry), write_calls(fmt, calls[:2], registry)
    prose = "No call needed."
    required, none = _lark(fmt, registry, tool_choice="required"), _lark(fmt, registry, tool_choice="none")
    assert not _accepts(required, prose) and _accepts(required, one) and _accepts(required, two)
    assert _accepts(none, prose) and not _accepts(none, one)
    call = _lark(fmt, registry, tool_choice="call")
    assert _accepts(call, two) and not _accepts(call, prose) and not _accepts(call, "Hmm. " + one)
    single = _lark(fmt, registry, tool_choice="call", single_call=True)
    assert _accepts(single, one) and not _accepts(single, two)
    named = _lark(fmt, ToolRegistry([registry.get(calls[1][0])]), tool_choice="call")
    assert _accepts(named, write_calls(fmt, calls[1:2], registry)) and not _accepts(named, one)


def test_text_before_calls_is_content_where_the_family_parser_says_so():
    """Hermes, Mistral and Gemma calls may follow text; a pythonic list or Llama's JSON is a call only
    from the turn's first character (vLLM's parsers match there), so after text it is prose."""
    registry = trace_registry()
    calls = calls_for(registry, validator)[:1]
    for fmt, is_call in ((HERMES, True), (MISTRAL, True), (GEMMA_TOOL_CODE, True), (PYTHONIC, False),
                         (LLAMA3_JSON, False)):
        text = "Let me check. " + write_calls(fmt, calls, registry)
        assert _accepts(_lark(fmt, registry), text), fmt.name
        assert (parse_calls(fmt, text) == [ToolCall(*calls[0])]) is is_call, fmt.name
        assert _accepts(_lark(fmt, registry, tool_choice="required"), text) is is_call, fmt.name


def test_python_calls_need_python_names_and_keyword_arguments():
    integer = {"type": "object", "properties": {"n": {"type": "integer"}}}
    dotted = ToolRegistry([{"name": "math.factorial", "parameters": integer}])
    with pytest.raises(ToolRegistryError, match="'math.factorial': a Python call needs a name"):
        turn_grammar(PYTHONIC, dotted)
    turn_grammar(MISTRAL, dotted)  # JSON syntaxes take any registry name
    keyword = ToolRegistry([{"name": "f", "parameters": {"type": "object",
                                                          "properties": {"from": {"type": "string"}}}}])
    with pytest.raises(SchemaNotSupported, match="property 'from' is not a Python keyword-argument name"):
        turn_grammar(GEMMA_TOOL_CODE, keyword)
    union = ToolRegistry([{"name": "f", "parameters": {"anyOf": [{"type": "object", "properties": {}}]}}])
    with pytest.raises(SchemaNotSupported, match="must be one object schema"):
        turn_grammar(PYTHONIC, union)
    open_args = ToolRegistry([{"name": "f", "parameters": {"type": "object", "properties": {},
                                                            "additionalProperties": True}}])
    with pytest.raises(SchemaNotSupported, match="declared keyword arguments only"):
        turn_grammar(PYTHONIC, open_args)


def test_python_literals_in_pythonic_values():
    registry = ToolRegistry([{"name": "f", "parameters": {"type": "object", "properties": {
        "flag": {"type": "boolean"}, "none": {"type": "null"}, "opts": {"type": "object", "properties": {
            "on": {"type": "boolean"}}}, "tags": {"type": "array", "items": {"type": "string"}},
        "n": {"type": "number"}}}}])
    parser = _lark(PYTHONIC, registry)
    assert _accepts(parser, '[f(flag=True, none=None, opts={"on": False}, tags=["a", "b"], n=-1.5)]')
    assert not _accepts(parser, "[f(flag=true)]")  # JSON's literals are not the grammar's
    assert not _accepts(parser, '[f(opts={"on": false})]')
    assert not _accepts(parser, "[f(n=1.5, flag=True)]")  # keyword arguments in the schema's order
    # the reader also takes JSON names (chat templates that write arguments with tojson)
    assert parse_calls(PYTHONIC, '[f(flag=true, none=null, opts={"on": false})]') == [
        ToolCall("f", {"flag": True, "none": None, "opts": {"on": False}})]


@pytest.mark.parametrize(("fmt", "text", "message"), [
    (PYTHONIC, "[f(1)]", r"f\(\) takes keyword arguments only"),
    (PYTHONIC, "[f(a=x)]", "not a literal"),
    (PYTHONIC, "[f(a=", "malformed Python"),
    (GEMMA_TOOL_CODE, "```tool_code\nprint\n```", "expected a Python call"),
    (MISTRAL, '[TOOL_CALLS][{"name": "f", "arguments": {', "malformed JSON"),
    (LLAMA3_JSON, '{"name": "f", "parameters": {}} {"name": "g"}', "expected '; ' between calls"),
    (HERMES, '<tool_call>\n{"arguments": {}}\n</tool_call>', "missing or non-string 'name'"),
])
def test_malformed_native_calls_raise_turn_parse_error(fmt, text, message):
    with pytest.raises(TurnParseError, match=message):
        parse_turn(fmt, text)


@pytest.mark.parametrize("name", NAMES)
def test_native_formats_round_trip_as_plain_data(name):
    fmt = get_format(name)
    data = json.loads(json.dumps(fmt.to_dict()))
    assert AgentFormat.from_dict(data) == fmt
    assert data["call_syntax"]["payload"] in ("json_object", "python_call")
    assert data.get("tool_parser") == (None if name == "gemma_tool_code" else name)
    assert "call_syntax" not in get_format("tool_calls").to_dict()  # older formats' dicts unchanged


@pytest.mark.parametrize(("change", "message"), [
    ({"layout": "call_list", "call_syntax": None}, "layout 'call_list' needs a call_syntax"),
    ({"call_syntax": {"payload": "xml"}}, "call_syntax.payload must be one of"),
    ({"call_syntax": {"nope": 1}}, "call_syntax has unknown keys"),
    ({"call_syntax": {"lead": "<x>", "list_sep": ", "}}, "must be an open marker of kind 'tool_call'"),
])
def test_bad_call_syntax_names_the_problem(change, message):
    data = {**MISTRAL.to_dict(), **change}
    if data.get("call_syntax") is None:
        data.pop("call_syntax")
    with pytest.raises(FormatError, match=message):
        AgentFormat.from_dict(data)


@pytest.mark.parametrize(("fmt", "text", "ok"), [
    (LLAMA3_JSON, "<|py is not the tag", True),  # a prefix of the anchored marker is text
    (LLAMA3_JSON, "{not a call}", False),  # text may not start with an anchored marker
    (LLAMA3_JSON, "x {not a call}", True),
    (PYTHONIC, "[1] is a citation", False),
    (PYTHONIC, "See [1].", True),
    (PYTHONIC, "ok <|start_header_id|>ipython<|end_header_id|>", False),  # the environment's segment
])
def test_anchored_text_under_the_three_judges(judges, fmt, text, ok):
    verdicts = _three_judges(judges, fmt, trace_registry())
    assert set(verdicts(text).values()) == {ok}, verdicts(text)


def test_the_replay_policy_call_turn_is_one_call_in_every_native_format():
    from agentspec_sdk.replay.loop import call_shape

    registry = trace_registry()
    calls = calls_for(registry, validator)
    for fmt in NATIVE_FORMATS:
        parser = _lark(fmt, registry, tool_choice="call", **call_shape(fmt.layout))
        assert _accepts(parser, write_calls(fmt, calls[:1], registry)), fmt.name
        assert not _accepts(parser, write_calls(fmt, calls[:2], registry)), fmt.name
