"""The LangGraph example and ChatAgentSpec's streaming / async paths on the real embedded engine.

    flock /tmp/agentspec-engine.lock python -m pytest tests/test_langgraph_example.py -q -m engine
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import jsonschema
import pytest
from agentspec_langgraph import ChatAgentSpec, openai_tool
from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.math_api import MathAPI

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "langgraph_agent.py"
pytestmark = pytest.mark.engine


def load_example():
    spec = importlib.util.spec_from_file_location("langgraph_agent_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def marks(engine_structure, monkeypatch):
    seen: list[tuple[str, str]] = []
    for verb in ("idle", "active"):
        original = getattr(engine_structure, f"mark_{verb}")

        def spy(agent_id, _verb=verb, _original=original):
            seen.append((_verb, agent_id))
            _original(agent_id)

        monkeypatch.setattr(engine_structure, f"mark_{verb}", spy)
    return seen


def test_example_agent_calls_real_tools_with_schema_valid_arguments(engine_structure, marks, capsys):
    example = load_example()
    out = example.main(example.QUESTION, engine=engine_structure)

    calls = out["tool_calls"]
    assert calls, "the first turn must call a tool (first_tool_choice='required')"
    schemas = {t.name: openai_tool(t)["function"]["parameters"] for t in out["tools"]}
    api = MathAPI()
    for call in calls:
        assert call["name"] in example.TOOLS
        jsonschema.validate(call["args"], schemas[call["name"]])
        result = out["tool_results"][call["id"]]  # executed: a ToolMessage answers this call id
        assert result.status == "success"
        expected = getattr(api, call["name"])(**call["args"])
        assert json.loads(result.content) == json.loads(json.dumps(expected, default=str))

    binding = out["binding"]
    records = binding.records
    assert len(records) >= 2 and all(r.agent_id == "math-agent" for r in records)
    assert records[0].tool_calls == tuple(c["name"] for c in calls[: len(records[0].tool_calls)])
    s_class = binding.acceptance()["S"]
    assert s_class["drafted"] > 0 and 0 <= s_class["accepted"] <= s_class["drafted"]
    rounds = sum(1 for r in records if r.tool_calls)
    assert marks == [("idle", "math-agent"), ("active", "math-agent")] * rounds
    assert "math-agent" not in engine_structure.stats()["idle_agents"]
    printed = capsys.readouterr().out
    assert "acceptance per class" in printed and "  S: " in printed and f"answer: {out['answer']}" in printed


def test_stream_and_astream_on_the_engine_give_the_same_valid_call(engine_structure):
    example = load_example()
    tools = example.math_tools()
    model = ChatAgentSpec(engine=engine_structure, max_tokens=48, reasoning=False)
    bound = model.bind_tools(tools, tool_choice="required")
    question = [("user", "Add 12 and 30.")]

    chunks = list(bound.stream(question))
    total = chunks[0]
    for c in chunks[1:]:
        total = total + c

    async def run():
        agg = None
        async for c in bound.astream(question):
            agg = c if agg is None else agg + c
        return agg, await bound.ainvoke(question)

    async_total, async_msg = asyncio.run(run())
    schemas = {t.name: openai_tool(t)["function"]["parameters"] for t in tools}
    expected = [(c["name"], c["args"]) for c in async_msg.tool_calls]
    assert len(expected) == 1
    jsonschema.validate(expected[0][1], schemas[expected[0][0]])
    for streamed in (total, async_total):  # temperature 0: the same call every time
        assert [(c["name"], c["args"]) for c in streamed.tool_calls] == expected
        assert streamed.content == async_msg.content == ""  # no marker text leaks into the content
        assert streamed.usage_metadata["output_tokens"] > 0
        assert "S" in streamed.response_metadata["acceptance"]
