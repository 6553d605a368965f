"""AgentSpecMiddleware in create_agent: grammar injection, idle/active marks, records, tool errors."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from agentspec_langgraph import AgentSpecMiddleware, ChatAgentSpec
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph_fake_engine import ACCEPTANCE, FakeEngine

from agentspec_sdk import TOOL_CALLS, ToolRegistry, turn_grammar

release = threading.Event()


@tool
def divide(a: float, b: float) -> float:
    """Divide a by b."""
    return a / b


@tool
def square_root(number: float) -> float:
    """Square root of a non-negative number."""
    if number < 0:
        raise ValueError(f"number must be >= 0, got {number}")
    return number**0.5


@tool
def hang(seconds: float) -> str:
    """Wait (a tool that hangs)."""
    release.wait(seconds)
    return "woke up"


@tool
async def ahang(seconds: float) -> str:
    """Wait asynchronously (a tool that hangs)."""
    await asyncio.sleep(seconds)
    return "woke up"


@pytest.fixture(autouse=True)
def _release_hung_tools():
    release.clear()
    yield
    release.set()


class ToolCallingFakeModel(GenericFakeChatModel):
    """LangChain's GenericFakeChatModel with bind_tools, as create_agent needs (its own tests' pattern)."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any):
        return self


def fake_model(*calls: dict[str, Any]) -> ToolCallingFakeModel:
    turns = [AIMessage("", tool_calls=[{**c, "id": f"c{i}"}]) for i, c in enumerate(calls)]
    return ToolCallingFakeModel(messages=iter([*turns, AIMessage("done")]))


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def run_agent(model: Any, tools: list[Any], mw: AgentSpecMiddleware, *, use_async: bool = False) -> dict:
    agent = create_agent(model, tools, middleware=[mw])
    if use_async:
        return asyncio.run(agent.ainvoke({"messages": [("user", "go")]}))
    return agent.invoke({"messages": [("user", "go")]})


@pytest.mark.parametrize("use_async", [False, True])
def test_a_tool_that_raises_becomes_an_error_tool_message(use_async):
    mw = AgentSpecMiddleware()
    state = run_agent(fake_model({"name": "divide", "args": {"a": 1, "b": 0}}), [divide], mw,
                      use_async=use_async)
    [msg] = tool_messages(state)
    assert msg.status == "error" and "ZeroDivisionError" in msg.content and msg.tool_call_id == "c0"
    assert state["messages"][-1].content == "done"


def test_without_the_middleware_a_raising_tool_crashes_the_agent():
    agent = create_agent(fake_model({"name": "divide", "args": {"a": 1, "b": 0}}), [divide])
    with pytest.raises(ZeroDivisionError):
        agent.invoke({"messages": [("user", "go")]})


@pytest.mark.parametrize("use_async", [False, True])
def test_arguments_the_tool_rejects_go_back_as_error_tool_messages(use_async):
    calls = ({"name": "square_root", "args": {"number": "nine"}},
             {"name": "square_root", "args": {"number": -4}})
    state = run_agent(fake_model(*calls), [square_root], AgentSpecMiddleware(), use_async=use_async)
    schema_error, value_error = tool_messages(state)
    assert schema_error.status == "error" and "number" in schema_error.content
    assert value_error.status == "error" and "must be >= 0, got -4" in value_error.content
    assert state["messages"][-1].content == "done"


@pytest.mark.parametrize(("use_async", "hanging"), [(False, hang), (True, hang), (True, ahang)])
def test_a_tool_that_hangs_past_its_timeout_becomes_an_error(use_async, hanging):
    mw = AgentSpecMiddleware(tool_timeout_s=30.0, tool_timeouts={hanging.name: 0.2})
    # 2 s: asyncio.run waits for the worker thread of a hung sync tool before it returns
    state = run_agent(fake_model({"name": hanging.name, "args": {"seconds": 2}}), [hanging], mw,
                      use_async=use_async)
    [msg] = tool_messages(state)
    assert msg.status == "error" and "timed out" in msg.content and "0.2 s" in msg.content
    assert state["messages"][-1].content == "done"


def test_a_tool_raising_timeouterror_itself_is_not_reported_as_our_timeout():
    @tool
    def slow_service(x: int) -> int:
        """Call a slow service."""
        raise TimeoutError("upstream took too long")

    state = run_agent(fake_model({"name": "slow_service", "args": {"x": 1}}), [slow_service],
                      AgentSpecMiddleware())
    [msg] = tool_messages(state)
    assert "TimeoutError: upstream took too long" in msg.content


CALL_SQRT = '<tool_call>{"name":"square_root","arguments":{"number":16}}</tool_call>'


@pytest.mark.parametrize("use_async", [False, True])
def test_with_chatagentspec_grammar_is_injected_sequence_marked_and_turns_recorded(use_async):
    engine = FakeEngine([CALL_SQRT, "The root is 4."])
    model = ChatAgentSpec(engine=engine)
    mw = AgentSpecMiddleware(agent_id="solver")
    state = run_agent(model, [square_root, divide], mw, use_async=use_async)

    assert [m.content for m in tool_messages(state)] == ["4.0"]
    assert state["messages"][-1].content == "The root is 4."
    first, second = engine.requests
    expected = model.grammar_for([model.bind_tools([square_root, divide]).kwargs["tools"]][0])
    assert first.grammar == second.grammar == expected == mw.grammars["solver"]
    assert first.agent_id == second.agent_id == "solver"
    assert engine.marks == [("idle", "solver"), ("active", "solver")]
    assert [(r.agent_id, r.tool_calls, r.acceptance) for r in mw.records] == [
        ("solver", ("square_root",), ACCEPTANCE),
        ("solver", (), ACCEPTANCE),
    ]
    totals = mw.acceptance()
    assert totals["S"] == {"drafted": 24, "accepted": 20, "rate": 20 / 24}


def test_parallel_tool_calls_mark_idle_once_and_thread_ids_separate_agents():
    two_calls = CALL_SQRT + '<tool_call>{"name":"divide","arguments":{"a":1,"b":4}}</tool_call>'
    engine = FakeEngine([two_calls, "ok"])
    mw = AgentSpecMiddleware(agent_id="solver")
    agent = create_agent(ChatAgentSpec(engine=engine), [square_root, divide], middleware=[mw])
    state = agent.invoke({"messages": [("user", "go")]}, {"configurable": {"thread_id": "t7"}})
    assert sorted(m.content for m in tool_messages(state)) == ["0.25", "4.0"]
    assert engine.marks == [("idle", "solver:t7"), ("active", "solver:t7")]
    assert {r.agent_id for r in mw.records} == {"solver:t7"}


def test_first_and_later_tool_choice_shape_the_grammar_of_each_turn():
    engine = FakeEngine([CALL_SQRT, "The root is 4."])
    mw = AgentSpecMiddleware(first_tool_choice="required", later_tool_choice="none")
    run_agent(ChatAgentSpec(engine=engine), [square_root], mw)
    first, later = engine.requests
    assert first.grammar == turn_grammar(TOOL_CALLS, ToolRegistry([square_root]), tool_choice="required")
    assert later.grammar == turn_grammar(TOOL_CALLS, ToolRegistry(), tool_choice="none")
    assert first.tools.names == ["square_root"] and len(later.tools) == 0


def test_langgraph_message_streaming_runs_the_turn_through_the_stream_path():
    engine = FakeEngine([f"Taking the root.{CALL_SQRT}", "The root is 4."])
    mw = AgentSpecMiddleware()
    agent = create_agent(ChatAgentSpec(engine=engine), [square_root], middleware=[mw])
    seen = list(agent.stream({"messages": [("user", "root of 16?")]}, stream_mode="messages"))
    model_text = "".join(chunk.content for chunk, meta in seen if meta["langgraph_node"] == "model")
    assert model_text == "Taking the root.The root is 4."
    calls = [c for chunk, _ in seen for c in getattr(chunk, "tool_call_chunks", [])]
    assert [(c["name"], c["args"]) for c in calls] == [("square_root", '{"number":16}')]
    assert [m.content for m, meta in seen if meta["langgraph_node"] == "tools"] == ["4.0"]
    assert len(mw.records) == 2


def test_a_round_of_parallel_calls_that_do_not_overlap_in_time_keeps_the_agent_idle():
    engine = FakeEngine()
    mw = AgentSpecMiddleware(agent_id="a", engine=engine)
    turn = AIMessage("", tool_calls=[{"name": "divide", "args": {}, "id": i} for i in ("c1", "c2")])

    def request(call_id):
        return ToolCallRequest(tool_call={"name": "divide", "args": {}, "id": call_id}, tool=divide,
                               state={"messages": [turn]}, runtime=None)

    ok = ToolMessage("1", tool_call_id="c1")
    mw.wrap_tool_call(request("c1"), lambda r: ok)
    assert engine.marks == [("idle", "a")]
    mw.wrap_tool_call(request("c2"), lambda r: ok)
    assert engine.marks == [("idle", "a"), ("active", "a")]
