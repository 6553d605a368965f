"""In-segment lookup: continue the current segment with text that followed the same suffix earlier.

Matching is on characters, not tokens, so an argument value typed after `"city": "` matches the same
word in the user's message even though the two are tokenized differently there. The longest suffix of
the current segment (at least `min_chars`) that occurs in a corpus wins; among equal lengths the earlier
corpus in the list wins, and inside one corpus the most recent occurrence. Corpora are separated by
NUL characters and a continuation never runs over one.

Corpora that grow with the context (the prompt before the turn, earlier segments of each kind) are
`CorpusIndex`es: the longest match is found from the most recent occurrences of the query's last
characters, so a lookup's work does not grow with the context (see `CorpusIndex`). The current segment
is searched with `str.rfind` (it is bounded by the turn).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SEPARATOR = "\x00"


def longest_match(query: str, corpus: str, end: int, min_k: int, max_k: int,
                  start: int = 0) -> tuple[int, int]:
    """(k, position) of the longest suffix of `query` (min_k <= k <= max_k) found in
    corpus[start:end], most recent occurrence; (0, -1) when none. If a k-suffix occurs so does every
    shorter one, so k is found by binary search."""
    max_k = min(max_k, len(query))
    if max_k < min_k or end <= 0:
        return 0, -1
    pos = corpus.rfind(query[-min_k:], start, end)
    if pos < 0:
        return 0, -1
    best_k, best_pos = min_k, pos
    lo, hi = min_k + 1, max_k
    while lo <= hi:
        mid = (lo + hi) // 2
        p = corpus.rfind(query[-mid:], start, end)
        if p >= 0:
            best_k, best_pos = mid, p
            lo = mid + 1
        else:
            hi = mid - 1
    return best_k, best_pos


class CorpusIndex:
    """Append-only text indexed by its `SHORT`- and `LONG`-character grams: per gram length, one sorted
    array of 64-bit entries, each a gram's 32-bit key above the end offset of one occurrence, so the
    occurrences of a key are contiguous and in text order. `longest_match` examines at most `CAP` of
    the most recent occurrences of the query's last `LONG` characters (matches of `LONG` or more
    characters), and otherwise of its last `SHORT` characters: its work is bounded whatever the text's
    length. It is exact (the same answer as `longest_match` over the text) unless a key has more than
    `CAP` occurrences, when an older, longer match may be missed. Text appended after the index was
    built (at most DIRECT characters, see `extend`) is searched as a string. `checked` counts the
    occurrences examined. A key is a hash of the gram (`_gram_keys`): grams that share one are told
    apart because every candidate is compared as text anyway.

    Why packed entries: numpy sorts a plain uint64 array with its SIMD sort, 15 times faster than a
    stable argsort of the keys (16k characters: 0.045 ms against 0.66 ms per gram length), and a row
    builds its prompt's index when it enters the batch."""

    SHORT, LONG, CAP = 3, 8, 48
    DIRECT = 4096  # up to this many characters a string search is cheaper than the index (and bounded)
    __slots__ = ("text", "_tables", "_indexed", "checked")

    def __init__(self, text: str = ""):
        self.text = ""
        self._tables: dict[int, np.ndarray] | None = None  # built at the first search
        self._indexed = 0  # the index covers text[:_indexed]
        self.checked = 0
        self.extend(text)

    def __len__(self) -> int:
        return len(self.text)

    def extend(self, piece: str) -> None:
        """Append text. The index keeps covering the text it was built on; what is appended after it
        is searched as a string until it is longer than DIRECT, and then the index is rebuilt, so a
        segment that ends costs no rebuild of a long corpus (it cost an argsort of the whole corpus
        each time: 0.17 ms per step at 6k-token contexts)."""
        if piece:
            self.text += piece

    def prepare(self) -> None:
        """Build the index now where searches will use it (a row's corpora when the row enters the
        batch: in the pass that prefills its prompt, not in the first step that searches them)."""
        n = len(self.text)
        if self.DIRECT < n < _MAX_OFFSET and (self._tables is None or self._indexed < n):
            self._build()

    @classmethod
    def extending(cls, base: CorpusIndex, text: str) -> CorpusIndex:
        """An index over `text` that takes over `base`'s gram tables where the text `base` indexed is
        the beginning of `text` (a row continuing its episode's previous turn: its prompt begins with
        that turn's prompt), so `prepare` indexes only the grams that end in the new text. The tables
        are those a new index over `text` builds."""
        out = cls(text)
        indexed = base._indexed
        if base._tables is not None and indexed <= len(text) and text.startswith(base.text[:indexed]):
            out._tables, out._indexed = base._tables, indexed
        return out

    def _build(self) -> None:
        """Index every gram of the text: the grams ending after `_indexed` merged into the tables
        (sorted arrays are never changed in place: an index that took them over keeps its own)."""
        n = len(self.text)
        old, start = (self._tables, self._indexed) if self._tables is not None else ({}, 0)
        self._tables = {}
        self._indexed = n
        for gram in (self.SHORT, self.LONG):
            first = max(0, start - gram + 1)  # the earliest window that ends after `start`
            codes = np.frombuffer(self.text[first:].encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
            if len(codes) < gram:
                new = np.zeros(0, np.uint64)
            else:
                keys = _gram_keys(codes, gram)
                ends = np.arange(first + gram, n + 1, dtype=np.uint64)
                new = np.sort((keys << _OFFSET_BITS) | ends)
            kept = old.get(gram)
            if kept is not None and len(kept):
                if len(new):  # two sorted runs: numpy's stable sort (a timsort) merges them in one
                    new = np.concatenate([kept, new])  # pass, 3-4x faster than np.insert
                    new.sort(kind="stable")
                else:
                    new = kept
            self._tables[gram] = new

    def _ends(self, gram: int, key: str, end: int) -> list[int]:
        """End offsets (at most `end`) of the occurrences of `key`'s hash, the most recent `CAP`,
        latest first."""
        table = self._tables[gram]
        base = _key_hash(key) << 32
        lo = int(table.searchsorted(np.uint64(base), "left"))
        stop = int(table.searchsorted(np.uint64(base | end), "right"))
        if lo >= stop:
            return []
        sel = table[max(lo, stop - self.CAP):stop] & _OFFSET_MASK
        return sel[::-1].tolist()

    def longest_match(self, query: str, end: int, min_k: int, max_k: int) -> tuple[int, int]:
        """As `longest_match(query, self.text, end, min_k, max_k)`, from the indexed occurrences."""
        max_k = min(max_k, len(query))
        if max_k < min_k or end <= 0:
            return 0, -1
        if min_k < self.SHORT or not self.DIRECT < len(self.text) < _MAX_OFFSET:  # offsets: 32 bits
            return longest_match(query, self.text, end, min_k, max_k)
        if self._tables is None or len(self.text) - self._indexed > self.DIRECT:
            self._build()
        k, pos = self._indexed_match(query, min(end, self._indexed), min_k, max_k)
        if end > self._indexed:  # the text appended since the build: a bounded string search, which
            # also sees matches that begin in the indexed text; on equal length it is the more recent
            tail_k, tail_pos = longest_match(query, self.text, end, min_k, max_k,
                                             max(0, self._indexed - max_k))
            if tail_k and tail_k >= k:
                return tail_k, tail_pos
        return k, pos

    def _indexed_match(self, query: str, end: int, min_k: int, max_k: int) -> tuple[int, int]:
        if end <= 0:
            return 0, -1
        best_k, best_e = 0, -1
        if max_k >= self.LONG:
            best_k, best_e = self._best(self._ends(self.LONG, query[-self.LONG:], end), query, self.LONG,
                                        max_k)
        if best_k == 0:
            best_k, best_e = self._best(self._ends(self.SHORT, query[-self.SHORT:], end), query, min_k,
                                        min(max_k, self.LONG - 1))
        return (best_k, best_e - best_k) if best_k else (0, -1)

    def _best(self, recent: list[int], query: str, min_k: int, max_k: int) -> tuple[int, int]:
        text = self.text
        best_k, best_e, seen = 0, -1, 0
        for e in recent:
            if best_k >= max_k:
                break
            seen += 1
            want = max(best_k + 1, min_k)  # a match no longer than the best so far loses to it
            if want > e or text[e - want:e] != query[-want:]:
                continue
            lo, hi = want, min(max_k, e)  # text[e-lo:e] matches; find the longest by bisection
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if text[e - mid:e] == query[-mid:]:
                    lo = mid
                else:
                    hi = mid - 1
            best_k, best_e = lo, e
        self.checked += seen
        return best_k, best_e


_PRIME = np.uint64(0x100000001B3)
_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: a key is the high half of code * _MIX
_OFFSET_BITS = np.uint64(32)
_MAX_OFFSET = 1 << 32
_OFFSET_MASK = np.uint64(_MAX_OFFSET - 1)
_MASK64 = (1 << 64) - 1
_MIX_INT = int(_MIX)


def _gram_codes(codes: np.ndarray, gram: int) -> np.ndarray:
    """One code per `gram`-character window of `codes` (uint64 code points): exact for 3 characters
    (21 bits each), a polynomial hash mod 2**64 for longer grams, Σ_j codes[i + j] · P^(gram-1-j).
    A power-of-two gram is hashed by doubling (the hash of 2m characters is the first m's times P^m
    plus the last m's): 6 array passes for 8 characters, not 16."""
    n = len(codes) - gram + 1
    if n <= 0:
        return np.zeros(0, dtype=np.uint64)
    if gram == 3:
        return (codes[:n] << np.uint64(42)) | (codes[1:n + 1] << np.uint64(21)) | codes[2:n + 2]
    with np.errstate(over="ignore"):
        if gram & (gram - 1) == 0:
            h, width = codes, 1
            while width < gram:
                h = h[:len(h) - width] * np.uint64(pow(int(_PRIME), width, 1 << 64)) + h[width:]
                width *= 2
            return h
        h = np.zeros(n, dtype=np.uint64)
        for j in range(gram):
            h = h * _PRIME + codes[j:n + j]
    return h


def _gram_keys(codes: np.ndarray, gram: int) -> np.ndarray:
    """The 32-bit key of every `gram`-character window: the high half of its code times `_MIX`."""
    with np.errstate(over="ignore"):
        return (_gram_codes(codes, gram) * _MIX) >> _OFFSET_BITS


def _key_code(key: str) -> int:
    """`_gram_codes` of one gram, in Python integers."""
    if len(key) == 3:
        return (ord(key[0]) << 42) | (ord(key[1]) << 21) | ord(key[2])
    h, prime = 0, int(_PRIME)
    for ch in key:
        h = (h * prime + ord(ch)) & _MASK64
    return h


_KEY_HASHES: dict[str, int] = {}  # a query's last grams are looked up in every corpus of a lookup
_KEY_HASHES_MAX = 1 << 16


def _key_hash(key: str) -> int:
    """`_gram_keys` of one gram, in Python integers."""
    h = _KEY_HASHES.get(key)
    if h is None:
        if len(_KEY_HASHES) >= _KEY_HASHES_MAX:
            _KEY_HASHES.clear()
        h = _KEY_HASHES[key] = ((_key_code(key) * _MIX_INT) & _MASK64) >> 32
    return h


def continuation(query: str, corpora: Sequence[tuple[str | CorpusIndex, int]], *, min_chars: int = 3,
                 max_match: int = 64, max_chars: int = 64, follow_chars: int = 8) -> tuple[str, str, int]:
    """(text that followed the best earlier match, the text after that, matched length);
    ("", "", 0) if nothing matches. The second part (up to `follow_chars`) tells the tokenizer what
    comes next, so the continuation's last token is only kept if it would not merge with it.

    `corpora` are (text, end) pairs, a text a str or a `CorpusIndex`: only occurrences ending at or
    before `end` count.
    """
    best_k, best_text, best_pos = 0, "", -1
    for text, end in corpora:
        if isinstance(text, CorpusIndex):
            k, pos = text.longest_match(query, end, min_chars, max_match)
            text = text.text
        else:
            k, pos = longest_match(query, text, end, min_chars, max_match)
        if k > best_k:
            best_k, best_text, best_pos = k, text, pos
    if best_k == 0:
        return "", "", 0
    start = best_pos + best_k
    window = best_text[start:start + max_chars + follow_chars]
    cut = window.find(SEPARATOR)
    if cut >= 0:
        window = window[:cut]
    return window[:max_chars], window[max_chars:], best_k
