"""Prompt rendering shared by both backends: a turn's messages with the format's instructions and tools.

The per-format text lives with the format (`AgentFormat.instructions`, `AgentFormat.env_wrap`); this
module only puts it in place, so the embedded engine and the server client send the same prompt.
"""

from __future__ import annotations

import json

from agentspec_sdk.errors import BackendError
from agentspec_sdk.structure.formats import AgentFormat
from agentspec_sdk.structure.tools import ToolRegistry

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
