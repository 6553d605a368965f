"""A scripted stand-in for the Engine surface, for the LangGraph integration's unit tests only.

It replays given model texts (a string, or a function of the request), and records the requests,
registered tools and idle/active marks so tests can check what the integration sent. Spans and the
per-event law classes come from the real segmenter.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

from agentspec_sdk import get_format
from agentspec_sdk.structure.segmenter import label_tokens, segment

ACCEPTANCE = {"S": {"drafted": 12, "accepted": 10}, "R": {"drafted": 4, "accepted": 1}}

Output = str | Callable[[Any], str]


class FakeEngine:
    def __init__(self, outputs: list[Output] | None = None, *, finish_reason: str = "stop",
                 native: str = "tool_calls"):
        """`native`: the format `resolve_format("auto")` answers (the one its model's template writes)."""
        self.outputs = list(outputs or [])
        self.finish_reason = finish_reason
        self.native = native
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

    def stream(self, request: Any) -> Iterator[SimpleNamespace]:
        result = self._result(request)
        pieces = [result.text[i : i + 4] for i in range(0, len(result.text), 4)]
        labels = label_tokens(get_format(request.fmt), pieces)
        for piece, (kind, law_class) in zip(pieces, labels, strict=True):
            yield SimpleNamespace(text_delta=piece, kind=kind, law_class=law_class, result=None)
        yield SimpleNamespace(text_delta="", kind=None, law_class=None, result=result)
