"""fmt="auto" (the default of every entry point): the format a model's own chat template writes, and
whether that template renders the turn's tools (real templates: Hermes' from tests/data/chat_templates,
SmolLM2's and the Gemma bundle's). The engine tests' turns name no format, so they run through auto
on the real SmolLM2 template.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentspec_sdk.backends.chat_template import ChatTemplate, auto_format
from agentspec_sdk.backends.inside_vllm.tool_prompt import chat_template
from agentspec_sdk.structure.formats import get_format

HERMES = (Path(__file__).parent / "data" / "chat_templates" / "hermes_vllm.jinja").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def smollm2():
    from agentspec_sdk.backends.model_bundle import load_tokenizer

    return load_tokenizer(None)


def test_auto_is_the_templates_own_format():
    """Hermes' template declares `<tool_call>`: auto is `hermes`, and only that format's turns go
    through the template (a `tool_calls` turn keeps our instructions: the template would teach another
    call layout than that grammar's)."""
    template = ChatTemplate(HERMES, {"bos_token": ""})
    assert auto_format(HERMES, []) == "hermes" == template.native == template.resolve("auto").name
    assert template.tools and template.renders_tools("auto") and template.renders_tools(get_format("hermes"))
    assert not template.renders_tools("tool_calls") and not template.renders_tools("react")


def test_every_entry_point_defaults_to_auto():
    """TurnRequest, ChatAgentSpec, @agentspec and `agentspec serve --tool-format` all start from the
    model's own format; naming one stays possible everywhere."""
    import inspect

    from agentspec_langgraph import ChatAgentSpec, agentspec

    from agentspec_sdk import TurnRequest
    from agentspec_sdk.backends.serving.serve_cli import serve

    assert TurnRequest(messages=[]).fmt == "auto" == ChatAgentSpec.model_fields["fmt"].default
    assert inspect.signature(agentspec).parameters["fmt"].default == "auto"
    assert inspect.signature(serve).parameters["tool_format"].default == "auto"


def test_templates_without_tool_syntax_are_tool_calls(smollm2):
    """SmolLM2's template declares no tool syntax and renders no tools: auto is `tool_calls`, our
    instructions stay; the same for no template at all."""
    template = ChatTemplate.of(smollm2)
    assert template.native == "tool_calls" and not template.tools and not template.renders_tools("auto")
    assert ChatTemplate(None).native == "tool_calls"


def test_serve_template_is_the_models_own_where_it_renders_tools():
    """`agentspec serve`'s template for plain clients reads the same decision: Hermes' template as is
    for its own format, our prelude before it for another."""
    assert chat_template("hermes", HERMES) == HERMES
    wrapped = chat_template("tool_calls", HERMES)
    assert wrapped.endswith(HERMES) and wrapped != HERMES and "Tools (JSON):" in wrapped
