"""Per-turn acceptance records: what one model call drafted and what the target accepted, per class."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class TurnRecord:
    """One model call of one agent."""

    agent_id: str | None
    request_id: str | None
    fmt: str
    tool_calls: tuple[str, ...]
    acceptance: dict[str, dict[str, int]]
    input_tokens: int
    output_tokens: int
    finish_reason: str | None
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def agent_key(base: str | None, config: Mapping[str, Any] | None) -> str | None:
    """The engine's id for an agent's sequence: `base`, qualified by the LangGraph thread id if any."""
    thread = ((config or {}).get("configurable") or {}).get("thread_id")
    if thread is None:
        return base
    return f"{base}:{thread}" if base else str(thread)


def current_config() -> Mapping[str, Any] | None:
    """The running LangGraph step's config, or None outside a graph run."""
    from langgraph.config import get_config

    try:
        return get_config()
    except RuntimeError:
        return None


def acceptance_of(result: Any) -> dict[str, dict[str, int]]:
    """`TurnResult.acceptance` as plain ints: {class: {"drafted": n, "accepted": n}}."""
    raw = getattr(result, "acceptance", None) or {}
    return {
        str(getattr(cls, "value", cls)): {
            "drafted": int(v.get("drafted", 0)),
            "accepted": int(v.get("accepted", 0)),
        }
        for cls, v in raw.items()
    }


def total_acceptance(records: Iterable[TurnRecord]) -> dict[str, dict[str, Any]]:
    """Drafted / accepted summed per class over turns, with the acceptance rate."""
    totals: dict[str, dict[str, Any]] = {}
    for rec in records:
        for cls, v in rec.acceptance.items():
            t = totals.setdefault(cls, {"drafted": 0, "accepted": 0})
            t["drafted"] += v["drafted"]
            t["accepted"] += v["accepted"]
    for t in totals.values():
        t["rate"] = t["accepted"] / t["drafted"] if t["drafted"] else None
    return dict(sorted(totals.items()))


class RecordLog:
    """A thread-safe list of turn records (tools and model calls may run on several threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[TurnRecord] = []

    def __call__(self, record: TurnRecord) -> None:
        with self._lock:
            self._records.append(record)

    @property
    def records(self) -> list[TurnRecord]:
        with self._lock:
            return list(self._records)

    def totals(self) -> dict[str, dict[str, Any]]:
        return total_acceptance(self.records)
