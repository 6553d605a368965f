"""A LangGraph agent with BFCL's executable MathAPI tools, adapted to AgentSpec by one decorator.

`build_agent` is ordinary LangChain v1 code: `create_agent(model, tools, middleware=...)`. `@agentspec`
hands it, through its `model` and `middleware` parameters, `ChatAgentSpec` on the embedded engine
(SmolLM2-135M by default, structure speculation) and `AgentSpecMiddleware`, which injects the turn
grammar (so each call names a real tool with schema-valid arguments), marks the agent idle while a tool
runs and records acceptance per turn; it registers the tools with the engine.

SmolLM2-135M is tiny: the middleware keeps it on a short leash (the first turn must call a tool, the
turn after the tool results must answer) and a model-call limit caps the loop.

    python examples/langgraph_agent.py ["Add 37 and 21."]
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from typing import Any

from agentspec_langgraph import agentspec
from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.math_api import MathAPI
from langchain.agents import create_agent
from langchain.agents.middleware import ModelCallLimitMiddleware
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import StructuredTool

from agentspec_sdk import ToolRegistry
from agentspec_sdk.bfcl import function_tool

QUESTION = "Add 37 and 21."
TOOLS = ("add", "subtract", "multiply", "divide")
SYSTEM = "You are a calculator assistant. Use a tool to compute, then state the result in one sentence."
SETTINGS: dict[str, Any] = {
    "max_tokens": 64,
    "agent_id": "math-agent",
    "reasoning": False,
    "tool_timeout_s": 10.0,
    "first_tool_choice": "required",
    "later_tool_choice": "none",
}
MAX_MODEL_CALLS = 4


def math_tools(api: MathAPI | None = None) -> list[StructuredTool]:
    """BFCL's MathAPI methods as LangChain tools, with the JSON Schemas of BFCL's own function docs."""
    api = api or MathAPI()
    doc_file = resources.files("bfcl_eval").joinpath("data/multi_turn_func_doc/math_api.json")
    docs = {d["name"]: d for d in map(json.loads, doc_file.read_text().splitlines())}
    tools = []
    for name in TOOLS:
        spec = ToolRegistry().add(function_tool(docs[name]))  # BFCL's type names → JSON Schema
        description = spec.description.split("Tool description: ")[-1]
        tools.append(
            StructuredTool.from_function(getattr(api, name), name=name, description=description,
                                         args_schema=spec.parameters)
        )
    return tools


@agentspec(**SETTINGS)
def build_agent(model, tools, middleware=()):
    """Ordinary LangChain v1 code: `@agentspec` hands it the model and its middleware to pass on."""
    return create_agent(
        model,
        tools,
        system_prompt=SYSTEM,
        middleware=[*middleware, ModelCallLimitMiddleware(run_limit=MAX_MODEL_CALLS, exit_behavior="end")],
    )


def run(question: str = QUESTION, engine: Any = None) -> dict[str, Any]:
    """Build the agent (on `engine`, else on the embedded engine the decorator starts) and run it."""
    build = build_agent if engine is None else agentspec(build_agent.__wrapped__, engine=engine, **SETTINGS)
    tools = math_tools()
    graph = build("any chat model: @agentspec replaces it", tools)
    state = graph.invoke({"messages": [("user", question)]}, {"recursion_limit": 2 * MAX_MODEL_CALLS + 2})
    messages = state["messages"]
    calls = [c for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    results = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    answer = next((m for m in reversed(messages) if isinstance(m, AIMessage) and not m.tool_calls), None)
    return {
        "answer": answer.content if answer else "",
        "tool_calls": calls,
        "tool_results": results,
        "tools": tools,
        "binding": graph.agentspec,
    }


def main(question: str = QUESTION, engine: Any = None) -> dict[str, Any]:
    out = run(question, engine)
    print(f"question: {question}")
    for call in out["tool_calls"]:
        result = out["tool_results"].get(call["id"])
        print(f"tool call: {call['name']}({json.dumps(call['args'])}) -> "
              f"{result.content if result else '(not run)'}")
    print(f"answer: {out['answer']}")
    print("acceptance per class (drafted / accepted / rate):")
    for cls, t in out["binding"].acceptance().items():
        rate = f"{t['rate']:.2f}" if t["rate"] is not None else "-"
        print(f"  {cls}: {t['drafted']} / {t['accepted']} / {rate}")
    for i, rec in enumerate(out["binding"].records):
        print(f"  turn {i + 1}: {rec.output_tokens} tokens, calls {list(rec.tool_calls)}, {rec.acceptance}")
    return out


if __name__ == "__main__":
    main(" ".join(sys.argv[1:]) or QUESTION)
