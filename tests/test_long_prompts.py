"""Long prompts: max_model_len defaults to the model's own context length; a turn that does not fit
fails with the numbers, its episode ends cleanly and the report counts it (real-engine check:
test_engine.py::test_prompt_beyond_max_model_len_fails_alone)."""

import json
import types
from concurrent.futures import Future

import pytest

from agentspec_sdk.backends.embedded.vllm_engine import prompt_token_ids
from agentspec_sdk.backends.model_bundle import context_length, load_tokenizer, resolve_model
from agentspec_sdk.backends.types import TurnRequest
from agentspec_sdk.errors import BackendError, PromptTooLong
from agentspec_sdk.replay import loop
from agentspec_sdk.replay.aggregate import add_speedups, summarize
from agentspec_sdk.replay.render import markdown
from agentspec_sdk.replay.trace import Episode, Turn
from agentspec_sdk.structure.formats import get_format
from agentspec_sdk.structure.token_labels import TokenClassifier
from agentspec_sdk.structure.tools import ToolRegistry


def test_context_length_of_the_default_model_is_its_config_value():
    path = resolve_model(None)
    expected = json.loads((__import__("pathlib").Path(path) / "config.json").read_text())[
        "max_position_embeddings"]
    assert context_length(path) == expected == 8192


def test_context_length_aliases_nested_and_missing(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.json").write_text(json.dumps({"n_positions": 1024}))
    assert context_length(tmp_path / "a") == 1024
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.json").write_text(
        json.dumps({"text_config": {"max_position_embeddings": 32768}}))
    assert context_length(tmp_path / "b") == 32768
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(BackendError, match="no context length.*max_position_embeddings.*pass max_model_len"):
        context_length(tmp_path / "c")


def test_engine_defaults_to_the_models_context_length():
    from agentspec_sdk.backends.engine_config import EngineConfig

    assert EngineConfig().max_model_len is None  # Engine(...) builds its EngineConfig from its keywords


def test_prompt_ids_refuses_a_prompt_beyond_the_limit_with_the_numbers():
    """The engine's prompt_token_ids on the real tokenizer and chat template, with a small limit."""
    tokenizer = load_tokenizer(None)
    fmt, registry = get_format("tool_calls"), ToolRegistry([])
    short = TurnRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=16)
    assert 0 < len(prompt_token_ids(tokenizer, short, fmt, registry, 300)) < 284
    long = TurnRequest(messages=[{"role": "user", "content": "word " * 400}], max_tokens=64)
    with pytest.raises(PromptTooLong) as err:
        prompt_token_ids(tokenizer, long, fmt, registry, 300)
    e = err.value
    assert e.limit == 300 and e.max_tokens == 64 and e.prompt_tokens > 400
    assert str(e) == (f"prompt of {e.prompt_tokens} tokens + max_tokens 64 = {e.prompt_tokens + 64} "
                      "exceeds max_model_len 300")
    assert isinstance(e, BackendError)


class GrowingPromptEngine:
    """Every turn calls a tool; a prompt over `limit` characters is refused as the engine refuses it."""

    def __init__(self, limit: int):
        self.limit, self.requests = limit, []

    def submit(self, req):
        self.requests.append(req)
        size = sum(len(m["content"]) for m in req["messages"])
        fut = Future()
        error = (f"PromptTooLong: {PromptTooLong(size, req['max_tokens'], self.limit)}"
                 if size + req["max_tokens"] > self.limit else None)
        fut.set_result(types.SimpleNamespace(
            text="" if error else "call", token_ids=[] if error else [1, 2],
            prompt_token_ids=[] if error else [0], finish_reason=None if error else "stop", error=error,
            spans=[], records=[], acceptance={},
            timings={} if error else {"decode_s": 0.1}, spec=None))
        return fut

    def mark_idle(self, agent):
        pass

    def mark_active(self, agent):
        pass


class Tok:
    def decode(self, ids):
        return "x"


def test_too_long_turn_ends_the_episode_and_is_counted(monkeypatch):
    monkeypatch.setattr(loop, "make_request", lambda **kw: kw)
    monkeypatch.setattr(loop, "turn_calls",
                        lambda fmt, text: [{"name": "ls", "arguments": {}}] if text else [])
    episode = Episode("e", {"name": "t"}, "sys", [], "tool_calls",
                      [Turn("user", "first"), Turn("user", "second")])
    engine = GrowingPromptEngine(limit=200)
    big = loop.Observation("x" * 90, 0.0, "real")
    logs, produced = loop.run_episode(engine, episode, lambda name, args, seg: big,
                                      classifier=TokenClassifier(Tok()),
                                      max_tokens=20, max_steps=lambda seg: 5, sleep=False)
    # turn 0 fits (3 + 5 + 20 chars), turn 1 fits (+ 94), turn 2 does not (+ 94 > 200):
    # the episode stops there
    assert [log.too_long for log in logs] == [False, False, True]
    assert len(engine.requests) == 3 and all(r["messages"][1]["content"] == "first" for r in engine.requests)
    assert "second" not in [t.content for t in produced]
    assert produced[-1].role == "tool"  # no empty assistant turn recorded for the refused one
    assert "exceeds max_model_len 200" in logs[-1].error
    run = summarize(logs, arm="D", mode="off", gamma=8, batch=1, wall_s=1.0, episodes=1)
    assert run["too_long"] == 1 and run["errors"] == 1 and run["turns"] == 3
    add_speedups([run])
    report = {"runs": [run], "meta": {}, "verdicts": [], "lossless": {}}
    assert "exceeded max_model_len (each ended its episode): D/off/γ8/b1: 1." in markdown(report)
    assert summarize(logs[:2], arm="D", mode="off", gamma=8, batch=1, wall_s=1.0)["too_long"] == 0


def test_server_context_error_counts_as_too_long():
    assert loop.is_too_long("server rejected the request: "
                            "This model's maximum context length is 2048 tokens.")
    assert not loop.is_too_long("BackendError: grammar does not compile")
    assert not loop.is_too_long(None)
