"""@agentspec on existing agent builders: create_agent and StateGraph+ToolNode shapes, and the errors."""

from __future__ import annotations

import threading
from typing import Annotated, Any

import langchain.agents
import langgraph.prebuilt
import pytest
from agentspec_langgraph import AgentSpecError, AgentSpecMiddleware, ChatAgentSpec, agentspec
from langchain.agents import create_agent
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph_fake_engine import ACCEPTANCE, FakeEngine
from typing_extensions import TypedDict

release = threading.Event()


@tool
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@tool
def stall(x: int) -> str:
    """A tool that hangs."""
    release.wait(30)
    return "late"


CALL_ADD = '<tool_call>{"name":"add","arguments":{"a":2,"b":3}}</tool_call>'


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def test_create_agent_builder_gets_our_model_tools_and_middleware():
    engine = FakeEngine([CALL_ADD, "It is 5."])

    @agentspec(engine=engine, agent_id="calc")
    def build(model, tools):
        return create_agent(model, tools, system_prompt="You are a calculator.")

    graph = build("openai:gpt-4o", [add])
    state = graph.invoke({"messages": [("user", "2+3?")]})

    assert [m.content for m in tool_messages(state)] == ["5.0"]
    assert state["messages"][-1].content == "It is 5."
    binding = graph.agentspec
    assert binding is build.agentspec and isinstance(binding.model, ChatAgentSpec)
    assert binding.create_agent_calls == 1 and binding.tools == ["add"]
    assert engine.registered[0] == ["add"]
    assert engine.requests[0].messages[0]["content"].startswith("You are a calculator.")
    assert engine.requests[0].grammar and engine.requests[0].agent_id == "calc"
    assert engine.marks == [("idle", "calc"), ("active", "calc")]
    assert [r.acceptance for r in binding.records] == [ACCEPTANCE, ACCEPTANCE]
    assert create_agent is langchain.agents.create_agent  # restored after the build


def test_the_model_writes_its_own_templates_format_by_default():
    """No fmt: the format the engine's model's template writes (here Hermes' `<tool_call>` with a
    newline around the JSON); the call is read back and run in that syntax."""
    hermes_call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    engine = FakeEngine([hermes_call, "It is 5."], native="hermes")

    @agentspec(engine=engine)
    def build(model, tools):
        return create_agent(model, tools)

    graph = build("openai:gpt-4o", [add])
    state = graph.invoke({"messages": [("user", "2+3?")]})
    assert build.agentspec.model.fmt == "hermes" and engine.asked == ["auto"]
    assert [r.fmt for r in engine.requests] == ["hermes", "hermes"]
    assert [m.content for m in tool_messages(state)] == ["5.0"]


def test_create_agent_imported_in_the_body_with_a_fixed_model_and_own_middleware():
    engine = FakeEngine(["No tool needed."])
    mine = AgentSpecMiddleware(agent_id="own")

    @agentspec(engine=engine)
    def build(tools):
        from langchain.agents import create_agent as make

        return make("anthropic:claude", tools=tools, middleware=[mine])

    graph = build([add])
    assert graph.invoke({"messages": [("user", "hi")]})["messages"][-1].content == "No tool needed."
    assert engine.requests[0].agent_id == "own"
    assert len(mine.records) == 1


class State(TypedDict):
    messages: Annotated[list, add_messages]


def test_stategraph_with_toolnode_and_bind_tools():
    engine = FakeEngine([CALL_ADD, '<tool_call>{"name":"stall","arguments":{"x":1}}</tool_call>', "Done."])

    @agentspec(engine=engine, agent_id="g", tool_timeouts={"stall": 0.2})
    def build(llm, tools):
        bound = llm.bind_tools(tools)

        def call_model(state: State):
            return {"messages": [bound.invoke(state["messages"])]}

        g = StateGraph(State)
        g.add_node("agent", call_model)
        g.add_node("tools", ToolNode(tools))
        g.add_edge(START, "agent")
        g.add_conditional_edges("agent", tools_condition)
        g.add_edge("tools", "agent")
        return g.compile()

    try:
        graph = build(None, [add, stall])
        state = graph.invoke({"messages": [("user", "2+3?")]})
    finally:
        release.set()
    done, late = tool_messages(state)
    assert done.content == "5.0"
    assert late.status == "error" and "timed out" in late.content
    binding = graph.agentspec
    assert binding.tool_nodes == 1 and binding.create_agent_calls == 0
    assert engine.marks == [("idle", "g"), ("active", "g"), ("idle", "g"), ("active", "g")]
    assert len(binding.records) == 3 and all(r.agent_id == "g" for r in binding.records)
    assert ToolNode is langgraph.prebuilt.ToolNode


def test_stategraph_without_a_model_parameter_is_refused():
    @agentspec(engine=FakeEngine())
    def build(tools):
        g = StateGraph(State)
        g.add_node("tools", ToolNode(tools))
        g.add_edge(START, "tools")
        g.add_edge("tools", END)
        return g.compile()

    with pytest.raises(AgentSpecError, match=r"no parameter named one of \['model', 'llm', 'chat_model'\]"):
        build([add])


def test_a_builder_that_builds_no_supported_agent_is_refused():
    @agentspec(engine=FakeEngine())
    def build(model, tools):
        g = StateGraph(State)
        g.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
        g.add_edge(START, "agent")
        return g.compile()

    with pytest.raises(AgentSpecError,
                       match=r"built no agent it can adapt \(found 0 create_agent call\(s\), 0 ToolNode"):
        build(None, [add])


def test_a_builder_must_return_the_graph():
    @agentspec(engine=FakeEngine())
    def build(model, tools):
        return {"agent": create_agent(model, tools)}

    with pytest.raises(AgentSpecError, match="must return the agent graph .* not dict"):
        build(None, [add])
    assert create_agent is langchain.agents.create_agent


def test_async_builders_are_refused_at_decoration():
    with pytest.raises(AgentSpecError, match="is an async def"):

        @agentspec(engine=FakeEngine())
        async def build(model, tools):
            return create_agent(model, tools)
