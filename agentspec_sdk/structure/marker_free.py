"""Marker-free text as one plain regex, for llguidance's lexer.

A turn grammar's free text (a thought, a code body, an answer) is text without any marker the
segmenter splits on, often followed by the marker that ends it, in one lexeme. Written with
llguidance's `&` and `~` (``/(?s:.*)M/ & ~/(?s:.*(?:A|B|M).+)/``) the language is right, but then
llguidance cannot fill a mask in that state from its token slices: it walks the whole vocabulary,
0.29 ms per mask with SmolLM2's 49k tokens, and vLLM fills one per draft position and row, every
pass. The same language as a plain regex, built here from the markers' automaton, lets the slices
of `backends.inside_vllm.vllm_grammar` apply (docs/formats.md, "Free text and the cost of a mask").

The automaton reads the text and keeps the longest suffix that is a proper prefix of a marker (the
Aho-Corasick states); a marker that completes kills the text, except the final marker at the very
end. `not_first` adds a second part to the state: the text so far while it is a proper prefix of one
of those (a text may not begin with them). The language is turned into a regex by state elimination;
markers that all end with one character they hold nowhere else (ReAct's `:`) get a linear form.
`token_slices` gives llguidance's tokenizer the slices these regexes are written for.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from agentspec_sdk.errors import FormatError
from agentspec_sdk.structure.schema.grammar_ir import regex_char

__all__ = ["marker_free_regex", "then_pieces", "token_slices"]

_OTHER = None  # the class of every character that appears in no marker
_FINAL = "F"


def marker_free_regex(avoid: Sequence[str], *, then: str | None = None,
                      not_first: Sequence[str] = ()) -> str:
    """Regex (the common syntax of Rust's `regex` and python's `re`, for a Lark ``/…/``) of:

    - `then` None: the non-empty texts in which no marker of `avoid` occurs, that do not begin
      with a marker of `not_first` (llguidance: ``/(?s:.+)/ & ~/(?s:.*(?:A|B).*)/ & ~/(?:H)(?s:.*)/``);
    - `then` a marker: the texts (maybe empty) followed by `then`, in which no marker of `avoid`
      ends before the last character (``/(?s:.*)M/ & ~/(?s:.*(?:A|B).+)/``).

    FormatError, naming the markers, where no text is left (a marker of `avoid` inside `then`)."""
    return _marker_free(tuple(sorted({m for m in avoid if m})), then,
                        tuple(sorted({h for h in not_first if h})))


@functools.lru_cache(maxsize=256)
def _marker_free(avoid: tuple[str, ...], then: str | None, heads: tuple[str, ...]) -> str:
    if then is not None and not then:
        raise FormatError("free text: the marker that ends it is empty")
    markers = tuple(sorted(set(avoid) | ({then} if then else set())))
    # The form decides which token slices llguidance can take whole (`token_slices` leaves out each
    # marker's first punctuation, else its last): after text without those characters the automaton
    # is back at its start, or, in the last-character form, in a piece that never ends the text.
    last = _common_last(markers)
    if last is not None and not heads and not all(_punct(m[0]) for m in markers):
        return _by_last_char(avoid, then, last)
    alphabet = sorted({c for m in markers + heads for c in m})
    prefixes = {""} | {m[:i] for m in markers for i in range(len(m))}
    head_prefixes = {h[:i] for h in heads for i in range(1, len(h))}

    def step(state, c):
        """The state after character c (None: the class of all others), None where the text dies."""
        text, head, _ = state
        if head is not None:
            grown_head = head + c if c is not None else None
            if grown_head in heads:
                return None
            head = grown_head if grown_head in head_prefixes else None
        grown = text + c if c is not None else ""
        done_avoid = any(grown.endswith(m) for m in avoid)
        done_then = then is not None and grown.endswith(then)
        while grown not in prefixes:  # "" is one
            grown = grown[1:]
        if done_then:  # the text may end here; past here only if no marker of `avoid` ended
            return grown, head, "end" if done_avoid else "accept"
        if done_avoid:
            return None
        return grown, head, "" if then is not None else "accept"

    start = ("", "" if heads else None, "")
    edges: dict[tuple, dict[tuple, set]] = {}
    todo = [start]
    while todo:
        state = todo.pop()
        out: dict[tuple, set] = {}
        if state[2] != "end":
            for c in alphabet + [_OTHER]:
                nxt = step(state, c)
                if nxt is not None:
                    out.setdefault(nxt, set()).add(c)
        edges[state] = out
        todo.extend(q for q in out if q not in edges and q not in todo)
    if not heads:
        _split_restarts(edges, start, {m[0] for m in markers})
    regex = _eliminate(edges, start, set(alphabet))
    if regex is None:
        raise FormatError(f"free text: no text avoids the markers {list(avoid)!r}"
                          + (f" before {then!r} (one of them lies inside it)" if then else ""))
    return regex


def _punct(c: str) -> bool:
    return c.isascii() and not c.isalnum() and not c.isspace()


def _common_last(markers: Sequence[str]) -> str | None:
    """The character every marker ends with and none holds elsewhere (ReAct's `:`), or None."""
    if not markers:
        return None
    last = markers[0][-1]
    if all(m[-1] == last and last not in m[:-1] for m in markers):
        return last
    return None


def then_pieces(avoid: Sequence[str], then: str) -> tuple[str | None, str] | None:
    """The language of `marker_free_regex(avoid, then=then)` as a rule of two lexemes,
    ``PIECE* FINAL`` (regexes `(piece, final)`; `piece` None: no piece is possible), where the
    markers are those of the last-character form (ReAct's): each lexeme ends at the first `:`,
    so llguidance's greedy lexer splits the text there without giving bytes back, and a mask
    while FINAL (`[^:]*Action:`) is being read takes the token slices whole (6 µs), where one
    lexeme for the whole text did not (0.29 ms; docs/formats.md). None where that form does not
    apply."""
    avoid = tuple(sorted({m for m in avoid if m}))
    markers = tuple(sorted(set(avoid) | {then}))
    last = _common_last(markers)
    if last is None or all(_punct(m[0]) for m in markers):
        return None
    words = {m[:-1] for m in avoid}
    k = regex_char(ord(last), False)
    piece = None if "" in words else _not_ending_with(words, last) + k
    final = "[^" + regex_char(ord(last), True) + "]*" + "".join(regex_char(ord(c), False) for c in then)
    return piece, final


def _by_last_char(avoid: Sequence[str], then: str | None, last: str) -> str:
    """The language of `marker_free_regex` when every marker ends with `last` and holds it nowhere
    else: a marker can only complete at a `last`, so the text is pieces without `last`, each followed
    by `last` only where it does not end with a marker's word (the marker without `last`); the
    final marker's word ends the last piece. Linear in the markers' length (the automaton's state
    elimination gives ReAct's markers 5-6 KB). Without `then` llguidance takes the slices whole in
    it; with `then` it does not, and the turn grammar uses `then_pieces` instead."""
    if then is not None:  # the pieces, then the final one (`then_pieces`)
        piece, final = then_pieces(avoid, then)
        return f"(?:{piece})*{final}" if piece is not None else final
    other = "[^" + regex_char(ord(last), True) + "]"
    words = {m[:-1] for m in avoid}
    if "" in words:  # `last` alone is a marker: it never appears
        return f"{other}+"
    piece = _not_ending_with(words, last) + regex_char(ord(last), False)
    return f"(?:(?:{piece})+{other}*|{other}+)"


def _not_ending_with(words: set[str], last: str) -> str:
    """Regex of the strings without `last` that end with none of `words` (non-empty, without
    `last`): the longest suffix u of such a string that is a suffix of a word must have no word as
    its own suffix, and either it is the whole string or the character before it leaves the
    words' suffixes."""
    suffixes = {w[i:] for w in words for i in range(len(w) + 1)}
    ok = sorted(u for u in suffixes if not any(u.endswith(w) for w in words))
    lit = lambda u: "".join(regex_char(ord(c), False) for c in u)  # noqa: E731
    wholes = [lit(u) for u in ok if u]
    tails = []
    for u in ok:
        before = sorted({v[0] for v in suffixes if len(v) == len(u) + 1 and v[1:] == u} | {last})
        tails.append("[^" + "".join(regex_char(ord(c), True) for c in before) + "]" + lit(u))
    alts = [""] + wholes  # the empty string, and a whole string that is a suffix of a word
    body = f"[^{regex_char(ord(last), True)}]*(?:{'|'.join(tails)})"
    return "(?:" + "|".join(alts + [body]) + ")"


_RESTART = ("", None, "restart")  # the start state, where the next character must begin a marker


def _split_restarts(edges: dict, start: tuple, firsts: set) -> None:
    """Where a state steps on every marker's first character c to the state that c leads to from
    the start (the text so far holds no partial marker that c would extend), those steps become one
    empty step to `_RESTART`, a copy of the start that only reads first characters. The states that
    first characters lead to are then entered from two states, not from every state: without this,
    state elimination gives ReAct's markers a 92 KB regex."""
    hubs = {}
    for target, cs in edges[start].items():
        for c in cs & firsts:
            hubs[c] = target
    for state, out in edges.items():
        if state == start or any(c not in out.get(hubs[c], ()) for c in hubs):
            continue
        for c, hub in hubs.items():
            out[hub] = out[hub] - {c}
            if not out[hub]:
                del out[hub]
        out[_RESTART] = {""}
    edges[_RESTART] = {}
    for c, hub in hubs.items():  # two first characters may lead to one state
        edges[_RESTART].setdefault(hub, set()).add(c)


def _eliminate(edges: dict, start: tuple, alphabet: set) -> str | None:
    """The regex of the paths from `start` to an accepting state (state elimination; `start`
    itself is not accepting: the empty text is never in the language)."""
    R: dict[object, dict[object, str]] = {
        p: {q: _class_regex(cs, alphabet) for q, cs in out.items()} for p, out in edges.items()}
    for p in edges:
        if p[2] in ("accept", "end") and p != start:
            R[p][_FINAL] = ""
    R["S"] = dict(R[start])  # a fresh start: `start` may be entered again later (and accept then)
    R[_FINAL] = {}
    # the longest prefixes first, the start state last: the regex is then a loop of excursions from
    # the start and back (`(?:…)*`), the shape llguidance subsumes token slices into (a state
    # elimination in another order gave regexes as exact, and masks as slow as `&`/`~`)
    for k in sorted(edges, key=lambda s: (s == start, s == _RESTART, -len(s[0]), -len(s[1] or ""), s)):
        loop = R[k].pop(k, None)
        star = f"(?:{loop})*" if loop is not None else ""
        for p in R:
            if k not in R[p]:
                continue
            into = R[p].pop(k)
            for q, out in R[k].items():
                piece = _cat(into, star, out)
                R[p][q] = f"{R[p][q]}|{piece}" if q in R[p] else piece
        del R[k]
    return R["S"].get(_FINAL)


def _cat(*parts: str) -> str:
    return "".join(p if _is_atom(p) else f"(?:{p})" for p in parts if p)


def _is_atom(r: str) -> bool:
    """No top-level alternation (so it concatenates without a group)."""
    depth, i = 0, 0
    while i < len(r):
        ch = r[i]
        if ch == "\\":
            i += 2
            continue
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "|" and depth == 0:
            return False
        i += 1
    return True


def _class_regex(cs: set, alphabet: set) -> str:
    """One step's characters: those listed in `cs`, or (`cs` holding `_OTHER`) every character but
    the rest of the alphabet; "" for the empty step."""
    if cs == {""}:
        return ""
    listed = {c for c in cs if c is not _OTHER}
    if _OTHER in cs:
        excluded = sorted(alphabet - listed)
        if not excluded:
            return "(?s:.)"
        return "[^" + "".join(regex_char(ord(c), True) for c in excluded) + "]"
    if len(listed) == 1:
        return regex_char(ord(next(iter(listed))), False)
    return "[" + "".join(regex_char(ord(c), True) for c in sorted(listed)) + "]"


# llguidance's own slices (`LLTokenizer.general_slices()`): whitespace, then JSON string contents
_WHITESPACE = r"[\x20\x0A\x0D\x09]+"
_JSON_CLASS = r'^"\\\x00-\x1F\x7F'


def token_slices(markers: Sequence[str]) -> list[str]:
    """Token slices for llguidance's tokenizer (`LLTokenizer.with_slices`) that let it fill a mask
    in marker-free text without walking the vocabulary.

    A mask is filled slice by slice: a slice (the tokens that match its regex, each token in the
    first slice it matches) whose every string the lexer state allows is taken whole. llguidance's
    own slices are JSON string contents, and inside free text they hold tokens with a marker's
    characters (`` ` ``, `<`, `:`), so no slice is allowed whole and every token is walked. Here the
    same slices come first without `cut` (characters that every marker holds one of, chosen from the
    markers' punctuation), then llguidance's, then free text without `cut`: a token without those
    characters cannot complete a marker. Masks are the same with any slices; only their cost moves."""
    cut = _cover(markers)
    if not cut:
        return [_WHITESPACE, f"[{_JSON_CLASS}]{{1,10}}", f"[{_JSON_CLASS}]{{1,30}}", f"[{_JSON_CLASS}]+"]
    ex = "".join(f"\\x{ord(c):02X}" for c in sorted(cut))
    plain = f"[{_JSON_CLASS}{ex}]"
    json = f"[{_JSON_CLASS}]"
    return [_WHITESPACE, plain + "{1,10}", plain + "{1,30}", plain + "+",
            json + "{1,10}", json + "{1,30}", json + "+", f"[^{ex}]+"]


def _cover(markers: Sequence[str]) -> set[str]:
    """A small set of ASCII punctuation characters such that every marker holding punctuation holds
    one of them: a marker's first character where it is punctuation, else its last (delimiters,
    rare in text: `<`, `` ` ``, `[`, ReAct's `:`), else any of its punctuation; greedy, the character
    in most uncovered markers first."""
    def punct(chars):
        return {c for c in chars if _punct(c)}

    left = [punct(m[0]) or punct(m[-1]) or punct(m) for m in markers if m]
    left = [s for s in left if s]
    cut: set[str] = set()
    while left:
        counts: dict[str, int] = {}
        for s in left:
            for c in s:
                counts[c] = counts.get(c, 0) + 1
        best = min(counts, key=lambda c: (-counts[c], c))
        cut.add(best)
        left = [s for s in left if best not in s]
    return cut
