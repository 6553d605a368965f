"""What a turn is on either backend: the request, the result, the stream event, and the tool rules.

`Engine` (embedded vLLM) and `RemoteEngine` (a vLLM server) take the same `TurnRequest` and answer
with the same `TurnResult` / `StreamEvent`s; both register tools through `merge_tools`, so a known
tool name with another schema is the same error on both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentspec_sdk.errors import ToolRegistryError
from agentspec_sdk.structure.formats import AgentFormat
from agentspec_sdk.structure.segmenter import Span
from agentspec_sdk.structure.tools import ToolRegistry


@dataclass
class TurnRequest:
    messages: list[dict[str, Any]]
    fmt: str | AgentFormat = "auto"  # "auto": the format the model's template writes (tool_calls if none)
    tools: ToolRegistry | list[dict] | None = None  # None: every registered tool
    grammar: str | None = None  # None: turn_grammar(fmt, tools, tool_choice); "": unconstrained; else Lark
    tool_choice: str = "auto"  # auto | required | none | call (the turn is tool calls only)
    max_tokens: int = 256
    temperature: float = 0.0
    request_id: str | None = None
    agent_id: str | None = None
    logprobs: int | None = None  # top-k log-probabilities of each output position (vLLM's raw logits)


@dataclass
class TurnResult:
    request_id: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    spans: list[Span] = field(default_factory=list)
    records: list[dict] = field(default_factory=list)
    acceptance: dict[str, dict[str, int]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    spec: dict[str, Any] | None = None  # vLLM's per-request spec-decode metrics (None: no speculation)
    agent_id: str | None = None
    logprobs: list[dict[int, float]] | None = None  # per output position: token id -> log-probability
    # Target passes that gave this turn tokens, the prefill's included, counted per engine step (the
    # embedded engine); None where the backend cannot see steps (a server). Not output tokens −
    # accepted: a pass whose accepted draft ends the turn (EOS, a stop string, max_tokens) emits no
    # bonus token, so that difference misses one pass per such turn (docs/replay.md, "passes").
    passes: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class StreamEvent:
    text_delta: str
    kind: str
    law_class: str
    result: TurnResult | None = None  # set on the last event only


def as_registry(tools: Any) -> ToolRegistry:
    """A ToolRegistry from a registry or anything `ToolRegistry(...)` takes (OpenAI dicts, callables...)."""
    if isinstance(tools, ToolRegistry):
        return tools
    return ToolRegistry(list(tools))


def merge_tools(registry: ToolRegistry, tools: Any) -> bool:
    """Add the new tools of `tools` to `registry`; True when any was added. A name already there with
    the same schema is kept; with another schema it is a ToolRegistryError (nothing is added then)."""
    new = []
    for tool in as_registry(tools):
        if tool.name in registry:
            if registry.get(tool.name).parameters != tool.parameters:
                raise ToolRegistryError(f"tool {tool.name!r} is already registered with another schema")
            continue
        new.append(tool)
    for tool in new:
        registry.add(tool)
    return bool(new)
