"""Observation matching and the concurrent replay loop (fake engine; the real one is in test_demo)."""

import threading
import time
import types
from concurrent.futures import Future

import pytest

from agentspec_sdk import bfcl
from agentspec_sdk.errors import TurnParseError
from agentspec_sdk.replay import loop
from agentspec_sdk.replay.record import bfcl_episode_stub
from agentspec_sdk.replay.replayer import ObservationBook, replay
from agentspec_sdk.replay.trace import Episode, Turn
from agentspec_sdk.structure.formats import TOOL_CALLS
from agentspec_sdk.structure.token_labels import TokenClassifier
from agentspec_sdk.structure.tools import ToolRegistry
from agentspec_sdk.structure.turn_grammar import turn_grammar
from agentspec_sdk.structure.turns import parse_calls


def traced_episode() -> Episode:
    entry = bfcl.multi_turn_entries()[0]
    stub = bfcl_episode_stub(entry, "base", 2)
    u1, u2 = [t for t in stub.turns if t.role == "user"]
    stub.turns = [
        u1,
        Turn("assistant", "a", tool_calls=[{"name": "cd", "arguments": {"folder": "document"}}]),
        Turn("tool", "REC cd document", name="cd", arguments={"folder": "document"}, latency_s=0.05),
        Turn("tool", "REC mkdir temp", name="mkdir", arguments={"dir_name": "temp"}, latency_s=0.0),
        u2,
        Turn("assistant", "b", tool_calls=[{"name": "grep", "arguments": {}}]),
        Turn("tool", "REC grep budget", name="grep", arguments={"file_name": "final_report.pdf",
                                                                "pattern": "budget analysis"}, latency_s=0.0),
        Turn("tool", "REC cd temp", name="cd", arguments={"folder": "temp"}, latency_s=0.0),
    ]
    return stub


def test_exact_match_prefers_unused_and_nearest_segment():
    ep = traced_episode()
    book = ObservationBook(ep)
    obs = book.lookup("cd", {"folder": "temp"}, 0)
    assert (obs.result, obs.match) == ("REC cd temp", "exact")
    obs = book.lookup("mkdir", {"dir_name": "temp"}, 1)
    assert (obs.result, obs.match, obs.latency_s) == ("REC mkdir temp", "exact", 0.0)


def test_same_name_takes_nearest_call():
    book = ObservationBook(traced_episode())
    obs = book.lookup("cd", {"folder": "archive"}, 0)
    assert (obs.result, obs.match, obs.latency_s) == ("REC cd document", "name", 0.05)
    obs = book.lookup("cd", {"folder": "archive"}, 1)
    assert obs.result == "REC cd temp"
    # more equal argument values beats segment distance
    obs = book.lookup("grep", {"file_name": "final_report.pdf", "pattern": "x"}, 0)
    assert obs.result == "REC grep budget" and obs.match == "name"


def test_unknown_tool_executes_real_bfcl_tool_with_agent_state():
    ep = traced_episode()
    book = ObservationBook(ep, lambda: bfcl.BfclEnvironment(ep.source["initial_config"],
                                                            ep.source["involved_classes"]))
    book.lookup("cd", {"folder": "workspace"}, 0)  # matched from the trace, applied to the shadow env too
    obs = book.lookup("ls", {}, 0)
    assert obs.match == "executed" and "document" in obs.result and "archive" in obs.result
    obs = book.lookup("teleport", {}, 0)
    assert obs.match == "missing" and obs.result == "Error: tool call not in trace: teleport"


def test_without_environment_unknown_is_missing():
    book = ObservationBook(traced_episode(), None)
    assert book.lookup("ls", {}, 0).match == "missing"


class ScriptedEngine:
    """Writes one tool call per first step, then a plain answer; tracks idle/active agents."""

    def __init__(self):
        self.lock = threading.Lock()
        self.idle, self.in_flight, self.max_in_flight, self.requests = set(), 0, 0, []

    def submit(self, req):
        with self.lock:
            self.requests.append(req)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            assert req["agent_id"] not in self.idle
        time.sleep(0.02)
        with self.lock:
            self.in_flight -= 1
        first = req["messages"][-1]["role"] == "user"
        text = '<tool_call>{"name":"cd","arguments":{"folder":"document"}}</tool_call>' if first else "Done."
        fut = Future()
        fut.set_result(types.SimpleNamespace(
            text=text, token_ids=[1] * 5, prompt_token_ids=[1] * 7, finish_reason="stop", error=None,
            spans=[{"start": 0, "end": len(text), "law_class": "S" if first else "F"}], records=[],
            acceptance={}, timings={"decode_s": 0.02, "prefill_s": 0.0, "e2e_s": 0.02}))
        return fut

    def mark_idle(self, agent):
        with self.lock:
            self.idle.add(agent)

    def mark_active(self, agent):
        with self.lock:
            self.idle.discard(agent)


class Tok:
    def decode(self, ids):
        return "ab"


def test_replay_runs_agents_concurrently_with_trace_observations(monkeypatch):
    monkeypatch.setattr(loop, "make_request", lambda **kw: kw)
    monkeypatch.setattr(loop, "turn_calls", lambda fmt, text: (
        [{"name": "cd", "arguments": {"folder": "document"}}] if "<tool_call>" in text else []))
    episodes = []
    for i in range(6):
        ep = traced_episode()
        ep.id = f"ep{i}"
        episodes.append(ep)
    engine = ScriptedEngine()
    run = replay(engine, episodes, tokenizer=Tok(), concurrency=3, max_tokens=32)
    assert engine.max_in_flight >= 2 and not engine.idle
    # per segment at most as many assistant turns as recorded (1 each): a call, then the next user turn
    assert len(run.logs) == 12 and run.matches == {"exact": 12}
    tool_msgs = [m for r in engine.requests for m in r["messages"] if m["role"] == "tool"]
    assert any("REC cd document" in m["content"] for m in tool_msgs)
    assert run.wall_s >= 0.05  # the recorded 0.05 s tool latency was slept
    log = run.logs[0]
    assert sum(log.tokens_by_class.values()) == log.output_tokens == 5


def test_token_classifier_assigns_spans():
    tc = TokenClassifier(Tok())
    spans = [{"start": 0, "end": 4, "law_class": "R"}, {"start": 4, "end": 10, "law_class": "S"}]
    assert tc.counts("x" * 10, [1, 2, 3, 4, 5], spans) == {"S": 3, "R": 2, "F": 0}
    assert tc.counts("", [], spans) == {"S": 0, "R": 0, "F": 0}


def test_turn_calls_reads_real_tool_call_turns_and_executes_none_of_a_malformed_one():
    calls = loop.turn_calls(TOOL_CALLS,
                            'ok <tool_call>{"name": "cd", "arguments": {"folder": "a"}}</tool_call>')
    assert calls == [{"name": "cd", "arguments": {"folder": "a"}}]
    cut = '<tool_call>{"name": "cd", "arguments": {"folder": "a"}}</tool_call><tool_call>{"name": "ls", "argu'
    with pytest.raises(TurnParseError, match="tool call #2 at offset 67: malformed JSON"):
        parse_calls(TOOL_CALLS, cut)  # structure's one behaviour: the parse error names the call
    assert loop.turn_calls(TOOL_CALLS, cut) == []  # the loop's policy: a cut-off turn runs no call


def test_policy_calls_first_then_auto():
    assert [loop.tool_choice_policy(s, 3) for s in range(3)] == ["call", "call", "auto"]
    assert loop.tool_choice_policy(0, 1) == "auto"


def test_call_first_grammar_accepts_exactly_one_call():
    import llguidance
    import llguidance.hf

    from agentspec_sdk.backends.model_bundle import load_tokenizer

    tools = bfcl.entry_tools(bfcl.multi_turn_entries()[1])
    grammar = loop.GrammarCache().get(Episode("e", {}, "sys", tools, "tool_calls", []), "call")
    assert grammar == turn_grammar(TOOL_CALLS, ToolRegistry(tools), tool_choice="call", single_call=True)
    assert llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(grammar)) == ""
    hf = load_tokenizer()
    tok = llguidance.hf.from_tokenizer(hf)

    def accepts(text: str) -> bool:
        m = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_lark(grammar))
        ok = m.consume_tokens(hf.encode(text, add_special_tokens=False))
        return bool(ok) and m.is_accepting()

    assert accepts('<tool_call>{"name":"cd","arguments":{"folder":"document"}}</tool_call>')
    assert not accepts('Let me think. <tool_call>{"name":"cd","arguments":{"folder":"document"}}</tool_call>')
    assert not accepts('<tool_call>{"name":"nope","arguments":{}}</tool_call>')


def test_prose_format_is_one_free_prose_segment():
    from agentspec_sdk.replay.arms import PROSE
    from agentspec_sdk.structure.segmenter import segment
    from agentspec_sdk.structure.turns import parse_turn

    spans = segment(PROSE, "Assertions are debugging checks; `assert x` raises AssertionError.")
    assert [(s.kind, s.law_class.value) for s in spans] == [("prose", "F")]
    assert parse_turn(PROSE, "Plain answer.").tool_calls == []
