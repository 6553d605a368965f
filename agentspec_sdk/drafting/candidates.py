"""Candidate drafts of one row: the half of `StructureDrafter` that builds a row's draft before sizing.

Grammar-forced text inside a tool call chained with in-segment lookup, a repeated call, a begun open
marker completed, the suffix trees' draft; cut at the segment's end (boundary "wall") or priced past it
(boundary "price"), turned into tokens as the model's BPE would write them. `CandidateBuilder` is a base
of `StructureDrafter` and reads its plan, matchers, trees and acceptance estimates.
"""

from __future__ import annotations

import numpy as np

from agentspec_sdk.drafting.budget import sent_length, sent_value
from agentspec_sdk.drafting.forced import (
    ArgsMatcher,
    CallMatcher,
    ListMatcher,
    canonical_tokens,
    name_grammar,
)
from agentspec_sdk.drafting.lookup import continuation
from agentspec_sdk.drafting.records import CALIBRATED_SOURCES
from agentspec_sdk.drafting.rows import Candidate, RowState
from agentspec_sdk.drafting.text import TokenBytes
from agentspec_sdk.structure.formats import LawClass
from agentspec_sdk.structure.segmenter import Segmenter

ANCHOR_TOKENS = 4  # emitted tokens re-tokenized together with a draft (BPE context)
MAX_MATCH_CHARS = 64
_DEPTH_BUCKET = (0, 1, 2, 2)  # law.OnlineCalibration.depth below 4
# What usually follows forced JSON text (a value's first letter or digit): a last forced token that
# survives these stays in the draft.
FORCED_PROBES = ("a", "0")
# After a lookup draft cut where the grammar or the segment ends it: what may come next there.
TRIMMED_PROBES = ("a", "0", '"')


class CandidateBuilder:
    """Builds each row's `Candidate`; the drafter (its subclass) holds `plan`, `gamma`, `ll`,
    `memo_tokenizer`, `end_ids`, `token_bytes`, `trees`, `accounting`, `explain`, `suffix_chosen`,
    `choice_bias`, `_registry`, `_call_grammar` and `_proto` (one prototype matcher per grammar)."""

    def _candidate(self, st: RowState, note: dict | None = None) -> Candidate | None:
        """The row's draft before sizing. `note` (explain mode): filled with what was weighed.

        A draft ends before its first turn-end token (`<|im_end|>`): accepted, that token saves
        nothing (the target's own next token in the same pass would have ended the turn too), and
        nothing after it can be accepted (the turn is over). A tree's draft priced past a segment
        end (boundary "price") can hold one in its middle, e.g. `</tool_call><|im_end|>…`."""
        st.contest = None
        cand = self._choose(st, note)
        if cand is None or self.end_ids.isdisjoint(cand.tokens):
            return cand
        n = next(i for i, t in enumerate(cand.tokens) if t in self.end_ids)
        if not n:
            return None
        conf = cand.confidences[:n] if cand.confidences is not None else None
        return Candidate(cand.tokens[:n], cand.sources[:n], cand.kind, cand.law_class, conf)

    def _choose(self, st: RowState, note: dict | None = None) -> Candidate | None:
        self._unpaid = None
        own = self._structure_candidate(st)
        unpaid = self._unpaid  # own would have been a lookup not worth its price: not tokenized
        note = {} if note is None else note
        note.update(own=own, tree=None, tree_raw=[], rule="own")
        priced = self.plan.boundary == "price" and self.plan.isolation
        if self.trees is None:
            return own
        if own is not None and own.source in ("forced", "marker"):  # grammar-forced text goes first
            note["rule"] = "forced-first"
            if priced or self.explain is not None:  # what the tree would have offered
                note["tree"] = self._suffix_candidate(st, note)
            return self._through(st, own, note) if priced else own
        tree = note["tree"] = self._suffix_candidate(st, note)
        if tree is not None and ((own is None and unpaid is None) or self._tree_wins(st, own, tree, unpaid)):
            self.suffix_chosen += 1
            note["rule"] = "tree"
            return tree
        if own is None and unpaid is not None and tree is not None:
            note["rule"] = "unpaid"  # the tree lost to a lookup sent empty: no draft (explain's causes)
        return self._through(st, own, note) if priced and own is not None else own

    def _tree_wins(self, st: RowState | None, own: Candidate | None, tree: Candidate,
                   unpaid: tuple[str, str] | None = None) -> bool:
        """The row's choice between its own candidate and the tree's: by worth at the row's price, the
        tree without its extension (`_unextended`), own's worth raised by the bias learned for own's
        (segment kind, source) from earlier choices (`StructureDrafter._judge_choice`). The candidate
        passed over is kept on the row, as the budget would send it, to judge this choice by.

        `own` None with `unpaid` = (kind, "lookup"): own would have been a lookup whose first token
        is not worth the price (`_lookup_pays`), worth 0 and sent empty: weighed as such, so the
        choice and what it learns are those the built lookup would have given."""
        key = (own.kind, own.source) if own is not None else unpaid
        learn = self.plan.learn_choice
        base = _unextended(tree)
        own_worth = self._worth(own) if own is not None else 0.0
        wins = self._worth(base) > own_worth + (self.choice_bias.get(key, 0.0) if learn else 0.0)
        if st is not None and learn:
            passed = own if wins else base
            if passed is None:  # the unpaid lookup, sent empty
                st.contest = (key, wins, [])
            else:
                n = sent_length(self._confidences(passed), self.row_price, self.gamma)
                st.contest = (key, wins, passed.tokens[:n])
        return wins

    def _through(self, st: RowState, own: Candidate, note: dict) -> Candidate:
        """Own candidate continued past the segment end by the tree (boundary "price"): when the
        tree's draft begins with own's tokens, its further tokens are appended as source "cross"."""
        raw, conf = note.get("tree_raw") or [], note.get("tree_conf") or []
        n = len(own.tokens)
        if len(raw) <= n or raw[:n] != own.tokens:
            return own
        # only through the boundary: where own stops inside its segment, the tree's further tokens
        # are what the source choice weighed and lost, not a crossing
        if tokens_inside(self.token_bytes, st.seg, raw) > n:
            return own
        cross = self.accounting.acceptance.alpha(own.law_class, "cross", own.kind)
        return Candidate(own.tokens + raw[n:], own.sources + ["cross"] * (len(raw) - n), own.kind,
                         own.law_class, self._estimates(own) + [c * cross for c in conf[n:]])

    def _suffix_candidate(self, st: RowState, note: dict | None = None) -> Candidate | None:
        """SuffixDecoding's draft for this row, cut where the current segment ends (boundary "wall")
        or priced past it (boundary "price": the tokens after the end are source "cross")."""
        tokens, conf = self.trees.speculate(st.tree_key, st.tail, self.gamma)
        kind = st.fmt.kind(st.seg.kind)
        law_class = kind.law_class.value
        sources = ["suffix"] * len(tokens)
        more, more_conf = self.trees.extension(st.tree_key, st.tail, self.gamma, tokens)
        if more:  # past what suffix's spec factor allows: priced by the learned acceptance of "extend"
            extend = self.accounting.acceptance.alpha(law_class, "extend", kind.name)
            tokens, conf = tokens + more, conf + [c * extend for c in more_conf]
            sources += ["extend"] * len(more)
        if note is not None:
            note["tree_raw"], note["tree_conf"] = list(tokens), list(conf)
        if not tokens:
            return None
        if self.plan.isolation:
            keep = tokens_inside(self.token_bytes, st.seg, tokens)
            if self.plan.boundary == "price" and keep < len(tokens):
                cross = self.accounting.acceptance.alpha(law_class, "cross", kind.name)
                sources[keep:] = ["cross"] * (len(tokens) - keep)
                conf = conf[:keep] + [c * cross for c in conf[keep:]]
            else:
                tokens, conf, sources = tokens[:keep], conf[:keep], sources[:keep]
        if not tokens:
            return None
        return Candidate(tokens, sources, kind.name, law_class, conf)

    def _worth(self, cand: Candidate) -> float:
        """What a candidate is worth at this row's price: `budget.sent_value` (only the tokens the
        budget would send count: a tree draft long in withheld `cross` tokens must not win the row)."""
        return sent_value(self._confidences(cand), self.row_price, self.gamma)

    def _expected(self, cand: Candidate) -> float:
        """Expected accepted tokens of a candidate: Σ_j Π_{i≤j} confidence_i."""
        return float(np.cumprod(self._confidences(cand)).sum())

    def _confidences(self, cand: Candidate) -> list[float]:
        """Per token, its acceptance given the ones before: `_estimates`, those of `CALIBRATED_SOURCES`
        times the factor learned for their class, kind, source and depth in their source's run
        (`law.OnlineCalibration`; plan `calibrate`)."""
        if cand.priced is not None:  # a row's candidates are weighed and sized several times a step
            return cand.priced
        raw = self._estimates(cand)
        if not self.plan.calibrate:
            return raw
        cal, out, factors = self.accounting.calibration, [], {}
        prev, depth = None, 0
        for c, src in zip(raw, cand.sources, strict=True):
            depth = depth + 1 if src == prev else 0
            prev = src
            if src not in CALIBRATED_SOURCES:
                out.append(c)
                continue
            f = factors.get(src)
            if f is None:
                f = factors[src] = cal.factors(cand.law_class, cand.kind, src)
            out.append(min(c * f[_DEPTH_BUCKET[depth] if depth < 4 else 3], 1.0))
        cand.priced = out
        return out

    def _estimates(self, cand: Candidate) -> list[float]:
        """Per token, the estimate its source gives: a tree's own, or the acceptance learned per
        (class, source, kind)."""
        if cand.confidences is not None:
            return cand.confidences
        acc, cache = self.accounting.acceptance, {}
        out = []
        for src in cand.sources:
            if src not in cache:
                cache[src] = acc.alpha(cand.law_class, src, cand.kind)
            out.append(cache[src])
        return out

    def _structure_candidate(self, st: RowState) -> Candidate | None:
        seg = st.seg
        kind = st.fmt.kind(seg.kind)
        if self.gamma == 0:
            return None
        opening = self._opening(st) if self.plan.isolation and not kind.delimited else None
        if opening is not None:  # the model began an open marker: the draft is the new segment's
            return self._opening_candidate(st, *opening)
        law_class = kind.law_class.value
        seg_text = st.segment_text()
        # A segment of an environment kind in the model's own output (a small model writing its own
        # <tool_response>) gets lookup drafts only: no grammar governs it.
        forced = self._forced(st, kind, seg_text) if kind.writer == "model" else ""
        call = st.call if kind.writer == "model" and st.call is not None \
            and st.call_start == seg.current.start else None
        text, keep_last, probes, parts = self._chain(st, kind, law_class, seg_text, call, forced)
        if not text:
            return None
        tokens, sources = self._tokens_for(st, text, parts, keep_last=keep_last, probes=probes)
        return Candidate(tokens, sources, kind.name, law_class) if tokens else None

    def _opening(self, st: RowState):
        """(kind, marker) when the text held back by the segmenter begins the open marker of a
        model-written structured kind (``<`` or ``<tool_`` of ``<tool_call>``): that text already
        belongs to the new segment, so drafting the rest of the marker stays inside it."""
        held = st.seg.pending
        if not held:
            return None
        for kind in st.fmt.kinds:
            if kind.writer != "model" or kind.law_class is not LawClass.S or not kind.delimited:
                continue
            for marker in kind.open:
                if marker.startswith(held) and marker != held:
                    return kind, marker
        return None

    def _opening_candidate(self, st: RowState, kind, marker: str) -> Candidate | None:
        rest = marker[len(st.seg.pending):]
        call = self._matcher_for(st, kind, marker) if self._registry is not None else None
        forced = call.forced_text("") if call is not None else ""
        law_class = kind.law_class.value
        text, keep_last, probes, parts = self._chain(st, kind, law_class, marker, call, forced, lead=False)
        seg = st.seg.clone()
        seg.feed(rest)
        # the marker's rest is a guess (the model may be opening another marker with the same start)
        parts = [(0, "marker")] + [(len(rest) + at, src) for at, src in parts]
        tokens, sources = self._tokens_for(st, rest + text, parts, keep_last=keep_last or not text,
                                           probes=probes,
                                           seg=seg, offset=len(rest))
        return Candidate(tokens, sources, kind.name, law_class) if tokens else None

    def _chain(self, st: RowState, kind, law_class: str, seg_text: str, call, forced: str,
               lead: bool = True):
        """(draft text, keep its last token, probes for the last token, parts: (offset, source) where
        each source's text begins). `lead`: the chain's text begins the draft (not so after a begun
        marker's rest, `_opening_candidate`).

        Sources alternate up to the draft's character budget: grammar-forced text, then a lookup
        continuation of the segment typed so far plus the draft, then forced text again (the matcher
        is advanced over the draft and restored afterwards), until the close marker or nothing more."""
        budget = 6 * self.gamma + 8
        close = _close_of(kind, seg_text)
        opener = _open_of(kind, seg_text) or ""
        saved = call.save() if call is not None else None
        text, follow, ended, last = "", "", False, ""
        parts: list[tuple[int, str]] = []

        def add(piece: str, source: str) -> None:
            nonlocal text, last
            if not parts or parts[-1][1] != source:
                parts.append((len(text), source))
            text += piece
            last = source

        try:
            while len(text) < budget:
                query = seg_text + text
                more, follow, matched = self._repeat(st, kind, query)
                source = "repeat"
                if not (more and matched >= len(query)):  # unless the segment so far repeats an earlier one
                    source = "lookup"
                    if forced:
                        add(forced, "forced")
                        if close and text.endswith(close):
                            ended = True
                            break
                        if not close and call.finished:  # a call list's end is the turn's end
                            ended = True
                            break
                        if not close and not call.chains:  # ReAct's name/arguments: the forced text
                            break                          # ends where the grammar does
                    more, follow, matched = self._lookup(st, kind, law_class, seg_text + text)
                    if forced and matched < len(forced) + self._min_chars(kind):
                        break  # a match inside the forced text only echoes the grammar
                if more and call is not None:
                    allowed = call.allowed_after(seg_text[len(opener):] + text, more)
                    if allowed != more:  # vLLM would trim the rest by the request grammar anyway
                        more, follow = allowed, ""
                if not more:
                    break
                if lead and not text and source == "lookup" and not self._lookup_pays(law_class, kind) \
                        and not (self.plan.isolation and st.seg.boundary_in(more) == 0):
                    self._unpaid = (kind.name, "lookup")  # weighed as worth 0 (`_tree_wins`)
                    break  # its first token would not be sent: not tokenized
                add(more, source)
                if close and text.endswith(close):
                    ended = True
                    break
                if call is None or len(text) >= budget:
                    break
                forced = call.forced_text(seg_text[len(opener):] + text)
        finally:
            if call is not None:
                call.restore(saved)
        if not text:
            return "", False, (), []
        if ended:
            return text, True, (), parts
        if last == "forced":
            probes = FORCED_PROBES
        else:
            probes = (follow,) if follow else TRIMMED_PROBES
        return text, False, probes, parts

    def _lookup_pays(self, law_class: str, kind) -> bool:
        """Whether a lookup draft's first token is worth this row's price (`row_price`): its learned
        acceptance, calibrated at depth 0 as `_confidences` counts it. Under the budget a draft whose
        first token is not is sent empty (`budget.allocate`), so where a lookup would begin the draft
        it is not tokenized (in free text a lookup's first token was accepted 4–5% of the time:
        docs/drafting.md, "Calibrated draft estimates"). Without the budget every draft is sent."""
        if not self.plan.budget:
            return True
        alpha = self.accounting.acceptance.alpha(law_class, "lookup", kind.name)
        if self.plan.calibrate:
            alpha = min(alpha * self.accounting.calibration.factor(law_class, kind.name, "lookup", 0), 1.0)
        return alpha >= self.row_price

    def _forced(self, st: RowState, kind, seg_text: str) -> str:
        if self._registry is None or kind.law_class is not LawClass.S:
            return ""
        start = st.seg.current.start
        if st.call_start != start:  # a new segment: a new matcher (or None: nothing to force here)
            st.call, st.call_start = self._matcher_for(st, kind, seg_text), start
        opener = _open_of(kind, seg_text)
        if st.call is None or opener is None:
            return ""
        return st.call.forced_text(seg_text[len(opener):])

    def _matcher_for(self, st: RowState, kind, seg_text: str) -> CallMatcher | None:
        """Which grammar forces text in this segment kind: a JSON tool call between markers (the
        union over tools), ReAct's ``Action:`` (a tool name), ReAct's ``Action Input:`` (the arguments
        of the tool named in the preceding action)."""
        proto = _call_prototype(self, st.fmt, kind, seg_text)
        if proto is not None:
            return proto.fork()
        if kind.name == "action" and not kind.delimited:
            key = ("names",)
            if key not in self._proto:
                self._proto[key] = CallMatcher(self.ll, name_grammar(self._registry.names),
                                                    text=self.memo_tokenizer)
        elif kind.name == "action_input":
            name = self._named_tool(st)
            if name is None:
                return None
            key = ("args", name)
            if key not in self._proto:
                grammar = _tool_call_grammar([self._registry.get(name)])
                self._proto[key] = ArgsMatcher(self.ll, grammar, name, text=self.memo_tokenizer)
        else:
            return None
        return self._proto[key].fork()

    def _named_tool(self, st: RowState) -> str | None:
        turn = st.text.slice(st.turn_char)
        for span in reversed(st.seg.spans):
            if span.kind == "action":
                text = turn[span.start:span.end]
                marker = _open_of(st.fmt.kind("action"), text) or ""
                name = text[len(marker):].strip()
                return name if name in self._registry else None
        return None

    def _repeat(self, st: RowState, kind, query: str) -> tuple[str, str, int]:
        """Lookup in earlier segments of the same kind only (a repeated tool call)."""
        same = st.corpora.get(kind.name)
        if not same or not self.plan.isolation:
            return "", "", 0
        return continuation(query, [(same, len(same))], min_chars=self._min_chars(kind),
                            max_match=MAX_MATCH_CHARS, max_chars=6 * self.gamma + 8)

    def _min_chars(self, kind) -> int:
        """The shortest match a lookup continues in segments of this kind."""
        return self.plan.lookup_min_chars_code if kind.content == "code" else self.plan.lookup_min_chars

    def _lookup(self, st: RowState, kind, law_class: str, seg_text: str) -> tuple[str, str, int]:
        if not self.plan.isolation:
            full = st.text.text
            corpora = [(full, len(full) - 1)]
        else:
            corpora = [(seg_text, len(seg_text) - 1)]
            same = st.corpora.get(kind.name)
            if same:
                corpora.append((same, len(same)))
            corpora.append((st.prompt_text, len(st.prompt_text)))
        return continuation(seg_text, corpora, min_chars=self._min_chars(kind),
                            max_match=MAX_MATCH_CHARS, max_chars=6 * self.gamma + 8)

    def _tokens_for(self, st: RowState, text: str, parts: list[tuple[int, str]], *, keep_last: bool,
                    probes: tuple[str, ...] = (), seg: Segmenter | None = None,
                    offset: int = 0) -> tuple[list[int], list[str]]:
        """(tokens, source of each token: the part its first byte lies in). `seg`/`offset`: the
        segmenter that judges isolation for text[offset:] (the row's by default)."""
        if self.plan.isolation:
            cut = (seg or st.seg).boundary_in(text[offset:])
            if cut is not None:
                text, keep_last = text[:offset + cut], True
        if not text:
            return [], []
        first = max(0, st.n - ANCHOR_TOKENS)
        emitted = st.tail[len(st.tail) - (st.n - first):].tolist()
        tail = st.text.slice(st.text.token_start(first))
        tokens = canonical_tokens(self.memo_tokenizer, emitted, tail, text, keep_last=keep_last,
                                  probes=probes)[: self.gamma]
        return tokens, _token_sources(self.token_bytes, tokens, text, parts)


def _unextended(tree: Candidate) -> Candidate:
    """The tree's draft without its `extend` tokens: what the row's choice between the tree and its
    own candidate weighs. Weighed with them, a longer tree draft won rows in code where own's lookup
    was accepted further (code_agent −0.4 to −0.8% at γ 16 b 8 and b 1, docs/drafting.md); the
    extension only lengthens a draft the tree has won on suffix's own terms."""
    if "extend" not in tree.sources:
        return tree
    n = tree.sources.index("extend")
    conf = tree.confidences[:n] if tree.confidences is not None else None
    return Candidate(tree.tokens[:n], tree.sources[:n], tree.kind, tree.law_class, conf)


def tokens_inside(token_bytes: TokenBytes, seg: Segmenter, tokens: list[int]) -> int:
    """How many of `tokens` lie inside the segmenter's current segment (a token holding the boundary
    is out)."""
    pieces = [token_bytes[t] for t in tokens]
    text = b"".join(pieces).decode("utf-8", errors="replace")
    cut = seg.boundary_in(text)
    if cut is None:
        return len(tokens)
    return _tokens_within(pieces, len(text[:cut].encode("utf-8")))


def _tokens_within(pieces: list[bytes], limit: int) -> int:
    """How many leading tokens (their bytes) fit in the first `limit` bytes."""
    keep = used = 0
    for piece in pieces:
        if used + len(piece) > limit:
            break
        used += len(piece)
        keep += 1
    return keep


def _token_sources(token_bytes: TokenBytes, tokens: list[int], text: str,
                   parts: list[tuple[int, str]]) -> list[str]:
    """The source of each draft token: the part of `text` (char offset, source) holding its first
    byte. The tokens spell `text` from its start (canonical_tokens continues the emitted tokens)."""
    if not parts:
        return ["lookup"] * len(tokens)
    starts = [len(text[:at].encode("utf-8")) for at, _ in parts]
    out, pos, k = [], 0, 0
    for tok in tokens:
        while k + 1 < len(starts) and starts[k + 1] <= pos:
            k += 1
        out.append(parts[k][1])
        pos += len(token_bytes[tok])
    return out


def _open_of(kind, seg_text: str) -> str | None:
    for marker in kind.open:
        if seg_text.startswith(marker):
            return marker
    return None


def _close_of(kind, seg_text: str) -> str:
    if not kind.close:
        return ""
    for marker, close in zip(kind.open, kind.close, strict=True):
        if seg_text.startswith(marker):
            return close
    return kind.close[0]


def _call_prototype(builder: CandidateBuilder, fmt, kind, seg_text: str) -> CallMatcher | None:
    """The prototype matcher (kept in `builder._proto`) of a tool-call segment, or None for another
    kind: the format's call syntax decides the grammar (one call in its markers, or the whole call
    list of a ``call_list`` layout), never the format's name."""
    protos, syntax = builder._proto, fmt.call_syntax  # None: the compact object of `tool_calls`
    if syntax is not None and kind.name == "tool_call" and fmt.layout == "call_list":
        opener = _open_of(kind, seg_text) or ""
        prefix = "" if opener == syntax.lead else opener  # `{` / `[`: the list's own first text
        key = ("list", prefix, syntax)
        if key not in protos:
            grammar = _tool_call_grammar(builder._registry, syntax, listed=True)
            protos[key] = ListMatcher(builder.ll, grammar, prefix, text=builder.memo_tokenizer)
        return protos[key]
    if (kind.content == "json" and kind.delimited) or (syntax is not None and kind.name == "tool_call"):
        close = _close_of(kind, seg_text)
        key = ("call", close, syntax)
        if key not in protos:
            grammar = (builder._call_grammar if syntax is None
                       else _tool_call_grammar(builder._registry, syntax))
            # Hermes' and Gemma's blocks end with a newline before the close marker
            newline = "\n" if syntax is not None and syntax.newlines == "required" else ""
            protos[key] = CallMatcher(builder.ll, grammar, newline + close, text=builder.memo_tokenizer)
        return protos[key]
    return None


def _tool_call_grammar(registry, syntax=None, *, listed: bool = False) -> str:
    from agentspec_sdk.structure.turn_grammar import tool_call_grammar

    return tool_call_grammar(registry, syntax=syntax, listed=listed)
