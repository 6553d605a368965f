"""Per-token law classes of a model output: each token takes the class of the span its first character
falls in (spans from the segmenter, in character offsets of the decoded text)."""

from __future__ import annotations

import threading
from typing import Any


class TokenClassifier:
    """Assigns each output token to the law class of the span its first character falls in."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._lock = threading.Lock()
        self._cache: dict[int, int] = {}

    def _length(self, token_id: int) -> int:
        with self._lock:
            n = self._cache.get(token_id)
            if n is None:
                n = self._cache[token_id] = len(self.tokenizer.decode([token_id]))
            return n

    def counts(self, text: str, token_ids: list[int], spans: list[Any]) -> dict[str, int]:
        return count_labels(self.labels(text, token_ids, spans))

    def starts(self, text: str, token_ids: list[int]) -> list[int]:
        """The character offset in `text` where each token begins."""
        out, pos = [], 0
        for tid in token_ids:
            out.append(pos)
            pos = min(pos + self._length(tid), len(text))
        return out

    def labels(self, text: str, token_ids: list[int], spans: list[Any]) -> str:
        """The law class of each token, one letter per token."""
        if not token_ids:
            return ""
        bounds = [(_get(s, "start"), _get(s, "end"), _law(s)) for s in spans]
        last = bounds[-1][2] if bounds else "F"
        out = []
        for pos in self.starts(text, token_ids):
            out.append(next((law for start, end, law in bounds if start <= pos < end), last))
        return "".join(out)


def count_labels(labels: str) -> dict[str, int]:
    """Tokens per law class from per-token labels ("SSR…")."""
    out = {"S": 0, "R": 0, "F": 0}
    for cls in labels:
        out[cls] = out.get(cls, 0) + 1
    return out


def _get(span: Any, key: str) -> Any:
    return span[key] if isinstance(span, dict) else getattr(span, key)


def _law(span: Any) -> str:
    law = _get(span, "law_class")
    return getattr(law, "value", law)
