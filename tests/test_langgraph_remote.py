"""ChatAgentSpec on RemoteEngine (the OpenAI-client backend) against a scripted OpenAI-style server.

The server is a stand-in for vLLM's HTTP API: it answers chat completions (plain and streamed) with
scripted texts and keeps the request bodies, so the test sees the grammar the agent's turn carried.
"""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from agentspec_langgraph import AgentSpecMiddleware, ChatAgentSpec
from langchain.agents import create_agent
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool

from agentspec_sdk import RemoteEngine

CALL = '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>'
SPEC = {"num_spec_steps": 2, "num_accepted_draft_tokens": 3, "num_draft_tokens": 4, "num_spec_tokens": 3,
        "per_step_accepted": [1, 2], "per_step_drafted": [2, 2]}


@tool
def get_weather(city: str) -> str:
    """Weather for a city."""
    return f"Sunny in {city}"


class Server:
    def __init__(self, texts: list[str]):
        self.texts = texts
        self.bodies: list[dict] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, body: bytes, ctype: str = "application/json"):
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._send(b"" if self.path == "/metrics" else b"{}", "text/plain")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.bodies.append(body)
                text = server.texts.pop(0)
                if body.get("stream"):
                    return self._stream(text)
                self._send(json.dumps({
                    "id": "c", "object": "chat.completion", "created": 0, "model": "m",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": "stop", "token_ids": list(range(len(text)))}],
                    "prompt_token_ids": [1, 2, 3],
                    "usage": {"prompt_tokens": 3, "completion_tokens": len(text),
                              "total_tokens": 3 + len(text)},
                    "metrics": {"speculative_decoding": SPEC},
                }).encode())  # fmt: skip

            def _stream(self, text: str):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                self.close_connection = True
                base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
                events = [{**base, "prompt_token_ids": [1, 2, 3],
                           "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
                for i in range(0, len(text), 4):
                    events.append({**base, "choices": [{"index": 0, "delta": {"content": text[i:i + 4]},
                                                        "token_ids": [i], "finish_reason": None}]})
                events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                events.append({**base, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9,
                                                                "total_tokens": 12},
                               "metrics": {"speculative_decoding": SPEC}})  # fmt: skip
                for e in events:
                    self.wfile.write(f"data: {json.dumps(e)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

        return Handler

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers: list[Server] = []

    def start(*texts: str) -> Server:
        servers.append(Server(list(texts)))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def remote(url: str) -> RemoteEngine:
    return RemoteEngine(url, model="m", backoff_s=0.01, max_backoff_s=0.05)


def test_create_agent_on_a_remote_engine_sends_the_grammar_and_runs_the_tool(serve):
    server = serve(CALL, "It is sunny in Paris.")
    engine = remote(server.url)
    mw = AgentSpecMiddleware(agent_id="w")
    agent = create_agent(ChatAgentSpec(engine=engine), [get_weather], middleware=[mw])
    state = agent.invoke({"messages": [("user", "Weather in Paris?")]})

    [result] = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert result.content == "Sunny in Paris"
    assert state["messages"][-1].content == "It is sunny in Paris."
    first = server.bodies[0]
    assert first["structured_outputs"]["grammar"] == mw.grammars["w"]
    assert '"name":"get_weather"' in first["messages"][0]["content"]  # the engine's tool list
    assert "<tool_response>\nSunny in Paris\n</tool_response>" in server.bodies[1]["messages"][-1]["content"]
    assert len(mw.records) == 2 and mw.records[0].tool_calls == ("get_weather",)
    assert mw.records[0].output_tokens == len(CALL)
    engine.close()


def test_stream_and_async_on_a_remote_engine(serve):
    server = serve(f"Checking.{CALL}", CALL)
    engine = remote(server.url)
    bound = ChatAgentSpec(engine=engine).bind_tools([get_weather])
    chunks = list(bound.stream("Weather in Paris?"))
    total = chunks[0]
    for c in chunks[1:]:
        total = total + c
    assert total.content == "Checking."
    assert [(c["name"], c["args"]) for c in total.tool_calls] == [("get_weather", {"city": "Paris"})]
    msg = asyncio.run(bound.ainvoke("Weather in Paris?"))
    assert msg.tool_calls[0]["args"] == {"city": "Paris"}
    engine.close()
