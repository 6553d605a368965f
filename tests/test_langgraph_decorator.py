"""@agentspec on agent builders: create_agent and StateGraph+ToolNode shapes, the pieces handed through
the builder's parameters (no module patched: builds in two threads at once), and the errors."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Annotated, Any

import langchain.agents
import langgraph.prebuilt
import pytest
from agentspec_langgraph import AgentSpecError, AgentSpecMiddleware, ChatAgentSpec, agentspec
from langchain.agents import create_agent
from langchain.agents.middleware import ModelCallLimitMiddleware
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph_fake_engine import ACCEPTANCE, FakeEngine
from typing_extensions import TypedDict

release = threading.Event()
CREATE_AGENT, TOOL_NODE = create_agent, ToolNode  # as imported: @agentspec replaces neither


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
    def build(model, tools, middleware=()):
        assert create_agent is langchain.agents.create_agent is CREATE_AGENT  # nothing swapped while it runs
        return create_agent(model, tools, system_prompt="You are a calculator.", middleware=middleware)

    graph = build("openai:gpt-4o", [add])
    state = graph.invoke({"messages": [("user", "2+3?")]})

    assert [m.content for m in tool_messages(state)] == ["5.0"]
    assert state["messages"][-1].content == "It is 5."
    binding = graph.agentspec
    assert binding is build.agentspec and isinstance(binding.model, ChatAgentSpec)
    assert binding.handed == ("model", "middleware") and binding.tools == ["add"]
    assert engine.registered[0] == ["add"]
    assert engine.requests[0].messages[0]["content"].startswith("You are a calculator.")
    assert engine.requests[0].grammar and engine.requests[0].agent_id == "calc"
    assert engine.marks == [("idle", "calc"), ("active", "calc")]
    assert [r.acceptance for r in binding.records] == [ACCEPTANCE, ACCEPTANCE]


def test_the_model_writes_its_own_templates_format_by_default():
    """No fmt: the format the engine's model's template writes (here Hermes' `<tool_call>` with a
    newline around the JSON); the call is read back and run in that syntax."""
    hermes_call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    engine = FakeEngine([hermes_call, "It is 5."], native="hermes")

    @agentspec(engine=engine)
    def build(model, tools, middleware=()):
        return create_agent(model, tools, middleware=middleware)

    graph = build("openai:gpt-4o", [add])
    state = graph.invoke({"messages": [("user", "2+3?")]})
    assert build.agentspec.model.fmt == "hermes" and engine.asked == ["auto"]
    assert [r.fmt for r in engine.requests] == ["hermes", "hermes"]
    assert [m.content for m in tool_messages(state)] == ["5.0"]


def test_the_callers_own_middleware_is_kept_and_its_agentspec_middleware_used():
    engine = FakeEngine(["No tool needed."])
    mine = AgentSpecMiddleware(agent_id="own")
    limit = ModelCallLimitMiddleware(run_limit=2)

    @agentspec(engine=engine)
    def build(llm, *, tools, middleware):
        from langchain.agents import create_agent as make

        return make(llm, tools=tools, middleware=middleware)

    graph = build(None, tools=[add], middleware=[limit, mine])
    assert graph.invoke({"messages": [("user", "hi")]})["messages"][-1].content == "No tool needed."
    assert engine.requests[0].agent_id == "own"
    assert len(mine.records) == 1 and graph.agentspec.middleware is mine


def test_the_middleware_goes_first_before_the_callers():
    seen: list[list[Any]] = []

    @agentspec(engine=FakeEngine())
    def build(model, tools, middleware=()):
        seen.append(list(middleware))
        return create_agent(model, tools, middleware=middleware)

    limit = ModelCallLimitMiddleware(run_limit=2)
    graph = build(None, [add], [limit])
    assert seen == [[graph.agentspec.middleware, limit]]


class State(TypedDict):
    messages: Annotated[list, add_messages]


def test_stategraph_with_toolnode_and_bind_tools():
    engine = FakeEngine([CALL_ADD, '<tool_call>{"name":"stall","arguments":{"x":1}}</tool_call>', "Done."])

    @agentspec(engine=engine, agent_id="g", tool_timeouts={"stall": 0.2})
    def build(llm, tools, wrap_tool_call=None, awrap_tool_call=None):
        bound = llm.bind_tools(tools)

        def call_model(state: State):
            return {"messages": [bound.invoke(state["messages"])]}

        assert ToolNode is langgraph.prebuilt.ToolNode is TOOL_NODE  # nothing swapped while it runs
        g = StateGraph(State)
        g.add_node("agent", call_model)
        g.add_node("tools", ToolNode(tools, wrap_tool_call=wrap_tool_call, awrap_tool_call=awrap_tool_call))
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
    assert binding.handed == ("llm", "wrap_tool_call", "awrap_tool_call")
    assert engine.marks == [("idle", "g"), ("active", "g"), ("idle", "g"), ("active", "g")]
    assert len(binding.records) == 3 and all(r.agent_id == "g" for r in binding.records)


def test_a_callers_tool_wrapper_runs_inside_the_middlewares():
    engine = FakeEngine(['<tool_call>{"name":"add","arguments":{"a":1,"b":1}}</tool_call>', "Two."])
    order: list[str] = []

    def mine(request, execute):
        order.append("mine")
        raise ValueError("refused by the caller's wrapper")

    @agentspec(engine=engine, agent_id="w")
    def build(model, tools, wrap_tool_call=None):
        bound = model.bind_tools(tools)
        g = StateGraph(State)
        g.add_node("agent", lambda s: {"messages": [bound.invoke(s["messages"])]})
        g.add_node("tools", ToolNode(tools, wrap_tool_call=wrap_tool_call))
        g.add_edge(START, "agent")
        g.add_conditional_edges("agent", tools_condition)
        g.add_edge("tools", "agent")
        return g.compile()

    state = build(None, [add], wrap_tool_call=mine).invoke({"messages": [("user", "1+1?")]})
    [error] = tool_messages(state)  # the middleware turned the wrapper's error into a ToolMessage
    assert order == ["mine"] and error.status == "error"
    assert "refused by the caller's wrapper" in error.content
    assert engine.marks == [("idle", "w"), ("active", "w")]


def test_a_builder_without_a_model_parameter_is_refused_at_decoration():
    with pytest.raises(AgentSpecError, match=r"no parameter named one of \['model', 'llm', 'chat_model'\]"):

        @agentspec(engine=FakeEngine())
        def build(tools, middleware=()):
            return create_agent("anthropic:claude", tools, middleware=middleware)


def test_a_builder_without_a_parameter_for_the_middleware_is_refused_at_decoration():
    with pytest.raises(AgentSpecError,
                       match=r"no parameter to receive the AgentSpecMiddleware \(its parameters: \['model', "
                             r"'tools'\]\): add 'middleware=\(\)'"):

        @agentspec(engine=FakeEngine())
        def build(model, tools):
            return create_agent(model, tools)


def test_a_builder_must_return_the_graph():
    @agentspec(engine=FakeEngine())
    def build(model, tools, middleware=()):
        return {"agent": create_agent(model, tools, middleware=middleware)}

    with pytest.raises(AgentSpecError, match="must return the agent graph .* not dict"):
        build(None, [add])


def test_async_builders_are_refused_at_decoration():
    with pytest.raises(AgentSpecError, match="is an async def"):

        @agentspec(engine=FakeEngine())
        async def build(model, tools, middleware=()):
            return create_agent(model, tools, middleware=middleware)


class ToolCallingFakeModel(GenericFakeChatModel):
    """LangChain's GenericFakeChatModel with bind_tools, as create_agent needs."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any):
        return self


def test_two_threads_build_and_run_decorated_agents_at_once_each_with_its_own_configuration():
    """Two decorated builders and a plain `create_agent` build run at the same moment (a barrier inside
    each), then each graph runs: every agent sees only its own model, engine, agent id, middleware and
    records, and the plain build gets none of the decorator's pieces."""
    at_once = threading.Barrier(3, timeout=10)
    engines = {name: FakeEngine([CALL_ADD, f"Agent {name}: 5."]) for name in "ab"}
    built: dict[str, Any] = {}
    failures: list[BaseException] = []

    def decorated(name: str) -> None:
        @agentspec(engine=engines[name], agent_id=name, tool_timeouts={"add": 5.0 if name == "a" else 6.0})
        def build(model, tools, middleware=()):
            at_once.wait()
            return create_agent(model, tools, system_prompt=f"You are agent {name}.", middleware=middleware)

        graph = build("openai:gpt-4o", [add])
        built[name] = (graph, graph.invoke({"messages": [("user", "2+3?")]}))

    def plain() -> None:
        model = ToolCallingFakeModel(messages=iter([AIMessage("plain answer")]))
        at_once.wait()
        graph = create_agent(model, [add], system_prompt="You are plain.")
        built["plain"] = (graph, graph.invoke({"messages": [("user", "hi")]}))

    def guarded(fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # re-raised in the test's thread below
            failures.append(exc)

    threads = [threading.Thread(target=guarded, args=(decorated, "a")),
               threading.Thread(target=guarded, args=(decorated, "b")),
               threading.Thread(target=guarded, args=(plain,))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not failures, failures
    for name in "ab":
        graph, state = built[name]
        engine, binding = engines[name], graph.agentspec
        assert binding.engine is engine and binding.model.agent_id == name
        assert binding.middleware.agent_id == name
        assert binding.middleware.tool_timeouts == {"add": 5.0 if name == "a" else 6.0}
        assert [m.content for m in tool_messages(state)] == ["5.0"]
        assert state["messages"][-1].content == f"Agent {name}: 5."
        assert [r.agent_id for r in engine.requests] == [name, name]
        assert engine.requests[0].messages[0]["content"].startswith(f"You are agent {name}.")
        assert engine.marks == [("idle", name), ("active", name)]
        assert [r.agent_id for r in binding.records] == [name, name]
    assert built["a"][0].agentspec is not built["b"][0].agentspec
    graph, state = built["plain"]
    assert state["messages"][-1].content == "plain answer"
    assert not hasattr(graph, "agentspec")
