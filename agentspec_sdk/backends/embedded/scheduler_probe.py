"""What each target pass computed, read from vLLM's own scheduler: prefill chunks, decoding rows and
the draft tokens they verify.

The engine's output of a pass says which requests got tokens, not what the pass computed: a long
prompt is prefilled in chunks of at most `max_num_batched_tokens` over several passes, and only the
last one emits a token. Attributing the whole prompt to that pass (what the output-based pass log
does) makes the earlier chunk passes look like slow decode passes and the last one like a huge
prefill. The scheduler knows exactly: `SchedulerOutput.num_scheduled_tokens` per request and
`scheduled_spec_decode_tokens` (the drafts it verifies, already trimmed to the request's grammar),
with each request's `num_computed_tokens` (advanced by the scheduled tokens before `schedule()`
returns) and `num_prompt_tokens`. The probe wraps `scheduler.schedule` in place (the scheduler's
output is returned untouched) and keeps one composition per call until the engine loop takes them.

Only for an embedded engine (vLLM's engine core in this process); `close()` puts `schedule` back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping

log = logging.getLogger("agentspec.backends")

# per pass: prefill tokens, their attention context (Σ chunk × mean position, in 1k-token units),
# decoding rows, their context, draft tokens verified, Σ drafts × context
FIELDS = ("prefill_tokens", "prefill_ctx", "decode_rows", "decode_ctx", "spec_drafted", "spec_drafted_ctx")


def composition(output, requests: Mapping) -> dict:
    """One `SchedulerOutput` read against the scheduler's `requests` (after `schedule()` advanced
    `num_computed_tokens`): what the pass computes, per FIELDS."""
    out = dict.fromkeys(FIELDS, 0.0)
    spec = getattr(output, "scheduled_spec_decode_tokens", None) or {}
    for req_id, n in output.num_scheduled_tokens.items():
        req = requests.get(req_id)
        if req is None or n <= 0:
            continue
        after = int(req.num_computed_tokens)
        before = after - int(n)
        prompt = int(req.num_prompt_tokens)
        if before < prompt:  # a prefill chunk (the last one also samples the first token)
            chunk = min(after, prompt) - before
            out["prefill_tokens"] += chunk
            out["prefill_ctx"] += chunk * (before + chunk / 2.0) / 1000.0
        else:  # a decoding row: one new token plus its verified drafts, over `before` tokens of context
            drafts = len(spec.get(req_id) or ())
            out["decode_rows"] += 1
            out["decode_ctx"] += before
            out["spec_drafted"] += drafts
            out["spec_drafted_ctx"] += drafts * before
    return out


def merge(parts: Iterable[Mapping]) -> dict:
    """The compositions of one engine step summed (normally one `schedule()` per step)."""
    total = dict.fromkeys(FIELDS, 0.0)
    for p in parts:
        for k in FIELDS:
            total[k] += float(p.get(k, 0.0))
    return total


class SchedulerProbe:
    """Wraps `scheduler.schedule`; `take()` returns (and forgets) the compositions since the last take."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self._original = scheduler.schedule
        self._pending: list[dict] = []
        self._lock = threading.Lock()
        self.failures = 0
        scheduler.schedule = self._schedule

    def _schedule(self, *args, **kwargs):
        output = self._original(*args, **kwargs)
        try:
            comp = composition(output, self.scheduler.requests)
            with self._lock:
                self._pending.append(comp)
        except Exception:  # accounting must never break decoding
            self.failures += 1
            if self.failures == 1:
                log.exception("reading the scheduler's output failed; the pass log falls back to outputs")
        return output

    def take(self) -> dict | None:
        with self._lock:
            parts, self._pending = self._pending, []
        return merge(parts) if parts else None

    def close(self) -> None:
        self.scheduler.schedule = self._original

    @classmethod
    def attach(cls, llm_engine) -> SchedulerProbe | None:
        """A probe on an embedded engine's scheduler; None where the engine core is another process."""
        try:
            scheduler = llm_engine.engine_core.engine_core.scheduler
        except AttributeError:
            return None
        if not hasattr(scheduler, "schedule") or not hasattr(scheduler, "requests"):
            return None
        return cls(scheduler)
