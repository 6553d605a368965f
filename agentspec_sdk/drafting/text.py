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
    """Decoded text of a growing token history."""

    __slots__ = ("_bytes", "_decoder", "text", "char_end")

    def __init__(self, token_bytes: TokenBytes):
        self._bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""
        self.char_end: list[int] = []

    def extend(self, token_ids) -> str:
        """Append tokens; return the newly decoded text."""
        table, decode = self._bytes, self._decoder.decode
        pieces = []
        count = len(self.text)
        ends = self.char_end
        for t in token_ids:
            piece = decode(table[int(t)])
            if piece:
                pieces.append(piece)
                count += len(piece)
            ends.append(count)
        new = "".join(pieces)
        self.text += new
        return new

    def token_start(self, i: int) -> int:
        """Character offset where token i's text starts."""
        return self.char_end[i - 1] if i > 0 else 0
