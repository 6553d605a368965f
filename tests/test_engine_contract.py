"""The engine contract (`backends.contract.AgentEngine`): the same calls on `Engine` and `RemoteEngine`.

The first tests need neither vLLM nor a server (signatures, tool merging, stream splitting, settings,
prompt text). The rest run once on the embedded engine (`engine`) and once on `RemoteEngine` against a
real `agentspec serve`-style vLLM server on 127.0.0.1 (`server`), one after the other. Run them under
the engine lock:

    flock /tmp/agentspec-engine.lock python -m pytest tests/test_engine_contract.py -q -m "engine or server"
"""

from __future__ import annotations

import asyncio
import inspect
import json

import pytest
from test_server import _free_port, _question

from agentspec_sdk.backends.contract import STATS_KEYS, AgentEngine
from agentspec_sdk.backends.embedded.vllm_engine import Engine
from agentspec_sdk.backends.engine_config import EngineConfig
from agentspec_sdk.backends.prompts import chat_messages
from agentspec_sdk.backends.remote.openai_backend import RemoteEngine
from agentspec_sdk.backends.stream_split import StreamSplitter
from agentspec_sdk.backends.types import TurnRequest, merge_tools
from agentspec_sdk.errors import BackendError, FormatError, ToolRegistryError
from agentspec_sdk.structure.formats import TOOL_CALLS, AgentFormat, get_format
from agentspec_sdk.structure.segmenter import segment
from agentspec_sdk.structure.tools import ToolRegistry
from agentspec_sdk.structure.turns import parse_turn

# The embedded backend is the session engine (tests/conftest.py), which other test files use too and
# which holds one schema per tool name: this is tests/test_engine.py's get_weather, to the letter.
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
# get_weather with another schema: the same name must not change meaning under a running engine
CONFLICT = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a town",
    "parameters": {"type": "object", "properties": {"town": {"type": "string"}}, "required": ["town"]}}}]
CONFLICT_ERROR = "tool 'get_weather' is already registered with another schema"


# -- no engine -------------------------------------------------------------------------------------


def _contract_methods() -> list[str]:
    return [name for name, value in vars(AgentEngine).items()
            if callable(value) and (not name.startswith("_") or name in ("__enter__", "__exit__"))]


@pytest.mark.parametrize("cls", [Engine, RemoteEngine])
def test_both_backends_have_every_contract_method_with_its_parameters(cls):
    names = _contract_methods()
    assert {"register_tools", "grammar_for", "submit", "generate", "agenerate", "stream", "mark_idle",
            "mark_active", "stats", "close"} <= set(names)
    for name in names:
        want = list(inspect.signature(getattr(AgentEngine, name)).parameters)
        have = list(inspect.signature(getattr(cls, name)).parameters)
        if want[-1:] == ["exc"]:  # *exc
            assert have[-1:] == ["exc"], (cls.__name__, name, have)
            continue
        assert have == want, (cls.__name__, name, have, want)
        assert inspect.iscoroutinefunction(getattr(cls, name)) == inspect.iscoroutinefunction(
            getattr(AgentEngine, name)), (cls.__name__, name)


def test_merge_tools_adds_new_names_keeps_same_ones_and_refuses_another_schema():
    registry = ToolRegistry()
    assert merge_tools(registry, TOOLS) is True
    assert merge_tools(registry, TOOLS) is False  # the same schema again: nothing to do
    extra = [{"type": "function", "function": {"name": "get_time", "description": "Time",
                                                "parameters": {"type": "object", "properties": {}}}}]
    with pytest.raises(ToolRegistryError, match=CONFLICT_ERROR):
        merge_tools(registry, extra + CONFLICT)
    assert [t.name for t in registry] == ["get_weather"]  # a refused batch adds nothing
    assert registry.get("get_weather").parameters == TOOLS[0]["function"]["parameters"]


def test_remote_engine_refuses_a_conflicting_schema_like_the_embedded_one():
    with RemoteEngine(f"http://127.0.0.1:{_free_port()}", tools=TOOLS, max_retries=0) as eng:
        with pytest.raises(ToolRegistryError, match=CONFLICT_ERROR):
            eng.register_tools(CONFLICT)
        assert "city" in eng.grammar_for("tool_calls") and "town" not in eng.grammar_for("tool_calls")


def test_stream_splitter_holds_a_possible_marker_until_it_is_decided():
    split = StreamSplitter(TOOL_CALLS)
    first = split.feed("Let me look <tool")
    assert [(e.text_delta, e.kind, e.law_class) for e in first] == [("Let me look ", "reasoning", "R")]
    call = '_call>{"name":"get_weather","arguments":{"city":"Oslo"}}</tool_call>'
    second = split.feed(call)
    assert [(e.text_delta, e.kind, e.law_class) for e in second] == [("<tool" + call, "tool_call", "S")]
    third = split.feed(" <")  # "<" may begin a marker: held back
    assert [(e.text_delta, e.kind) for e in third] == [(" ", "reasoning")] and split.segmenter.pending == "<"
    last = split.feed("", final=True)  # the turn is over: the held text goes out too
    assert [(e.text_delta, e.kind, e.law_class) for e in last] == [("<", "reasoning", "R")]
    assert "".join(e.text_delta for e in first + second + third + last) == split.text
    assert split.feed("", final=True) == []


def test_engine_config_from_keywords_or_a_config_and_bad_settings_before_anything_starts(monkeypatch):
    from agentspec_sdk.backends.embedded import vllm_engine

    def no_model(*a, **k):
        raise AssertionError("the engine went on to load a model")

    monkeypatch.setattr(vllm_engine, "resolve_model", no_model)
    base = EngineConfig(speculation="ngram", gamma_max=4)
    assert EngineConfig.of(base, seed=3) == EngineConfig(speculation="ngram", gamma_max=4, seed=3)
    assert EngineConfig.of(base) is base
    with pytest.raises(BackendError, match=r"unknown engine setting\(s\) \['gama_max'\]"):
        Engine(model="m", gama_max=4)
    with pytest.raises(BackendError, match="gamma_max must be an integer"):
        Engine(config=base, gamma_max=0)
    with pytest.raises(BackendError, match="speculation must be one of"):
        Engine(config=EngineConfig(), speculation="eagle")
    with pytest.raises(BackendError, match="config must be an EngineConfig"):
        Engine(config={"speculation": "off"})


def test_prompt_text_lives_with_the_format():
    mine = AgentFormat.from_dict({**TOOL_CALLS.to_dict(), "name": "contract_calls",
                                  "instructions": "Call tools like this.",
                                  "env_wrap": "[result] {} [/result]"})
    msgs = chat_messages([{"role": "user", "content": "hi"}, {"role": "tool", "content": "sunny {x}"}], mine,
                         ToolRegistry(TOOLS))
    assert msgs[0]["content"].startswith("Call tools like this.\n\nTools (JSON):\n")
    assert msgs[2] == {"role": "user", "content": "[result] sunny {x} [/result]"}
    assert AgentFormat.from_dict(json.loads(json.dumps(mine.to_dict()))) == mine
    with pytest.raises(FormatError, match="env_wrap must hold"):
        AgentFormat.from_dict({**TOOL_CALLS.to_dict(), "name": "contract_bad", "env_wrap": "no slot"})


# -- both backends, for real -------------------------------------------------------------------------


def _start_server(work):
    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.backends.serving.serve_cli import write_plan
    from agentspec_sdk.backends.serving.server import ServerProcess, ServerSpec

    (work / "tools.json").write_text(json.dumps(TOOLS))
    model = resolve_model()
    plan = write_plan(model, work / "plan.json", tools_file=work / "tools.json", formats="tool_calls",
                      gamma_max=4, records_path=work / "records.jsonl")
    spec = ServerSpec(model=model, port=_free_port(), gamma_max=4, plan_path=plan, max_model_len=2048,
                      extra_args=["--enforce-eager"], metrics_dir=work / "prom")
    proc = ServerProcess(spec, log_path=work / "server.log").start()
    try:
        proc.wait_ready(timeout=600)
    except BaseException:
        proc.stop()
        raise
    return proc


@pytest.fixture(scope="module", params=[pytest.param("engine", marks=pytest.mark.engine),
                                        pytest.param("remote", marks=pytest.mark.server)])
def backend(request, tmp_path_factory):
    """The session's embedded engine (a second in-process engine would tear down vLLM's process-wide
    state when closed, taking the session engine with it), then a client of a real vLLM server."""
    if request.param == "engine":
        yield request.param, request.getfixturevalue("engine_structure")
        return
    work = tmp_path_factory.mktemp("contract")
    proc = _start_server(work)
    try:
        eng = RemoteEngine(proc.base_url, records_path=work / "records.jsonl", plan_path=work / "plan.json")
        yield request.param, eng
        eng.close()
    finally:
        proc.stop()


def _turn(city: str, **kw) -> TurnRequest:
    kw.setdefault("max_tokens", 64)
    return TurnRequest(messages=_question(city), fmt="tool_calls", request_id=f"contract/{city}",
                       agent_id=city, **kw)


def test_is_an_agent_engine(backend):
    _, eng = backend
    assert isinstance(eng, AgentEngine)


def test_register_tools_refuses_another_schema_for_a_known_name(backend):
    _, eng = backend
    eng.register_tools(TOOLS)
    eng.register_tools(ToolRegistry(TOOLS))  # the same tool again is fine
    with pytest.raises(ToolRegistryError, match=CONFLICT_ERROR):
        eng.register_tools(CONFLICT)
    grammar = eng.grammar_for("tool_calls")
    assert "get_weather" in grammar and "city" in grammar and "town" not in grammar


def test_a_tool_call_turn_gets_the_same_prompt_grammar_and_accounting(backend):
    from agentspec_sdk.backends.model_bundle import load_tokenizer

    _, eng = backend
    (res,) = eng.generate([_turn("Paris", tools=TOOLS, tool_choice="call")])
    assert res.error is None, res.error
    tokenizer = load_tokenizer()
    text = tokenizer.apply_chat_template(chat_messages(_question("Paris"), TOOL_CALLS, ToolRegistry(TOOLS)),
                                         tokenize=False, add_generation_prompt=True)
    assert res.prompt_token_ids == tokenizer(text, add_special_tokens=False)["input_ids"]  # one prompt, both
    calls = parse_turn(TOOL_CALLS, res.text).tool_calls
    assert res.text.startswith("<tool_call>") and calls and calls[0].name == "get_weather", res.text
    assert "tool_call" in {s.kind for s in res.spans} and res.token_ids and res.agent_id == "Paris"
    assert res.spec is not None and res.spec["num_draft_tokens"] > 0, res.spec
    assert set(res.acceptance) <= {"S", "R", "F"} and res.acceptance.get("S", {}).get("drafted", 0) > 0
    # settled against vLLM's own count on both backends
    assert sum(v["accepted"] for v in res.acceptance.values()) == res.spec["num_accepted_draft_tokens"]


def test_stream_events_follow_the_segments_and_end_with_the_result(backend):
    _, eng = backend
    events = list(eng.stream(_turn("Oslo", tools=TOOLS)))
    result = events[-1].result
    assert result is not None and result.error is None, result and result.error
    assert all(e.result is None for e in events[:-1]) and events[-1].text_delta == ""
    assert "".join(e.text_delta for e in events[:-1]) == result.text
    spans, at = segment(get_format("tool_calls"), result.text), 0
    for ev in events[:-1]:  # every event lies inside one segment and carries its kind and class
        span = next(s for s in spans if s.start <= at < s.end)
        assert at + len(ev.text_delta) <= span.end, (ev, span)
        assert (ev.kind, ev.law_class) == (span.kind, span.law_class.value)
        at += len(ev.text_delta)


def test_a_bad_turn_fails_alone(backend):
    _, eng = backend
    bad = TurnRequest(messages=[{"role": "user", "content": "hi"}], fmt="no_such_format",
                      request_id="contract/bad")
    res = eng.submit(bad).result()
    assert res.error and "no_such_format" in res.error
    events = list(eng.stream(TurnRequest(messages=bad.messages, fmt="no_such_format",
                                         request_id="contract/bad2")))
    assert len(events) == 1 and "no_such_format" in events[0].result.error


def test_agenerate_idle_marks_and_stats(backend):
    _, eng = backend
    # its own tools: the session engine knows other tests' tools too, and all of them make a long prompt
    res = asyncio.run(eng.agenerate(_turn("Lima", tools=TOOLS, max_tokens=8)))
    assert res.error is None, res.error
    eng.mark_idle("Lima")
    assert "Lima" in eng.stats()["idle_agents"]
    eng.mark_active("Lima")
    stats = eng.stats()
    assert set(STATS_KEYS) <= set(stats), sorted(stats)
    assert "Lima" not in stats["idle_agents"]
    assert stats["requests"] >= 3 and stats["errors"] >= 2 and stats["output_tokens"] > 0
    assert set(stats["acceptance"]) <= {"S", "R", "F"} and stats["acceptance"]["S"]["accepted"] > 0


# remote only: the session engine is shared, its context manager and close are checked at its teardown
# (tests/conftest.py engine_structure); last in the file, as it closes the module's remote engine
@pytest.mark.parametrize("backend", [pytest.param("remote", marks=pytest.mark.server)], indirect=True)
def test_close_and_context_manager(backend):
    _, eng = backend
    with eng as same:
        assert same is eng
    with pytest.raises(BackendError, match="closed"):
        eng.submit(_turn("Rome"))
    eng.close()  # a second close does nothing
