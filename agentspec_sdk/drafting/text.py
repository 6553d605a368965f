"""Incremental detokenisation of a row's history: token ids → text, and token ↔ character offsets.

Byte-level tokens may end in the middle of a UTF-8 character; an incremental decoder holds such bytes
until the character completes, so `char_end[i]` (characters decoded after token i) never splits one.
"""

from __future__ import annotations

import codecs


class TokenBytes:
    """Per-token bytes of a vocabulary (special tokens as their text), computed once."""

    def __init__(self, ll_tokenizer):
        self.ll = ll_tokenizer
        n = ll_tokenizer.vocab_size
        self.table: list[bytes] = [ll_tokenizer.decode_bytes([i]) for i in range(n)]

    def __getitem__(self, token: int) -> bytes:
        try:
            return self.table[token]
        except IndexError:
            return b""


class HistoryText:
    """Decoded text of a growing token history.

    `freeze(at)` splits the text: what lies before character `at` (a row's prompt before the model's
    turn) is kept as it is and only the part after it grows, so appending a step's tokens copies
    nothing of the prompt. `slice(a, b)` reads it; `text` (the whole, joined) is for the ablation that
    searches the whole history and for tests."""

    __slots__ = ("_bytes", "_decoder", "_head", "_live", "_base", "char_end")

    def __init__(self, token_bytes: TokenBytes):
        self._bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._head, self._live, self._base = "", "", 0
        self.char_end: list[int] = []

    @property
    def text(self) -> str:
        return self._head + self._live

    def __len__(self) -> int:
        return self._base + len(self._live)

    def freeze(self, at: int) -> None:
        full = self.text
        at = max(0, min(at, len(full)))
        self._head, self._live, self._base = full[:at], full[at:], at

    def slice(self, start: int, end: int | None = None) -> str:
        """text[start:end] (offsets in the whole text, non-negative)."""
        base = self._base
        if start >= base:
            return self._live[start - base:None if end is None else end - base]
        if end is not None and end <= base:
            return self._head[start:end]
        return self._head[start:] + self._live[:None if end is None else end - base]

    def extend(self, token_ids) -> str:
        """Append tokens; return the newly decoded text."""
        table, decode = self._bytes, self._decoder.decode
        pieces = []
        count = len(self)
        ends = self.char_end
        for t in token_ids:
            piece = decode(table[int(t)])
            if piece:
                pieces.append(piece)
                count += len(piece)
            ends.append(count)
        new = "".join(pieces)
        self._live += new
        return new

    def token_start(self, i: int) -> int:
        """Character offset where token i's text starts."""
        return self.char_end[i - 1] if i > 0 else 0
