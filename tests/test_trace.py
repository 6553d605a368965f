"""Trace format: round trip, clear errors on corrupt/truncated files, BFCL data and live tools."""

import json

import pytest

from agentspec_sdk import bfcl
from agentspec_sdk.errors import TraceError
from agentspec_sdk.replay.record import bfcl_episode_stub, pick_entries
from agentspec_sdk.replay.trace import (
    Episode,
    Turn,
    atomic_write_text,
    bundled_traces,
    dump_traces,
    load_traces,
)

TOOL = {"type": "function", "function": {"name": "cd", "description": "change dir",
                                         "parameters": {"type": "object",
                                                        "properties": {"folder": {"type": "string"}}}}}


def episode(ep_id="e1") -> Episode:
    return Episode(ep_id, {"name": "test", "license": "Apache-2.0"}, "sys", [TOOL], "tool_calls", [
        Turn("user", "go to docs"),
        Turn("assistant", '<tool_call>{"name":"cd","arguments":{"folder":"docs"}}</tool_call>',
             tool_calls=[{"name": "cd", "arguments": {"folder": "docs"}}]),
        Turn("tool", '{"current_working_directory": "docs"}', name="cd", arguments={"folder": "docs"},
             latency_s=0.01),
        Turn("assistant", "Done."),
        Turn("user", "thanks"),
    ])


def test_round_trip(tmp_path):
    path = tmp_path / "t.jsonl"
    dump_traces([episode("a"), episode("b")], path)
    back = load_traces(path)
    assert [e.id for e in back] == ["a", "b"]
    assert back[0].to_dict() == episode("a").to_dict()
    assert [len(s) for s in back[0].user_segments()] == [4, 1]
    assert back[0].observations()[0][0] == 0 and back[0].observations()[0][1].latency_s == 0.01


def test_corrupt_line_names_file_and_line(tmp_path):
    path = tmp_path / "t.jsonl"
    good = json.dumps(episode("a").to_dict())
    path.write_text(good + "\n" + good.replace('"e', '"x', 1)[:-40] + "}\n")
    with pytest.raises(TraceError, match=rf"{path.name}:2: corrupt JSON"):
        load_traces(path)


def test_truncated_last_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(episode("a").to_dict()) + "\n" + json.dumps(episode("b").to_dict())[:120])
    with pytest.raises(TraceError, match=r":2: truncated line"):
        load_traces(path)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("system"), "missing field 'system'"),
    (lambda d: d["turns"][2].pop("latency_s"), r"turns\[2\]: missing field 'latency_s'"),
    (lambda d: d["turns"][0].update(role="robot"), r"turns\[0\]: role must be one of"),
    (lambda d: d["turns"][2].update(latency_s=-1), "latency_s must be >= 0"),
    (lambda d: d.update(tools=[{"name": "cd"}]), r"tools\[0\] must be an OpenAI tool dict"),
    (lambda d: d.update(turns=[]), "no user message"),
    (lambda d: d.update(version=99), "trace version 99"),
    (lambda d: d.update(format="no_such_format"),
     r"field 'format': unknown format 'no_such_format'; known: \["),
    (lambda d: d["turns"][1].update(content='{"name":"cd"}'),
     r"turns\[1\]: the assistant turn is answered by a tool turn but has no '<tool_call>' "
     r"\(format 'tool_calls'\)"),
])
def test_invalid_episode_is_named(tmp_path, mutate, message):
    data = episode("a").to_dict()
    mutate(data)
    path = tmp_path / "t.jsonl"
    path.write_text("\n" + json.dumps(data) + "\n")
    with pytest.raises(TraceError, match=rf":2: .*{message}"):
        load_traces(path)


def test_duplicate_and_empty_and_missing(tmp_path):
    path = tmp_path / "t.jsonl"
    dump_traces([episode("a"), episode("a")], path)
    with pytest.raises(TraceError, match=":2: duplicate episode id 'a'"):
        load_traces(path)
    path.write_text("\n")
    with pytest.raises(TraceError, match="no episodes"):
        load_traces(path)
    with pytest.raises(TraceError, match="cannot read trace file"):
        load_traces(tmp_path / "nope.jsonl")


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    path = tmp_path / "r.json"
    atomic_write_text(path, "old")

    with pytest.raises(TypeError):
        atomic_write_text(path, 123)  # write fails midway: nothing replaced, no temp left
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_bundled_traces_are_valid_and_licensed():
    episodes = load_traces(bundled_traces())
    assert 8 <= len(episodes) <= 16
    for ep in episodes:
        assert ep.source["license"] == "Apache-2.0" and ep.source["name"] == "bfcl-multi-turn"
        assert any(t.role == "assistant" for t in ep.turns)
        for _, obs in ep.observations():
            assert obs.latency_s >= 0 and isinstance(obs.arguments, dict)


def test_bfcl_schema_conversion_and_prompt():
    entry = bfcl.multi_turn_entries()[0]
    tools = bfcl.entry_tools(entry)
    names = [t["function"]["name"] for t in tools]
    assert "cd" in names and "post_tweet" in names
    excluded = {f.split(".")[-1] for f in entry["excluded_function"]}
    assert not excluded & set(names)
    for t in tools:
        params = t["function"]["parameters"]
        assert params["type"] == "object"
        assert all(p.get("type") not in ("dict", "float", "tuple")
                   for p in params.get("properties", {}).values())
    cd = next(t for t in tools if t["function"]["name"] == "cd")
    assert cd["function"]["description"] == "Change the current working directory to the specified folder"
    assert cd["function"]["parameters"] == {"type": "object", "properties": {"folder": {"type": "string"}},
                                            "required": ["folder"]}


def test_bfcl_environment_runs_real_tools():
    entry = bfcl.multi_turn_entries()[0]
    env = bfcl.BfclEnvironment(entry["initial_config"], entry["involved_classes"])
    assert env.execute("cd", {"folder": "workspace"}).ok
    listing = env.execute("ls", {})
    assert "document" in listing.result and listing.latency_s >= 0
    bad = env.execute("cd", {"folder": "nowhere"})
    assert "No such" in bad.result or "Error" in bad.result
    assert not env.execute("rm_rf", {}).ok


def test_pick_entries_spreads_classes():
    entries = bfcl.multi_turn_entries()
    chosen = pick_entries(entries, 8)
    # every class set with <= 24 tools
    assert len({tuple(sorted(e["involved_classes"])) for e in chosen}) == 4
    assert all(len(bfcl.entry_tools(e)) <= 24 for e in chosen)
    stub = bfcl_episode_stub(chosen[0], "base", 2)
    assert len([t for t in stub.turns if t.role == "user"]) == 2
    with pytest.raises(TraceError, match="--n must be >= 1"):
        pick_entries(entries, 0)


def _other_format(fmt: str, assistant: str) -> dict:
    data = episode("a").to_dict()
    data["format"] = fmt
    data["turns"][1]["content"] = assistant
    return data


@pytest.mark.parametrize("fmt, assistant, message", [
    ("code_agent", "I will run it: print(1)",
     r"turns\[1\]: .* has no '```' or '<code>' \(format 'code_agent'\)"),
    ("react", 'Thought: go\nAction Input: {"folder":"docs"}',
     r"turns\[1\]: .* has no 'Action:' \(format 'react'\)"),
    ("react", "Thought: go\nAction: cd\n", r"turns\[1\]: .* has no 'Action Input:' \(format 'react'\)"),
])
def test_turns_must_follow_their_format(tmp_path, fmt, assistant, message):
    path = tmp_path / "t.jsonl"
    good = _other_format(fmt, {"code_agent": "```python\nprint(1)\n```",
                               "react": 'Thought: go\nAction: cd\nAction Input: {"folder":"docs"}'}[fmt])
    path.write_text(json.dumps(good) + "\n" + json.dumps(_other_format(fmt, assistant) | {"id": "b"}) + "\n")
    with pytest.raises(TraceError, match=rf"t\.jsonl:2: episode 'b': {message}"):
        load_traces(path)


@pytest.mark.parametrize("fmt, source, licence", [("react", "bfcl-multi-turn", "Apache-2.0"),
                                                  ("code_agent", "humaneval", "MIT")])
def test_bundled_react_and_code_agent_traces(fmt, source, licence):
    episodes = load_traces(bundled_traces(fmt))
    assert 10 <= len(episodes) <= 16
    for ep in episodes:
        assert ep.format == fmt and ep.source["name"] == source and ep.source["license"] == licence
        assert ep.meta["model"] and ep.meta["temperature"] == 0.0
        assert any(t.role == "assistant" for t in ep.turns)
    assert sum(len(ep.observations()) for ep in episodes) >= len(episodes)  # tools / code ran for real
    with pytest.raises(TraceError, match="no bundled traces in format 'prose'"):
        bundled_traces("prose")


def test_an_episode_carries_its_own_format_instructions(tmp_path):
    """A recording made with other wording of the format's instructions keeps it (`instructions`) and
    replays with it: run_episode sends the format with those instructions, the prompt holds them."""
    from concurrent.futures import Future

    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.backends.prompts import chat_messages
    from agentspec_sdk.backends.types import TurnResult
    from agentspec_sdk.replay.loop import run_episode
    from agentspec_sdk.structure.formats import REACT, get_format
    from agentspec_sdk.structure.token_labels import TokenClassifier
    from agentspec_sdk.structure.tools import ToolRegistry

    own = 'Start with a line "Thought:" saying in a few words of your own what you will do.'
    ep = Episode("r1", {"name": "test"}, "sys", [TOOL], "react", [Turn("user", "go to docs")],
                 instructions=own)
    path = tmp_path / "t.jsonl"
    dump_traces([ep, episode("plain")], path)
    back = load_traces(path)
    assert back[0].instructions == own and back[1].instructions == ""
    assert "instructions" not in back[1].to_dict()  # traces without own wording are written as before
    assert back[0].agent_format().instructions == own and back[0].agent_format().kinds == REACT.kinds

    sent = []

    class Engine:
        def submit(self, req):
            sent.append(req)
            future = Future()
            future.set_result(TurnResult(request_id=req.request_id, text="Final Answer: done"))
            return future

    tok = AutoTokenizer.from_pretrained(resolve_model())
    run_episode(Engine(), back[0], lambda *a: None, classifier=TokenClassifier(tok), max_tokens=8,
                max_steps=lambda seg: 1, sleep=False)
    system = chat_messages(sent[0].messages, get_format(sent[0].fmt), ToolRegistry([TOOL]))[0]["content"]
    assert own in system and "<your reasoning>" not in system
    bad = back[0].to_dict() | {"instructions": 3}
    path.write_text(json.dumps(bad) + "\n")
    with pytest.raises(TraceError, match="instructions"):
        load_traces(path)


def test_bundled_react_plain_traces_carry_their_instructions():
    """The second ReAct recording: its own instructions (no placeholder to copy), every turn real."""
    episodes = load_traces(bundled_traces().with_name("bfcl_react_plain.jsonl"))
    assert len(episodes) == 8 and all(ep.format == "react" and ep.instructions for ep in episodes)
    assert "<" not in episodes[0].instructions  # no placeholder in the wording
    assistant = [t for ep in episodes for t in ep.turns if t.role == "assistant"]
    assert len(assistant) >= 40
    assert not any("<your reasoning>" in t.content or "in a few words of your own" in t.content
                   for t in assistant)
    assert all(ep.source["license"] == "Apache-2.0" for ep in episodes)
