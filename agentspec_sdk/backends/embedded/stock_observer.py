"""Watch vLLM's own drafters (`ngram`, `suffix`) draft, without changing a token of what they propose.

The peers are only comparable by law class if we know where each of their drafts began: vLLM's
per-request counters say how many tokens a request drafted and accepted, not in which segment. In an
embedded engine (vLLM's engine core in this process) the engine wraps the drafter's `propose` and
appends, per row and step, the same "draft" lines the structure proposer writes (position, fingerprint
of the history, tokens) plus a timestamped "step" line, to the engine's records file. A finished
request then claims its drafts exactly as for `structure` (`vllm_metrics.RecordsTail.claim`), and the
replay labels each draft with the law class of the output token it began at. The drafts handed to
vLLM are the drafter's own, untouched; the observer costs a fingerprint per drafted row (≈ 20 µs at
3k tokens), well under 1% of a step here.

Not available under `vllm serve` (the engine core is another process): there the peers report
vLLM's per-request totals only.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np

from agentspec_sdk.drafting.fingerprint import prefix_hashes
from agentspec_sdk.drafting.records import RecordsFile

log = logging.getLogger("agentspec.backends")


def _rows_ngram(args, kwargs):
    """NgramProposer.propose(num_spec, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, ...)."""
    return args[2], args[3]


def _rows_suffix(args, kwargs):
    """SuffixDecodingProposer.propose(num_spec, input_batch, sampled_token_ids, ...)."""
    batch = args[1]
    return batch.num_tokens_no_spec, batch.token_ids_cpu


ROWS = {"ngram": _rows_ngram, "suffix": _rows_suffix}


class StockDraftObserver:
    """Wraps `drafter.propose` in place; `close()` puts the original back."""

    def __init__(self, drafter, method: str, records_path: str | Path, records_max_bytes: int | None = None):
        if method not in ROWS:
            raise ValueError(f"no observer for drafter method {method!r}")
        self.drafter, self.method = drafter, method
        self.records_path = Path(records_path)
        self.records_max_bytes = records_max_bytes  # rotated as the structure proposer's records are
        self._file = RecordsFile(self.records_path, records_max_bytes)  # kept open, as the proposer's
        self._rows = ROWS[method]
        self._original = drafter.propose
        self.failures = 0
        drafter.propose = self._propose

    def _propose(self, *args, **kwargs):
        at, started = time.time(), time.perf_counter()
        drafts = self._original(*args, **kwargs)
        seconds = time.perf_counter() - started  # the drafter's own time; the observer's is not in it
        try:
            self._log(drafts, *self._rows(args, kwargs), at, seconds)
        except Exception:  # accounting must never break decoding
            self.failures += 1
            if self.failures == 1:
                log.exception("observing %s drafts failed; per-class accounting is incomplete", self.method)
        return drafts

    def _log(self, drafts, num_tokens, token_ids, at: float, seconds: float) -> None:
        lines = []
        drafted = drafted_ctx = 0
        for i, draft in enumerate(drafts):
            if draft is None or not len(draft):
                continue
            n = int(num_tokens[i])
            tokens = [int(t) for t in draft]
            drafted += len(tokens)
            drafted_ctx += len(tokens) * n
            lines.append(json.dumps({"type": "draft", "position": n,
                                     "prefix_hash": int(prefix_hashes(np.asarray(token_ids[i][:n]))[-1]),
                                     "kind": None, "law_class": None, "source": self.method,
                                     "tokens": tokens}))
        ctx = int(sum(int(num_tokens[i]) for i in range(len(drafts))))
        lines.append(json.dumps({"type": "step", "t": round(at, 6), "rows": len(drafts), "drafted": drafted,
                                 "proposer_s": round(seconds, 7), "errors": 0, "ctx": ctx,
                                 "drafted_ctx": drafted_ctx}))
        self._file.append(lines)

    def close(self) -> None:
        self.drafter.propose = self._original
        self._file.close()
