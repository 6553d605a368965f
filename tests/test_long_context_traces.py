"""The second trace set: BFCL multi_turn_long_context episodes (full tool documentation, classes
loaded with long_context=True, as BFCL loads them), recorded with `agentspec record`."""

import json
from pathlib import Path

import pytest

from agentspec_sdk import bfcl
from agentspec_sdk.replay.record import bfcl_episode_stub, environment_for
from agentspec_sdk.replay.trace import load_traces

TRACES = Path(__file__).resolve().parent.parent / "agentspec_sdk" / "replay" / "traces"
LONG = TRACES / "bfcl_long_context.jsonl"


def _entry(category: str, entry_id: str) -> dict:
    return next(e for e in bfcl.multi_turn_entries(category) if e["id"] == entry_id)


def test_long_context_category_keeps_full_docs_and_loads_long_states():
    assert bfcl.is_long_context("long_context") and not bfcl.is_long_context("base")
    entry = _entry("long_context", "multi_turn_long_context_100")
    stub = bfcl_episode_stub(entry, "long_context", 2)
    assert stub.source["long_context"] is True and stub.source["dataset"] == "BFCL_v4_multi_turn_long_context"
    fn = next(t["function"] for t in stub.tools if t["function"]["name"] == "place_order")
    assert "Tool description:" in fn["description"]  # BFCL's documentation, unshortened
    assert all("description" in p for p in fn["parameters"]["properties"].values())
    watch = environment_for(stub).execute("get_watchlist", {})
    # the long_context state: a watch list of hundreds of symbols
    assert watch.ok and len(watch.result) > 5000
    base = bfcl_episode_stub(_entry("base", "multi_turn_base_100"), "base", 2)
    assert "long_context" not in base.source
    assert environment_for(base).execute("get_watchlist", {}).result == '{"watchlist": ["NVDA"]}'


def test_slim_docs_are_unchanged_for_the_base_category():
    entry = _entry("base", "multi_turn_base_100")
    assert bfcl.entry_tools(entry) == bfcl.entry_tools(entry, slim=True)
    full = bfcl.entry_tools(entry, slim=False)
    assert [t["function"]["name"] for t in full] == [t["function"]["name"] for t in bfcl.entry_tools(entry)]
    assert len(json.dumps(full)) > 1.5 * len(json.dumps(bfcl.entry_tools(entry)))


def test_shipped_long_context_traces():
    from agentspec_sdk.backends.model_bundle import load_tokenizer
    from agentspec_sdk.backends.prompts import chat_messages
    from agentspec_sdk.structure.formats import get_format
    from agentspec_sdk.structure.tools import ToolRegistry

    episodes = load_traces(LONG)
    assert 12 <= len(episodes) <= 16
    assert {ep.source["license"] for ep in episodes} == {"Apache-2.0"}
    assert all(ep.source["long_context"] and ep.id.startswith("bfcl/multi_turn_long_context_")
               for ep in episodes)
    assert "Apache-2.0" in (TRACES / "README.md").read_text()
    tok, fmt = load_tokenizer(None), get_format("tool_calls")
    prompts = []  # the prompt of every recorded assistant turn, as the engine builds it
    for ep in episodes:
        msgs = [{"role": "system", "content": ep.system}]
        for t in ep.turns:
            if t.role == "assistant":
                text = tok.apply_chat_template(chat_messages(msgs, fmt, ToolRegistry(ep.tools)),
                                               tokenize=False, add_generation_prompt=True)
                prompts.append(len(tok(text, add_special_tokens=False)["input_ids"]))
            msgs.append({"role": t.role, "content": t.content})
        assert sum(t.role == "tool" for t in ep.turns) >= 1 or ep.meta["output_tokens"] > 0
    prompts.sort()
    assert prompts[len(prompts) // 2] >= 2000 and sum(p >= 2000 for p in prompts) >= 0.9 * len(prompts)
    assert prompts[-1] + episodes[0].meta["max_tokens"] <= 8192


@pytest.mark.parametrize("command", ["demo", "bench"])
def test_demo_and_bench_take_the_trace_file(monkeypatch, tmp_path, command):
    from agentspec_sdk.replay import cli

    plans = []
    monkeypatch.setattr(cli, "_execute", lambda plan, out, desc, *_: plans.append(plan) or {"runs": []})
    monkeypatch.setattr(cli, "_headline", lambda report: None)
    if command == "demo":
        cli.demo(out=tmp_path, episodes=3, modes="off,structure", traces=LONG)
    else:
        cli.bench(out=tmp_path, arms="A,D", modes="off,structure", gammas="8", batches="8", n=3, traces=LONG,
                  prefix_check=False, entropies=False)
    arms = {a.name: a for a in plans[0].arms}
    assert [ep.id for ep in arms["D"].episodes] == [ep.id for ep in load_traces(LONG, limit=3)]
    assert plans[0].meta["traces"] == str(LONG)
    if command == "bench":
        assert arms["A"].episodes[0].id.startswith("A/")
