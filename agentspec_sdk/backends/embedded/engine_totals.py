"""Totals over an engine's finished turns: requests, errors, output tokens, the drafts claimed from
the proposer's records, vLLM's own per-request spec-decode counts, and acceptance per law class."""

from __future__ import annotations

import json
import threading

from agentspec_sdk.backends.vllm_metrics import merge_acceptance

__all__ = ["EngineTotals"]


class EngineTotals:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = {"requests": 0, "errors": 0, "output_tokens": 0, "claimed_drafted": 0,
                        "claimed_accepted": 0}
        self._vllm = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
        self._acceptance: dict[str, dict[str, int]] = {}

    def error(self) -> None:
        with self._lock:
            self._counts["errors"] += 1

    def finished(self, output_tokens: int, records: list[dict], spec: dict | None,
                 acceptance: dict[str, dict[str, int]]) -> None:
        with self._lock:
            self._counts["requests"] += 1
            self._counts["output_tokens"] += output_tokens
            self._counts["claimed_drafted"] += sum(r["drafted"] for r in records)
            self._counts["claimed_accepted"] += sum(r["accepted"] for r in records)
            if spec:
                self._vllm["num_drafts"] += spec["num_spec_steps"]
                self._vllm["num_draft_tokens"] += spec["num_draft_tokens"]
                self._vllm["num_accepted_tokens"] += spec["num_accepted_draft_tokens"]
            merge_acceptance(self._acceptance, acceptance)

    def snapshot(self) -> tuple[dict, dict, dict]:
        """(counts, vLLM's counts, acceptance per class), copies."""
        with self._lock:
            return dict(self._counts), dict(self._vllm), json.loads(json.dumps(self._acceptance))
