"""In-segment lookup: continue the current segment with text that followed the same suffix earlier.

Matching is on characters, not tokens, so an argument value typed after `"city": "` matches the same
word in the user's message even though the two are tokenized differently there. The longest suffix of
the current segment (at least `min_chars`) that occurs in a corpus wins; among equal lengths the earlier
corpus in the list wins, and inside one corpus the most recent occurrence. Corpora are separated by
NUL characters and a continuation never runs over one.

Compiled (csrc/lookup, built by `pip install` as `agentspec_sdk.drafting._lookup`):

- `longest_match(query, corpus, end, min_k, max_k, start=0)`: (k, position) of the longest suffix of
  `query` (min_k <= k <= max_k) in corpus[start:end], most recent occurrence; (0, -1) when none. If a
  k-suffix occurs so does every shorter one, so k is found by binary search, each probe a reverse
  search as `str.rfind`.
- `CorpusIndex(text="")`: append-only text (`extend`) indexed by its `SHORT`- and `LONG`-character
  grams: per gram length one sorted array of 64-bit entries, a gram's 32-bit key above the end offset
  of one occurrence, so one key's occurrences are contiguous and in text order (`tables`).
  `longest_match(query, end, min_k, max_k)` examines at most `CAP` of the most recent occurrences of
  the query's last `LONG` characters (matches of `LONG` or more characters), and otherwise of its last
  `SHORT` characters: its work is bounded whatever the text's length. It answers as `longest_match`
  over the text unless a key has more than `CAP` occurrences, when an older, longer match may be
  missed. Up to `DIRECT` characters a string search is cheaper than the index and the text is not
  indexed; text appended after a build (at most `DIRECT` characters) is searched as a string, a longer
  tail is merged into the tables (a segment that ends costs no rebuild of a long corpus). `prepare()`
  builds the index now (a row's corpora when the row enters the batch); `CorpusIndex.extending(base,
  text)` takes over `base`'s tables where the text `base` indexed begins `text` (a row continuing its
  episode's previous turn), so only the grams ending in the new text are indexed; the tables are those
  one build over `text` makes. Grams whose keys collide are told apart: every candidate is compared as
  text. `checked` counts the entries an index examined.
- `continuation(query, corpora, *, min_chars=3, max_match=64, max_chars=64, follow_chars=8)`: (text
  that followed the best earlier match, the text after that, matched length); ("", "", 0) if nothing
  matches. `corpora` are (text, end) pairs, a text a str or a `CorpusIndex`: only occurrences ending at
  or before `end` count. The second part (up to `follow_chars`) tells the tokenizer what comes next,
  so the continuation's last token is only kept if it would not merge with it.
- `work()`: (characters the string searches may have scanned, index entries examined) in this process.

The keys: a 3-character gram is its code points (21 bits each), an 8-character one their polynomial
hash mod 2**64 (prime 0x100000001B3); a key is the high half of that code times 0x9E3779B97F4A7C15.
"""

from __future__ import annotations

from agentspec_sdk.drafting._lookup import CorpusIndex, continuation, longest_match, work

__all__ = ["SEPARATOR", "CorpusIndex", "continuation", "longest_match", "work"]

SEPARATOR = "\x00"
