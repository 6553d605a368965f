"""The `agentspec` tool parser: plain OpenAI tool calling on `agentspec serve`.

vLLM loads this file by path (`--tool-parser-plugin <this file> --tool-call-parser agentspec
--enable-auto-tool-choice`, which `agentspec serve` passes by default). Per chat request with `tools`:

- `adjust_request` builds the turn grammar of the server's format (`AGENTSPEC_TOOL_FORMAT`, default
  `tool_calls`) from the request's own tools and `tool_choice` (`auto`: text, or text then calls;
  `required`: one or more calls from the first token (a react turn keeps its Thought); a named
  function: calls of that tool only; `none`: text without a call marker) and puts it in the
  request's `structured_outputs` (Lark for the `guidance` backend), with the format's stop strings.
  A schema the compiler refuses is a 400 naming the tool and the schema path. New tools are added to
  the plan file (`AGENTSPEC_PLAN`), which the structure proposer re-reads: that is how the proposer
  inside the engine core learns each request's tools (forced drafts, per-class accounting).
- `extract_tool_calls` / `extract_tool_calls_streaming` turn the model's text into OpenAI
  `tool_calls` (ids, arguments as compact JSON strings, several calls per message); text before the
  first call stays `content`.

The prompt of such a request (the format's instructions and the tools in the system prompt, earlier
calls written in the format) comes from the chat template `agentspec serve` writes
(`backends.inside_vllm.tool_prompt`). With `capture_hook` (which imports them only when capturing), the
only SDK module that imports vLLM's API-server classes.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vllm.entrypoints.generate.base.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionNamedToolChoiceParam,
    ChatCompletionRequest,
)
from vllm.exceptions import VLLMValidationError
from vllm.parser import abstract_parser
from vllm.renderers.chat_utils import make_tool_call_id
from vllm.sampling_params import StructuredOutputsParams
from vllm.tool_parsers.abstract_tool_parser import ToolParser, ToolParserManager

from agentspec_sdk.backends.inside_vllm.tool_prompt import LAYOUTS
from agentspec_sdk.drafting.plan import PLAN_ENV
from agentspec_sdk.errors import AgentSpecError, SchemaNotSupported, TurnParseError
from agentspec_sdk.structure.formats import AgentFormat, get_format
from agentspec_sdk.structure.tools import ToolRegistry
from agentspec_sdk.structure.turn_grammar import turn_grammar
from agentspec_sdk.structure.turns import parse_turn

log = logging.getLogger("agentspec.backends")

FORMAT_ENV = "AGENTSPEC_TOOL_FORMAT"  # a built-in format name, or a format's JSON dict
PARSER_NAME = "agentspec"

# vLLM calls `adjust_request` only when tool_choice is not "none" (vllm/renderers/online_renderer.py),
# unless the composed parser says `always_adjust_request`: we want "none" to get its text-only grammar
# too. The flag is a documented class attribute of vLLM's Parser; this server's process only.
abstract_parser.DelegatingParser.always_adjust_request = True


def server_format() -> AgentFormat:
    """The format of this server's turns (`AGENTSPEC_TOOL_FORMAT`: a name or a JSON format dict)."""
    spec = os.environ.get(FORMAT_ENV, "").strip() or "tool_calls"
    fmt = AgentFormat.from_dict(json.loads(spec)) if spec.startswith("{") else get_format(spec)
    if fmt.layout not in LAYOUTS:
        raise AgentSpecError(f"format {fmt.name!r} (layout {fmt.layout!r}) has no OpenAI tool calls; the "
                             f"tool parser needs a format with layout {' or '.join(LAYOUTS)}")
    return fmt


def grammar_for(fmt: AgentFormat, tools: list[dict], tool_choice: Any, parallel: bool = True) -> str:
    """The turn grammar for an OpenAI request's `tools` (dicts) and `tool_choice`; `parallel=False`
    (`parallel_tool_calls: false`) with a required or named choice: exactly one call."""
    registry = registry_of(tools)
    if isinstance(tool_choice, dict) or _named(tool_choice):
        name = _choice_name(tool_choice)
        if name not in registry:
            raise VLLMValidationError(f"tool_choice names function {name!r}, which is not in `tools` "
                                      f"(tools: {registry.names()})", parameter="tool_choice")
        registry = ToolRegistry([registry.get(name)])
        return turn_grammar(fmt, registry, tool_choice="call") if parallel else one_call(fmt, registry)
    if tool_choice == "required" and not parallel:
        return one_call(fmt, registry)
    choice = tool_choice or "auto"
    if choice not in ("auto", "required", "none"):
        raise VLLMValidationError(f"tool_choice must be 'auto', 'required', 'none' or a named function, "
                                  f"got {choice!r}", parameter="tool_choice")
    # required: the turn is calls from its first token ("call"; react turns keep their Thought), so that
    # a model that would rather chat cannot run to max_tokens before its call
    return turn_grammar(fmt, registry, tool_choice="call" if choice == "required" else choice)


def one_call(fmt: AgentFormat, registry: ToolRegistry) -> str:
    """Exactly one call block (tool_calls layout; a react turn is one call already but keeps its
    Thought, so it gets its required turn grammar)."""
    single = fmt.layout in ("tool_calls", "call_list")
    return turn_grammar(fmt, registry, tool_choice="call", single_call=single)


def registry_of(tools: list[dict]) -> ToolRegistry:
    registry = ToolRegistry()
    for i, tool in enumerate(tools):
        try:
            registry.add(tool)
        except AgentSpecError as exc:
            raise VLLMValidationError(f"tools[{i}]: {exc}", parameter=f"tools[{i}]") from None
    return registry


class AgentSpecToolParser(ToolParser):
    """Grammar-constrained tool calls in the server's agent format."""

    # required / named are parsed from our own call blocks, not vLLM's JSON-list form
    supports_required_and_named = False

    def __init__(self, tokenizer, tools=None):
        super().__init__(tokenizer, tools)
        self.fmt = server_format()
        self._sent_content = 0  # characters of content already streamed
        self._sent_calls = 0

    # -- request ---------------------------------------------------------------------------------

    def adjust_request(self, request):
        if not isinstance(request, ChatCompletionRequest) or not request.tools:
            return request  # RemoteEngine's requests carry their own grammar and no tools
        if _own_constraint(request):
            return request  # the client constrains the output itself: its constraint applies
        tools = [t.model_dump(exclude_none=True) for t in request.tools]
        choice = request.tool_choice
        if isinstance(choice, ChatCompletionNamedToolChoiceParam):
            choice = {"type": "function", "function": {"name": choice.function.name}}
        try:
            grammar = grammar_for(self.fmt, tools, choice, parallel=request.parallel_tool_calls is not False)
        except SchemaNotSupported as exc:  # "tool 'x' parameters: ... (at /pointer)"
            name = str(exc).split("'", 2)[1] if str(exc).startswith("tool '") else None
            index = next((i for i, t in enumerate(tools) if t.get("function", {}).get("name") == name), None)
            where = f"tools[{index}].function.parameters" if index is not None else "tools"
            raise VLLMValidationError(f"{where}: {exc}", parameter=where) from None
        except VLLMValidationError:
            raise
        except AgentSpecError as exc:
            raise VLLMValidationError(f"{type(exc).__name__}: {exc}", parameter="tools") from None
        request.structured_outputs = StructuredOutputsParams(grammar=grammar)
        request.response_format = None
        stops = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        request.stop = stops + [s for s in self.fmt.stop if s not in stops]
        share_tools(tools)
        return request

    # -- output ----------------------------------------------------------------------------------

    def extract_tool_calls(self, model_output: str, request) -> ExtractedToolCallInformation:
        if not getattr(request, "tools", None):
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)
        calls = self._calls(model_output)
        if not calls:
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)
        content = self._content(model_output, final=True)
        tool_calls = [ToolCall(id=make_tool_call_id(), function=FunctionCall(name=n, arguments=a))
                      for n, a in calls]
        self.prev_tool_call_arr = [{"name": n, "arguments": a} for n, a in calls]
        return ExtractedToolCallInformation(tools_called=True, tool_calls=tool_calls, content=content or None)

    def extract_tool_calls_streaming(self, previous_text: str, current_text: str, delta_text: str,
                                     previous_token_ids: Sequence[int], current_token_ids: Sequence[int],
                                     delta_token_ids: Sequence[int], request) -> DeltaMessage | None:
        if not getattr(request, "tools", None):
            return DeltaMessage(content=delta_text) if delta_text else None
        content = self._content(current_text, final=False)
        fresh = content[self._sent_content:]
        self._sent_content = max(self._sent_content, len(content))
        calls = self._calls(current_text)
        deltas = []
        for n, (name, args) in enumerate(calls[self._sent_calls:], start=self._sent_calls):
            deltas.append(DeltaToolCall(index=n, id=make_tool_call_id(), type="function",
                                        function=DeltaFunctionCall(name=name, arguments=args)))
            self.prev_tool_call_arr.append({"name": name, "arguments": args})
            self.streamed_args_for_tool.append(args)
        self._sent_calls = max(self._sent_calls, len(calls))
        self.current_tool_id = self._sent_calls - 1
        if not fresh and not deltas:
            return None
        return DeltaMessage(content=fresh or None, tool_calls=deltas)

    # -- reading the format ----------------------------------------------------------------------

    def _call_markers(self) -> tuple[str, ...]:
        kind = "action" if self.fmt.layout == "react" else "tool_call"
        return self.fmt.kind(kind).open

    def _content(self, text: str, *, final: bool) -> str:
        """Text before the first call marker, right-stripped. While streaming, a tail that may still
        become a marker is held back (so is trailing whitespace, which the final content drops). An
        anchored call kind (a pythonic list, Llama's bare JSON) is a call only from the first character."""
        markers = self._call_markers()
        if self.fmt.layout == "call_list" and self.fmt.kind("tool_call").anchored:
            if any(text.startswith(m) for m in markers):
                return ""
            if not final and any(m.startswith(text) for m in markers):
                return ""
            return text.rstrip()
        cut = min((i for i in (text.find(m) for m in markers) if i >= 0), default=-1)
        if cut >= 0:
            return text[:cut].rstrip()
        if final:
            return text.rstrip()
        hold = max((k for m in markers for k in range(1, len(m)) if text.endswith(m[:k])), default=0)
        return text[: len(text) - hold].rstrip()

    def _calls(self, text: str, partial: bool = False) -> list[tuple[str, str]]:
        """(name, arguments JSON) of the complete calls in `text` (a call cut by max_tokens, or still
        being streamed, is not one)."""
        try:
            parsed = parse_turn(self.fmt, text)
        except TurnParseError:
            parsed = self._complete_prefix(text)
            if parsed is None:
                return []
        return [(c.name, json.dumps(c.arguments, ensure_ascii=False, separators=(",", ":")))
                for c in parsed.tool_calls]

    def _complete_prefix(self, text: str):
        """While streaming: the turn up to the last closed call (a call being written does not parse)."""
        if self.fmt.layout != "tool_calls":
            return None
        close = self.fmt.kind("tool_call").close
        end = max((text.rfind(c) + len(c) for c in close if c in text), default=-1)
        if end <= 0:
            return None
        try:
            return parse_turn(self.fmt, text[:end])
        except TurnParseError:
            return None


ToolParserManager.register_module(PARSER_NAME, module=AgentSpecToolParser)


# -- the tools channel to the proposer ------------------------------------------------------------

_shared: set[str] = set()
_shared_lock = threading.Lock()


def share_tools(tools: list[dict]) -> None:
    """Add tools the plan lacks to the plan file (`AGENTSPEC_PLAN`), which the structure proposer
    re-reads on change (at most every 0.5 s). Without a plan (other speculation modes) nothing to do.
    A name already in the plan keeps its first schema: a different one only costs rejected drafts."""
    path = os.environ.get(PLAN_ENV)
    if not path:
        return
    names = {t.get("function", {}).get("name") for t in tools}
    with _shared_lock:
        if names <= _shared:
            return
        from agentspec_sdk.backends.plan_file import PlanFile

        try:
            PlanFile(Path(path)).update(tools=registry_of(tools).openai_tools())
        except AgentSpecError as exc:  # the request is served all the same, without forced drafts
            log.warning("agentspec tool parser: plan %s not updated: %s", path, exc)
            return
        _shared.update(names)


def _own_constraint(request) -> bool:
    so = request.structured_outputs
    own = so is not None and any(getattr(so, k, None) is not None for k in
                                 ("json", "regex", "choice", "grammar", "structural_tag"))
    rf = request.response_format
    return own or (rf is not None and getattr(rf, "type", "text") != "text")


def _named(choice: Any) -> bool:
    return isinstance(choice, ChatCompletionNamedToolChoiceParam)


def _choice_name(choice: Any) -> str:
    if isinstance(choice, ChatCompletionNamedToolChoiceParam):
        return choice.function.name
    return str((choice.get("function") or {}).get("name"))
