"""Prompt rendering shared by both backends: a turn's messages with the format's instructions and tools,
or, where the model's chat template renders tools itself (`chat_template.ChatTemplate.renders_tools`, the
one decision), the messages in OpenAI form with `tools=` for that template, as vLLM's chat endpoint
hands them to it.

The per-format text lives with the format (`AgentFormat.instructions`, `AgentFormat.env_wrap`); this
module only puts it in place, so the embedded engine and the server client send the same prompt.
"""

from __future__ import annotations

import json
from typing import Any

from agentspec_sdk.backends.chat_template import ChatTemplate
from agentspec_sdk.errors import BackendError, TurnParseError
from agentspec_sdk.structure.formats import AgentFormat
from agentspec_sdk.structure.tools import ToolRegistry
from agentspec_sdk.structure.turns import parse_turn

ROLES = ("system", "user", "assistant", "tool")


def format_instructions(fmt: AgentFormat, registry: ToolRegistry) -> str:
    """The system-prompt section that tells the model how to write a turn of `fmt` and which tools exist."""
    tools = "\n".join(json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters},
                                 ensure_ascii=False, separators=(",", ":")) for t in registry)
    how = fmt.instructions or fmt.description or f"Write your turn in the {fmt.name} format."
    return f"{how}\n\nTools (JSON):\n{tools}" if tools else how


def wrap_result(fmt: AgentFormat, content: str) -> str:
    """A tool result as the model sees it (`fmt.env_wrap` with the result in place of `{}`)."""
    before, _, after = fmt.env_wrap.partition("{}")
    return f"{before}{content}{after}"


def chat_messages(messages: list[dict], fmt: AgentFormat, registry: ToolRegistry) -> list[dict[str, str]]:
    """Messages with the format/tool instructions in the system prompt and tool results wrapped."""
    out: list[dict[str, str]] = []
    system = format_instructions(fmt, registry)
    for m in messages:
        role, content = m.get("role"), m.get("content") or ""
        if role not in ROLES:
            raise BackendError(f"message role must be system, user, assistant or tool, got {role!r}")
        if role == "system":
            system = f"{content}\n\n{system}"
        elif role == "tool":
            out.append({"role": "user", "content": wrap_result(fmt, content)})
        else:
            out.append({"role": role, "content": content})
    return [{"role": "system", "content": system}] + out


def prompt_text(tokenizer: Any, messages: list[dict], fmt: AgentFormat, registry: ToolRegistry,
                template: ChatTemplate | None = None) -> str:
    """A turn's prompt text: through the model's own template with `tools=` where it renders them for
    `fmt` (`template.renders_tools`), else with our format's instructions (`chat_messages`)."""
    template = template or ChatTemplate.of(tokenizer)
    if template.renders_tools(fmt):
        return template_prompt(tokenizer, messages, fmt, registry)
    return tokenizer.apply_chat_template(chat_messages(messages, fmt, registry), tokenize=False,
                                         add_generation_prompt=True)


def template_prompt(tokenizer: Any, messages: list[dict], fmt: AgentFormat, registry: ToolRegistry) -> str:
    """The prompt as vLLM's chat endpoint renders it for a client that sends `template_messages` and
    the registry's OpenAI tool dicts (none: `tools=None`, as vLLM passes a request without tools)."""
    tools = registry.openai_tools() or None
    return tokenizer.apply_chat_template(template_messages(messages, fmt), tools=tools, tokenize=False,
                                         add_generation_prompt=True)


def template_messages(messages: list[dict], fmt: AgentFormat) -> list[dict[str, Any]]:
    """Messages in OpenAI form for a template that renders tools. An assistant's text in `fmt` becomes
    its content (the text before the calls) and `tool_calls`; calls it already carries are kept. Call
    arguments are objects (vLLM turns the OpenAI JSON strings into objects before the template sees
    them: a malformed or empty string is `{}`). A tool result gets the name and id of the call it
    answers, in order, where it names none (templates such as Hermes' require the name)."""
    out: list[dict[str, Any]] = []
    pending: list[dict] = []  # calls of the last assistant turn not yet answered
    for m in messages:
        role, content = m.get("role"), m.get("content") or ""
        if role not in ROLES:
            raise BackendError(f"message role must be system, user, assistant or tool, got {role!r}")
        if role == "assistant":
            msg = _assistant(m, fmt, len(out))
            pending = list(msg.get("tool_calls", []))
        elif role == "tool":
            call = pending.pop(0) if pending else None
            msg = {"role": "tool", "content": content}
            if m.get("tool_call_id") or call:
                msg["tool_call_id"] = m.get("tool_call_id") or call["id"]
            if m.get("name") or call:
                msg["name"] = m.get("name") or call["function"]["name"]
        else:
            msg = {"role": role, "content": content}
        out.append(msg)
    return out


def _assistant(m: dict, fmt: AgentFormat, index: int) -> dict[str, Any]:
    """One assistant message in OpenAI form (see `template_messages`); ids `call<index><n>`, 9 characters
    where the conversation is shorter than 1000 messages (Mistral's templates want 9 alphanumerics)."""
    text = m.get("content") or ""
    calls = m.get("tool_calls")
    if calls is None:
        try:
            parsed = parse_turn(fmt, text)
        except TurnParseError:  # a malformed turn stays in the history as it was written
            return {"role": "assistant", "content": text}
        if not parsed.tool_calls:
            return {"role": "assistant", "content": text}
        text = parsed.reasoning
        calls = [{"id": f"call{index:03d}{n:02d}", "type": "function",
                  "function": {"name": c.name, "arguments": c.arguments}}
                 for n, c in enumerate(parsed.tool_calls)]
    if not calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": text, "tool_calls": [_call_object(c) for c in calls]}


def _call_object(call: dict) -> dict[str, Any]:
    """A call with its arguments as an object (vLLM's `_postprocess_messages`)."""
    function = dict(call.get("function") or {})
    args = function.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args else {}
        except ValueError:
            args = {}
    function["arguments"] = args if args else {}
    return {**call, "function": function}
