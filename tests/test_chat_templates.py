"""Prompts through the model's own chat template where it renders tools (tests/data/chat_templates/,
origins in tests/data/README.md), our format's instructions where it does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentspec_sdk.backends.chat_template import ChatTemplate, supports_tools
from agentspec_sdk.backends.prompts import prompt_text, template_prompt
from agentspec_sdk.structure.formats import TOOL_CALLS
from agentspec_sdk.structure.tools import ToolRegistry

HERMES = (Path(__file__).parent / "data" / "chat_templates" / "hermes_vllm.jinja").read_text(encoding="utf-8")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city"}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def tokenizer():
    from agentspec_sdk.backends.model_bundle import load_tokenizer

    return load_tokenizer(None)  # SmolLM2-135M-Instruct: ChatML tokens, a template without tools


@pytest.fixture()
def hermes(tokenizer):
    original = tokenizer.chat_template
    tokenizer.chat_template = HERMES
    yield tokenizer
    tokenizer.chat_template = original


# a two-call turn, its two results, an answer, and the next question: what the engine receives
ENGINE_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What's the weather in Paris and in Rome?"},
    {"role": "assistant",
     "content": '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>\n'
                '<tool_call>{"name":"get_weather","arguments":{"city":"Rome"}}</tool_call>'},
    {"role": "tool", "content": "18 C, sunny"},
    {"role": "tool", "content": "21 C, cloudy"},
    {"role": "assistant", "content": "Paris: sunny, 18 C. Rome: cloudy, 21 C."},
    {"role": "user", "content": "And in Oslo?"},
]


def _openai_conversation() -> list[dict]:
    """The same conversation as an OpenAI client sends it to vLLM, after vLLM's own step that turns
    the calls' JSON argument strings into objects."""
    calls = [{"id": f"call_{i}", "type": "function",
              "function": {"name": "get_weather", "arguments": {"city": city}}}
             for i, city in enumerate(("Paris", "Rome"))]
    return [ENGINE_MESSAGES[0], ENGINE_MESSAGES[1],
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "tool_call_id": "call_0", "name": "get_weather", "content": "18 C, sunny"},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "21 C, cloudy"},
            ENGINE_MESSAGES[5], ENGINE_MESSAGES[6]]


def test_tool_template_renders_the_conversation_as_transformers_does(hermes):
    """Hermes' template (vLLM's example, Apache-2.0) renders our engine's messages exactly as
    transformers renders the OpenAI conversation a vLLM client would send."""
    assert supports_tools(HERMES, {"bos_token": hermes.bos_token or ""})
    ours = template_prompt(hermes, ENGINE_MESSAGES, TOOL_CALLS, ToolRegistry([WEATHER]))
    theirs = hermes.apply_chat_template(_openai_conversation(), tools=[WEATHER], add_generation_prompt=True,
                                        tokenize=False)
    assert ours == theirs
    assert "<tools>" in ours and '"name": "get_weather", "content": "21 C, cloudy"' in ours
    assert '{ "arguments": {"city": "Rome"}, "name": "get_weather"}' in ours
    assert "Tools (JSON)" not in ours  # no instructions of ours beside the template's


def test_template_without_tools_gets_our_instructions(tokenizer):
    """SmolLM2's template has no tool support: the probe says so, and the prompt carries the format's
    instructions, the tools as JSON and the results wrapped as the format wraps them."""
    template = ChatTemplate.of(tokenizer)
    assert not supports_tools(tokenizer.chat_template) and not template.renders_tools(TOOL_CALLS)
    text = prompt_text(tokenizer, ENGINE_MESSAGES, TOOL_CALLS, ToolRegistry([WEATHER]), template)
    assert TOOL_CALLS.instructions in text and "Tools (JSON):" in text
    assert json.dumps(WEATHER["function"]["name"]) in text
    assert "<tool_response>\n21 C, cloudy\n</tool_response>" in text


def test_probe_rejects_templates_that_ignore_or_refuse_tools():
    """A template that renders only `content` (tool calls and tools= dropped) or raises on the tool
    role has no tool support; no template has none."""
    content_only = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    refuses = ("{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}"
               "{% endif %}{{ m.content }}{% endfor %}{% for t in tools or [] %}{{ t.function.description }}"
               "{% endfor %}")
    assert not supports_tools(content_only) and not supports_tools(refuses) and not supports_tools(None)
