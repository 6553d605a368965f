"""The engine contract: what `Engine` (embedded vLLM) and `RemoteEngine` (a vLLM server) both do.

Integrations and the replay code type against `AgentEngine`, never against one backend; the contract
test (tests/test_engine_contract.py) runs the same calls on both. Extra methods (`Engine.step_log`,
`RemoteEngine.check`, ...) are backend-specific and are looked up with `hasattr` where used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any, Protocol, runtime_checkable

from agentspec_sdk.backends.types import StreamEvent, TurnRequest, TurnResult
from agentspec_sdk.structure.formats import AgentFormat

# Keys every backend's stats() holds: finished turns, failed turns, output tokens, per-class
# acceptance ({law class: {"rounds", "drafted", "accepted"}}), agents waiting on a tool.
STATS_KEYS = ("requests", "errors", "output_tokens", "acceptance", "idle_agents")


@runtime_checkable
class AgentEngine(Protocol):
    """One agent turn in, one `TurnResult` out, on either backend."""

    def register_tools(self, tools: Any) -> None:
        """Add tools (a ToolRegistry or what it takes); a known name with another schema raises
        ToolRegistryError and adds nothing."""

    def grammar_for(self, fmt: str | AgentFormat, tools: Any = None, tool_choice: str = "auto") -> str:
        """The Lark turn grammar a request of `fmt` gets (tools None: the registered ones)."""

    def resolve_format(self, fmt: str | AgentFormat) -> AgentFormat:
        """`fmt` as a format; "auto" (`TurnRequest`'s default): the one the model's chat template writes,
        `tool_calls` for a template that declares no tool syntax."""

    def submit(self, req: TurnRequest) -> Future:
        """Queue a turn; the future resolves to its TurnResult (`error` set for a turn that failed)."""

    def generate(self, requests: Sequence[TurnRequest]) -> list[TurnResult]:
        """The results of `requests`, in order (they run concurrently)."""

    async def agenerate(self, req: TurnRequest) -> TurnResult:
        """`submit` awaited."""

    def stream(self, req: TurnRequest) -> Iterator[StreamEvent]:
        """Text deltas labelled with segment kind and law class; the last event carries the result."""

    def mark_idle(self, agent_id: str) -> None:
        """The agent waits on a tool."""

    def mark_active(self, agent_id: str) -> None:
        """The agent is back."""

    def stats(self) -> dict:
        """Totals since start; holds at least `STATS_KEYS`."""

    def close(self) -> None:
        """Stop; a second close does nothing."""

    def __enter__(self) -> AgentEngine: ...

    def __exit__(self, *exc: Any) -> None: ...


class EngineBase:
    """What both backends derive from `submit` and `close`, written once: batch `generate`, the
    awaitable `agenerate` and the context manager."""

    def submit(self, req: TurnRequest) -> Future:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def generate(self, requests: Sequence[TurnRequest]) -> list[TurnResult]:
        """The results of `requests`, in order (they run concurrently)."""
        futures = [self.submit(r) for r in requests]
        return [f.result() for f in futures]

    async def agenerate(self, req: TurnRequest) -> TurnResult:
        return await asyncio.wrap_future(self.submit(req))

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
