"""LangChain messages ↔ the engine's chat messages, in the text form of an agent format.

The engine sees plain `{"role", "content"}` messages; it writes the format's instructions and the tool
list into the system prompt and wraps tool results in the format's environment markers itself. An
assistant turn that called tools is sent back exactly as the model wrote it (kept in
`additional_kwargs["agentspec_text"]`, so the prompt prefix stays byte-identical and the prefix cache
hits), or rendered in the format's canonical form when the message came from elsewhere or was edited.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from agentspec_langgraph import _sdk
from agentspec_langgraph._sdk import AgentSpecError

RAW_TEXT_KEY = "agentspec_text"
TOOL_FORMATS = ("tool_calls", "react", "code_agent")  # code_agent: a code block is a call of the code tool
ROLES = ("system", "user", "assistant", "tool")


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def render_assistant(fmt: Any, message: AIMessage, registry: Any = None) -> str:
    """The text the model would have written for `message` in `fmt`. A native call syntax (`hermes`,
    `mistral`, `pythonic`, ...) writes the calls as its turn grammar accepts them (`write_calls`), which
    needs the tools' schemas: `registry`, the bound tools."""
    fmt = _sdk.get_format(fmt)
    raw = message.additional_kwargs.get(RAW_TEXT_KEY)
    # Reuse the model's own text unless the format changed or someone edited the tool calls since.
    if isinstance(raw, dict) and raw.get("fmt") == fmt.name \
            and raw.get("calls") == _call_pairs(message.tool_calls):
        return raw["text"]
    content = str(message.text)
    calls = message.tool_calls
    if not calls:
        return f"Thought: {content}\nFinal Answer: {content}" if fmt.name == "react" and content else content
    if fmt.name == "tool_calls":
        body = "".join(
            f"<tool_call>{compact_json({'name': c['name'], 'arguments': c['args']})}</tool_call>"
            for c in calls
        )
        return f"{content}\n{body}" if content else body
    if fmt.name == "react":
        c = calls[0]
        return f"Thought: {content}\nAction: {c['name']}\nAction Input: {compact_json(c['args'])}\n"
    if fmt.name == "code_agent" and calls[0]["name"] == _sdk.CODE_TOOL:
        block = f"```python\n{calls[0]['args'].get('code', '')}\n```"
        return f"{content}\n{block}" if content else block
    if fmt.layout in ("tool_calls", "call_list"):  # a model's native syntax
        unbound = sorted({c["name"] for c in calls} - set(registry.names if registry is not None else ()))
        if unbound:
            raise AgentSpecError(f"format {fmt.name!r}: writing the tool calls of an earlier AI message "
                                 f"needs the bound tools' schemas (bind_tools); not bound: {unbound}")
        body = _sdk.write_calls(fmt, [(c["name"], c["args"]) for c in calls], registry)
        return f"{content}\n{body}" if content else body
    raise AgentSpecError(f"format {fmt.name!r} has no tool-call syntax; tools need one of "
                         f"{list(TOOL_FORMATS)} or a native call syntax (layout 'tool_calls' or 'call_list')")


def to_engine_messages(messages: Sequence[BaseMessage], fmt: Any,
                       registry: Any = None) -> list[dict[str, str]]:
    """LangChain messages → engine messages (the engine adds the tool list and wraps tool results);
    `registry`: the bound tools, for AI messages whose calls must be written in a native syntax."""
    out: list[dict[str, str]] = []
    for m in messages:
        if isinstance(m, SystemMessage):
            out.append({"role": "system", "content": str(m.text)})
        elif isinstance(m, HumanMessage):
            out.append({"role": "user", "content": str(m.text)})
        elif isinstance(m, AIMessage):
            out.append({"role": "assistant", "content": render_assistant(fmt, m, registry)})
        elif isinstance(m, ToolMessage):
            out.append({"role": "tool", "content": str(m.text)})
        elif isinstance(m, ChatMessage) and m.role in ROLES:
            out.append({"role": m.role, "content": str(m.text)})
        else:
            raise AgentSpecError(
                f"cannot send a {type(m).__name__} (role {getattr(m, 'role', m.type)!r}) to the engine; "
                f"roles are {list(ROLES)}"
            )
    return out


def langchain_calls(fmt: Any, text: str) -> list[dict[str, Any]]:
    """The calls of one model turn (the SDK's `parse_calls`: a code agent's block is one call of the
    code tool, which the sandbox runs), as LangChain tool-call dicts with fresh ids.

    Raises the SDK's parse error (naming the call and offset) when a call is malformed, e.g. cut
    off at max_tokens.
    """
    return [{"name": call.name, "args": dict(call.arguments), "id": new_call_id(), "type": "tool_call"}
            for call in _sdk.parse_calls(_sdk.get_format(fmt), text)]


def raw_record(fmt_name: str, text: str, calls: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What `additional_kwargs[RAW_TEXT_KEY]` holds: the model's text and the calls read from it."""
    return {"fmt": fmt_name, "text": text, "calls": _call_pairs(calls)}


def _call_pairs(calls: Sequence[dict[str, Any]]) -> list[list[Any]]:
    return [[c["name"], c["args"]] for c in calls]
