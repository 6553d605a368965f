"""In-segment lookup: continue the current segment with text that followed the same suffix earlier.

Matching is on characters, not tokens, so an argument value typed after `"city": "` matches the same
word in the user's message even though the two are tokenized differently there. The longest suffix of
the current segment (at least `min_chars`) that occurs in a corpus wins; among equal lengths the earlier
corpus in the list wins, and inside one corpus the most recent occurrence. Corpora are separated by
NUL characters and a continuation never runs over one.
"""

from __future__ import annotations

from collections.abc import Sequence

SEPARATOR = "\x00"


def longest_match(query: str, corpus: str, end: int, min_k: int, max_k: int) -> tuple[int, int]:
    """(k, position) of the longest suffix of `query` (min_k <= k <= max_k) found in corpus[:end],
    most recent occurrence; (0, -1) when none. If a k-suffix occurs so does every shorter one, so k is
    found by binary search."""
    max_k = min(max_k, len(query))
    if max_k < min_k or end <= 0:
        return 0, -1
    pos = corpus.rfind(query[-min_k:], 0, end)
    if pos < 0:
        return 0, -1
    best_k, best_pos = min_k, pos
    lo, hi = min_k + 1, max_k
    while lo <= hi:
        mid = (lo + hi) // 2
        p = corpus.rfind(query[-mid:], 0, end)
        if p >= 0:
            best_k, best_pos = mid, p
            lo = mid + 1
        else:
            hi = mid - 1
    return best_k, best_pos


def continuation(query: str, corpora: Sequence[tuple[str, int]], *, min_chars: int = 3,
                 max_match: int = 64, max_chars: int = 64, follow_chars: int = 8) -> tuple[str, str, int]:
    """(text that followed the best earlier match, the text after that, matched length);
    ("", "", 0) if nothing matches. The second part (up to `follow_chars`) tells the tokenizer what
    comes next, so the continuation's last token is only kept if it would not merge with it.

    `corpora` are (text, end) pairs: only occurrences ending at or before `end` count.
    """
    best_k, best_text, best_pos = 0, "", -1
    for text, end in corpora:
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
