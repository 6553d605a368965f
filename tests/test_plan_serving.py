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
