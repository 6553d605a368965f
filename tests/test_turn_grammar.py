import json

import lark
import pytest

from agentspec_sdk.errors import FormatError, SchemaNotSupported, ToolRegistryError, TurnParseError
from agentspec_sdk.structure.call_syntax import write_calls
from agentspec_sdk.structure.formats import CODE_AGENT, CODE_TOOL, REACT, TOOL_CALLS, AgentFormat, get_format
from agentspec_sdk.structure.tools import ToolRegistry
from agentspec_sdk.structure.turn_grammar import tool_call_grammar, turn_grammar, turn_grammar_gbnf
from agentspec_sdk.structure.turns import ParsedTurn, ToolCall, parse_calls, parse_turn


def search(query: str, k: int = 3) -> str:
    """Search the web."""
    return query


def get_weather(city: str, unit: str = "c") -> str:
    """Weather for a city."""
    return city


REGISTRY = ToolRegistry([search, get_weather])

SAMPLES = {
    "tool_calls": [
        ('I will search.<tool_call>{"name":"search","arguments":{"query":"a </tool_call> Observation: x"}}'
         '</tool_call>', True),
        ('<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris","unit":"f"}}\n</tool_call>\n'
         '<tool_call>{"name":"search","arguments":{"query":"x","k":2}}</tool_call>', True),
        ("Just an answer, no call.", True),
        ('bad <tool_call>{"name":"nope","arguments":{}}</tool_call>', False),  # unknown tool
        ('bad <tool_call>{"name":"search","arguments":{"query":3}}</tool_call>', False),  # wrong type
        # closed object
        ('<tool_call>{"name":"search","arguments":{"query":"x","extra":1}}</tool_call>', False),
        ('<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>', False),  # not compact
        ('ok <tool_call>{"name":"search","arguments":{"query":"x"}}</tool_call> then more text', False),
        ("x <tool_response>", False),  # the environment's segment
    ],
    "react": [
        ('Thought: I need Act now.\nAction: search\nAction Input: {"query":"Observation: y"}\n', True),
        (' I know.\nFinal Answer: 42', True),
        ('Action: get_weather\nAction Input: {"city":"Oslo"}', True),
        ("Thought: x\nAction: nope\nAction Input: {}", False),
        ('Thought: x\nAction: search\nAction Input: {"query":1}', False),
        ('Thought: x\nAction: search\nAction Input: {"query":"q"}\nObservation: 1', False),
        ("Thought: x\nObservation: 1\nFinal Answer: 2", False),
    ],
    "code_agent": [
        ('Let me compute.\n```python\nprint("Thought: <result>")\n```', True),
        ("The answer is 3.", True),
        ("<code>x = 1</code>\n", True),
        ("x <result>3</result>", False),
        ("```python\nx = 1\n``` and more", False),
        ("```python\nx = 1\n```\n\n\n", False),  # the turn ends with the block
    ],
}
FORMATS = {"tool_calls": TOOL_CALLS, "react": REACT, "code_agent": CODE_AGENT}
CASES = [(name, text, ok) for name, items in SAMPLES.items() for text, ok in items]


@pytest.fixture(scope="module")
def lark_parsers():
    return {name: lark.Lark(turn_grammar(fmt, REGISTRY, dialect="lark"), parser="earley", lexer="dynamic")
            for name, fmt in FORMATS.items()}


@pytest.fixture(scope="module")
def hf_tokenizer():
    transformers = pytest.importorskip("transformers", reason="extra: cpu (transformers not installed)")
    from agentspec_sdk.backends.model_bundle import resolve_model

    return transformers.AutoTokenizer.from_pretrained(str(resolve_model()))


@pytest.fixture(scope="module")
def ll_tokenizer(hf_tokenizer):
    import llguidance.hf

    return llguidance.hf.from_tokenizer(hf_tokenizer)


@pytest.fixture(scope="module")
def xgr_compiler(hf_tokenizer):
    import xgrammar as xgr  # a base dependency: a missing one fails

    return xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(hf_tokenizer))


def _lark_accepts(parser, text):
    try:
        parser.parse(text)
        return True
    except lark.exceptions.LarkError:
        return False


@pytest.mark.parametrize(("fmt_name", "text", "ok"), CASES)
def test_python_lark_accepts_exactly_the_valid_turns(lark_parsers, fmt_name, text, ok):
    assert _lark_accepts(lark_parsers[fmt_name], text) is ok


def _llg_accepts(ll_tokenizer, hf_tokenizer, grammar, text):
    import llguidance

    matcher = llguidance.LLMatcher(ll_tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar))
    assert not matcher.is_error(), matcher.get_error()
    ok = all(matcher.consume_token(t) for t in hf_tokenizer.encode(text))
    return ok and matcher.is_accepting(), matcher


@pytest.mark.parametrize("fmt_name", list(FORMATS))
def test_llguidance_compiles_and_agrees_on_real_tokens(ll_tokenizer, hf_tokenizer, fmt_name):
    import llguidance

    grammar = turn_grammar(FORMATS[fmt_name], REGISTRY)
    assert llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(grammar),
                                                 ll_tokenizer) == ""
    for text, ok in SAMPLES[fmt_name]:
        assert _llg_accepts(ll_tokenizer, hf_tokenizer, grammar, text)[0] is ok, text


@pytest.mark.parametrize("fmt_name", list(FORMATS))
def test_xgrammar_ebnf_compiles_and_agrees(xgr_compiler, fmt_name):
    import xgrammar as xgr

    compiled = xgr_compiler.compile_grammar(turn_grammar_gbnf(FORMATS[fmt_name], REGISTRY))
    for text, ok in SAMPLES[fmt_name]:
        matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
        assert (matcher.accept_string(text) and matcher.is_completed()) is ok, text


def test_react_turn_ends_where_the_observation_would_begin(ll_tokenizer, hf_tokenizer):
    import llguidance
    import llguidance.numpy

    grammar = turn_grammar(REACT, REGISTRY)
    ok, matcher = _llg_accepts(ll_tokenizer, hf_tokenizer, grammar,
                               'Thought: go\nAction: search\nAction Input: {"query":"q"}\n')
    assert ok
    mask = llguidance.numpy.allocate_token_bitmask(1, ll_tokenizer.vocab_size)
    llguidance.numpy.fill_next_token_bitmask(matcher, mask, 0)
    bits = [(int(mask[0, i // 32]) >> (i % 32)) & 1 for i in range(ll_tokenizer.vocab_size)]
    assert [i for i, b in enumerate(bits) if b] == [ll_tokenizer.eos_token]
    assert not llguidance.LLMatcher(ll_tokenizer,
                                    llguidance.LLMatcher.grammar_from_lark(grammar)).is_accepting()


def test_grammar_text_is_byte_stable():
    again = ToolRegistry.from_json(REGISTRY.to_json())
    for fmt in FORMATS.values():
        assert turn_grammar(fmt, REGISTRY) == turn_grammar(fmt, again)
        assert turn_grammar_gbnf(fmt, REGISTRY) == turn_grammar_gbnf(fmt, again)
    assert tool_call_grammar(REGISTRY) == tool_call_grammar(again)


def test_tool_call_grammar_is_the_call_object(ll_tokenizer, hf_tokenizer):
    parser = lark.Lark(tool_call_grammar(REGISTRY, dialect="lark"), parser="earley", lexer="dynamic")
    call = {"name": "get_weather", "arguments": {"city": "Ünïcode \"q\"", "unit": "f"}}
    text = json.dumps(call, ensure_ascii=False, separators=(",", ":"))
    assert _lark_accepts(parser, text)
    assert not _lark_accepts(parser, text.replace("get_weather", "get_wether"))
    ok, matcher = _llg_accepts(ll_tokenizer, hf_tokenizer, tool_call_grammar(REGISTRY), '{"name":"get_w')
    assert ok is False  # incomplete, but not an error: the rest of the name is forced
    assert not matcher.is_error()
    assert matcher.compute_ff_bytes().startswith(b'eather","arguments":{"city":"')


def test_tool_choice_variants(lark_parsers):
    required = lark.Lark(turn_grammar(TOOL_CALLS, REGISTRY, tool_choice="required", dialect="lark"),
                         parser="earley")
    assert not _lark_accepts(required, "Just text.")
    assert _lark_accepts(required, '<tool_call>{"name":"search","arguments":{"query":"x"}}</tool_call>')
    none = lark.Lark(turn_grammar(TOOL_CALLS, REGISTRY, tool_choice="none", dialect="lark"), parser="earley")
    assert _lark_accepts(none, "Just text.")
    assert not _lark_accepts(none, '<tool_call>{"name":"search","arguments":{"query":"x"}}</tool_call>')
    empty = lark.Lark(turn_grammar(REACT, ToolRegistry(), dialect="lark"), parser="earley")
    assert _lark_accepts(empty, "Thought: hmm\nFinal Answer: 1")
    with pytest.raises(ToolRegistryError, match="no tools are registered"):
        turn_grammar(TOOL_CALLS, ToolRegistry(), tool_choice="required")
    with pytest.raises(ToolRegistryError, match="at least one tool"):
        tool_call_grammar(ToolRegistry())


def test_call_only_shapes_are_arguments(lark_parsers):
    one = turn_grammar(TOOL_CALLS, REGISTRY, tool_choice="call", single_call=True, dialect="lark")
    call = '<tool_call>{"name":"search","arguments":{"query":"x"}}</tool_call>'
    parser = lark.Lark(one, parser="earley")
    assert _lark_accepts(parser, call)
    assert not _lark_accepts(parser, call + call)  # "call" alone allows several; single_call one
    assert _lark_accepts(lark.Lark(turn_grammar(TOOL_CALLS, REGISTRY, tool_choice="call", dialect="lark"),
                                   parser="earley"), call + call)
    assert not _lark_accepts(parser, "Hmm. " + call)
    # the single call is the call object of tool_call_grammar inside the format's call markers
    body = tool_call_grammar(REGISTRY).split("\n", 1)[1]
    assert turn_grammar(TOOL_CALLS, REGISTRY, tool_choice="call", single_call=True) == \
        'start: "<tool_call>" (turn_tool_call) "</tool_call>"\n' + body
    acting = turn_grammar(REACT, REGISTRY, tool_choice="required", thought_chars=20)
    assert acting.startswith('start: "Thought: " REACT_THOUGHT "\\n" "Action:" " "? turn_react_call')
    # the bounded line alone: intersected with "no marker" it overran llguidance's lexer limit while
    # drafts were validated (test_react_agent.py)
    assert acting.endswith("REACT_THOUGHT: /[^\\n]{1,20}/\n")
    assert acting == turn_grammar(REACT, REGISTRY, tool_choice="call", thought_chars=20)
    with pytest.raises(FormatError, match="single_call needs the 'tool_calls' layout and tool_choice='call'"):
        turn_grammar(REACT, REGISTRY, tool_choice="call", single_call=True)
    with pytest.raises(FormatError, match="tool_choice='auto'"):
        turn_grammar(TOOL_CALLS, REGISTRY, single_call=True)
    with pytest.raises(FormatError, match="thought_chars needs the 'react' layout"):
        turn_grammar(REACT, REGISTRY, tool_choice="auto", thought_chars=20)
    with pytest.raises(FormatError, match="thought_chars needs dialect='llguidance'"):
        turn_grammar(REACT, REGISTRY, tool_choice="required", thought_chars=20, dialect="lark")
    with pytest.raises(ValueError, match="thought_chars must be a positive int, not 0"):
        turn_grammar(REACT, REGISTRY, tool_choice="required", thought_chars=0)
    with pytest.raises(ToolRegistryError, match="at least one tool"):
        turn_grammar(TOOL_CALLS, ToolRegistry(), tool_choice="call", single_call=True)
    gbnf = turn_grammar_gbnf(TOOL_CALLS, REGISTRY, tool_choice="call", single_call=True)
    assert gbnf.startswith('root ::= "<tool_call>" (turn_tool_call) "</tool_call>"\n')


def test_parse_calls_has_one_error_behaviour():
    text = 'ok <tool_call>{"name":"search","arguments":{"query":"x"}}</tool_call>'
    assert parse_calls(TOOL_CALLS, text) == [ToolCall("search", {"query": "x"})]
    assert parse_calls(CODE_AGENT, "```python\nprint(1)\n```") == [ToolCall(CODE_TOOL, {"code": "print(1)"})]
    assert parse_calls(REACT, "Thought: done.\nFinal Answer: 4") == []
    with pytest.raises(TurnParseError, match="tool call #1 at offset 0: malformed JSON"):
        parse_calls(TOOL_CALLS, '<tool_call>{"name":"search","argu')


def test_special_token_markers_use_llguidance_token_syntax():
    grammar = turn_grammar(TOOL_CALLS, REGISTRY, special_tokens=["<tool_call>", "</tool_call>"])
    assert '"<tool_call>"' not in grammar and " <tool_call>" in grammar and " </tool_call>" in grammar
    with pytest.raises(FormatError, match="special-token syntax"):
        turn_grammar(TOOL_CALLS, REGISTRY, special_tokens=["<tool_call>"], dialect="lark")


def test_unsupported_tool_schema_names_the_tool():
    reg = ToolRegistry([{"name": "odd",
                         "parameters": {"type": "object", "properties": {"x": {"not": {"type": "string"}}}}}])
    with pytest.raises(SchemaNotSupported, match="tool 'odd' parameters") as info:
        turn_grammar(TOOL_CALLS, reg)
    assert info.value.pointer.startswith("/properties/x")


def test_format_without_layout_has_no_turn_grammar():
    fmt = AgentFormat.from_dict({"name": "plain", "initial": "t", "kinds": [{"name": "t", "law_class": "F"}]})
    with pytest.raises(FormatError, match="no layout"):
        turn_grammar(fmt, REGISTRY)


def test_user_format_reuses_a_layout(ll_tokenizer, hf_tokenizer):
    fmt = AgentFormat.from_dict({
        "name": "invoke_agent", "initial": "plan", "layout": "tool_calls", "stop": ["<output>"],
        "kinds": [
            {"name": "plan", "law_class": "R"},
            {"name": "tool_call", "law_class": "S", "open": ["<invoke>"], "close": ["</invoke>"],
             "content": "json"},
            {"name": "output", "law_class": "F", "writer": "env", "open": ["<output>"],
             "close": ["</output>"]},
        ],
    })
    text = 'plan<invoke>{"name":"search","arguments":{"query":"<output>"}}</invoke>'
    assert _llg_accepts(ll_tokenizer, hf_tokenizer, turn_grammar(fmt, REGISTRY), text)[0]
    assert parse_turn(fmt, text).tool_calls == [ToolCall("search", {"query": "<output>"})]


# -- parse_turn ------------------------------------------------------------------------------


def test_parse_tool_calls_turn():
    text = SAMPLES["tool_calls"][1][0] + "<tool_response>ignored</tool_response>"
    assert parse_turn(TOOL_CALLS, text) == ParsedTurn(
        "", [ToolCall("get_weather", {"city": "Paris", "unit": "f"}),
             ToolCall("search", {"query": "x", "k": 2})]
    )
    first = parse_turn(TOOL_CALLS, SAMPLES["tool_calls"][0][0])
    assert first.reasoning == "I will search."
    assert first.tool_calls[0].arguments == {"query": "a </tool_call> Observation: x"}
    assert parse_turn(TOOL_CALLS, "Just text.") == ParsedTurn("", [], "Just text.")
    # OpenAI-style string arguments, and a call cut off before its close marker
    cut = parse_turn(TOOL_CALLS, '<tool_call>{"name":"f","arguments":"{\\"a\\":1}"}')
    assert cut.tool_calls == [ToolCall("f", {"a": 1})]


def test_parse_react_turn():
    assert parse_turn(REACT, SAMPLES["react"][0][0]) == ParsedTurn(
        "I need Act now.", [ToolCall("search", {"query": "Observation: y"})], None
    )
    assert parse_turn(REACT, " I know.\nFinal Answer: 42") == ParsedTurn("I know.", [], "42")


def test_parse_code_turn():
    parsed = parse_turn(CODE_AGENT, SAMPLES["code_agent"][0][0] + "\n<result>3</result>")
    assert parsed == ParsedTurn("Let me compute.", [], None, 'print("Thought: <result>")')
    assert parse_turn(CODE_AGENT, "<code>x = 1</code>").code == "x = 1"
    assert parse_turn(CODE_AGENT, "The answer is 3.").final_answer == "The answer is 3."


@pytest.mark.parametrize(
    ("fmt", "text", "message"),
    [
        (TOOL_CALLS, '<tool_call>{"name":"f","arguments":{"a":}}</tool_call>',
         r"tool call #1 at offset 0: malformed JSON"),
        (TOOL_CALLS, '<tool_call>{"arguments":{}}</tool_call>', "missing or non-string 'name'"),
        (TOOL_CALLS, '<tool_call>{"name":"f","arguments":[1]}</tool_call>', "must be a JSON object"),
        (REACT, "Action: search\nAction Input: {oops}",
         "action input of 'search' at offset 15: malformed JSON"),
        (REACT, "Action: search\n", "has no action input"),
        (REACT, "Action: \nAction Input: {}", "names no tool"),
    ],
)
def test_parse_errors_are_clear(fmt, text, message):
    with pytest.raises(TurnParseError, match=message):
        parse_turn(fmt, text)


def test_a_format_is_passed_as_the_object_resolved_at_the_edge():
    for call in (lambda f: turn_grammar(f, REGISTRY), lambda f: turn_grammar_gbnf(f, REGISTRY),
                 lambda f: parse_turn(f, "x"), lambda f: parse_calls(f, "x"),
                 lambda f: write_calls(f, [], REGISTRY)):
        with pytest.raises(FormatError, match="takes an AgentFormat, got str 'tool_calls'.*get_format"):
            call("tool_calls")
    assert parse_turn(get_format("react"), " I know.\nFinal Answer: 42").final_answer == "42"
    prose = AgentFormat.from_dict({"name": "prose_x", "initial": "p",
                                   "kinds": [{"name": "p", "law_class": "F"}]})
    assert parse_turn(prose, " free text ") == ParsedTurn("", [], "free text")
