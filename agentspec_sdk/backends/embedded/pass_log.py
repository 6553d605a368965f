"""The embedded engine's pass log: one entry per engine step (one target pass), with what it computed
(rows, new tokens, context, first-token prefill, grammar rows) and, where vLLM's scheduler runs in
this process, what the scheduler put in it (`scheduler_probe.FIELDS`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["PassLog", "MAX_PASS_LOG"]

MAX_PASS_LOG = 1_000_000


class PassLog:
    def __init__(self, no_spec: bool) -> None:
        self.no_spec = int(no_spec)  # an engine without speculative decoding: vLLM's plain sampling path
        # (t, s, rows, tokens, ctx, prefill, new, grammar, scheduled composition or None)
        self._passes: deque[tuple] = deque(maxlen=MAX_PASS_LOG)

    def record(self, at: float, seconds: float, outputs: Iterable[Any], live: Mapping[str, Any],
               scheduled: dict | None) -> None:
        """One pass: `outputs` are vLLM's request outputs of the step, `live` the engine's turns by
        vLLM id (each with `prompt_ids`, `sampling`, and `seen`, the output tokens counted so far,
        which this updates)."""
        rows = tokens = ctx = prefill = new = grammar = 0
        for out in outputs:
            turn = live.get(out.request_id)
            if turn is None:
                continue
            n = len(out.outputs[0].token_ids)
            rows, tokens, ctx = rows + 1, tokens + n - turn.seen, ctx + len(turn.prompt_ids) + n
            grammar += getattr(turn.sampling, "structured_outputs", None) is not None
            if not turn.seen and n:  # the pass of the first token: the prompt was prefilled in it
                prefill += len(turn.prompt_ids) - int(getattr(out, "num_cached_tokens", 0) or 0)
                new += 1
            turn.seen = n
        self._passes.append((at, seconds, rows, tokens, ctx, prefill, new, grammar, scheduled))

    def entries(self, start: float = 0.0, end: float = float("inf")) -> list[dict]:
        """The passes that began between `start` and `end` (time.time()): `{"t", "s" (seconds), "rows"
        (requests that got tokens), "tokens" (new tokens), "ctx" (their context lengths summed),
        "prefill" (uncached prompt tokens of requests whose first token came in this pass), "new" (those
        requests: their decode starts after it), "grammar" (rows decoding under a grammar: a token
        bitmask per row and pass)}`, and where vLLM's scheduler is in this process what the pass
        computed (`scheduler_probe.FIELDS`: prefill chunk tokens and their context, decoding rows, the
        draft tokens they verify); `no_spec`: 1 for an engine without speculative decoding (vLLM's
        plain sampling path, a pass cost term of its own)."""
        return [{"t": t, "s": s, "rows": r, "tokens": k, "ctx": c, "prefill": p, "new": n, "grammar": g,
                 "no_spec": self.no_spec, **(sched or {})}
                for t, s, r, k, c, p, n, g, sched in list(self._passes) if start <= t <= end]
