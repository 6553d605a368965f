"""`ChatAgentSpec`: a LangChain chat model whose turns run on an AgentSpec engine.

The engine is the embedded `Engine` (vLLM in this process) or a `RemoteEngine` (a vLLM server through
the OpenAI client); both offer `generate`, `agenerate` and `stream`. `bind_tools` registers the tools'
schemas and turns on the grammar of the format's tool-call syntax, so every call the model writes
names a bound tool and carries schema-valid arguments.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from pydantic import ConfigDict, Field, PrivateAttr, model_validator

from agentspec_langgraph import _sdk

if TYPE_CHECKING:
    from agentspec_sdk import AgentEngine
from agentspec_langgraph._sdk import AgentSpecError
from agentspec_langgraph.messages import (
    RAW_TEXT_KEY,
    compact_json,
    langchain_calls,
    new_call_id,
    raw_record,
    to_engine_messages,
)
from agentspec_langgraph.records import TurnRecord, acceptance_of, agent_key, current_config
from agentspec_langgraph.tools import openai_tool, registry_from_tools, tools_key

# Keys a caller (the middleware, `bind`, `invoke(..., **kw)`) may pass for one call.
GRAMMAR = "agentspec_grammar"
AGENT_ID = "agentspec_agent_id"
RECORDER = "agentspec_recorder"
_CALL_KEYS = {"tools", "tool_choice", GRAMMAR, AGENT_ID, RECORDER, "max_tokens", "temperature"}
_NO_TOOLS = ("none",)
_ANY_TOOL = ("any", "required")


class ChatAgentSpec(BaseChatModel):
    """A chat model backed by an AgentSpec engine.

    - `engine`: an `agentspec_sdk.Engine` or `RemoteEngine` (anything with `generate`, `agenerate`,
      `stream`; `resolve_format` for `fmt="auto"`; `register_tools`, `mark_idle`, `mark_active` are used
      when present).
    - `fmt`: the agent format of tool-calling turns. `"auto"` (the default): the format the engine's
      model's own chat template writes (`resolve_format`: `hermes`, `llama3_json`, `mistral`,
      `pythonic`, `gemma_tool_code`, ..., or `tool_calls` for a template that declares no tool
      syntax), resolved once, here. Named: `"tool_calls"`, `"react"`, a native one, or `"code_agent"`:
      the model writes Python in a fenced block, which becomes a call of the code tool (bind
      `agentspec_langgraph.code_tool()`, the SDK's sandbox, as the agent's only tool); its result
      comes back to the model in `<result>…</result>`.
    - `grammar`: Lark text forced on every turn instead of the one derived from the format and the
      bound tools (`""` turns the grammar off). Without bound tools the turn grammar still applies:
      text without the format's markers, so no call can be written.
    - `agent_id`: the sequence this model's turns belong to (budget and accounting in the engine).
    - `reasoning`: False makes a turn that must call a tool (tool_choice "required" / a tool name)
      start with the call itself, no text before it (a tool-call format: `tool_calls` or a native one
      such as `hermes`, `mistral`, `pythonic`; one call per turn).
      Small models otherwise tend to talk until max_tokens instead of calling.
    - `recorder`: called with a `TurnRecord` after every turn (the middleware sets one per call).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    engine: Any = Field(exclude=True)  # an AgentEngine; not validated (partial engines serve too)
    fmt: str = "auto"
    max_tokens: int = 256
    temperature: float = 0.0
    grammar: str | None = None
    agent_id: str | None = None
    reasoning: bool = True
    recorder: Callable[[TurnRecord], None] | None = Field(default=None, exclude=True)
    model_name: str = "agentspec"

    _registries: dict[tuple[str, str], Any] = PrivateAttr(default_factory=dict)
    _registered: set[str] = PrivateAttr(default_factory=set)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @model_validator(mode="after")
    def _resolve_auto(self) -> ChatAgentSpec:
        """`fmt="auto"` becomes the engine's answer (its model's template), so that every later use of
        `fmt` (grammars, history, parsing) names one format."""
        if self.fmt == "auto":
            if not hasattr(self.engine, "resolve_format"):
                raise AgentSpecError("fmt='auto' (the default) needs an engine that knows its model's chat "
                                     "template (AgentEngine.resolve_format); name the format for this engine")
            self.fmt = self.engine.resolve_format("auto").name
        return self

    @property
    def _llm_type(self) -> str:
        return "agentspec"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name, "fmt": self.fmt, "max_tokens": self.max_tokens}

    # -- tools ---------------------------------------------------------------------------------

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | Any],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Register the tools with the engine and bind them: later turns follow the tool-call grammar.

        `tool_choice`: None / "auto" (the model may call any bound tool or answer), "none" (no call:
        text only), "any" / "required" / True (the turn must call one or more tools), a tool name or
        `{"type": "function", "function": {"name": ...}}` (the turn must call that tool).
        """
        formatted = [openai_tool(t) for t in tools]
        registry = self.registry_for(formatted)
        self._register(formatted, registry)
        _check_choice(tool_choice, formatted)
        unknown = set(kwargs) - _CALL_KEYS
        if unknown:
            raise AgentSpecError(f"ChatAgentSpec.bind_tools got unknown settings {sorted(unknown)}")
        return self.bind(tools=formatted, tool_choice=tool_choice, **kwargs)

    def registry_for(self, tools: Sequence[dict[str, Any]]) -> Any:
        """The ToolRegistry of these OpenAI tool dicts (cached: bind_tools runs on every agent step)."""
        key = (self.fmt, tools_key(tools))
        with self._lock:
            found = self._registries.get(key)
        if found is None:
            found = registry_from_tools(tools)
            with self._lock:
                self._registries[key] = found
        return found

    def grammar_for(self, tools: Sequence[dict[str, Any]], tool_choice: Any = None) -> str:
        """The turn grammar a call with these tools and this tool choice runs under."""
        if self.grammar is not None:
            return self.grammar
        chosen = _chosen_tools(tools, tool_choice)
        choice = _grammar_choice(tool_choice) if chosen else "none"
        fmt = _sdk.get_format(self.fmt)
        if choice == "required" and not self.reasoning:
            return _call_only_grammar(fmt, self.registry_for(chosen))
        return _sdk.turn_grammar(fmt, self.registry_for(chosen), tool_choice=choice)

    def _register(self, tools: list[dict[str, Any]], registry: Any) -> None:
        key = tools_key(tools)
        register = getattr(self.engine, "register_tools", None)
        with self._lock:
            if key in self._registered or register is None:
                return
        register(registry)  # a name already registered with another schema: the engine says which
        with self._lock:
            self._registered.add(key)

    # -- one turn ------------------------------------------------------------------------------

    def _request(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> Any:
        if stop:
            raise AgentSpecError(
                f"ChatAgentSpec does not take stop sequences (got {stop!r}); the turn ends where the "
                f"format {self.fmt!r} hands over to the environment"
            )
        unknown = set(kwargs) - _CALL_KEYS
        if unknown:
            raise AgentSpecError(f"ChatAgentSpec got unknown call settings {sorted(unknown)}")
        tools = [openai_tool(t) for t in kwargs.get("tools") or ()]
        chosen = _chosen_tools(tools, kwargs.get("tool_choice"))
        if self.fmt == "code_agent":
            others = [t["function"]["name"] for t in chosen if t["function"]["name"] != _sdk.CODE_TOOL]
            if others:
                raise AgentSpecError(f"format 'code_agent' calls only the code tool {_sdk.CODE_TOOL!r} "
                                     f"(agentspec_langgraph.code_tool()); also bound: {others}")
            chosen = []  # the code tool is the code block itself, not a function listed in the prompt
        grammar = kwargs.get(GRAMMAR)
        if grammar is None:
            grammar = self.grammar_for(tools, kwargs.get("tool_choice"))
        return _sdk.TurnRequest(
            messages=to_engine_messages(messages, self.fmt, self.registry_for(tools)),
            fmt=self.fmt,
            tools=self.registry_for(chosen),  # an empty registry, not None (None: every registered tool)
            grammar=grammar,
            max_tokens=int(kwargs.get("max_tokens", self.max_tokens)),
            temperature=float(kwargs.get("temperature", self.temperature)),
            agent_id=kwargs.get(AGENT_ID) or agent_key(self.agent_id, current_config()),
        )

    def _message(self, result: Any, request: Any, kwargs: dict[str, Any]) -> AIMessage:
        if result.error:
            raise AgentSpecError(f"the engine failed request {result.request_id!r}: {result.error}")
        with_calls = len(request.tools) > 0 or (self.fmt == "code_agent" and any(
            openai_tool(t)["function"]["name"] == _sdk.CODE_TOOL for t in kwargs.get("tools") or ()))
        content, calls, invalid = _read_turn(self.fmt, result, with_calls=with_calls)
        message = AIMessage(
            content=content,
            tool_calls=calls,
            invalid_tool_calls=invalid,
            additional_kwargs={RAW_TEXT_KEY: raw_record(self.fmt, result.text, calls)},
            response_metadata=_metadata(self.model_name, result),
            usage_metadata=_usage(result),
        )
        self._record(result, request, calls, kwargs)
        return message

    def _record(self, result: Any, request: Any, calls: list[dict[str, Any]], kwargs: dict[str, Any]) -> None:
        recorder = kwargs.get(RECORDER) or self.recorder
        if recorder is not None:
            recorder(_turn_record(self.fmt, result, request, calls))

    # -- LangChain entry points ----------------------------------------------------------------

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        request = self._request(messages, stop, kwargs)
        result = self.engine.generate([request])[0]
        return _chat_result(self._message(result, request, kwargs))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        request = self._request(messages, stop, kwargs)
        result = await self.engine.agenerate(request)
        return _chat_result(self._message(result, request, kwargs))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        request = self._request(messages, stop, kwargs)
        streamer = _ContentStreamer(self.fmt)
        result = None
        for event in self.engine.stream(request):
            result = getattr(event, "result", None) or result
            delta = streamer.feed(event)
            if delta:
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=delta))
                if run_manager:
                    run_manager.on_llm_new_token(delta, chunk=chunk)
                yield chunk
        tail = streamer.finish(result)
        if tail:
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=tail))
            if run_manager:
                run_manager.on_llm_new_token(tail, chunk=chunk)
            yield chunk
        yield from self._final_chunks(result, request, kwargs)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        request = self._request(messages, stop, kwargs)
        streamer = _ContentStreamer(self.fmt)
        result = None
        async for event in _events(self.engine, request):
            result = getattr(event, "result", None) or result
            delta = streamer.feed(event)
            if delta:
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=delta))
                if run_manager:
                    await run_manager.on_llm_new_token(delta, chunk=chunk)
                yield chunk
        tail = streamer.finish(result)
        if tail:
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=tail))
            if run_manager:
                await run_manager.on_llm_new_token(tail, chunk=chunk)
            yield chunk
        for chunk in self._final_chunks(result, request, kwargs):
            yield chunk

    def _final_chunks(self, result: Any, request: Any,
                      kwargs: dict[str, Any]) -> Iterator[ChatGenerationChunk]:
        """One chunk per tool call (whole: calls are only usable once closed), then usage/metadata."""
        if result is None:
            raise AgentSpecError("the engine's stream ended without a result")
        message = self._message(result, request, kwargs)
        for index, call in enumerate(message.tool_calls):
            chunk = {"name": call["name"], "args": compact_json(call["args"]), "id": call["id"],
                     "index": index}
            yield ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=[chunk]))
        yield ChatGenerationChunk(
            message=AIMessageChunk(
                content="",
                invalid_tool_calls=message.invalid_tool_calls,
                additional_kwargs=message.additional_kwargs,
                response_metadata=message.response_metadata,
                usage_metadata=message.usage_metadata,
                chunk_position="last",
            )
        )


# -- a finished turn in LangChain's terms ----------------------------------------------------------


def _read_turn(fmt: str, result: Any, *, with_calls: bool) -> tuple[str, list, list]:
    """The turn's content, its tool calls and its invalid ones (a call cut at max_tokens)."""
    text, finish_reason = result.text, result.finish_reason
    content = _content(fmt, result)
    if not with_calls:
        return content, [], []
    try:
        return content, langchain_calls(fmt, text), []
    except AgentSpecError as exc:  # a turn cut at max_tokens inside a call, or no grammar
        cut = " (the turn hit max_tokens)" if finish_reason == "length" else ""
        bad = {"name": None, "args": text, "id": new_call_id(), "error": f"{exc}{cut}",
               "type": "invalid_tool_call"}
        return content, [], [bad]


def _metadata(model_name: str, result: Any) -> dict[str, Any]:
    return {
        "model_name": model_name,
        "model_provider": "agentspec",
        "finish_reason": result.finish_reason,
        "request_id": result.request_id,
        "acceptance": acceptance_of(result),
        "timings": dict(getattr(result, "timings", None) or {}),
    }


def _turn_record(fmt: str, result: Any, request: Any, calls: list[dict[str, Any]]) -> TurnRecord:
    usage = _usage(result)
    return TurnRecord(
        agent_id=request.agent_id,
        request_id=result.request_id,
        fmt=fmt,
        tool_calls=tuple(c["name"] for c in calls),
        acceptance=acceptance_of(result),
        input_tokens=usage["input_tokens"],
        output_tokens=usage["output_tokens"],
        finish_reason=result.finish_reason,
        timings=dict(getattr(result, "timings", None) or {}),
    )


def _chat_result(message: AIMessage) -> ChatResult:
    return ChatResult(
        generations=[ChatGeneration(message=message)],
        llm_output={"token_usage": dict(message.usage_metadata or {}), **message.response_metadata},
    )


def _usage(result: Any) -> dict[str, int]:
    prompt = len(getattr(result, "prompt_token_ids", None) or ())
    output = len(getattr(result, "token_ids", None) or ())
    return {"input_tokens": prompt, "output_tokens": output, "total_tokens": prompt + output}


def _is_tool_class(law_class: Any) -> bool:
    return str(getattr(law_class, "value", law_class)) == "S"


def _content(fmt: str, result: Any) -> str:
    """The message content: the turn's text outside schema-bound (S) segments, i.e. outside tool calls,
    cut by the segments the engine reports (`TurnResult.spans`)."""
    text = result.text
    parts = (text[s.start : s.end] for s in _spans(fmt, result) if not _is_tool_class(s.law_class))
    return "".join(parts).strip()


def _spans(fmt: str, result: Any) -> list[Any]:
    """The result's segments; the text is segmented here only when a result carries none."""
    spans = list(getattr(result, "spans", None) or ())
    if spans or not result.text:
        return spans
    segmenter = _sdk.Segmenter(_sdk.get_format(fmt))
    segmenter.feed(result.text)
    return segmenter.all_spans()


class _ContentStreamer:
    """Stream events → content deltas: the text of the events not labelled S (outside tool calls),
    stripped at both ends, so the streamed content equals `_content` of the whole turn.

    The engines label each event with its segment (`StreamEvent.law_class`): an event never straddles
    a segment boundary, and text that may still begin a marker (``<tool_``) comes only once decided.
    Text without a label (a remote turn replayed whole from its ledger) and all text after it is held
    until the turn's result and cut by the result's segments. Trailing whitespace is held back until
    more content follows.
    """

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self.seen = 0  # characters of the turn's text received so far
        self.held_from: int | None = None  # offset of the first unlabelled text
        self.started = False
        self.pending = ""

    def feed(self, event: Any) -> str:
        delta = getattr(event, "text_delta", "") or ""
        start, self.seen = self.seen, self.seen + len(delta)
        if not delta or self.held_from is not None:
            return ""
        label = getattr(event, "law_class", None)
        if not label:
            self.held_from = start
            return ""
        return "" if _is_tool_class(label) else self._strip(delta)

    def finish(self, result: Any) -> str:
        """Content of the held text, if any, by the result's segments."""
        if self.held_from is None or result is None:
            return ""
        lo, text = self.held_from, result.text
        parts = [text[max(s.start, lo) : s.end] for s in _spans(self.fmt, result)
                 if s.end > lo and not _is_tool_class(s.law_class)]
        return self._strip("".join(parts))

    def _strip(self, text: str) -> str:
        if not self.started:
            text = text.lstrip()
            if not text:
                return ""
            self.started = True
        text = self.pending + text
        body = text.rstrip()
        self.pending = text[len(body) :]
        return body


async def _events(engine: AgentEngine, request: Any) -> AsyncIterator[Any]:
    """The engine's async stream when it has one, else its sync stream stepped on a worker thread."""
    astream = getattr(engine, "astream", None)
    if astream is not None:
        async for event in astream(request):
            yield event
        return
    iterator = iter(engine.stream(request))
    done = object()
    while True:
        event = await asyncio.to_thread(next, iterator, done)
        if event is done:
            return
        yield event


def _chosen_tools(tools: Sequence[dict[str, Any]], tool_choice: Any) -> list[dict[str, Any]]:
    if not tools or tool_choice in _NO_TOOLS or tool_choice is False:
        return []
    name = _choice_name(tool_choice)
    if name is None:
        return list(tools)
    return [t for t in tools if t["function"]["name"] == name]


def _call_only_grammar(fmt: Any, registry: Any) -> str:
    """One tool call and nothing else (the SDK's single-call turn grammar)."""
    if fmt.layout not in ("tool_calls", "call_list"):  # any format with a call syntax (native ones too)
        raise AgentSpecError(f"reasoning=False needs a tool-call format (layout 'tool_calls' or "
                             f"'call_list'), not {fmt.name!r} (layout {fmt.layout!r})")
    return _sdk.turn_grammar(fmt, registry, tool_choice="call", single_call=True)


def _grammar_choice(tool_choice: Any) -> str:
    if tool_choice in _ANY_TOOL or tool_choice is True or _choice_name(tool_choice) is not None:
        return "required"
    return "auto"


def _choice_name(tool_choice: Any) -> str | None:
    if isinstance(tool_choice, dict):
        return (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
    if isinstance(tool_choice, str) and tool_choice not in ("auto", *_NO_TOOLS, *_ANY_TOOL):
        return tool_choice
    return None


def _check_choice(tool_choice: Any, tools: Sequence[dict[str, Any]]) -> None:
    name = _choice_name(tool_choice)
    names = [t["function"]["name"] for t in tools]
    if name is not None and name not in names:
        raise AgentSpecError(f"tool_choice names tool {name!r}, which is not bound; bound tools: {names}")
