"""ChatAgentSpec / @agentspec with fmt="code_agent": code blocks become calls of the sandbox code tool,
on real LangGraph graphs (scripted engine), and one agent on the real engine (-m engine)."""

from __future__ import annotations

from typing import Any

import pytest
from agentspec_langgraph import AgentSpecError, ChatAgentSpec, agentspec, code_tool
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph_fake_engine import FakeEngine

from agentspec_sdk import CODE_AGENT, SandboxLimits, ToolRegistry, turn_grammar

CODE = "Let me compute it.\n```python\nprint(sum(range(10)))\n```"


@tool
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def test_a_code_block_is_a_call_of_the_code_tool():
    engine = FakeEngine([CODE])
    runner = code_tool()
    msg = ChatAgentSpec(engine=engine, fmt="code_agent").bind_tools([runner]).invoke("Sum 0..9 in Python.")
    assert [(c["name"], c["args"]) for c in msg.tool_calls] == [("python", {"code": "print(sum(range(10)))"})]
    req = engine.requests[0]
    assert req.fmt == "code_agent" and len(req.tools) == 0  # the code tool is not listed as a function
    assert req.grammar == turn_grammar(CODE_AGENT, ToolRegistry([runner]))
    assert runner.invoke({"code": "print(6 * 7)"}) == "42"
    assert "ZeroDivisionError" in runner.invoke({"code": "1 / 0"})


def test_history_is_rendered_as_a_code_block_and_other_tools_are_refused():
    engine = FakeEngine(["Done: 45."])
    model = ChatAgentSpec(engine=engine, fmt="code_agent").bind_tools([code_tool()])
    foreign = AIMessage("I run it.",
                        tool_calls=[{"name": "python", "args": {"code": "print(45)"}, "id": "c1"}])
    model.invoke([HumanMessage("sum?"), foreign, ToolMessage("45", tool_call_id="c1")])
    sent = engine.requests[0].messages
    assert sent[1]["content"] == "I run it.\n```python\nprint(45)\n```"
    assert sent[2] == {"role": "tool", "content": "45"}  # the engine wraps it in <result>…</result>
    with pytest.raises(AgentSpecError, match="calls only the code tool 'python'.*also bound: \\['add'\\]"):
        ChatAgentSpec(engine=FakeEngine([CODE]), fmt="code_agent").bind_tools([code_tool(), add]).invoke("x")


def test_agentspec_decorator_runs_a_code_agent_graph_with_the_sandbox():
    engine = FakeEngine([CODE, "```python\nwhile True:\n    pass\n```", "The sum is 45."])

    @agentspec(engine=engine, fmt="code_agent", agent_id="coder")
    def build(model, tools, middleware=()):
        return create_agent(model, tools, system_prompt="You write Python.", middleware=middleware)

    graph = build("openai:gpt-4o", [code_tool(SandboxLimits(timeout_s=1.5))])
    state = graph.invoke({"messages": [("user", "Sum 0..9.")]})
    results = [m.content for m in tool_messages(state)]
    assert results[0] == "45"
    assert results[1].startswith("Error: timed out after 1.5 s")  # a hung run is an observation
    assert state["messages"][-1].content == "The sum is 45."
    assert all(r.fmt == "code_agent" for r in engine.requests)


@pytest.mark.engine
def test_a_code_agent_runs_on_the_real_engine(engine_structure):
    model = ChatAgentSpec(engine=engine_structure, fmt="code_agent", max_tokens=96)
    graph = create_agent(model, [code_tool(SandboxLimits(timeout_s=5))],
                         system_prompt="You are a Python programmer.")
    states = []
    for values in graph.stream({"messages": [("user", "Print the sum of the numbers 1 to 10 with Python.")]},
                               stream_mode="values"):
        states.append(values)
        # the question, the model, its code run, the model again (a 135M model may go on)
        if len(states) >= 4:
            break
    state = states[-1]
    calls = [c for m in state["messages"] if isinstance(m, AIMessage) for c in m.tool_calls]
    assert calls and all(c["name"] == "python" and isinstance(c["args"]["code"], str) for c in calls)
    assert tool_messages(state), "the sandbox ran the model's code"
    first = next(m for m in state["messages"] if isinstance(m, AIMessage))
    assert first.response_metadata["acceptance"] is not None
