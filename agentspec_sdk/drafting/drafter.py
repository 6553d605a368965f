"""The structure drafter: one draft per batch row from the row's token history and the plan.

vLLM's custom proposer hands over only token histories (no request ids, no grammar state), so each row
is tracked by its history: a cached `RowState` (decoded text, segmenter over the model's turn, lookup
corpora, tool-call matcher, pending draft) is reused when the row's history extends the cached one by
at most one round's worth of tokens, and rebuilt otherwise (rows finish, arrive, get reordered).

Per step and row: resolve the previous draft (accounting), find the open segment, build a candidate
draft (grammar-forced text inside a tool call chained with in-segment lookup; a begun open marker
is completed and the new segment drafted), cut it at the segment's end,
then size all drafts together with the budget allocator. The rows' own objects (`RowInput`, the cached
`RowState`, a `Candidate`) are in `drafting.rows`; the tokenizer set-up in `drafting.tokenizer`.

`propose` never raises (vLLM's engine must survive any drafter bug): a row that fails gets no draft, a
step that fails gives no drafts at all and counts a batch error. Either is logged with its traceback
on the `agentspec.drafting` logger (the first LOGGED_FAILURES, then every LOG_EVERY-th) and the last
traceback stays in `stats()["last_error"]`.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from agentspec_sdk.drafting.budget import allocate, batch_price, fixed
from agentspec_sdk.drafting.forced import ArgsMatcher, CallMatcher, canonical_tokens, name_grammar
from agentspec_sdk.drafting.lookup import continuation
from agentspec_sdk.drafting.plan import DraftPlan, PlanWatcher
from agentspec_sdk.drafting.records import Accounting, PendingDraft, resolve
from agentspec_sdk.drafting.rows import Candidate, RowContext, RowInput, RowState
from agentspec_sdk.drafting.suffix_source import SuffixTrees
from agentspec_sdk.drafting.suffix_source import available as suffix_available
from agentspec_sdk.drafting.text import TokenBytes
from agentspec_sdk.drafting.tokenizer import ll_tokenizer, turn_markers
from agentspec_sdk.errors import AgentSpecError
from agentspec_sdk.law.cost_fits import OnlineStepCost
from agentspec_sdk.law.estimators import OnlineAcceptance
from agentspec_sdk.structure.formats import AgentFormat, LawClass
from agentspec_sdk.structure.segmenter import Segmenter

log = logging.getLogger("agentspec.drafting")

LOGGED_FAILURES = 10  # failures (rows or steps) logged with their traceback; after them every LOG_EVERY-th
LOG_EVERY = 1000
ANCHOR_TOKENS = 4  # emitted tokens re-tokenized together with a draft (BPE context)
MAX_MATCH_CHARS = 64
# What usually follows forced JSON text (a value's first letter or digit): a last forced token that
# survives these stays in the draft.
FORCED_PROBES = ("a", "0")
# After a lookup draft cut where the grammar or the segment ends it: what may come next there.
TRIMMED_PROBES = ("a", "0", '"')


class StructureDrafter:
    """`propose(rows) -> list[list[int]]`: structure-isolated, budget-sized drafts for a batch."""

    def __init__(self, plan: DraftPlan, tokenizer, *, plan_path: str | None = None,
                 max_draft: int | None = None):
        """`plan_path`: re-read the plan when this file changes. `max_draft`: hard cap on a draft's
        length whatever the plan says (vLLM's num_speculative_tokens)."""
        self.max_draft = max_draft
        self.ll, self.token_bytes = ll_tokenizer(tokenizer)
        self._watcher = PlanWatcher(plan_path) if plan_path else None
        self._turn_start_default, self.turn_end = turn_markers(tokenizer)
        self._rows: list[RowState | None] = []
        self.trees: SuffixTrees | None = None
        self.suffix_chosen = 0  # rows whose draft came from the suffix trees
        self.accounting = Accounting(OnlineAcceptance(plan.prior_acceptance), plan.records_path)
        self.cost = OnlineStepCost(plan.delta)
        self.last_error: str | None = None  # traceback of the last failing row or step
        self.failures = 0  # failing rows and steps, logged or not
        # explain mode (benchmarks/offline_drafting.py --explain): a list that gets, per step, one dict
        # per row with the candidates weighed (own, tree, tree_raw before the segment cut, rule) and
        # what was sent; None (the default): nothing recorded
        self.explain: list | None = None
        self._apply_plan(plan)

    @classmethod
    def from_env(cls, tokenizer) -> StructureDrafter:
        from agentspec_sdk.drafting.plan import PLAN_ENV

        plan = DraftPlan.from_env()
        return cls(plan, tokenizer, plan_path=os.environ[PLAN_ENV])

    # -- plan -----------------------------------------------------------------------------------

    def _apply_plan(self, plan: DraftPlan) -> None:
        self.plan = plan
        self.formats = plan.agent_formats()
        self.turn_start = plan.turn_start or self._turn_start_default
        self.step_budget = plan.effective_step_budget()
        self.gamma = plan.gamma_max if self.max_draft is None else min(plan.gamma_max, self.max_draft)
        self.cost.prior = plan.delta
        registry = plan.registry()
        self.grammar_error: str | None = None
        self._registry = registry if len(registry) else None
        try:
            self._call_grammar = _tool_call_grammar(registry) if len(registry) else None
        except AgentSpecError as exc:  # an unsupported schema: lookup still works, no forced drafts
            self._call_grammar, self._registry, self.grammar_error = None, None, str(exc)
        self._proto: dict[tuple, CallMatcher] = {}
        self._forget_rows(self._rows)
        self._rows = []  # formats or tools changed: rebuild every row's state
        if plan.suffix_trees and self.trees is None:
            if suffix_available():
                self.trees = SuffixTrees()
            else:
                log.warning("arctic-inference is not installed: the structure drafter runs without suffix "
                            "trees")
        elif not plan.suffix_trees:
            self.trees = None
        self.accounting.flush()
        self.accounting.records_path = Path(plan.records_path) if plan.records_path else None
        self.accounting.records_max_bytes = plan.records_max_bytes

    def _check_plan(self) -> None:
        if self._watcher is None:
            return
        plan = self._watcher.poll()
        if plan is None:
            return
        old = self.plan
        try:
            self._apply_plan(plan)
        except Exception as exc:  # a plan that cannot be applied keeps the running one
            log.warning("structure drafter: plan version %s not applied, the running one stays", plan.version,
                        exc_info=True)
            self._apply_plan(old)
            self.grammar_error = f"plan version {plan.version} not applied: {exc}"

    def _row_context(self) -> RowContext:
        return RowContext(self.trees, self.token_bytes, self.turn_start, self.turn_end, self.pick_format)

    def pick_format(self, prompt_text: str) -> AgentFormat:
        """With several formats in the plan, the one whose open markers the prompt mentions most."""
        if len(self.formats) == 1:
            return self.formats[0]
        scores = [sum(prompt_text.count(m) for k in f.kinds for m in k.open) for f in self.formats]
        return self.formats[int(np.argmax(scores))]

    # -- the step -------------------------------------------------------------------------------

    def propose(self, rows: Sequence[RowInput]) -> list[list[int]]:
        """One draft per row (empty = none). Never raises: a failing row, or a failing step, drafts
        nothing and is counted in `stats()["errors"]` (a failing step also in `batch_errors`); its
        traceback is logged and kept in `stats()["last_error"]`."""
        started, at = time.perf_counter(), time.time()
        try:
            return self._propose(rows, started, at)
        except Exception:  # the one batch-level catch: vLLM's engine must survive any drafter bug
            self._failed(f"step of {len(rows)} rows")
            self._forget_rows(self._rows)
            self._rows = []
            self.accounting.batch_errors += 1
            self.accounting.end_step(len(rows), 0, time.perf_counter() - started, max(1, len(rows)), at,
                                     {"batch_error": True})
            return [[] for _ in rows]

    def _failed(self, what: str) -> None:
        """Log the exception being handled, with its traceback, and keep it for `stats()`."""
        self.failures += 1
        self.last_error = f"{what}: {traceback.format_exc()}"
        n = self.failures
        if n <= LOGGED_FAILURES or n % LOG_EVERY == 0:
            later = f"; from now on every {LOG_EVERY}th is logged" if n == LOGGED_FAILURES else ""
            log.exception("structure drafter: %s failed, no draft there (failure %d%s)", what, n, later)

    def _propose(self, rows: Sequence[RowInput], started: float, at: float) -> list[list[int]]:
        self._check_plan()
        errors = 0
        states = self._match_rows(rows)
        candidates: list[Candidate | None] = [None] * len(rows)
        notes = [{} for _ in rows] if self.explain is not None else None
        for i, row in enumerate(rows):
            if not row.draftable:
                continue
            try:
                st = states[i]
                ids = row.history()
                if st is None:
                    st = states[i] = RowState(self._row_context(), ids)
                    self.accounting.rebuilds += 1
                else:
                    self._resolve(st, ids, row.sampled)
                    st.advance(ids)
                candidates[i] = self._candidate(st, notes[i] if notes is not None else None)
            except Exception:  # one bad row never takes the batch down: it gets no draft
                errors += 1
                states[i] = None
                self._failed(f"row {i}")
        self._rows = states
        drafts = self._size(candidates)
        if notes is not None:
            for note, cand, draft in zip(notes, candidates, drafts, strict=True):
                note.update(chosen=cand, sent=draft)
            self.explain.append(notes)
        self.accounting.sized([(c.law_class, len(c.tokens), len(d))
                               for c, d in zip(candidates, drafts, strict=True)
                               if c is not None])
        if self.plan.learn_delta:
            self.cost.observe(at, len(rows), sum(map(len, drafts)))
        for i, draft in enumerate(drafts):
            st, cand = states[i], candidates[i]
            if st is not None and draft and cand is not None:
                st.pending = PendingDraft(st.n, st.hash.value, cand.kind, cand.law_class, cand.source, draft,
                                          cand.sources[: len(draft)])
        sizes = [len(d) for d in drafts]  # for the report's cost fit: context and class of the drafted tokens
        extra = {"ctx": int(sum(r.num_tokens if r.num_tokens is not None
                                else len(r.token_ids) for r in rows)),
                 "drafted_ctx": int(sum(k * states[i].n for i, k in enumerate(sizes) if k)),
                 "drafted_s": int(sum(k for k, c in zip(sizes, candidates, strict=True)
                                      if k and c.law_class == "S"))}
        self.accounting.end_step(len(rows), sum(sizes), time.perf_counter() - started, errors, at, extra)
        return drafts

    def _match_rows(self, rows: Sequence[RowInput]) -> list[RowState | None]:
        old = self._rows
        growth = self.gamma + 1
        out: list[RowState | None] = [None] * len(rows)
        free = set(range(len(old)))
        histories = [r.history() for r in rows]
        for i, ids in enumerate(histories):
            if i < len(old) and old[i] is not None and old[i].matches(ids,
                                                                      max(growth, old[i].pending_len + 1)):
                out[i] = old[i]
                free.discard(i)
        if free:
            for i, ids in enumerate(histories):
                if out[i] is not None:
                    continue
                for j in sorted(free):
                    st = old[j]
                    if st is not None and st.matches(ids, max(growth, st.pending_len + 1)):
                        out[i] = st
                        free.discard(j)
                        break
        for j in free:
            if old[j] is not None and old[j].pending is not None:
                self.accounting.dropped += 1
        self._forget_rows([old[j] for j in free])
        return out

    @staticmethod
    def _forget_rows(rows) -> None:
        for st in rows:
            if st is not None:
                st.forget()

    def _resolve(self, st: RowState, ids: np.ndarray, sampled: int | None = None) -> None:
        pending = st.pending
        if pending is None or len(ids) <= pending.position:
            return
        st.pending = None
        # verified in the step that just ran only when the draft began where that step's tokens begin
        verified = sampled - 1 if sampled and len(ids) - sampled == pending.position else None
        self.accounting.add(resolve(pending, ids[pending.position:].tolist(), verified), pending.sources)

    # -- one row's candidate draft ------------------------------------------------------------

    def _candidate(self, st: RowState, note: dict | None = None) -> Candidate | None:
        """The row's draft before sizing. `note` (explain mode): filled with what was weighed."""
        own = self._structure_candidate(st)
        note = {} if note is None else note
        note.update(own=own, tree=None, tree_raw=[], rule="own")
        priced = self.plan.boundary == "price" and self.plan.isolation
        if self.trees is None:
            return own
        if own is not None and own.source in ("forced", "marker"):  # grammar-forced text goes first
            note["rule"] = "forced-first"
            if priced or self.explain is not None:  # what the tree would have offered
                note["tree"] = self._suffix_candidate(st, note)
            return self._through(own, note) if priced else own
        tree = note["tree"] = self._suffix_candidate(st, note)
        if tree is not None and (own is None or self._expected(tree) > self._expected(own)):
            self.suffix_chosen += 1
            note["rule"] = "tree"
            return tree
        return self._through(own, note) if priced and own is not None else own

    def _through(self, own: Candidate, note: dict) -> Candidate:
        """Own candidate continued past the segment end by the tree (boundary "price"): when the
        tree's draft begins with own's tokens, its further tokens are appended as source "cross"."""
        raw, conf = note.get("tree_raw") or [], note.get("tree_conf") or []
        n = len(own.tokens)
        if len(raw) <= n or raw[:n] != own.tokens:
            return own
        cross = self.accounting.acceptance.alpha(own.law_class, "cross")
        return Candidate(own.tokens + raw[n:], own.sources + ["cross"] * (len(raw) - n), own.kind,
                         own.law_class, self._confidences(own) + [c * cross for c in conf[n:]])

    def _suffix_candidate(self, st: RowState, note: dict | None = None) -> Candidate | None:
        """SuffixDecoding's draft for this row, cut where the current segment ends (boundary "wall")
        or priced past it (boundary "price": the tokens after the end are source "cross")."""
        tokens, conf = self.trees.speculate(st.tree_key, st.tail, self.gamma)
        if note is not None:
            note["tree_raw"], note["tree_conf"] = list(tokens), list(conf)
        if not tokens:
            return None
        kind = st.fmt.kind(st.seg.kind)
        law_class = kind.law_class.value
        sources = ["suffix"] * len(tokens)
        if self.plan.isolation:
            keep = self._inside(st, tokens)
            if self.plan.boundary == "price" and keep < len(tokens):
                cross = self.accounting.acceptance.alpha(law_class, "cross")
                sources[keep:] = ["cross"] * (len(tokens) - keep)
                conf = conf[:keep] + [c * cross for c in conf[keep:]]
            else:
                tokens, conf, sources = tokens[:keep], conf[:keep], sources[:keep]
        if not tokens:
            return None
        return Candidate(tokens, sources, kind.name, law_class, conf)

    def _inside(self, st: RowState, tokens: list[int]) -> int:
        """How many of `tokens` lie inside the current segment (a token holding the boundary is out)."""
        pieces = [self.token_bytes[t] for t in tokens]
        text = b"".join(pieces).decode("utf-8", errors="replace")
        cut = st.seg.boundary_in(text)
        if cut is None:
            return len(tokens)
        limit, keep, used = len(text[:cut].encode("utf-8")), 0, 0
        for piece in pieces:
            if used + len(piece) > limit:
                break
            used += len(piece)
            keep += 1
        return keep

    def _expected(self, cand: Candidate) -> float:
        """Expected accepted tokens of a candidate: Σ_j Π_{i≤j} confidence_i."""
        return float(np.cumprod(self._confidences(cand)).sum())

    def _confidences(self, cand: Candidate) -> list[float]:
        if cand.confidences is not None:
            return cand.confidences
        acc, cache = self.accounting.acceptance, {}
        out = []
        for src in cand.sources:
            if src not in cache:
                cache[src] = acc.alpha(cand.law_class, src)
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
        text, keep_last, probes, parts = self._chain(st, kind, law_class, marker, call, forced)
        seg = st.seg.clone()
        seg.feed(rest)
        # the marker's rest is a guess (the model may be opening another marker with the same start)
        parts = [(0, "marker")] + [(len(rest) + at, src) for at, src in parts]
        tokens, sources = self._tokens_for(st, rest + text, parts, keep_last=keep_last or not text,
                                           probes=probes,
                                           seg=seg, offset=len(rest))
        return Candidate(tokens, sources, kind.name, law_class) if tokens else None

    def _chain(self, st: RowState, kind, law_class: str, seg_text: str, call, forced: str):
        """(draft text, keep its last token, probes for the last token, parts: (offset, source) where
        each source's text begins).

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
                        if not close:  # ReAct's name/arguments: the forced text ends where the grammar does
                            break
                    more, follow, matched = self._lookup(st, kind, law_class, seg_text + text)
                    if forced and matched < len(forced) + self.plan.lookup_min_chars:
                        break  # a match inside the forced text only echoes the grammar
                if more and call is not None:
                    allowed = call.allowed_after(seg_text[len(opener):] + text, more)
                    if allowed != more:  # vLLM would trim the rest by the request grammar anyway
                        more, follow = allowed, ""
                if not more:
                    break
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
        if kind.content == "json" and kind.delimited:
            close = _close_of(kind, seg_text)
            key = ("call", close)
            if key not in self._proto:
                self._proto[key] = CallMatcher(self.ll, self._call_grammar, close)
        elif kind.name == "action" and not kind.delimited:
            key = ("names",)
            if key not in self._proto:
                self._proto[key] = CallMatcher(self.ll, name_grammar(self._registry.names))
        elif kind.name == "action_input":
            name = self._named_tool(st)
            if name is None:
                return None
            key = ("args", name)
            if key not in self._proto:
                grammar = _tool_call_grammar([self._registry.get(name)])
                self._proto[key] = ArgsMatcher(self.ll, grammar, name)
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
        return continuation(query, [(same, len(same))], min_chars=self.plan.lookup_min_chars,
                            max_match=MAX_MATCH_CHARS, max_chars=6 * self.gamma + 8)

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
        return continuation(seg_text, corpora, min_chars=self.plan.lookup_min_chars,
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
        tokens = canonical_tokens(self.ll, emitted, tail, text, keep_last=keep_last,
                                  probes=probes)[: self.gamma]
        return tokens, _token_sources(self.token_bytes, tokens, text, parts)

    # -- sizing -------------------------------------------------------------------------------

    def _size(self, candidates: list[Candidate | None]) -> list[list[int]]:
        if not candidates:
            return []
        lengths = np.array([len(c.tokens) if c else 0 for c in candidates])
        width = max(1, int(lengths.max()))
        alphas = np.zeros((len(candidates), width))  # per row and draft position
        for i, c in enumerate(candidates):
            if c is not None:
                conf = self._confidences(c)
                alphas[i, : len(conf)] = conf
        terms = self.cost.terms() if self.plan.learn_delta else None  # the learned pass cost terms
        price = batch_price(self.price, len(candidates), terms)  # per row of this step
        if self.plan.budget:
            sizes = allocate(alphas, price, self.step_budget, self.gamma, lengths)
        else:
            sizes = fixed(alphas[:, 0], price, self.gamma, lengths, gate=self.plan.gate)
        return [c.tokens[: int(k)] if c and k else [] for c, k in zip(candidates, sizes, strict=True)]

    # -- reading --------------------------------------------------------------------------------

    @property
    def records(self):
        return self.accounting.records

    def pending_draft(self, row: int) -> PendingDraft | None:
        """The unresolved draft the last `propose` gave batch row `row` (position, prefix_hash, kind,
        law_class, source, tokens), or None."""
        states = self._rows
        state = states[row] if 0 <= row < len(states) else None
        return state.pending if state is not None else None

    @property
    def price(self) -> float:
        """delta + d for one sequence: the learned delta once the step times allow, else the plan's."""
        return (self.cost.delta() if self.plan.learn_delta else self.plan.delta) + self.plan.d

    def stats(self) -> dict:
        return {**self.accounting.stats(), "plan_version": self.plan.version,
                "suffix_trees": self.trees is not None, "suffix_chosen": self.suffix_chosen,
                "grammar_error": self.grammar_error, "delta": self.price - self.plan.d,
                "delta_learned": self.plan.learn_delta and self.cost.learned, "last_error": self.last_error}

    def reset_stats(self) -> None:
        self.accounting.reset()

    def flush(self) -> None:
        self.accounting.flush()


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


def _tool_call_grammar(registry) -> str:
    from agentspec_sdk.structure.turn_grammar import tool_call_grammar

    return tool_call_grammar(registry)
