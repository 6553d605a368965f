"""The sources of a row's candidate draft: the structure's own (`OwnSource`) and the suffix trees'
(`TreeSource`).

Own: grammar-forced text inside a tool call chained with in-segment lookup, a repeated call, a begun
open marker completed; cut at the segment's end, turned into tokens as the model's BPE would write
them. Tree: SuffixDecoding's draft cut at the segment's end (boundary "wall") or priced past it
(boundary "price"). Both get what they need as a `DraftSetup` (fixed while a plan runs) and their
own parts; the row's choice between them is `drafting.choice`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from agentspec_sdk.drafting.forced import canonical_tokens
from agentspec_sdk.drafting.grammars import CallGrammars, close_of, open_of
from agentspec_sdk.drafting.lab import LabSwitches
from agentspec_sdk.drafting.lookup import continuation
from agentspec_sdk.drafting.plan import DraftPlan, KindRule
from agentspec_sdk.drafting.pricing import Estimates
from agentspec_sdk.drafting.rows import Candidate, RowState
from agentspec_sdk.drafting.suffix_source import SuffixTrees
from agentspec_sdk.drafting.text import TokenBytes
from agentspec_sdk.law.estimators import OnlineAcceptance
from agentspec_sdk.structure.formats import LawClass
from agentspec_sdk.structure.segmenter import Segmenter

ANCHOR_TOKENS = 4  # emitted tokens re-tokenized together with a draft (BPE context)
MAX_MATCH_CHARS = 64
# What usually follows forced JSON text (a value's first letter or digit): a last forced token that
# survives these stays in the draft.
FORCED_PROBES = ("a", "0")
# After a lookup draft cut where the grammar or the segment ends it: what may come next there.
TRIMMED_PROBES = ("a", "0", '"')


@dataclass(frozen=True, slots=True)
class DraftSetup:
    """What building a row's draft needs from the plan and the tokenizer, fixed while a plan runs:
    the plan, the draft's length cap `gamma`, the vocabulary's bytes, the draft-text tokenizer
    (`tokenizer.MemoTokenizer`), the turn-end token ids, the lab switches and each segment kind's
    rule by (format name, kind name) (`DraftPlan.kind_rules`)."""

    plan: DraftPlan
    gamma: int
    token_bytes: TokenBytes
    memo_tokenizer: object
    end_ids: frozenset
    lab: LabSwitches
    rules: dict[tuple[str, str], KindRule]
    default_rule: KindRule

    def rule(self, kind: str, fmt: str) -> KindRule:
        """The rule of segment kind `kind` of format `fmt` (a kind no plan format names: the plan's
        global knobs)."""
        return self.rules.get((fmt, kind), self.default_rule)


class Chain(NamedTuple):
    """A chain of sources' text (`OwnSource._chain`): the draft text, whether its last token stays,
    probes for the last token, parts ((offset, source) where each source's text begins) and, where
    the chain stopped before a lookup not worth the row's price (not tokenized), (kind, "lookup")."""

    text: str
    keep_last: bool = False
    probes: tuple[str, ...] = ()
    parts: list[tuple[int, str]] | tuple = ()
    unpaid: tuple[str, str] | None = None


class OwnSource:
    """The structure's own candidate of a row: `candidate(st, price)`. `grammars`: the plan's tool
    grammars (None: no tools, or a schema they do not support: lookup only); `estimates` decides
    whether a lookup beginning the draft is worth tokenizing at the row's price."""

    def __init__(self, setup: DraftSetup, grammars: CallGrammars | None, estimates: Estimates):
        self.setup, self.plan, self.gamma, self.lab = setup, setup.plan, setup.gamma, setup.lab
        self.grammars, self.estimates = grammars, estimates

    def candidate(self, st: RowState, price: float) -> tuple[Candidate | None, tuple[str, str] | None]:
        """(the row's own candidate, unpaid): `unpaid` = (kind, "lookup") where own would have been a
        lookup whose first token is not worth the row's `price`, not tokenized (`Estimates.lookup_pays`)."""
        seg = st.seg
        kind = st.fmt.kind(seg.kind)
        if self.gamma == 0:
            return None, None
        opening = self._opening(st) if self.lab.isolation and not kind.delimited else None
        if opening is not None:  # the model began an open marker: the draft is the new segment's
            return self._opening_candidate(st, *opening), None
        law_class = kind.law_class.value
        seg_text = st.segment_text()
        # A segment of an environment kind in the model's own output (a small model writing its own
        # <tool_response>) gets lookup drafts only: no grammar governs it.
        forced = self._forced(st, kind, seg_text) if kind.writer == "model" else ""
        call = st.call if kind.writer == "model" and st.call is not None \
            and st.call_start == seg.current.start else None
        text, keep_last, probes, parts, unpaid = self._chain(st, kind, law_class, seg_text, call, forced,
                                                             price)
        if not text:
            return None, unpaid
        tokens, sources = self._tokens_for(st, text, parts, keep_last=keep_last, probes=probes)
        return (Candidate(tokens, sources, kind.name, law_class) if tokens else None), None

    def _opening(self, st: RowState):
        return opening_of(st)

    def _opening_candidate(self, st: RowState, kind, marker: str) -> Candidate | None:
        rest = marker[len(st.seg.pending):]
        call = self.grammars.matcher_for(st, kind, marker) if self.grammars is not None else None
        forced = call.forced_text("") if call is not None else ""
        law_class = kind.law_class.value
        text, keep_last, probes, parts, _ = self._chain(st, kind, law_class, marker, call, forced, None)
        seg = st.seg.clone()
        seg.feed(rest)
        # the marker's rest is a guess (the model may be opening another marker with the same start)
        parts = [(0, "marker")] + [(len(rest) + at, src) for at, src in parts]
        tokens, sources = self._tokens_for(st, rest + text, parts, keep_last=keep_last or not text,
                                           probes=probes,
                                           seg=seg, offset=len(rest))
        return Candidate(tokens, sources, kind.name, law_class) if tokens else None

    def _chain(self, st: RowState, kind, law_class: str, seg_text: str, call, forced: str,
               price: float | None) -> Chain:
        """The chain's text (`Chain`). `price`: the row's, where the chain's text begins the draft
        (a lookup there must pay it, `Estimates.lookup_pays`); None after a begun marker's rest
        (`_opening_candidate`).

        Sources alternate up to the draft's character budget: grammar-forced text, then a lookup
        continuation of the segment typed so far plus the draft, then forced text again (the matcher
        is advanced over the draft and left there, `CallMatcher.keep_ahead`), until the close marker or
        nothing more."""
        budget = 6 * self.gamma + 8
        close = close_of(kind, seg_text)
        opener = open_of(kind, seg_text) or ""
        flags = call.flags() if call is not None else None
        text, follow, ended, last, unpaid = "", "", False, "", None
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
                    if forced and matched < len(forced) + self._min_chars(st, kind):
                        break  # a match inside the forced text only echoes the grammar
                if more and call is not None:
                    allowed = call.allowed_after(seg_text[len(opener):] + text, more)
                    if allowed != more:  # vLLM would trim the rest by the request grammar anyway
                        more, follow = allowed, ""
                if not more:
                    break
                if price is not None and not text and source == "lookup" \
                        and not self.estimates.lookup_pays(law_class, kind, price) \
                        and not (self.lab.isolation and st.seg.boundary_in(more) == 0):
                    unpaid = (kind.name, "lookup")  # weighed as worth 0 (`RowChoice.tree_wins`)
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
                call.keep_ahead(flags)
        if not text:
            return Chain("", unpaid=unpaid)
        if ended:
            return Chain(text, True, (), parts)
        if last == "forced":
            probes = FORCED_PROBES
        else:
            probes = (follow,) if follow else TRIMMED_PROBES
        return Chain(text, False, probes, parts)

    def _forced(self, st: RowState, kind, seg_text: str) -> str:
        if self.grammars is None or kind.law_class is not LawClass.S:
            return ""
        start = st.seg.current.start
        if st.call_start != start:  # a new segment: a new matcher (or None: nothing to force here)
            st.call, st.call_start = self.grammars.matcher_for(st, kind, seg_text), start
        opener = open_of(kind, seg_text)
        if st.call is None or opener is None:
            return ""
        return st.call.forced_text(seg_text[len(opener):])

    def _repeat(self, st: RowState, kind, query: str) -> tuple[str, str, int]:
        """Lookup in earlier segments of the same kind only (a repeated tool call)."""
        same = st.corpora.get(kind.name)
        if not same or not self.lab.isolation:
            return "", "", 0
        return continuation(query, [(same, len(same))], min_chars=self._min_chars(st, kind),
                            max_match=MAX_MATCH_CHARS, max_chars=6 * self.gamma + 8)

    def _min_chars(self, st: RowState, kind) -> int:
        """The shortest match a lookup continues in segments of this kind."""
        return self.setup.rule(kind.name, st.fmt.name).lookup_min_chars

    def _lookup(self, st: RowState, kind, law_class: str, seg_text: str) -> tuple[str, str, int]:
        if not self.lab.isolation:
            full = st.text.text
            corpora = [(full, len(full) - 1)]
        else:
            corpora = [(seg_text, len(seg_text) - 1)]
            same = st.corpora.get(kind.name)
            if same:
                corpora.append((same, len(same)))
            corpora.append((st.prompt_text, len(st.prompt_text)))
        return continuation(seg_text, corpora, min_chars=self._min_chars(st, kind),
                            max_match=MAX_MATCH_CHARS, max_chars=6 * self.gamma + 8)

    def _tokens_for(self, st: RowState, text: str, parts: list[tuple[int, str]], *, keep_last: bool,
                    probes: tuple[str, ...] = (), seg: Segmenter | None = None,
                    offset: int = 0) -> tuple[list[int], list[str]]:
        """(tokens, source of each token: the part its first byte lies in). `seg`/`offset`: the
        segmenter that judges isolation for text[offset:] (the row's by default)."""
        if self.lab.isolation:
            cut = (seg or st.seg).boundary_in(text[offset:])
            if cut is not None:
                text, keep_last = text[:offset + cut], True
        if not text:
            return [], []
        first = max(0, st.n - ANCHOR_TOKENS)
        emitted = st.tail[len(st.tail) - (st.n - first):].tolist()
        tail = st.text.slice(st.text.token_start(first))
        tokens = canonical_tokens(self.setup.memo_tokenizer, emitted, tail, text, keep_last=keep_last,
                                  probes=probes)[: self.gamma]
        return tokens, _token_sources(self.setup.token_bytes, tokens, text, parts)


class TreeSource:
    """The suffix trees' candidate of a row (`candidate(st, note)`); the tokens past what suffix's
    spec factor allows (`extend`) and past the segment end (`cross`, boundary "price") are priced by
    their learned `acceptance`."""

    def __init__(self, setup: DraftSetup, trees: SuffixTrees, acceptance: OnlineAcceptance):
        self.setup, self.plan, self.gamma, self.lab = setup, setup.plan, setup.gamma, setup.lab
        self.trees, self.acceptance = trees, acceptance

    def ask(self, st: RowState, new_tokens, policy: str, policy_kind: str, room: int) -> tuple:
        """The row's part of the step's call into the trees (`SuffixTrees.step`): its `new_tokens`
        added, then by the `policy` of its `policy_kind` its draft at its segment kind's knobs with
        the extension ("structure", read by `candidate`), exactly vLLM's suffix draft at the policy
        kind's knobs, at most `room` tokens ("trees", read by `vllm_draft`), or none. The draft comes
        back as `st.tree_draft`."""
        if policy == "structure":
            rule = self.setup.rule(st.seg.kind, st.fmt.name)
            return self.trees.request(st.tree_key, new_tokens, st.tail, 1, self.gamma, rule.tree_spec_factor,
                                      rule.tree_min_token_prob, rule.extend_factor or 0.0)
        if policy == "trees":
            rule = self.setup.rule(policy_kind, st.fmt.name)
            return self.trees.request(st.tree_key, new_tokens, st.tail, 2, room, rule.tree_spec_factor,
                                      rule.tree_min_token_prob)
        return self.trees.request(st.tree_key, new_tokens, st.tail, 0)

    def candidate(self, st: RowState, note: dict | None = None) -> Candidate | None:
        """SuffixDecoding's draft for this row (`st.tree_draft`, see `ask`), cut where the current
        segment ends (boundary "wall") or priced past it (boundary "price": the tokens after the end
        are source "cross"). `note` (explain mode) gets the draft before the cut (`tree_raw`,
        `tree_conf`)."""
        kind = st.fmt.kind(st.seg.kind)
        rule = self.setup.rule(kind.name, st.fmt.name)
        tokens, conf, more, more_conf = st.tree_draft or ([], [], [], [])
        law_class = kind.law_class.value
        sources = ["suffix"] * len(tokens)
        if more:  # past what suffix's spec factor allows: priced by the learned acceptance of "extend"
            extend = self.acceptance.alpha(law_class, "extend", kind.name)
            tokens, conf = tokens + more, conf + [c * extend for c in more_conf]
            sources += ["extend"] * len(more)
        if note is not None:
            note["tree_raw"], note["tree_conf"] = list(tokens), list(conf)
        if not tokens:
            return None
        if self.lab.isolation:
            keep = tokens_inside(self.setup.token_bytes, st.seg, tokens)
            if rule.boundary == "price" and keep < len(tokens):
                cross = self.acceptance.alpha(law_class, "cross", kind.name)
                sources[keep:] = ["cross"] * (len(tokens) - keep)
                conf = conf[:keep] + [c * cross for c in conf[keep:]]
            else:
                tokens, conf, sources = tokens[:keep], conf[:keep], sources[:keep]
        if not tokens:
            return None
        return Candidate(tokens, sources, kind.name, law_class, conf)


    def vllm_draft(self, st: RowState) -> Candidate | None:
        """Exactly the draft vLLM's suffix proposer sends for this row (policy "trees", `st.tree_draft`
        from `ask`): the trees' speculation on the history's last `max_tree_depth` tokens at
        the kind's knobs, at most `room` tokens; no segment cut, no extension, no budget."""
        tokens, conf = st.tree_draft or ([], [])
        if not tokens:
            return None
        kind = st.fmt.kind(st.seg.kind)
        return Candidate(tokens, ["suffix"] * len(tokens), kind.name, kind.law_class.value, conf)


def opening_of(st: RowState):
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


def tokens_inside(token_bytes: TokenBytes, seg: Segmenter, tokens: list[int]) -> int:
    """How many of `tokens` lie inside the segmenter's current segment (a token holding the boundary
    is out)."""
    table = token_bytes.table
    try:
        pieces = [table[t] for t in tokens]
    except IndexError:  # an id past the vocabulary's bytes (a padded vocabulary): no bytes
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
    out, pos, k, last = [], 0, 0, len(starts) - 1
    table = token_bytes.table
    size = len(table)
    for tok in tokens:
        while k < last and starts[k + 1] <= pos:
            k += 1
        out.append(parts[k][1])
        pos += len(table[tok]) if 0 <= tok < size else len(token_bytes[tok])
    return out
