"""Incremental detokenisation of a row's history: token ids → text, and token ↔ character offsets.

Byte-level tokens may end in the middle of a UTF-8 character; an incremental decoder holds such bytes
until the character completes, so `char_end[i]` (characters decoded after token i) never splits one.
"""

from __future__ import annotations

import codecs

import numpy as np


class TokenBytes:
    """Per-token bytes of a vocabulary (special tokens as their text), computed once; `texts[i]`:
    token i's text where its bytes are whole UTF-8 characters on their own (None where they are not)."""

    def __init__(self, ll_tokenizer):
        self.ll = ll_tokenizer
        n = ll_tokenizer.vocab_size
        self.table: list[bytes] = [ll_tokenizer.decode_bytes([i]) for i in range(n)]
        self.texts: list[str | None] = [_whole_text(b) for b in self.table]
        # characters of each token's text, -1 where its bytes are not whole characters
        self.text_lengths = np.array([len(t) if t is not None else -1 for t in self.texts], dtype=np.int64)
        # the same texts as an object array: a run of tokens' texts in one take (`HistoryText.extend`)
        self.text_array = np.array(self.texts, dtype=object)

    def __getitem__(self, token: int) -> bytes:
        try:
            return self.table[token]
        except IndexError:
            return b""


WHOLE_RUN = 64  # tokens from which `HistoryText.extend` tries the numpy path


class HistoryText:
    """Decoded text of a growing token history.

    `freeze(at)` splits the text: what lies before character `at` (a row's prompt before the model's
    turn) is kept as it is and only the part after it grows, so appending a step's tokens copies
    nothing of the prompt. `slice(a, b)` reads it; `text` (the whole, joined) is for the ablation that
    searches the whole history and for tests."""

    __slots__ = ("_bytes", "_decoder", "_clean", "_head", "_live", "_base", "char_end")

    def __init__(self, token_bytes: TokenBytes):
        self._bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._clean = True  # the decoder holds no bytes of an unfinished character
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
        """Append tokens; return the newly decoded text. While the decoder holds no unfinished
        character, a token whose bytes are whole characters is taken as its text (a new row's whole
        prompt, usually: 0.75 ms at 4.9k tokens against about 2.5 ms through the decoder); the other
        tokens go through the incremental decoder."""
        if self._clean and len(token_ids) > WHOLE_RUN:
            new = self._extend_whole(token_ids)
            if new is not None:
                return new
        table, texts, decoder = self._bytes, self._bytes.texts, self._decoder
        decode, n_texts, clean = decoder.decode, len(texts), self._clean
        pieces = []
        count = len(self)
        ends = self.char_end
        for t in token_ids:
            t = int(t)
            piece = texts[t] if clean and 0 <= t < n_texts else None
            if piece is None:
                piece = decode(table[t])
                clean = not decoder.getstate()[0]
            if piece:
                pieces.append(piece)
                count += len(piece)
            ends.append(count)
        self._clean = clean
        new = "".join(pieces)
        self._live += new
        return new

    def _extend_whole(self, token_ids) -> str | None:
        """`extend` for a run of tokens that are all whole characters (a prompt, usually), in numpy:
        their texts joined and their ends summed at once (a 7.1k-token prompt 0.62 → 0.38 ms). None
        (nothing appended) where one is not: the decoder takes the run."""
        ids = np.asarray(token_ids, dtype=np.int64)
        lengths = self._bytes.text_lengths
        if ids.min() < 0 or ids.max() >= len(lengths):
            return None
        sizes = lengths[ids]
        if sizes.min() < 0:
            return None
        new = "".join(self._bytes.text_array[ids].tolist())
        self.char_end.extend((np.cumsum(sizes) + len(self)).tolist())
        self._live += new
        return new

    def token_start(self, i: int) -> int:
        """Character offset where token i's text starts."""
        return self.char_end[i - 1] if i > 0 else 0


def _whole_text(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
