"""The HumanEval code-agent environment, recording and replay (scripted engine, real sandbox and data).
The real engine replays the bundled code-agent and ReAct traces in test_demo."""

from __future__ import annotations

import threading
import types
from concurrent.futures import Future

import pytest

from agentspec_sdk.errors import TraceError
from agentspec_sdk.replay import humaneval, loop
from agentspec_sdk.replay.record import check_source_format, record
from agentspec_sdk.replay.replayer import replay
from agentspec_sdk.replay.trace import bundled_traces, load_traces
from agentspec_sdk.sandbox import SandboxLimits
from agentspec_sdk.structure.formats import CODE_AGENT, CODE_TOOL
from agentspec_sdk.structure.turns import ToolCall, parse_calls

TASK = "HumanEval/0"
HANG = "while True:\n    pass"
HOG = "blocks = []\nwhile True:\n    blocks.append(bytes(256 * 2**20))"


def solution(task_id: str = TASK) -> str:
    t = humaneval.task(task_id)
    return t["prompt"] + t["canonical_solution"]


def fenced(code: str) -> str:
    return f"Here it is.\n```python\n{code}\n```"


@pytest.fixture(autouse=True)
def fast_sandbox(request, monkeypatch):
    monkeypatch.setattr(humaneval, "LIMITS", SandboxLimits(timeout_s=1.5, cpu_s=3))
    if request.node.get_closest_marker("engine") is None:  # the scripted engines take plain dicts
        monkeypatch.setattr(loop, "make_request", lambda **kw: kw)


class ScriptedCoder:
    """Per episode, the i-th assistant turn writes script[i]; records every request."""

    def __init__(self, script: list[str]):
        self.script = script
        self.requests: list[dict] = []
        self.lock = threading.Lock()

    def submit(self, req):
        with self.lock:
            self.requests.append(req)
        step = sum(1 for m in req["messages"] if m["role"] == "assistant")
        text = self.script[min(step, len(self.script) - 1)]
        fut = Future()
        fut.set_result(types.SimpleNamespace(
            text=text, token_ids=[7] * 4, prompt_token_ids=[1] * 9, finish_reason="stop", error=None,
            spans=[{"start": 0, "end": len(text), "law_class": "R"}], records=[], acceptance={},
            timings={"decode_s": 0.01, "prefill_s": 0.0, "e2e_s": 0.01}))
        return fut

    def mark_idle(self, agent):
        pass

    def mark_active(self, agent):
        pass


class Tok:
    def decode(self, ids):
        return "ab"


def test_data_ships_in_the_package_and_tasks_are_picked_deterministically():
    assert len(humaneval.tasks()) == 164
    picked = [t["task_id"] for t in humaneval.pick_tasks(12)]
    assert picked == [t["task_id"] for t in humaneval.pick_tasks(12)] and len(set(picked)) == 12
    with pytest.raises(TraceError, match="no HumanEval task 'HumanEval/999'"):
        humaneval.task("HumanEval/999")
    with pytest.raises(TraceError, match="--n must be >= 1"):
        humaneval.pick_tasks(0)


def test_environment_runs_the_tests_in_the_sandbox():
    env = humaneval.HumanEvalEnvironment(TASK)
    ok = env.execute("python", {"code": solution()})
    assert ok.ok and ok.result == humaneval.PASSED
    # the prompt's imports are added: a body without `from typing import List` still runs
    body = solution().split("from typing import List", 1)[1]
    assert env.execute("python", {"code": body}).ok
    wrong = env.execute("python", {"code": "def has_close_elements(numbers, threshold):\n    return False"})
    assert not wrong.ok and "AssertionError" in wrong.result and "Error: exit code 1" in wrong.result
    hang = env.execute("python", {"code": HANG})
    assert not hang.ok and "timed out after 1.5 s" in hang.result
    assert not env.execute("search", {"query": "x"}).ok


def test_a_code_block_is_a_code_run():
    calls = loop.turn_calls(CODE_AGENT, fenced("print(1)"))
    assert calls == [{"name": "python", "arguments": {"code": "print(1)"}}]
    assert parse_calls(CODE_AGENT, "<code>x = 2</code>") == [ToolCall(CODE_TOOL, {"code": "x = 2"})]
    assert CODE_TOOL == "python"
    assert loop.turn_calls(CODE_AGENT, "No code, just words.") == []


def test_record_goes_on_after_bad_code_and_stops_at_a_pass():
    engine = ScriptedCoder([fenced(HANG), fenced(HOG), fenced(solution())])
    (ep,) = record(engine, source="humaneval", n=1, max_steps=3, tokenizer=Tok(), concurrency=1)
    assert ep.format == "code_agent" and ep.source["task_id"] == TASK and ep.source["license"] == "MIT"
    roles = [t.role for t in ep.turns]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant", "tool"]
    tools = [t for t in ep.turns if t.role == "tool"]
    assert "timed out" in tools[0].content and "MemoryError" in tools[1].content
    assert tools[2].content == humaneval.PASSED and ep.meta["passed"] is True
    assert tools[0].latency_s >= 1.5
    # the model saw each result in the next request
    assert engine.requests[1]["messages"][-1] == {"role": "tool", "content": tools[0].content}
    # a pass at the first step ends the episode
    (short,) = record(ScriptedCoder([fenced(solution())]), source="humaneval", n=1, max_steps=3,
                      tokenizer=Tok(), concurrency=1)
    assert [t.role for t in short.turns] == ["user", "assistant", "tool"] and short.meta["passed"]


def test_replay_answers_recorded_code_from_the_trace_and_runs_other_code():
    (ep,) = record(ScriptedCoder([fenced("def has_close_elements(n, t):\n    return 1 / 0"),
                                  fenced(solution())]),
                   source="humaneval", n=1, max_steps=3, tokenizer=Tok(), concurrency=1)
    assert [t.role for t in ep.turns].count("assistant") == 2
    same = replay(ScriptedCoder([fenced("def has_close_elements(n, t):\n    return 1 / 0"),
                                 fenced(solution())]),
                  [ep], tokenizer=Tok(), concurrency=1, latency_scale=0.0)
    assert same.matches == {"exact": 2}
    # a recorded pass ends the episode early, as when recorded
    early = replay(ScriptedCoder([fenced(solution())]), [ep], tokenizer=Tok(), concurrency=1,
                   latency_scale=0.0)
    assert early.matches == {"exact": 1} and len(early.logs) == 1
    # other code than recorded is run in the sandbox (never answered with another code's result)
    other = replay(ScriptedCoder([fenced("# another\n" + solution())]), [ep], tokenizer=Tok(), concurrency=1,
                   latency_scale=0.0)
    assert other.matches == {"executed": 1} and len(other.logs) == 1
    wrong = replay(ScriptedCoder([fenced("def has_close_elements(n, t):\n    return None")]), [ep],
                   tokenizer=Tok(), concurrency=1, latency_scale=0.0)
    assert wrong.matches == {"executed": 2} and len(wrong.logs) == 2


def test_source_and_format_are_checked():
    assert check_source_format("humaneval", None) == "code_agent"
    assert check_source_format("bfcl-multi-turn", "react") == "react"
    with pytest.raises(TraceError,
                       match="source 'humaneval' records formats \\['code_agent'\\], not 'react'"):
        check_source_format("humaneval", "react")
    with pytest.raises(TraceError, match="unknown trace source 'mbpp'"):
        check_source_format("mbpp", None)


@pytest.mark.engine
def test_real_engine_replays_a_react_and_a_code_agent_episode(engine_structure):
    """The bundled ReAct and code-agent traces on the real engine: observations from the trace or the
    sandbox, ReAct actions forced by the grammar (class S), Thought and code text class R."""
    from agentspec_sdk.backends.model_bundle import load_tokenizer

    react = load_traces(bundled_traces("react"), limit=1)[0]
    code = load_traces(bundled_traces("code_agent"), limit=1)[0]
    run = replay(engine_structure, [react, code], tokenizer=load_tokenizer(None), concurrency=2,
                 max_tokens=64, max_segments=1, latency_scale=0.0)
    assert run.logs and not [log.error for log in run.logs if log.error]
    assert set(run.matches) <= {"exact", "name", "executed"}
    react_logs = [log for log in run.logs if log.episode == react.id]
    code_logs = [log for log in run.logs if log.episode == code.id]
    assert react_logs and code_logs
    calls = [c for log in react_logs for c in log.tool_calls]
    assert calls and all(c["name"] in {t["function"]["name"] for t in react.tools} for c in calls)
    assert sum(log.tokens_by_class["S"] for log in react_logs) > 0  # Action / Action Input
    assert sum(log.tokens_by_class["R"] for log in code_logs) > 0  # reasoning and code
    drafted_s = sum(r["drafted"] for log in react_logs for r in log.records if r["law_class"] == "S")
    assert drafted_s > 0  # the structure drafter forced the grammar's action text


def test_arm_d_runs_once_per_agent_format():
    from agentspec_sdk.replay.arms import build_arm, format_arms

    assert format_arms(["tool_calls", "react", "code_agent"]) == ["D", "D-react", "D-code"]
    with pytest.raises(TraceError, match=r"unknown agent format\(s\) \['prose'\] for arm D"):
        format_arms(["prose"])
    for name, fmt in (("D-react", "react"), ("D-code", "code_agent")):
        arm = build_arm(name, 2, max_tokens=32, max_segments=1)
        assert arm.name == name and len(arm.episodes) == 2 and {e.format for e in arm.episodes} == {fmt}


def test_record_cli_names_a_bad_source_format_pair():
    from typer.testing import CliRunner

    from agentspec_sdk.replay.cli import app

    result = CliRunner().invoke(app(), ["record", "--source", "humaneval", "--format", "react", "--n", "1"])
    assert result.exit_code == 2
    assert "source 'humaneval' records formats ['code_agent'], not 'react'" in result.output
