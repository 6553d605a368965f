"""Tool schemas: LangChain tools, OpenAI tool dicts, callables and pydantic models → a ToolRegistry."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from langchain_core.tools import BaseTool

from agentspec_langgraph import _sdk
from agentspec_langgraph._sdk import AgentSpecError


def openai_tool(obj: Any) -> dict[str, Any]:
    """The OpenAI tool dict of a LangChain tool, callable, pydantic model, SDK `Tool` or tool dict.

    The SDK's registry reads the schema (the same reading the grammar is built from).
    """
    try:
        return _sdk.ToolRegistry().add(obj).openai()
    except AgentSpecError:
        raise
    except Exception as exc:
        raise AgentSpecError(f"cannot read a tool schema from {_describe(obj)}: {exc}") from exc


def registry_from_tools(tools: Iterable[Any]) -> Any:
    """A fresh `ToolRegistry` holding the schemas of `tools` (a duplicate name is an error)."""
    registry = _sdk.ToolRegistry()
    for tool in tools:
        if isinstance(tool, _sdk.ToolRegistry):
            for inner in tool.tools:
                registry.add(inner)
        else:
            registry.add(openai_tool(tool))
    return registry


def tools_key(tools: Sequence[dict[str, Any]]) -> str:
    return json.dumps(tools, sort_keys=True, default=str)


def _describe(obj: Any) -> str:
    if isinstance(obj, BaseTool):
        return f"tool {obj.name!r}"
    name = getattr(obj, "__name__", None)
    return f"{type(obj).__name__} {name!r}" if name else repr(obj)[:80]


def code_tool(limits: Any = None) -> BaseTool:
    """The code-running tool of a `code_agent` (name `python`, argument `code`): runs the code in the
    SDK's sandbox (a fresh process in its own namespaces, rlimits, a wall-clock timeout; see
    docs/replay.md) and returns its output, or the output and an error line when it failed."""
    from langchain_core.tools import StructuredTool

    sandbox = _sdk.Sandbox(limits)

    def python(code: str) -> str:
        """Run Python code in a sandbox and return what it printed (and the error, if it failed)."""
        return sandbox.run(code).observation()

    return StructuredTool.from_function(python, name=_sdk.CODE_TOOL)
