"""A scripted stand-in for the Engine surface, for the LangGraph integration's unit tests only.

It replays given model texts (a string, or a function of the request), and records the requests,
registered tools and idle/active marks so tests can check what the integration sent. Spans come
from the real segmenter, stream events from the engines' own `StreamSplitter`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

from agentspec_sdk import get_format
from agentspec_sdk.backends.stream_split import StreamSplitter
from agentspec_sdk.backends.types import StreamEvent
from agentspec_sdk.structure.segmenter import segment

ACCEPTANCE = {"S": {"drafted": 12, "accepted": 10}, "R": {"drafted": 4, "accepted": 1}}

Output = str | Callable[[Any], str]


class FakeEngine:
    def __init__(self, outputs: list[Output] | None = None, *, finish_reason: str = "stop",
                 native: str = "tool_calls", unlabelled: bool = False):
        """`native`: the format `resolve_format("auto")` answers (the one its model's template writes);
        `unlabelled`: `stream` sends the text in one event without a segment label."""
        self.outputs = list(outputs or [])
        self.finish_reason = finish_reason
        self.native = native
        self.unlabelled = unlabelled
        self.asked: list[Any] = []
        self.requests: list[Any] = []
        self.registered: list[list[str]] = []
        self.marks: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def register_tools(self, registry: Any) -> None:
        self.registered.append(list(registry.names))

    def resolve_format(self, fmt: Any) -> Any:
        self.asked.append(fmt)
        return get_format(self.native if fmt == "auto" else fmt)

    def mark_idle(self, agent_id: str) -> None:
        self.marks.append(("idle", agent_id))

    def mark_active(self, agent_id: str) -> None:
        self.marks.append(("active", agent_id))

    def _result(self, request: Any) -> SimpleNamespace:
        with self._lock:
            self.requests.append(request)
            n = len(self.requests)
            if not self.outputs:
                raise AssertionError(f"FakeEngine: no scripted output left for request {n}")
            out = self.outputs.pop(0)
        text = out(request) if callable(out) else out
        prompt = sum(len(m["content"]) for m in request.messages)
        return SimpleNamespace(
            request_id=f"req-{n}",
            text=text,
            token_ids=list(range(len(text) // 3 + 1)),
            prompt_token_ids=list(range(prompt // 4 + 1)),
            finish_reason=self.finish_reason,
            error=None,
            spans=segment(get_format(request.fmt), text),
            records=[],
            acceptance={k: dict(v) for k, v in ACCEPTANCE.items()},
            timings={"e2e_s": 0.01},
        )

    def generate(self, requests: list[Any]) -> list[SimpleNamespace]:
        return [self._result(r) for r in requests]

    async def agenerate(self, request: Any) -> SimpleNamespace:
        return self._result(request)

    def stream(self, request: Any) -> Iterator[StreamEvent]:
        """As the engines stream: 4-character deltas through the SDK's `StreamSplitter` (events labelled
        by segment, never straddling a boundary, marker-like text held until decided); with
        `unlabelled=True`, the whole text in one event without a label, as a remote turn replayed
        from its ledger."""
        result = self._result(request)
        if self.unlabelled:
            yield StreamEvent(result.text, "", "")
        else:
            splitter = StreamSplitter(get_format(request.fmt))
            for at in range(0, len(result.text), 4):
                yield from splitter.feed(result.text[at : at + 4])
            yield from splitter.feed("", final=True)
        yield StreamEvent("", "", "", result=result)
