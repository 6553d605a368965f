"""Serving a tuned plan: `Engine(plan=…)`, `agentspec serve --plan FILE` on an existing plan, and the loop
on a real server (capture → `agentspec tune` → a server started with the tuned plan)."""

from __future__ import annotations

import json

import pytest

from agentspec_sdk.backends.engine_config import EngineConfig
from agentspec_sdk.backends.serving.serve_cli import write_plan
from agentspec_sdk.drafting.plan import DraftPlan
from agentspec_sdk.errors import PlanError

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}
OTHER = {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}}


def test_merged_keeps_the_tuned_settings_and_adds_formats_and_tools():
    tuned = DraftPlan(formats=["react"], tools=[TOOL], kinds={"*": {"policy": "trees"}},
                      suffix_max_spec_factor=4.0, gamma_max=16)
    plan = tuned.merged(formats=["tool_calls"], tools=[OTHER], gamma_max=8, tokenizer="tok")
    assert [f["name"] for f in plan.formats] == ["tool_calls", "react"]  # the given first, the plan's kept
    assert [t["function"]["name"] for t in plan.tools] == ["lookup", "other"]
    assert plan.kinds["*"].policy == "trees" and plan.suffix_max_spec_factor == 4.0
    assert (plan.gamma_max, plan.tokenizer) == (8, "tok")
    assert tuned.gamma_max == 16  # the base plan is not changed
    # a tool given again replaces the plan's definition of that name
    changed = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    assert plan.merged(tools=[changed]).tools[-1] == changed
    assert len(plan.merged(tools=[changed]).tools) == 2


def test_merged_refuses_unknown_fields_and_bad_values():
    with pytest.raises(PlanError, match="unknown fields.*'gama_max'"):
        DraftPlan().merged(gama_max=8)
    with pytest.raises(PlanError, match="gamma_max"):
        DraftPlan().merged(gamma_max=65)


def test_plan_of_a_file_an_object_or_none(tmp_path):
    path = DraftPlan(kinds={"tool_call": {"policy": "off"}}).save(tmp_path / "p.json")
    assert DraftPlan.of(path).kinds["tool_call"].policy == "off"
    assert DraftPlan.of(None).kinds == {}
    with pytest.raises(PlanError, match="a plan file's path"):
        DraftPlan.of(3)


def test_engine_config_checks_the_plan_before_vllm_starts(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kinds": {"nonsense": {"policy": "trees"}}}))
    with pytest.raises(PlanError, match=r"bad.json: kinds.nonsense"):
        EngineConfig(plan=bad)
    with pytest.raises(PlanError, match="cannot read plan file"):
        EngineConfig(plan=tmp_path / "missing.json")
    assert EngineConfig(plan=DraftPlan(kinds={"*": {"policy": "off"}})).plan is not None


def test_serve_keeps_an_existing_plan_file_and_adds_its_own(tmp_path):
    plan_path = DraftPlan(formats=["react"], kinds={"*": {"policy": "trees", "tree_spec_factor": 2.0}},
                          suffix_min_token_prob=0.2).save(tmp_path / "tuned.json")
    (tmp_path / "tools.json").write_text(json.dumps([TOOL]))
    write_plan("model-x", plan_path, tools_file=tmp_path / "tools.json", formats="tool_calls", gamma_max=8)
    served = DraftPlan.load(plan_path)
    assert served.kinds["*"].policy == "trees" and served.kinds["*"].tree_spec_factor == 2.0
    assert served.suffix_min_token_prob == 0.2
    assert [f["name"] for f in served.formats] == ["tool_calls", "react"]
    assert [t["function"]["name"] for t in served.tools] == ["lookup"] and served.tokenizer == "model-x"
    # a new file: the defaults
    fresh = DraftPlan.load(write_plan("model-x", tmp_path / "new.json", formats="tool_calls"))
    assert fresh.kinds == {} and [f["name"] for f in fresh.formats] == ["tool_calls"]


def test_serve_refuses_a_broken_plan_file_and_leaves_it(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text('{"kinds": {"*": {"policy": "sometimes"}}}')
    with pytest.raises(PlanError, match=r"plan.json: kinds.\*.policy"):
        write_plan("model-x", path, formats="tool_calls")
    assert path.read_text() == '{"kinds": {"*": {"policy": "sometimes"}}}'


def test_structure_tuned_mode_runs_structure_with_the_plan(tmp_path):
    from agentspec_sdk.errors import TraceError
    from agentspec_sdk.replay.arms import engine_kwargs

    path = DraftPlan(kinds={"*": {"policy": "trees"}}).save(tmp_path / "tuned.json")
    kw = engine_kwargs("structure-tuned", 16, tuned_plan=path)
    assert kw == {"speculation": "structure", "gamma_max": 16, "plan": str(path)}
    EngineConfig(**kw)  # the engine takes these settings as they are
    with pytest.raises(TraceError, match="needs the tuned plan"):
        engine_kwargs("structure-tuned", 8)


def test_demo_and_bench_add_structure_tuned_with_a_plan(tmp_path):
    from agentspec_sdk.errors import AgentSpecError
    from agentspec_sdk.replay.cli import _with_tuned

    path = DraftPlan().save(tmp_path / "tuned.json")
    assert _with_tuned(["off", "structure"], path) == ["off", "structure", "structure-tuned"]
    assert _with_tuned(["off", "structure-tuned"], path) == ["off", "structure-tuned"]
    assert _with_tuned(["off", "structure"], None) == ["off", "structure"]
    with pytest.raises(AgentSpecError, match="needs --plan"):
        _with_tuned(["structure-tuned"], None)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(PlanError, match="broken.json is not valid JSON"):
        _with_tuned(["off"], tmp_path / "broken.json")


def test_peer_table_compares_structure_tuned_like_structure():
    from agentspec_sdk.replay import accounting

    def run(mode, passes, drafted):
        return {"arm": "D", "mode": mode, "gamma": 8, "batch": 8, "prefix_cache": True, "passes": passes,
                "drafted": drafted, "cost": passes + 0.1 * drafted, "decode_tok_s": 10.0}

    runs = [run("off", 100, 0), run("suffix", 80, 100), run("structure", 75, 100),
            run("structure-tuned", 70, 100)]
    rows = {r["mode"]: r for r in accounting.peer_table(runs)}
    assert set(rows) == {"structure", "structure-tuned"}
    assert rows["structure-tuned"]["best_stock_by_cost"] == "suffix"
    assert rows["structure-tuned"]["cost_vs_best_stock"] == pytest.approx(90 / 80)
    assert rows["structure"]["cost_vs_best_stock"] == pytest.approx(90 / 85)


WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}]


def _plain_agent(client, model: str, episode: str, city: str) -> None:
    """Two turns of a plain OpenAI client's agent: a tool call, its result, the answer."""
    messages = [{"role": "user", "content": f"What is the weather in {city}? Use the tool."}]
    first = client.chat.completions.create(model=model, messages=messages, tools=WEATHER,
                                           tool_choice="required", max_tokens=48, temperature=0, user=episode)
    call = first.choices[0].message.tool_calls[0]
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": f"21 degrees in {city}"}]
    client.chat.completions.create(model=model, messages=messages, tools=WEATHER, max_tokens=32,
                                   temperature=0, user=episode)


@pytest.mark.server
def test_the_loop_capture_tune_serve_on_a_real_server(served, tmp_path):
    """`agentspec serve --capture` (the session's server) with a plain OpenAI client's agents, `agentspec
    tune` on that capture, then `agentspec serve --plan` with the result: the new server serves the
    tuned plan (its kinds, its digest on /metrics) and answers a plain client's tool call valid for its
    schema."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import jsonschema
    import openai
    from conftest import _free_port
    from typer.testing import CliRunner

    from agentspec_sdk.backends.inside_vllm.prom_metrics import plan_identity
    from agentspec_sdk.backends.serving.server import http_ok
    from agentspec_sdk.cli import app

    proc, work = served
    client = openai.OpenAI(base_url=proc.base_url + "/v1", api_key="EMPTY", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    for i, city in enumerate(["Paris", "Oslo", "Lima", "Cairo"]):
        _plain_agent(client, model, f"loop-{i}", city)
    tuned, report = tmp_path / "tuned.json", tmp_path / "report"
    result = CliRunner().invoke(app, ["tune", str(work / "capture"), "--out", str(tuned), "--report",
                                      str(report), "--gamma", "4", "--batch", "8", "--jobs", "1"])
    assert result.exit_code == 0, result.output
    kinds = DraftPlan.load(tuned).kinds
    assert json.loads((report / "report.json").read_text())["held_out_summary"]["best_stock_over_tuned"] > 0

    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(WEATHER))
    port = _free_port()
    cmd = [sys.executable, "-m", "agentspec_sdk.cli", "serve", "--plan", str(tuned), "--port", str(port),
           "--tools", str(tools), "--formats", "tool_calls", "--gamma-max", "4", "--max-model-len", "2048",
           "--", "--enforce-eager"]
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom")}
    (tmp_path / "prom").mkdir()
    with (tmp_path / "serve.log").open("w") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while not http_ok(base + "/health"):
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the tuned server did not come up"
            time.sleep(2)
        served_plan = DraftPlan.load(tuned)  # the same file, this server's formats and tools added
        assert served_plan.kinds == kinds
        tuned_client = openai.OpenAI(base_url=base + "/v1", api_key="EMPTY", max_retries=0, timeout=300)
        answer = tuned_client.chat.completions.create(
            model=tuned_client.models.list().data[0].id, tools=WEATHER, tool_choice="required",
            max_tokens=48, messages=[{"role": "user", "content": "What is the weather in Rome?"}],
            temperature=0, user="after")
        call = answer.choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER[0]["function"]["parameters"])
        import urllib.request

        identity = plan_identity(urllib.request.urlopen(base + "/metrics", timeout=10).read().decode())
        assert identity is not None and identity["digest"] == f"{served_plan.digest():012x}"
    finally:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
