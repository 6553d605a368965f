"""The one place this package touches the SDK: names of the public façade `agentspec_sdk` only.

Heavy names (the engines) stay lazy, like in the façade: importing the integration pulls in neither
vllm nor torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import agentspec_sdk
from agentspec_sdk import AgentSpecError, ToolRegistryError

if TYPE_CHECKING:
    from agentspec_sdk import AgentEngine

_FACADE = ("ToolRegistry", "Tool", "get_format", "Segmenter", "turn_grammar", "tool_call_grammar",
           "parse_turn", "parse_calls", "write_calls", "TurnRequest",
           "AgentEngine", "Sandbox", "SandboxLimits", "CODE_TOOL")
__all__ = ["AgentSpecError", "ToolRegistryError", "new_engine", *_FACADE]  # noqa: F822 (lazy names)


def __getattr__(name: str) -> Any:
    if name in _FACADE:
        return getattr(agentspec_sdk, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def new_engine(**kwargs: Any) -> AgentEngine:
    """An embedded engine (vLLM in this process) with structure speculation unless told otherwise."""
    kwargs.setdefault("speculation", "structure")
    return agentspec_sdk.Engine(**kwargs)
