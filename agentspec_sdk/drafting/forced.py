"""Grammar-forced drafts inside a tool call.

An llguidance matcher for the tool-call JSON grammar is kept per open tool-call segment and synced
with the segment's text each step: what it consumed stays, only a changed tail is rolled back, and only
the text after it is tokenized (`CallMatcher._sync`), so a step's work is in the text it added.
The forced continuation is `compute_ff_bytes()` (more than `compute_ff_tokens()`, which stops before a
token that could merge with later bytes); when the JSON object is complete after it, the segment's
close marker is forced too. The forced text is then tokenized the way the model's BPE would write it
(`canonical_tokens`), continuing the row's last tokens.

A call in its own markers (layout ``tool_calls``) is read with the grammar of one call
(`CallMatcher`, its close marker after a newline where the call syntax requires one); a call list
(layout ``call_list``: Mistral's ``[{…}, {…}]``, Llama's ``{…}; {…}``, pythonic ``[f(), g()]``) with
the grammar of the whole list after its lead marker (`ListMatcher`): its end is the turn's end.
"""

from __future__ import annotations

import codecs
import json

import llguidance

MAX_EXTEND_CHARS = 8


class CallMatcher:
    """Grammar state of one tool-call segment."""

    __slots__ = ("ll", "matcher", "fed", "cuts", "fed_bytes", "dead", "close", "complete", "finished",
                 "ahead", "_opening")

    prefix = ""  # text the grammar expects before the segment's content (see ArgsMatcher)
    # lookup text may follow forced text though no close marker ends the segment (a call list)
    chains = False

    def __init__(self, ll_tokenizer, grammar: str, close_marker: str = "", *, text=None):
        """`text`: what tokenizes and decodes text for the matcher (`tokenizer.MemoTokenizer`: the
        forced text `_ends_object` checks and the lookup text `valid_prefix` trims recur, 87-89% and
        55-75% of the calls on captured tool-call turns); None: `ll_tokenizer` itself."""
        self.ll = ll_tokenizer if text is None else text
        self.matcher = llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0)
        if self.matcher.is_error():
            raise ValueError(f"tool-call grammar does not compile: {self.matcher.get_error()}")
        self._clear()
        self.dead = False
        self.close = close_marker  # what follows the call: its close marker, a newline first if required
        self.complete = False  # the JSON object is finished (only the close marker may follow)
        self.finished = False  # the last forced text ended the grammar (ListMatcher: the turn)
        # what the grammar forces at its start (nothing consumed, empty body), once computed: the same
        # for every fork (a begun open marker's draft and a new call's first step ask for it)
        self._opening: list[tuple[str, bool]] = []

    def fork(self) -> CallMatcher:
        """A fresh matcher for a new segment, sharing the compiled grammar."""
        other = object.__new__(type(self))
        other.ll, other.matcher = self.ll, self.matcher.deep_copy()
        other._clear()
        other.dead, other.close, other.complete, other.finished = False, self.close, False, False
        other._opening = self._opening
        return other

    def _clear(self) -> None:
        # the matcher consumed draft text past the row's content (`keep_ahead`): the next sync rolls
        # back only where the row's text left the draft
        self.ahead = False
        self.fed: list[int] = []  # tokens the matcher consumed
        # (tokens, bytes) consumed after each sync: a rollback goes back to one of these, where the
        # consumed tokens end on the text's own bytes
        self.cuts: list[tuple[int, int]] = []
        self.fed_bytes = b""  # the bytes of `fed`: the start of the text synced last

    def forced_text(self, content: str) -> str:
        """Text the grammar forces after `content` (the JSON typed so far in this segment)."""
        synced = self._synced(content)
        if synced is None:
            return ""
        body, rest = synced
        if rest is not None:
            return self._close_after(rest)
        at_start = not body and not self.fed
        if at_start and self._opening:
            forced, self.finished = self._opening[0]
            return forced
        forced = self._trim(body, _utf8_prefix(self.matcher.compute_ff_bytes()))
        if forced and (self.close or self.chains) and self._ends_object(forced):
            forced += self.close
            self.finished = True
        if at_start:
            self._opening[:] = [(forced, self.finished)]
        return forced

    def sync(self, content: str) -> None:
        """The matcher synced with `content` as `forced_text` leaves it, without computing the forced
        text (what `allowed_after` needs before it trims a lookup)."""
        synced = self._synced(content)
        if synced is not None and synced[1] is not None:
            self._close_after(synced[1])

    def _synced(self, content: str) -> tuple[str, str | None] | None:
        """Sync the matcher with `content`: None where the call is dead (nothing can be forced),
        (body, None) while the JSON object is open, (body, text typed after it) once it is complete."""
        self.finished = False
        if self.dead:
            return None
        body = self._body(content)
        if self.ahead:  # back to what the row's text shares with the draft the matcher consumed
            self.ahead = False
            data = body.encode("utf-8")
            if not data.startswith(self.fed_bytes):
                self._rollback_to_bytes(_common_prefix(data, self.fed_bytes))
        rest = ""
        if self.complete or self.matcher.is_stopped():
            body, rest = self._split_done(body)
        else:
            ok = self._sync(body)
            if not ok:
                if not self.matcher.is_accepting():
                    self.dead = True
                    return None
                self.complete = True
                body, rest = self._split_done(body)
        if self.complete or self.matcher.is_stopped():
            self.complete = True
            return body, rest
        return body, None

    def _body(self, content: str) -> str:
        return self.prefix + content.lstrip()

    def _trim(self, body: str, forced: str) -> str:
        return forced

    def _close_after(self, rest: str) -> str:
        """The rest of `self.close` once the call is complete and `rest` was typed after it (the
        newline before the marker is the model's to write or skip when it already wrote other space)."""
        if not self.close:
            if rest.strip():
                self.dead = True
            return ""
        if self.close.startswith(rest):
            return self.close[len(rest):]
        marker, typed = self.close.lstrip(), rest.strip()
        if marker.startswith(typed):
            return marker[len(typed):]
        self.dead = True
        return ""

    def valid_prefix(self, text: str) -> str:
        """The longest prefix of `text` (in whole matcher tokens) the grammar allows next; call after
        `forced_text` synced the matcher. Used to trim lookup drafts inside a tool call."""
        if self.dead or self.complete:
            return text
        toks = self.ll.tokenize_str(text)
        ok = self.matcher.validate_tokens(toks)
        if ok == len(toks):
            return text
        good = self.ll.decode_str(toks[:ok])
        # the first rejected token may merge allowed characters with a rejected one (`"}` where `"`
        # closes the value and `}` is not allowed yet): extend the prefix a character at a time
        for end in range(len(good) + 1, min(len(text), len(good) + MAX_EXTEND_CHARS) + 1):
            more = self.ll.tokenize_str(text[:end])
            if self.matcher.validate_tokens(more) != len(more):
                break
            good = text[:end]
        return good

    def allowed_after(self, content: str, more: str) -> str:
        """The prefix of lookup text `more` the grammar allows after `content`; whitespace before the
        JSON starts (a newline after the open marker) is allowed as the model may write it."""
        self.sync(content)  # the matcher at the draft so far
        lead = ""
        if not content.strip():
            lead = more[: len(more) - len(more.lstrip())]
        return lead + self.valid_prefix(more[len(lead):])

    def flags(self) -> tuple[bool, bool]:
        """What `keep_ahead` restores after drafting ahead: (dead, complete) at the row's content."""
        return self.dead, self.complete

    def keep_ahead(self, flags: tuple[bool, bool]) -> None:
        """After drafting ahead of the row's content: the flags back to the content's (`flags`), the
        tokens consumed over the draft kept. The next sync rolls back only past what the row's text
        shares with the draft, so the draft text the target accepts is not consumed a second time
        (restored here, it was consumed again when the row's text reached it)."""
        self.dead, self.complete = flags
        self.ahead = True

    def _sync(self, body: str) -> bool:
        """Feed the matcher `body`: the consumed tokens whose bytes begin it stay (a sync point where
        it differs), the rest of it is tokenized on its own and consumed. The matcher reads bytes, so
        how the text is split into tokens does not change what it forces; tokenizing only the text
        after what was consumed keeps a sync's work in what the step added, not in the call so far
        (the whole of a 1k-character call took 180 µs to tokenize, each sync)."""
        data = body.encode("utf-8")
        if not data.startswith(self.fed_bytes):
            common = _common_prefix(data, self.fed_bytes)
            self._rollback_to(lambda _, size: size <= common)
        start = len(self.fed_bytes)
        if start == len(data):
            return True
        new = self.ll.tokenize_bytes(data[start:])
        taken = self.matcher.try_consume_tokens(new) if new else 0
        if taken:
            added = data[start:] if taken == len(new) else self.ll.decode_bytes(new[:taken])
            self.fed.extend(new[:taken])
            self.fed_bytes += added
            self.cuts.append((len(self.fed), len(self.fed_bytes)))
        return taken == len(new)

    def _rollback_to(self, keep) -> None:
        """Roll the matcher back to the last sync point `keep(tokens, bytes)` accepts."""
        cuts = self.cuts
        while cuts and not keep(*cuts[-1]):
            cuts.pop()
        tokens, size = cuts[-1] if cuts else (0, 0)
        if len(self.fed) > tokens:
            self.matcher.rollback(len(self.fed) - tokens)
            del self.fed[tokens:]
        self.fed_bytes = self.fed_bytes[:size]

    def _rollback_to_bytes(self, size: int) -> None:
        """Roll the matcher back to the last consumed token that ends at or before byte `size`: the
        last sync point there and the tokens after it whose bytes lie in the first `size` (the part of
        a draft consumed ahead that the row's text kept), a sync point added where they end."""
        cuts = self.cuts
        while cuts and cuts[-1][1] > size:
            cuts.pop()
        tokens, end = cuts[-1] if cuts else (0, 0)
        for token in self.fed[tokens:]:
            piece = self.ll.decode_bytes([token])
            if end + len(piece) > size or self.fed_bytes[end:end + len(piece)] != piece:
                break
            end += len(piece)
            tokens += 1
        if not cuts or cuts[-1][0] < tokens:
            cuts.append((tokens, end))
        if len(self.fed) > tokens:
            self.matcher.rollback(len(self.fed) - tokens)
            del self.fed[tokens:]
        self.fed_bytes = self.fed_bytes[:end]

    def _split_done(self, body: str) -> tuple[str, str]:
        done = len(self.fed_bytes.decode("utf-8", errors="replace"))
        return body[:done], body[done:]

    def _ends_object(self, forced: str) -> bool:
        toks = self.ll.tokenize_str(forced)
        taken = self.matcher.try_consume_tokens(toks)
        stopped = taken == len(toks) and self.matcher.is_stopped()
        if taken:
            self.matcher.rollback(taken)
        return stopped


class ArgsMatcher(CallMatcher):
    """The arguments object of one named tool (ReAct's ``Action Input:``), read with that tool's call
    grammar: the matcher is fed ``{"name":"<tool>","arguments":`` before the segment's text, and forced
    text is cut where the arguments object closes (the call's own ``}`` is not the segment's)."""

    def __init__(self, ll_tokenizer, grammar: str, tool_name: str, *, text=None):
        super().__init__(ll_tokenizer, grammar, "", text=text)
        self.prefix = '{"name":' + json.dumps(tool_name) + ',"arguments":'

    def fork(self) -> ArgsMatcher:
        other = super().fork()
        other.prefix = self.prefix
        return other

    def _trim(self, body: str, forced: str) -> str:
        end = json_value_end(body[len(self.prefix):] + forced)
        if end is None:
            return forced
        return forced[: max(0, end - (len(body) - len(self.prefix)))]


class ListMatcher(CallMatcher):
    """The call list of a ``call_list`` segment, read with the grammar of the whole list (what follows
    the syntax's lead marker). A segment opened by another marker (Llama's ``{``, pythonic ``[``: the
    turn's first character) holds that marker as the list's first text: it is fed first (`prefix`).
    The list has no close marker; where its grammar ends, the turn ends, and nothing more is drafted."""

    chains = True

    def __init__(self, ll_tokenizer, grammar: str, prefix: str, *, text=None):
        super().__init__(ll_tokenizer, grammar, "", text=text)
        self.prefix = prefix

    def fork(self) -> ListMatcher:
        other = super().fork()
        other.prefix = self.prefix
        return other

    def _body(self, content: str) -> str:
        # after a lead marker the model may write a space; after `{` or `[` the text is the list's own
        return self.prefix + (content if self.prefix else content.lstrip())

    def valid_prefix(self, text: str) -> str:
        if self.complete and not self.dead:
            return ""  # the list is complete: the turn ends here
        return super().valid_prefix(text)

    def allowed_after(self, content: str, more: str) -> str:
        if self.prefix:  # no whitespace before the list: its first character opened the segment
            self.sync(content)
            return self.valid_prefix(more)
        return super().allowed_after(content, more)


def _common_prefix(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix of two byte strings (bisection over C-level compares)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def json_value_end(text: str) -> int | None:
    """Index just after the first complete JSON object/array at the start of `text`, or None."""
    depth, in_str, esc = 0, False, False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def name_grammar(names) -> str:
    """llguidance Lark for ReAct's ``Action:`` content: one tool name and the newline after it."""
    return "start: (" + " | ".join(json.dumps(n) for n in names) + ') "\\n"'



def _utf8_prefix(data: bytes) -> str:
    """The longest whole-character prefix of `data`."""
    return codecs.getincrementaldecoder("utf-8")(errors="ignore").decode(data, final=False)


def canonical_tokens(ll_tokenizer, emitted: list[int], tail_text: str, new_text: str,
                     *, keep_last: bool, probes: tuple[str, ...] = ()) -> list[int]:
    """Tokens the model's tokenizer would write for `new_text` after `emitted` (whose text is `tail_text`).

    Re-tokenizes `tail_text + new_text`; if that reproduces `emitted`, the tokens after them are the
    draft. Otherwise (the model split its last tokens differently from the canonical BPE) the new text is
    tokenized on its own. The final token may merge with text that follows, and then the target writes
    a different token: it is kept if `keep_last`, or if appending each of `probes` (likely next
    characters) leaves it unchanged (`_stable_end`); otherwise dropped.
    """
    text = tail_text + new_text
    toks = ll_tokenizer.tokenize_str(text)
    n = len(emitted)
    if toks[:n] == emitted:
        out = toks[n:]
    else:
        text, n = new_text, 0
        out = toks = ll_tokenizer.tokenize_str(new_text)
    if out and not keep_last and not _stable_end(ll_tokenizer, text, toks, probes):
        out = out[:-1]
    return out


PROBE_TOKENS = 3  # tokens at the end of a text re-tokenized with each probe


def _stable_end(ll_tokenizer, text: str, toks: list[int], probes: tuple[str, ...]) -> bool:
    """Whether `toks` (the tokens of `text`) stay the tokens of `text + p` for every probe p.

    Only the text's last PROBE_TOKENS tokens are re-tokenized with each probe, where they tokenize
    on their own as they do in the whole text (a probe changes the tokens at the text's end, not
    its start); otherwise the whole text is. Re-tokenizing the whole text with each probe was up to
    3 tokenizations of 100 characters per candidate, every row and step."""
    if not probes:
        return False
    k = min(len(toks), PROBE_TOKENS)
    end = toks[len(toks) - k:]
    tail = ll_tokenizer.decode_bytes(end)
    if len(toks) > k and ll_tokenizer.tokenize_bytes(tail) == end:
        return all(ll_tokenizer.tokenize_bytes(tail + p.encode("utf-8"))[:k] == end for p in probes)
    return all(ll_tokenizer.tokenize_str(text + p)[: len(toks)] == toks for p in probes)
