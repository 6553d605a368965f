"""RemoteEngine against a small scripted HTTP server on 127.0.0.1 (retries, errors, idempotency, streaming).

The real vLLM server is exercised in tests/test_server.py."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agentspec_sdk.backends.remote.openai_backend import RemoteEngine
from agentspec_sdk.backends.remote.remote_inspect import PROBE_GRAMMAR, parse_prometheus
from agentspec_sdk.backends.types import TurnRequest
from agentspec_sdk.errors import BackendError, MalformedResponse

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}]
CALL = '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>'
METRICS_PAGE = """# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 5.0
"""
SPEC = {"mean_acceptance_length": 2.5, "draft_acceptance_rate": 0.75, "acceptance_histogram": [0, 0, 1, 1],
        "num_spec_steps": 2, "num_accepted_draft_tokens": 3, "num_draft_tokens": 4, "num_spec_tokens": 3,
        "per_step_accepted": [1, 2], "per_step_drafted": [2, 2]}


def completion(text: str, *, request_id: str = "x", spec: dict | None = SPEC) -> dict:
    return {"id": f"chatcmpl-{request_id}", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop", "token_ids": list(range(len(text)))}],
            "prompt_token_ids": [1, 2, 3],
            "usage": {"prompt_tokens": 3, "completion_tokens": len(text), "total_tokens": 3 + len(text)},
            "metrics": {"time_to_first_token_ms": 20.0, "queue_time_ms": 1.0, "generation_time_ms": 100.0,
                        "speculative_decoding": spec}}


class Script:
    """What the fake server answers to each chat request, in order (the last action repeats)."""

    def __init__(self, *actions):
        self.actions = list(actions)
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.metrics_page = METRICS_PAGE
        self.tokenizer_info: dict | None = None  # GET /tokenizer_info (None: 404, not published)
        self.lock = threading.Lock()

    def next(self, body: dict, headers: dict | None = None):
        with self.lock:
            self.bodies.append(body)
            self.headers.append(headers or {})
            return self.actions.pop(0) if len(self.actions) > 1 else self.actions[0]


def make_handler(script: Script):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, code: int, body: bytes, ctype: str = "application/json"):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                self._send(200, b"")
            elif self.path == "/v1/models":
                self._send(200, json.dumps({"object": "list",
                                            "data": [{"id": "m", "object": "model"}]}).encode())
            elif self.path == "/metrics":
                self._send(200, script.metrics_page.encode(), "text/plain")
            elif self.path == "/tokenizer_info" and script.tokenizer_info is not None:
                self._send(200, json.dumps(script.tokenizer_info).encode())
            else:
                self._send(404, b"{}")

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            action = script.next(body, {k.lower(): v for k, v in self.headers.items()})
            kind, arg = action if isinstance(action, tuple) else (action, None)
            rid = body.get("request_id", "x")
            if kind == "ok":
                self._send(200, json.dumps(completion(arg, request_id=rid)).encode())
            elif kind == "json":
                self._send(200, json.dumps(arg).encode())
            elif kind == "raw":
                self._send(200, arg.encode())
            elif kind == "status":
                self._send(arg, json.dumps({"error": {"message": f"status {arg}", "code": arg}}).encode())
            elif kind == "drop":  # the connection dies without an answer
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
            elif kind == "sleep":
                time.sleep(arg)
                self._send(200, json.dumps(completion("late", request_id=rid)).encode())
            elif kind in ("stream", "stream_cut"):
                self._stream(arg, rid, cut=kind == "stream_cut")

        def _stream(self, text: str, rid: str, cut: bool):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.close_connection = True
            pieces = [text[i:i + 4] for i in range(0, len(text), 4)]
            if cut:
                pieces = pieces[: len(pieces) // 2]

            def event(obj):
                self.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
                self.wfile.flush()

            base = {"id": f"chatcmpl-{rid}", "object": "chat.completion.chunk", "created": 0, "model": "m"}
            event({**base, "prompt_token_ids": [1, 2, 3],
                   "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            for i, piece in enumerate(pieces):
                event({**base, "choices": [{"index": 0, "delta": {"content": piece}, "token_ids": [i],
                                            "finish_reason": None}]})
            if cut:
                return  # the server dies mid-answer
            event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            event({**base, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": len(pieces),
                                                    "total_tokens": 3 + len(pieces)},
                   "metrics": {"speculative_decoding": SPEC}})
            self.wfile.write(b"data: [DONE]\n\n")

    return Handler


@pytest.fixture
def fake():
    servers = []

    def start(*actions):
        script = Script(*actions)
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(script))
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        script.url = f"http://127.0.0.1:{httpd.server_address[1]}"
        return script

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def engine(url: str, **kw) -> RemoteEngine:
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("max_backoff_s", 0.05)
    return RemoteEngine(url, tools=TOOLS, **kw)


def turn(rid: str = "agent-1/0/0", **kw) -> TurnRequest:
    return TurnRequest(messages=[{"role": "system", "content": "You are helpful."},
                                 {"role": "user", "content": "Weather in Paris?"}],
                       fmt="tool_calls", request_id=rid, agent_id="agent-1", **kw)


def test_a_turn_carries_its_grammar_and_reads_acceptance(fake):
    script = fake(("ok", CALL))
    with engine(script.url) as eng:
        res = eng.generate([turn()])[0]
    body = script.bodies[0]
    assert body["structured_outputs"]["grammar"].strip()
    assert "get_weather" in body["structured_outputs"]["grammar"]
    assert not [k for k in body if k.startswith("guided_")]
    assert body["request_id"] == "agent-1/0/0.1" and body["return_token_ids"] is True
    assert body["stop"] == ["<tool_response>"] and body["model"] == "m"
    assert body["messages"][0]["role"] == "system" and "get_weather" in body["messages"][0]["content"]
    assert res.error is None and res.text == CALL and res.token_ids == list(range(len(CALL)))
    assert res.prompt_token_ids == [1, 2, 3] and res.agent_id == "agent-1"
    assert res.acceptance == {"all": {"rounds": 2, "drafted": 4, "accepted": 3}}
    assert [(r["drafted"], r["accepted"]) for r in res.records] == [(2, 1), (2, 2)]
    assert res.timings["prefill_s"] == pytest.approx(0.02) and res.timings["decode_s"] == pytest.approx(0.1)
    assert {s.law_class.value for s in res.spans} >= {"S"}


def test_a_turn_carries_its_episode_key_for_a_router(fake):
    script = fake(("ok", CALL))
    with engine(script.url) as eng:
        eng.generate([turn("a"), TurnRequest(messages=[{"role": "user", "content": "Hi"}], fmt="tool_calls",
                                             request_id="b")])
    by_id = {b["request_id"]: (b, h) for b, h in zip(script.bodies, script.headers, strict=True)}
    body, headers = by_id["a.1"]
    assert body["user"] == "agent-1" and headers["x-session-id"] == "agent-1"
    body, headers = by_id["b.1"]  # no agent: no key, the router balances it freely
    assert "user" not in body and "x-session-id" not in headers
    assert headers["x-agentspec-format"] == "tool_calls"  # for a capturing server (docs/capture.md)


def test_an_explicit_grammar_or_none_is_sent_as_given(fake):
    script = fake(("ok", "hello"))
    with engine(script.url) as eng:
        eng.generate([turn("a", grammar='start: "hello"'), turn("b", grammar="")])
    by_id = {b["request_id"]: b for b in script.bodies}
    assert by_id["a.1"]["structured_outputs"] == {"grammar": 'start: "hello"'}
    assert "structured_outputs" not in by_id["b.1"]


@pytest.mark.parametrize("failure", [("status", 503), ("status", 500), "drop", ("sleep", 1.5)])
def test_transient_failures_are_retried_and_logged(fake, caplog, failure):
    script = fake(failure, failure, ("ok", CALL))
    caplog.set_level(logging.WARNING, logger="agentspec.remote")
    with engine(script.url, timeout=0.5) as eng:
        res = eng.submit(turn()).result()
        stats = eng.stats()
    assert res.text == CALL
    assert [b["request_id"] for b in script.bodies] == ["agent-1/0/0.1", "agent-1/0/0.2", "agent-1/0/0.3"]
    retries = [r for r in caplog.records if "agent-1/0/0" in r.getMessage() and "retrying" in r.getMessage()]
    assert len(retries) == 2
    assert stats["requests"] == 1 and stats["retries"] == 2 and stats["attempts"] == 3


def test_unreachable_server_fails_clearly_after_bounded_retries(caplog):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    caplog.set_level(logging.WARNING, logger="agentspec.remote")
    eng = RemoteEngine(f"http://127.0.0.1:{port}/v1", model="m", max_retries=3, backoff_s=0.01,
                       max_backoff_s=0.02)
    started = time.monotonic()
    with pytest.raises(BackendError, match=rf"127\.0\.0\.1:{port}.*after 4 attempt"):
        eng.submit(turn()).result()
    assert time.monotonic() - started < 10
    assert len([r for r in caplog.records if "retrying" in r.getMessage()]) == 3
    eng.close()


def test_retry_deadline_bounds_the_wait():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    eng = RemoteEngine(f"http://127.0.0.1:{port}", model="m", max_retries=1000, backoff_s=0.05,
                       max_backoff_s=0.05, retry_deadline_s=0.5)
    started = time.monotonic()
    with pytest.raises(BackendError, match="failed turn"):
        eng.submit(turn()).result()
    assert time.monotonic() - started < 3
    eng.close()


@pytest.mark.parametrize("body, field", [
    ({"id": "x", "object": "chat.completion"}, "choices.0"),
    ({**completion(CALL), "choices": [{"index": 0, "message": {"content": CALL}, "finish_reason": "stop"}]},
     "choices.0.token_ids"),
    ({**completion(CALL), "choices": [{"index": 0, "message": {"content": 7}, "token_ids": [1]}]},
     "choices.0.message.content"),
    ({**completion(CALL), "prompt_token_ids": ["a"]}, "prompt_token_ids"),
    (completion(CALL, spec={"num_draft_tokens": 3}),
     "metrics.speculative_decoding.num_accepted_draft_tokens"),
    ({**completion(CALL), "metrics": {"speculative_decoding": "yes"}}, "metrics.speculative_decoding"),
])
def test_malformed_response_names_the_field(fake, body, field):
    script = fake(("json", body))
    with engine(script.url) as eng, pytest.raises(MalformedResponse, match=rf"'{field}'"):
        eng.submit(turn()).result()
    assert len(script.bodies) == 1  # a malformed answer is not retried


def test_a_body_that_is_not_json_is_a_clear_error(fake):
    script = fake(("raw", "<html>proxy error</html>"))
    with engine(script.url) as eng, pytest.raises(MalformedResponse, match="not JSON"):
        eng.submit(turn()).result()


def test_a_rejected_request_fails_alone_without_retries(fake):
    script = fake(("status", 400), ("ok", CALL))
    with engine(script.url) as eng:
        bad = eng.submit(turn("bad")).result()
        good = eng.submit(turn("good")).result()
    assert bad.error and "rejected" in bad.error and bad.text == ""
    assert good.error is None
    assert [b["request_id"] for b in script.bodies] == ["bad.1", "good.1"], script.bodies


def test_a_turn_is_committed_once(fake):
    script = fake(("ok", CALL))
    with engine(script.url) as eng:
        first = eng.submit(turn("agent-1/3/0"))
        again = eng.submit(turn("agent-1/3/0"))  # e.g. the caller retries on its own
        assert again is first
        assert first.result() is again.result()
        assert eng.submit(turn("agent-1/3/0")).result() is first.result()
        assert eng.stats()["requests"] == 1
    assert len(script.bodies) == 1


def test_a_failed_turn_can_be_submitted_again(fake):
    script = fake(("status", 503), ("status", 503), ("ok", CALL))
    with engine(script.url, max_retries=1) as eng:
        with pytest.raises(BackendError):
            eng.submit(turn("t")).result()
        assert eng.submit(turn("t")).result().text == CALL


def test_stream_delivers_text_with_segment_labels(fake):
    script = fake(("stream", "I will call it. " + CALL))
    with engine(script.url) as eng:
        events = list(eng.stream(turn()))
    result = events[-1].result
    assert "".join(e.text_delta for e in events[:-1]) == result.text == "I will call it. " + CALL
    assert (script.bodies[0]["stream"] is True
            and script.bodies[0]["stream_options"] == {"include_usage": True})
    assert {e.law_class for e in events[:-1]} == {s.law_class.value for s in result.spans} == {"R", "S"}
    assert result.acceptance["all"]["accepted"] == 3 and result.prompt_token_ids == [1, 2, 3]


def test_a_cut_stream_is_resumed_without_duplicated_text(fake, caplog):
    text = "Let me check. " + CALL
    script = fake(("stream_cut", text), ("stream", text))
    caplog.set_level(logging.WARNING, logger="agentspec.remote")
    with engine(script.url) as eng:
        events = list(eng.stream(turn()))
    assert "".join(e.text_delta for e in events[:-1]) == text == events[-1].result.text
    assert len(script.bodies) == 2 and any("retrying" in r.getMessage() for r in caplog.records)


def test_a_resumed_stream_that_diverges_is_an_error(fake):
    script = fake(("stream_cut", "Let me check the weather please."), ("stream", "Something else entirely."))
    with engine(script.url) as eng, pytest.raises(BackendError, match="diverged"):
        list(eng.stream(turn()))


def test_agenerate_and_idle_accounting(fake):
    import asyncio

    script = fake(("ok", CALL))
    with engine(script.url) as eng:
        res = asyncio.run(eng.agenerate(turn()))
        eng.mark_idle("agent-1")
        time.sleep(0.02)
        eng.mark_active("agent-1")
        stats = eng.stats()
    assert res.text == CALL
    assert stats["idle_s"]["agent-1"] > 0
    assert stats["vllm"] == {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}


def test_prometheus_counters_are_summed_over_engines():
    assert parse_prometheus(METRICS_PAGE) == {"num_drafts": 10.0, "num_draft_tokens": 40.0,
                                              "num_accepted_tokens": 35.0}
    assert parse_prometheus("vllm:num_requests_running 1\n") == {}


def test_check_passes_on_a_healthy_server(fake):
    script = fake(("ok", "agentspec probe beta."))
    with engine(script.url) as eng:
        report = eng.check()
    assert report["grammar"] == "honoured" and report["model"] == "m"
    assert script.bodies[0]["structured_outputs"]["grammar"] == PROBE_GRAMMAR


def test_check_fails_when_the_server_ignores_grammars(fake):
    script = fake(("ok", "Hello! How can I help?"))
    with engine(script.url) as eng, pytest.raises(BackendError, match="ignores grammars"):
        eng.check()


def test_check_fails_without_speculation(fake):
    script = fake(("ok", "agentspec probe beta."))
    script.metrics_page = "vllm:num_requests_running 0\n"
    with engine(script.url) as eng, pytest.raises(BackendError, match="without speculative decoding"):
        eng.check()


def test_check_fails_without_per_request_acceptance(fake):
    script = fake(("json", completion("agentspec probe alpha.", spec=None)))
    with engine(script.url) as eng, pytest.raises(BackendError, match="per-request-spec-decode-metrics"):
        eng.check()


def test_check_fails_when_the_proposer_is_not_in_the_server(fake, tmp_path):
    script = fake(("ok", "agentspec probe gamma."))
    records = tmp_path / "records.jsonl"
    records.write_text("")
    with (engine(script.url, records_path=records) as eng,
          pytest.raises(BackendError, match="proposer is not")):
        eng.check()


def test_bad_url_is_rejected():
    with pytest.raises(BackendError, match="http://host:port"):
        RemoteEngine("localhost:8000")


def test_a_committed_stream_is_not_generated_again(fake):
    text = "Checking. " + CALL
    script = fake(("stream", text))
    with engine(script.url) as eng:
        first = list(eng.stream(turn("s/0")))
        again = list(eng.stream(turn("s/0")))
        assert eng.submit(turn("s/0")).result() is first[-1].result
    assert "".join(e.text_delta for e in again[:-1]) == text and again[-1].result is first[-1].result
    assert len(script.bodies) == 1


def test_the_idempotency_window_is_bounded(fake):
    script = fake(("ok", CALL))
    with engine(script.url, ledger_size=2) as eng:
        for rid in ("a", "b", "c"):
            eng.submit(turn(rid)).result()
        eng.submit(turn("c")).result()  # still in the window
        eng.submit(turn("a")).result()  # fell out: generated again
    assert [b["request_id"] for b in script.bodies] == ["a.1", "b.1", "c.1", "a.1"]


def test_a_bad_turn_fails_alone_before_anything_is_sent(fake):
    script = fake(("ok", CALL))
    with engine(script.url) as eng:
        res = eng.submit(TurnRequest(
            messages=[{"role": "user", "content": "hi"}], fmt="no_such_format", request_id="x")).result()
        events = list(eng.stream(TurnRequest(messages=[{"role": "user", "content": "hi"}],
                                             fmt="no_such_format", request_id="y")))
    assert res.error and "no_such_format" in res.error
    assert len(events) == 1 and "no_such_format" in events[0].result.error
    assert script.bodies == []


# -- the chat template decision (remote_template): the same as the embedded engine's ----------------

HERMES = (Path(__file__).parent / "data" / "chat_templates" / "hermes_vllm.jinja").read_text()
HISTORY = [{"role": "system", "content": "You are helpful."},
           {"role": "user", "content": "Weather in Paris?"},
           {"role": "assistant", "content": CALL}, {"role": "tool", "content": "sunny"}]


def smol_info() -> dict:
    from agentspec_sdk.backends.model_bundle import load_tokenizer, resolve_model

    tok = load_tokenizer(resolve_model(None))
    return {"chat_template": tok.chat_template, "bos_token": tok.bos_token, "eos_token": tok.eos_token,
            "added_tokens_decoder": {str(i): t.content for i, t in tok.added_tokens_decoder.items()}}


def test_a_template_without_tools_keeps_todays_messages_and_auto_resolves(fake):
    from agentspec_sdk.backends.prompts import chat_messages
    from agentspec_sdk.backends.types import as_registry
    from agentspec_sdk.structure.formats import get_format

    script = fake(("ok", CALL))
    script.tokenizer_info = smol_info()
    with engine(script.url) as eng:
        eng.generate([TurnRequest(messages=HISTORY, fmt=f, request_id=f) for f in ("tool_calls", "auto")])
    registry = as_registry(TOOLS)
    for body in script.bodies:  # byte-identical to the messages sent before the decision existed
        assert body["messages"] == chat_messages(HISTORY, get_format("tool_calls"), registry)
        assert "tools" not in body and "tool_choice" not in body
    assert script.bodies[0]["structured_outputs"] == script.bodies[1]["structured_outputs"]


def test_a_template_that_renders_tools_gets_openai_messages_and_tools(fake):
    from agentspec_sdk.backends.chat_template import render
    from agentspec_sdk.backends.prompts import template_prompt
    from agentspec_sdk.backends.types import as_registry
    from agentspec_sdk.structure.formats import get_format

    script = fake(("ok", "hi"))
    script.tokenizer_info = {"chat_template": HERMES, "eos_token": "<|im_end|>"}
    hermes_call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    history = [*HISTORY[:2], {"role": "assistant", "content": hermes_call}, HISTORY[3]]
    with engine(script.url) as eng:
        res = eng.generate([TurnRequest(messages=history, fmt=f, request_id=f) for f in ("auto", "hermes")])
        plain = eng.generate([TurnRequest(messages=HISTORY, fmt="tool_calls", request_id="plain")])[0]
    assert all(r.error is None for r in [*res, plain])
    auto, named, other = script.bodies
    assert auto["tools"] == TOOLS and auto["tool_choice"] == "none"
    assert auto["messages"] == named["messages"] and auto["structured_outputs"] == named["structured_outputs"]
    assert auto["stop"] == (list(get_format("hermes").stop) or None)
    call = auto["messages"][2]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}  # OpenAI form: JSON text
    assert auto["messages"][3] == {"role": "tool", "content": "sunny", "tool_call_id": call["id"],
                                   "name": "get_weather"}
    assert "tools" not in other  # another format than the template's: our instructions
    assert eng.resolve_format("auto").name == "hermes" and eng.resolve_format("react").name == "react"

    class Tok:  # what vLLM does with the request: arguments back to objects, then the template
        def apply_chat_template(self, messages, tools=None, **_kw):
            return render(HERMES, messages, tools, {"eos_token": "<|im_end|>"})

    sent = [dict(m) for m in auto["messages"]]
    for m in sent:
        for c in m.get("tool_calls", []):
            c["function"] = {**c["function"], "arguments": json.loads(c["function"]["arguments"])}
    served = render(HERMES, sent, auto["tools"], {"eos_token": "<|im_end|>"})
    assert served == template_prompt(Tok(), history, get_format("hermes"), as_registry(TOOLS))


def test_a_wrapped_template_or_an_unpublished_one_is_a_clear_error(fake):
    from agentspec_sdk.backends.inside_vllm.tool_prompt import chat_template

    script = fake(("ok", CALL))
    with engine(script.url) as eng:  # /tokenizer_info 404: named formats as before, auto refused
        ok, auto = eng.generate([turn("a"), TurnRequest(messages=HISTORY, fmt="auto", request_id="b")])
    assert ok.error is None and "tokenizer_info" in auto.error and "name the format" in auto.error
    script = fake(("ok", CALL))
    script.tokenizer_info = {"chat_template": chat_template("tool_calls", HERMES)}  # served for tool_calls
    with engine(script.url) as eng:
        plain, native = eng.generate([TurnRequest(messages=HISTORY, fmt="tool_calls", request_id="p"),
                                      TurnRequest(messages=HISTORY, fmt="auto", request_id="n")])
    assert plain.error is None and "tools" not in script.bodies[0]
    assert "--tool-format hermes" in native.error and len(script.bodies) == 1
