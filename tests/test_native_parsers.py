"""Round trip: calls a native format's grammar accepts, fed to the REAL vLLM tool parser class the
format pairs with (`AgentFormat.tool_parser`), read back to the same names and arguments; our
`agentspec` tool parser (the one for Gemma's ```tool_code blocks, which vLLM 0.32 has no parser for)
and `parse_calls` read them too; the chat template of `agentspec serve` writes earlier calls the same
way. The tokenizer is SmolLM2's; a parser that needs its marker in the vocabulary (Llama's
``<|python_tag|>``, Mistral's ``[TOOL_CALLS]``) gets it added as a special token to a copy."""

import copy
import json

import pytest

from agentspec_sdk.structure.call_syntax import write_calls
from agentspec_sdk.structure.formats import NATIVE_FORMATS, get_format
from agentspec_sdk.structure.tools import ToolRegistry
from agentspec_sdk.structure.turn_grammar import turn_grammar
from agentspec_sdk.structure.turns import ToolCall, parse_calls
from tests.native_tools import bfcl_registry, calls_for, trace_registry, validator

pytest.importorskip("vllm", reason="extra: cpu (vllm not installed)")

PARSED = [f.name for f in NATIVE_FORMATS if f.tool_parser]
NEEDS_TOKEN = {"llama3_json": ["<|python_tag|>"], "mistral": ["[TOOL_CALLS]"]}


@pytest.fixture(scope="module")
def checker(hf_tokenizer):
    from agentspec_sdk.coverage.grammar_checks import GrammarChecker

    return GrammarChecker(hf_tokenizer)


def _request(registry: ToolRegistry):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}],
                                 tools=registry.openai_tools())


def _turns(name: str):
    """(registry, turns: list of (text, calls)) on BFCL and trace tools, two calls per turn and one."""
    fmt = get_format(name)
    python = fmt.syntax.payload == "python_call"
    out = []
    for registry in (bfcl_registry(10, python_names=python), trace_registry()):
        calls = calls_for(registry, validator)
        turns = [calls[i:i + 2] for i in range(0, len(calls), 2)] + [calls[:1]]
        out.append((registry, [(write_calls(fmt, c, registry), c) for c in turns]))
    return out


def _read_back(tool_calls) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in tool_calls]


@pytest.mark.parametrize("name", PARSED)
def test_vllm_parser_reads_back_what_the_grammar_allows(hf_tokenizer, checker, name):
    from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

    fmt = get_format(name)
    tokenizer = copy.deepcopy(hf_tokenizer)
    if name in NEEDS_TOKEN:
        tokenizer.add_special_tokens({"additional_special_tokens": NEEDS_TOKEN[name]})
    parser_class = ToolParserManager.get_tool_parser(fmt.tool_parser)
    checked = 0
    for registry, turns in _turns(name):
        grammar = checker.judges(turn_grammar(fmt, registry), "root ::= \"\"")
        for text, calls in turns:
            assert grammar.llguidance_accepts(text), text  # the turn grammar allows it
            out = parser_class(tokenizer).extract_tool_calls(text, _request(registry))
            assert out.tools_called, (name, text)
            assert _read_back(out.tool_calls) == calls, text
            assert parse_calls(fmt, text) == [ToolCall(n, a) for n, a in calls]
            checked += len(calls)
    assert checked >= 20


@pytest.mark.parametrize("name", [f.name for f in NATIVE_FORMATS])
def test_agentspec_tool_parser_reads_every_native_format(hf_tokenizer, monkeypatch, name):
    from agentspec_sdk.backends.inside_vllm import tool_parser

    monkeypatch.setenv(tool_parser.FORMAT_ENV, name)
    fmt = get_format(name)
    for registry, turns in _turns(name):
        request = _request(registry)
        for text, calls in turns:
            parser = tool_parser.AgentSpecToolParser(hf_tokenizer)
            out = parser.extract_tool_calls(text, request)
            assert out.tools_called and _read_back(out.tool_calls) == calls, text
        prose = parser.extract_tool_calls("No tool needed [1].", request)
        assert not prose.tools_called and prose.content == "No tool needed [1]."
        # the request's grammar is the format's own turn grammar
        adjusted = tool_parser.AgentSpecToolParser(hf_tokenizer).adjust_request(_request(registry))
        assert adjusted.structured_outputs.grammar == turn_grammar(fmt, registry)
        assert set(fmt.stop) <= set(adjusted.stop)


@pytest.mark.parametrize("name", [f.name for f in NATIVE_FORMATS])
def test_serve_chat_template_writes_earlier_calls_in_the_format(hf_tokenizer, name):
    from agentspec_sdk.backends.inside_vllm.tool_prompt import chat_template

    fmt = get_format(name)
    registry = trace_registry()
    calls = [c for c in calls_for(registry, validator)
             if all(not isinstance(v, dict | list) for v in c[1].values())][:2]  # scalar arguments
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
                    for i, (n, a) in enumerate(calls)]},
                {"role": "tool", "tool_call_id": "c0", "content": "done"}]
    base = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    text = hf_tokenizer.apply_chat_template(messages, tools=registry.openai_tools(), tokenize=False,
                                            chat_template=chat_template(fmt, base))
    assert f"<assistant>{write_calls(fmt, calls, registry)}</assistant>" in text
    before, _, after = fmt.env_wrap.partition("{}")
    assert f"<user>{before}done{after}</user>" in text


LIGHTS = ToolRegistry([{"type": "function", "function": {
    "name": "set_lights", "description": "Set the lights of some rooms.",
    "parameters": {"type": "object", "properties": {
        "rooms": {"type": "array", "items": {"type": "string"}},
        "settings": {"type": "object", "properties": {
            "on": {"type": "boolean"}, "level": {"type": ["integer", "null"]}, "scene": {"type": "string"}},
            "required": ["on"]},
        "dry_run": {"type": "boolean"}},
        "required": ["rooms", "settings"]}}}])


@pytest.mark.parametrize("name", [f.name for f in NATIVE_FORMATS])
def test_serve_chat_template_writes_nested_values_as_write_calls_does(hf_tokenizer, name):
    """Nested values of an earlier call: Python literals at every depth for a Python-call syntax
    ({"on": True, "level": None}), JSON for a JSON one, as `write_calls` writes them."""
    from agentspec_sdk.backends.inside_vllm.tool_prompt import chat_template

    fmt = get_format(name)
    calls = [("set_lights", {"rooms": ["hall", "café"], "settings": {"on": True, "level": None,
                                                                     "scene": 'a "b"'}, "dry_run": False}),
             ("set_lights", {"rooms": [], "settings": {"on": False}})]
    messages = [{"role": "user", "content": "lights"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
                    for i, (n, a) in enumerate(calls)]}]
    base = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    text = hf_tokenizer.apply_chat_template(messages, tools=LIGHTS.openai_tools(), tokenize=False,
                                            chat_template=chat_template(fmt, base))
    assert f"<assistant>{write_calls(fmt, calls, LIGHTS)}</assistant>" in text
