"""AgentSpec for LangGraph / LangChain: a chat model on the engine, an agent middleware, one decorator.

    from agentspec_langgraph import ChatAgentSpec, AgentSpecMiddleware, agentspec

See docs/langgraph.md.
"""

from agentspec_langgraph._sdk import AgentSpecError
from agentspec_langgraph.chat_model import ChatAgentSpec
from agentspec_langgraph.decorator import AgentSpecBinding, agentspec
from agentspec_langgraph.middleware import AgentSpecMiddleware
from agentspec_langgraph.records import TurnRecord, total_acceptance
from agentspec_langgraph.tools import code_tool, openai_tool, registry_from_tools

__all__ = [
    "AgentSpecBinding",
    "AgentSpecError",
    "AgentSpecMiddleware",
    "ChatAgentSpec",
    "TurnRecord",
    "agentspec",
    "code_tool",
    "openai_tool",
    "registry_from_tools",
    "total_acceptance",
]
