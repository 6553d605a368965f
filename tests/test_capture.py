"""Capture (docs/capture.md): the format v1 reader and writer, `Engine(capture=DIR)` and `agentspec serve
--capture DIR`.

The first tests are the file format (round trip, bounds, sample, permissions, every bad input); then the
real embedded engine (`engine_off`, the shared session fixture) and the real server (`served`, the
session's server of tests/conftest.py, started with a capture directory), each writing the turns a
plain client sees. Engine and server tests run under the engine lock:

    flock /tmp/agentspec-engine.lock pytest tests/test_capture.py -m "engine or server"
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from agentspec_sdk.backends.capture import (
    CAPTURE_VERSION,
    CaptureWriter,
    Grammar,
    read_capture,
    writer_for,
)
from agentspec_sdk.errors import BackendError, CaptureError

TOOLS = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}]
LARK = Grammar("lark", 'start: "<tool_call>" /[a-z]+/ "</tool_call>"')


def _turn(i: int, episode: str | None = "ep", **kw) -> dict:
    turn = dict(id=f"r{i}", episode=episode, prompt=[1, 2, 3, i], out=[4, 5, i], temperature=0.0,
                grammar=LARK, format="tool_calls", tools=TOOLS, started=100.0 + i, finished=101.0 + i,
                finish_reason="stop")
    return {**turn, **kw}


def _writer(tmp_path, **kw) -> CaptureWriter:
    return CaptureWriter(tmp_path / "cap", writer="engine", model="m", **kw)


def test_round_trip_keeps_every_field_and_writes_tools_and_grammars_once_per_file(tmp_path):
    w = _writer(tmp_path)
    for i in range(3):
        assert w.write_turn(**_turn(i))
    assert w.write_turn(**_turn(3, episode=None, grammar=None, tools=None, format=None, temperature=0.7,
                                started=None, finished=None, finish_reason=None))
    w.close()
    (path,) = w.files
    assert path.name == f"capture-{os.getpid()}-0.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    header = lines[0]
    assert header["agentspec_capture"] == CAPTURE_VERSION and header["writer"] == "engine"
    assert header["model"] == "m" and header["pid"] == os.getpid() and header["created"].endswith("+00:00")
    assert [x["type"] for x in lines[1:]] == ["tools", "grammar", "turn", "turn", "turn", "turn"]
    cap = read_capture([tmp_path / "cap"])
    assert cap.files == [str(path)] and cap.notes == []
    assert [t.id for t in cap.turns] == ["r0", "r1", "r2", "r3"]
    first, last = cap.turns[0], cap.turns[3]
    assert (first.episode, first.prompt, first.out, first.temperature) == ("ep", [1, 2, 3, 0], [4, 5, 0], 0.0)
    assert first.grammar == LARK and first.tools == TOOLS and first.format == "tool_calls"
    assert (first.started, first.finished, first.finish_reason) == (100.0, 101.0, "stop")
    assert first.source == f"{path}:4"
    assert (last.episode, last.grammar, last.tools, last.format) == (None, None, None, None)
    assert last.temperature == 0.7
    assert read_capture(str(path)).turns == cap.turns  # a file alone, a path given as a string


def test_files_rotate_past_the_cap_the_oldest_go_and_each_file_reads_alone(tmp_path):
    w = _writer(tmp_path, max_bytes=2048, max_files=3)
    for i in range(40):
        w.write_turn(**_turn(i))
    names = [p.name for p in w.files]
    pid = os.getpid()
    assert len(names) == 3 and names[-1] == f"capture-{pid}-{int(names[-1].split('-')[2][:-6])}.jsonl"
    on_disk = sorted(p.name for p in (tmp_path / "cap").iterdir())
    assert on_disk == sorted(names)  # the older files were removed
    for path in w.files:
        assert path.stat().st_size <= 2048
        cap = read_capture([path])  # its own header, tools and grammar lines
        assert cap.turns and all(t.tools == TOOLS and t.grammar == LARK for t in cap.turns)
    kept = read_capture([tmp_path / "cap"]).turns
    assert [t.id for t in kept] == [f"r{i}" for i in range(40 - len(kept), 40)]  # the newest, in order


def test_a_turn_larger_than_the_cap_gets_a_file_of_its_own(tmp_path):
    w = _writer(tmp_path, max_bytes=1024)
    w.write_turn(**_turn(0))
    w.write_turn(**_turn(1, prompt=list(range(600))))
    w.write_turn(**_turn(2))
    assert [len(read_capture([p]).turns) for p in w.files] == [1, 1, 1]


def test_the_sample_keeps_whole_episodes(tmp_path):
    w = _writer(tmp_path, sample=0.5, seed=7)
    kept = {}
    for ep in range(200):
        results = {w.write_turn(**_turn(k, episode=f"ep{ep}")) for k in range(3)}
        assert len(results) == 1  # all of an episode's turns in, or all out
        kept[ep] = results.pop()
    assert 60 < sum(kept.values()) < 140
    again = CaptureWriter(tmp_path / "again", writer="engine", model="m", sample=0.5, seed=7)
    assert all(again.keeps(f"ep{ep}") == k for ep, k in kept.items())  # a seed: the same episodes
    alone = [w.write_turn(**_turn(i, episode=None)) for i in range(200)]
    assert 60 < sum(alone) < 140  # turns without episode: decided one by one
    assert not _writer(tmp_path / "none", sample=0.0).write_turn(**_turn(0))


def test_only_the_owner_can_read_the_directory_and_files(tmp_path):
    w = _writer(tmp_path)
    w.write_turn(**_turn(0))
    assert stat.S_IMODE((tmp_path / "cap").stat().st_mode) == 0o700
    assert stat.S_IMODE(w.files[0].stat().st_mode) == 0o600


def test_one_writer_per_process_and_directory_safe_across_threads(tmp_path):
    a = writer_for(tmp_path / "shared", writer="engine", model="m")
    assert writer_for(tmp_path / "shared", writer="engine", model="m") is a
    assert writer_for(tmp_path / "other", writer="engine", model="m") is not a

    def many(t):
        for i in range(50):
            a.write_turn(**_turn(i, episode=f"t{t}", prompt=list(range(200))))

    threads = [threading.Thread(target=many, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    cap = read_capture([tmp_path / "shared"])
    assert len(cap.turns) == 200 and cap.notes == []  # whole lines only
    a.close()
    with pytest.raises(CaptureError, match="closed"):
        a.write_turn(**_turn(0))
    assert writer_for(tmp_path / "shared", writer="engine", model="m") is not a  # a closed one is replaced


@pytest.mark.parametrize("kw, match", [
    ({"writer": "nobody"}, "writer must be one of"),
    ({"max_bytes": 10}, "max_bytes must be an integer >= 1024"),
    ({"max_files": 0}, "max_files"), ({"sample": 1.5}, r"sample must be a number in \[0, 1\]"),
    ({"sample": True}, "sample")])
def test_bad_writer_settings_are_named(tmp_path, kw, match):
    with pytest.raises(CaptureError, match=match):
        CaptureWriter(tmp_path, **{"writer": "engine", "model": "m", **kw})


def _file(tmp_path, lines: list, end: str = "\n") -> Path:
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + end)
    return path


HEADER = {"agentspec_capture": 1, "created": "2026-12-07T00:00:00+00:00", "writer": "serve", "model": "m",
          "pid": 1}
GRAMMAR = {"type": "grammar", "id": "g1", "kind": "lark", "text": "start: /a/"}
TURN = {"type": "turn", "id": "x", "episode": None, "prompt": [1], "out": [2], "temperature": 0.0,
        "grammar": "g1", "format": None, "tools": None, "started": None, "finished": None,
        "finish_reason": "stop"}


@pytest.mark.parametrize("lines, match", [
    ([{**HEADER, "agentspec_capture": 2}, TURN], r"c.jsonl:1: unknown capture version 2"),
    ([TURN], r"c.jsonl:1: no capture header"),
    (["not json", TURN], r"c.jsonl:1: no capture header"),
    ([HEADER, GRAMMAR, '{"type": "turn", "id": ', TURN], r"c.jsonl:3: malformed line"),
    ([HEADER, GRAMMAR, "[1, 2]", TURN], r"c.jsonl:3: malformed line: not a JSON object"),
    ([HEADER, {**TURN, "grammar": "g9"}], r"c.jsonl:2: turn refers to unknown grammar id 'g9'"),
    ([HEADER, {**TURN, "grammar": None, "tools": "t9"}], r"c.jsonl:2: turn refers to unknown tools id 't9'"),
    ([HEADER, GRAMMAR, {**TURN, "prompt": [1, "2"]}], r"c.jsonl:3: key 'prompt': token ids must be integers"),
    ([HEADER, GRAMMAR, {k: v for k, v in TURN.items() if k != "out"}], r"c.jsonl:3: turn has no key 'out'"),
    ([HEADER, {"type": "comment"}], r"c.jsonl:2: unknown line type 'comment'"),
])
def test_bad_capture_files_are_named_by_file_and_line(tmp_path, lines, match):
    with pytest.raises(CaptureError, match=match):
        read_capture([_file(tmp_path, lines)])


def test_an_empty_file_or_a_missing_path_is_named(tmp_path):
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(CaptureError, match=r"e.jsonl:1: no capture header \(the file is empty\)"):
        read_capture([tmp_path / "e.jsonl"])
    with pytest.raises(CaptureError, match="nowhere: no such capture file or directory"):
        read_capture([tmp_path / "nowhere"])


def test_a_truncated_last_line_is_skipped_with_a_note(tmp_path):
    cut = json.dumps(TURN)[:30]
    cap = read_capture([_file(tmp_path, [HEADER, GRAMMAR, TURN, cut], end="")])
    assert len(cap.turns) == 1
    (note,) = cap.notes
    assert note.startswith(f"{tmp_path / 'c.jsonl'}:4: truncated last line skipped (Unterminated string")
    whole_but_unended = read_capture([_file(tmp_path, [HEADER, GRAMMAR, TURN, TURN], end="")])
    assert len(whole_but_unended.turns) == 1
    assert whole_but_unended.notes[0].endswith(":4: truncated last line skipped (no newline at its end)")


# -- the real embedded engine ----------------------------------------------------------------------------


@pytest.mark.engine
def test_engine_capture_writes_each_turn_as_the_engine_answered_it(engine_off, tmp_path):
    """A capture on the default model (the session's `off` engine, `capture_to(DIR)`, which
    `Engine(capture=DIR)` calls at start): the captured prompt and output token ids are the result's,
    with the turn's grammar as sent, its format, tools, agent and times; nothing after `capture_to(None)`."""
    from agentspec_sdk.backends.types import TurnRequest, as_registry

    engine_off.capture_to(tmp_path / "cap")
    try:
        reqs = [TurnRequest(messages=[{"role": "user", "content": "List the files."}], fmt="tool_calls",
                            tools=TOOLS, max_tokens=24, agent_id="agent-7", request_id="cap-a"),
                TurnRequest(messages=[{"role": "user", "content": "Say hi."}], fmt="react", max_tokens=16,
                            grammar="", request_id="cap-b")]
        results = [engine_off.submit(r).result(timeout=300) for r in reqs]
    finally:
        engine_off.capture_to(None)
    assert all(r.ok for r in results)
    cap = read_capture([tmp_path / "cap"])
    got = {t.id: t for t in cap.turns}
    assert set(got) == {"cap-a", "cap-b"}
    a, b = got["cap-a"], got["cap-b"]
    assert (a.prompt, a.out) == (results[0].prompt_token_ids, results[0].token_ids)
    assert (b.prompt, b.out) == (results[1].prompt_token_ids, results[1].token_ids)
    assert a.grammar == Grammar("lark", engine_off.grammar_for("tool_calls", TOOLS)) and b.grammar is None
    assert (a.format, a.episode, a.temperature) == ("tool_calls", "agent-7", 0.0)
    assert a.tools == as_registry(TOOLS).openai_tools()  # the tools as the prompt showed them
    assert b.format == "react" and b.episode is None and b.finish_reason == results[1].finish_reason
    assert a.started < a.finished and stat.S_IMODE(Path(cap.files[0]).stat().st_mode) == 0o600
    engine_off.submit(reqs[1]).result(timeout=300)  # after capture_to(None): not captured
    assert len(read_capture([tmp_path / "cap"]).turns) == 2


def test_engine_capture_settings_are_checked_before_anything_starts():
    from agentspec_sdk.backends.engine_config import EngineConfig

    with pytest.raises(BackendError, match=r"capture_sample must be a number in \[0, 1\]"):
        EngineConfig(capture="x", capture_sample=2)


# -- the real server ---------------------------------------------------------------------------------


def test_serve_passes_the_capture_directory_and_bounds_to_vllm(tmp_path):
    from agentspec_sdk.backends.inside_vllm.capture_hook import CAPTURE_DIR_ENV, CAPTURE_SAMPLE_ENV
    from agentspec_sdk.backends.serving.server import ServerSpec

    env = ServerSpec(model="m", speculation="off", capture_dir=tmp_path / "c", capture_sample=0.25).env()
    assert env[CAPTURE_DIR_ENV] == str((tmp_path / "c").resolve()) and env[CAPTURE_SAMPLE_ENV] == "0.25"
    assert CAPTURE_DIR_ENV not in ServerSpec(model="m", speculation="off").env()  # nothing unless asked
    with pytest.raises(BackendError, match="capture: capture max_files must be an integer >= 1"):
        ServerSpec(model="m", speculation="off", capture_dir=tmp_path, capture_max_files=0)


def test_serve_capture_on_the_command_line(tmp_path):
    """`agentspec serve --capture DIR --dry-run`: the printed command carries the capture's directory and
    bounds; a bad bound is named before anything starts."""
    import shlex

    import typer
    from typer.testing import CliRunner

    from agentspec_sdk.backends.serving.serve_cli import serve

    app = typer.Typer()
    app.command("serve")(serve)
    app.command("noop")(lambda: None)
    (tmp_path / "config.json").write_text("{}")
    base = ["serve", "--model", str(tmp_path), "--speculation", "off", "--no-tool-parser", "--dry-run",
            "--capture", str(tmp_path / "cap")]
    out = CliRunner().invoke(app, [*base, "--capture-sample", "0.5", "--capture-max-mb", "1",
                                   "--capture-max-files", "3"])
    assert out.exit_code == 0, out.output
    line = shlex.split(out.output.splitlines()[-1])
    env = dict(w.split("=", 1) for w in line if w.startswith("AGENTSPEC_"))
    assert env["AGENTSPEC_CAPTURE_DIR"] == str((tmp_path / "cap").resolve())
    assert (env["AGENTSPEC_CAPTURE_SAMPLE"], env["AGENTSPEC_CAPTURE_MAX_BYTES"],
            env["AGENTSPEC_CAPTURE_MAX_FILES"]) == ("0.5", str(1 << 20), "3")
    bad = CliRunner().invoke(app, [*base, "--capture-sample", "2"])
    assert bad.exit_code == 2 and "capture sample must be a number in [0, 1], got 2.0" in bad.output


def test_the_capture_hook_is_inert_unless_asked(monkeypatch):
    import sys

    from agentspec_sdk.backends.inside_vllm import capture_hook

    monkeypatch.delenv(capture_hook.CAPTURE_DIR_ENV, raising=False)
    capture_hook.register()  # no directory: nothing imported, nothing patched
    assert "vllm.entrypoints.openai.chat_completion.serving" not in sys.modules or not getattr(
        sys.modules["vllm.entrypoints.openai.chat_completion.serving"].OpenAIServingChat._create_chat_completion,
        "_agentspec_capture", False)


@pytest.mark.parametrize("kind", ["DELTA", "CUMULATIVE", "FINAL_ONLY"])
def test_the_hook_sums_a_streams_deltas_and_writes_the_turn_when_it_finishes(tmp_path, monkeypatch, kind):
    """vLLM's output stream as the API server sees it (small fakes of its outputs, vLLM's own sampling
    parameters): deltas summed when streaming, the last cumulative output otherwise; the grammar and
    temperature from the sampling parameters, the note of the chat request (tools, user, format)."""
    import asyncio
    from types import SimpleNamespace

    from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

    from agentspec_sdk.backends.inside_vllm import capture_hook

    monkeypatch.setenv(capture_hook.CAPTURE_DIR_ENV, str(tmp_path / f"cap-{kind}"))
    params = SamplingParams(temperature=0.0, max_tokens=8, output_kind=getattr(RequestOutputKind, kind),
                            structured_outputs=StructuredOutputsParams(grammar=LARK.text))
    pieces = [[5, 6], [7], [8, 9]]

    def output(i):
        ids = pieces[i] if kind == "DELTA" else sum(pieces[:i + 1], [])
        comp = SimpleNamespace(token_ids=ids, finish_reason="stop" if i == 2 else None)
        prompt = [1, 2, 3] if i == 0 else None
        return SimpleNamespace(prompt_token_ids=prompt, finished=i == 2, outputs=[comp])

    async def stream():
        for i in range(3) if kind != "FINAL_ONLY" else [2]:
            yield output(i)

    engine = SimpleNamespace(model_config=SimpleNamespace(served_model_name="m"))
    turn = capture_hook._Turn(engine, {"prompt_token_ids": [1, 2, 3]}, params, "chatcmpl-1", None,
                              {"tools": TOOLS, "user": "ep1", "format": "tool_calls"})

    async def drain():
        return [o async for o in turn.watch(stream())]

    assert len(asyncio.run(drain())) == (1 if kind == "FINAL_ONLY" else 3)  # every output passed on
    (got,) = read_capture([tmp_path / f"cap-{kind}"]).turns
    assert (got.id, got.episode, got.prompt, got.out) == ("chatcmpl-1", "ep1", [1, 2, 3], [5, 6, 7, 8, 9])
    assert (got.grammar, got.tools, got.format, got.temperature, got.finish_reason) == \
        (LARK, TOOLS, "tool_calls", 0.0, "stop")


def test_a_grammar_is_captured_in_the_field_it_was_sent_in():
    from vllm.sampling_params import StructuredOutputsParams

    from agentspec_sdk.backends.inside_vllm.capture_hook import grammar_of

    assert grammar_of(StructuredOutputsParams(grammar="start: /a/")) == Grammar("lark", "start: /a/")
    assert grammar_of(StructuredOutputsParams(json={"type": "object"})) == \
        Grammar("json", '{"type":"object"}')
    assert grammar_of(StructuredOutputsParams(choice=["a", "b"])) == Grammar("choice", '["a","b"]')
    assert grammar_of(StructuredOutputsParams(regex="a+")) == Grammar("regex", "a+")
    assert grammar_of(None) is None


@pytest.mark.server
def test_served_turns_of_a_plain_openai_client_are_captured(served):
    """A plain `openai` client on `agentspec serve --capture DIR` (the session's server): a tool-call
    request with `user="ep1"` and a streaming one in the same episode; the capture holds both turns,
    with the grammar the tool parser sent, the request's tools, the server's format, the episode, and
    output token ids that decode to what the client was answered."""
    import openai
    from transformers import AutoTokenizer

    proc, work = served
    client = openai.OpenAI(base_url=proc.base_url + "/v1", api_key="EMPTY", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    plain = client.chat.completions.create(model=model, messages=ask, tools=WEATHER, tool_choice="required",
                                           max_tokens=48, temperature=0, user="ep1")
    chunks = list(client.chat.completions.create(model=model, messages=ask, max_tokens=16, temperature=0,
                                                 user="ep1", stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    turns = [t for t in read_capture([work / "capture"]).turns if t.episode == "ep1"]
    by_id = {t.id: t for t in turns}
    assert set(by_id) == {plain.id, chunks[0].id}
    call, text = by_id[plain.id], by_id[chunks[0].id]
    assert call.tools == WEATHER and call.format == "tool_calls" and call.grammar.kind == "lark"
    assert "get_weather" in call.grammar.text and call.temperature == 0.0 and call.finish_reason
    tok = AutoTokenizer.from_pretrained(proc.spec.model)
    name = plain.choices[0].message.tool_calls[0].function.name
    assert name in tok.decode(call.out) and len(call.out) == plain.usage.completion_tokens
    assert len(call.prompt) == plain.usage.prompt_tokens
    assert text.tools is None and text.format is None
    assert tok.decode(text.out, skip_special_tokens=True).strip() == streamed.strip()
    assert text.prompt and text.started <= text.finished


@pytest.mark.server
def test_our_clients_turns_are_captured_with_their_format_and_agent(served):
    """`RemoteEngine` names the turn's format (`x-agentspec-format`) and its agent (`user`): the
    captured turn has them, the grammar it sent, and the token ids the client got back."""
    from agentspec_sdk.backends.remote.openai_backend import RemoteEngine
    from agentspec_sdk.backends.types import TurnRequest

    proc, work = served
    with RemoteEngine(proc.base_url) as remote:
        req = TurnRequest(messages=[{"role": "user", "content": "What is the weather in Rome?"}], fmt="react",
                          tools=WEATHER, max_tokens=40, agent_id="ep2", request_id="capture/rome")
        res = remote.submit(req).result(timeout=300)
        grammar = remote.grammar_for("react", WEATHER)
    assert res.ok, res.error
    (turn,) = [t for t in read_capture([work / "capture"]).turns if t.episode == "ep2"]
    assert turn.format == "react" and turn.grammar == Grammar("lark", grammar)
    assert (turn.prompt, turn.out) == (res.prompt_token_ids, res.token_ids)


WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}]
