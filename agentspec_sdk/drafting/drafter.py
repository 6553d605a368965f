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

from agentspec_sdk.drafting.budget import TokenRate, allocate, fixed, row_prices
from agentspec_sdk.drafting.candidates import CandidateBuilder, _tool_call_grammar
from agentspec_sdk.drafting.fingerprint import prefix_hashes
from agentspec_sdk.drafting.forced import CallMatcher
from agentspec_sdk.drafting.plan import DraftPlan, PlanWatcher
from agentspec_sdk.drafting.records import Accounting, PendingDraft, agreement, resolve
from agentspec_sdk.drafting.rows import Candidate, Parking, RowContext, RowInput, RowState
from agentspec_sdk.drafting.suffix_source import SuffixTrees
from agentspec_sdk.drafting.suffix_source import available as suffix_available
from agentspec_sdk.drafting.tokenizer import MemoTokenizer, ll_tokenizer, turn_markers
from agentspec_sdk.errors import AgentSpecError
from agentspec_sdk.law.cost_fits import OnlineStepCost
from agentspec_sdk.law.estimators import OnlineAcceptance
from agentspec_sdk.structure.format_detect import prompt_format
from agentspec_sdk.structure.formats import AgentFormat

# how far one wrong source choice moves its bias, in expected accepted tokens (`_judge_choice`);
# offline the five captures move by at most 0.4% between 0.05 and 0.2
CHOICE_STEP = 0.1

log = logging.getLogger("agentspec.drafting")

LOGGED_FAILURES = 10  # failures (rows or steps) logged with their traceback; after them every LOG_EVERY-th
LOG_EVERY = 1000


def _context(row: RowInput) -> int:
    """A row's context as vLLM holds it this step (tokens)."""
    return row.num_tokens if row.num_tokens is not None else len(row.token_ids)


class StructureDrafter(CandidateBuilder):
    """`propose(rows) -> list[list[int]]`: structure-isolated, budget-sized drafts for a batch."""

    def __init__(self, plan: DraftPlan, tokenizer, *, plan_path: str | None = None,
                 max_draft: int | None = None):
        """`plan_path`: re-read the plan when this file changes. `max_draft`: hard cap on a draft's
        length whatever the plan says (vLLM's num_speculative_tokens)."""
        self.max_draft = max_draft
        self.ll, self.token_bytes = ll_tokenizer(tokenizer)
        # draft text tokenized once: `_tokens_for`'s canonical tokens and the tool-call matchers' checks
        self.memo_tokenizer = MemoTokenizer(self.ll)
        self._watcher = PlanWatcher(plan_path) if plan_path else None
        self._turn_start_default, self.turn_end = turn_markers(tokenizer)
        end = self.turn_end.encode("utf-8") if self.turn_end else None
        self.end_ids = frozenset(i for i, b in enumerate(self.token_bytes.table) if end and b == end)
        self._rows: list[RowState | None] = []
        # rows that left the batch, for their episode's next turn to continue (`_new_row`)
        self.parked = Parking()
        self.continued = 0  # new rows that took over a parked row's state
        self.trees: SuffixTrees | None = None
        self.suffix_chosen = 0  # rows whose draft came from the suffix trees
        # (own's segment kind, own's source) -> what the row's choice adds to own's worth (_judge_choice)
        self.choice_bias: dict[tuple[str, str], float] = {}
        self.accounting = Accounting(OnlineAcceptance(plan.prior_acceptance), plan.records_path)
        self.cost = OnlineStepCost(plan.delta)
        self.rate = TokenRate()  # the run's tokens per unit of pass cost (plan budget_rule "rate")
        self._accepted_now = 0  # draft tokens accepted among the drafts resolved in this step
        self.last_error: str | None = None  # traceback of the last failing row or step
        self.failures = 0  # failing rows and steps, logged or not
        # explain mode (benchmarks/offline_drafting.py --explain): a list that gets, per step, one dict
        # per row with the candidates weighed (own, tree, tree_raw before the segment cut, rule) and
        # what was sent; None (the default): nothing recorded
        self.explain: list | None = None
        self.row_price = 0.0  # this step's price of a draft token per row (set by each step)
        self._unpaid: tuple[str, str] | None = None  # the row's own lookup was not worth tokenizing
        # this step's mean row context (tokens, every row of the pass): where the prior delta holds
        # while it is not learned and the plan sets no ctx_ref (`_prices`)
        self.step_ctx: float | None = None
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
        self.parked.clear()
        if plan.suffix_trees and self.trees is not None:  # the knobs apply from the next step on
            self.trees.max_spec_factor = plan.suffix_max_spec_factor
            self.trees.min_token_prob = plan.suffix_min_token_prob
            self.trees.extend_factor = plan.suffix_extend_factor
        if plan.suffix_trees and self.trees is None:
            if suffix_available():
                self.trees = SuffixTrees(max_spec_factor=plan.suffix_max_spec_factor,
                                         min_token_prob=plan.suffix_min_token_prob,
                                         extend_factor=plan.suffix_extend_factor)
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
        """The plan's format that the prompt asks for (`structure.format_detect.prompt_format`)."""
        return prompt_format(prompt_text, self.formats)

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
        errors, self._accepted_now = 0, 0
        self.step_ctx = float(np.mean([_context(r) for r in rows])) if rows else None
        states = self._match_rows(rows)
        # what sizing will charge each row's draft tokens (its context is its history's length)
        prices = self._prices(len(rows), [len(r.history()) for r in rows]) if rows else []
        candidates: list[Candidate | None] = [None] * len(rows)
        notes = [{} for _ in rows] if self.explain is not None else None
        for i, row in enumerate(rows):
            if not row.draftable:
                continue
            try:
                st = states[i]
                ids = row.history()
                if st is None:
                    st = states[i] = self._new_row(ids)
                else:
                    self._resolve(st, ids, row.sampled)
                    st.advance(ids)
                self.row_price = float(prices[i])
                candidates[i] = self._row_candidate(i, st, notes[i] if notes is not None else None)
            except Exception:  # one bad row never takes the batch down: it gets no draft
                errors += 1
                states[i] = None
                self._failed(f"row {i}")
        self._rows = states
        drafts = self._size(candidates, [st.n if st is not None else 0 for st in states])
        if notes is not None:
            for note, cand, draft in zip(notes, candidates, drafts, strict=True):
                note.update(chosen=cand, sent=draft)
            self.explain.append(notes)
        self.accounting.sized([(c.law_class, len(c.tokens), len(d))
                               for c, d in zip(candidates, drafts, strict=True)
                               if c is not None])
        drafted_ctx = int(sum(len(d) * states[i].n for i, d in enumerate(drafts) if d))
        if self.plan.learn_delta:
            self.cost.observe(at, len(rows), sum(map(len, drafts)), drafted_ctx)
        for i, draft in enumerate(drafts):
            st, cand = states[i], candidates[i]
            if st is not None and draft and cand is not None:
                conf = self._estimates(cand)[: len(draft)]
                st.pending = PendingDraft(st.n, st.hash.value, cand.kind, cand.law_class, cand.source, draft,
                                          cand.sources[: len(draft)], conf)
        sizes = [len(d) for d in drafts]  # for the report's cost fit: context and class of the drafted tokens
        extra = {"ctx": int(sum(_context(r) for r in rows)),
                 "drafted_ctx": drafted_ctx,
                 "drafted_s": int(sum(k for k, c in zip(sizes, candidates, strict=True)
                                      if k and c.law_class == "S"))}
        self.accounting.end_step(len(rows), sum(sizes), time.perf_counter() - started, errors, at, extra)
        return drafts

    def _row_candidate(self, i: int, st: RowState, note: dict | None) -> Candidate | None:
        """Batch row `i`'s candidate (a subclass may weigh another source per row: drafting.hybrid)."""
        return self._candidate(st, note)

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
            if old[j] is not None:
                if old[j].pending is not None:
                    self.accounting.dropped += 1
                self.parked.park(old[j])
        return out

    def _new_row(self, ids: np.ndarray) -> RowState:
        """A row the drafter has not followed: it continues a parked row (its episode's previous
        turn) or is built from its history."""
        ids = np.asarray(ids, dtype=np.int64)
        hashes = prefix_hashes(ids)
        prev = self.parked.take(ids, hashes)
        self.accounting.rebuilds += 1
        self.continued += prev is not None
        return RowState(self._row_context(), ids, prev, hashes)

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
        rnd = resolve(pending, ids[pending.position:].tolist(), verified)
        self.accounting.add(rnd, pending.sources, pending.confidences)
        self._accepted_now += rnd.accepted
        if st.contest is not None:
            self._judge_choice(st.contest, rnd.accepted, ids[pending.position:].tolist())
            st.contest = None

    def _judge_choice(self, contest: tuple, accepted: int, revealed: list[int]) -> None:
        """Learn the row choice's bias for own's (kind, source): one `CHOICE_STEP` toward the
        candidate passed over whenever the tokens the target wrote after the draft (`revealed`)
        show it would have been accepted further than the sent draft (`accepted` tokens).

        One step always reveals which of the two went further (the sent draft's accepted tokens
        plus the target's own next one), though not always by how much. A source's learned
        acceptance cannot settle the choice: it is learned only where that source wins it, i.e.
        where the other was weak (code_agent's lookups ended at 0.73 at b 1 against 0.95 at b 8 on
        the same turns, and lost rows where they were accepted further). Judging the passed-over
        candidate's acceptance instead is biased the other way (judged only as far as the sent
        draft reveals) and drafted more everywhere (docs/drafting.md). At equilibrium the two wrong
        choices, tree for own and own for tree, are equally frequent."""
        key, chose_tree, passed = contest
        if agreement(passed, revealed) <= accepted:
            return
        step = CHOICE_STEP if chose_tree else -CHOICE_STEP  # a larger bias favours own
        self.choice_bias[key] = self.choice_bias.get(key, 0.0) + step

    # -- sizing -------------------------------------------------------------------------------

    def _size(self, candidates: list[Candidate | None], contexts=None) -> list[list[int]]:
        """Each row's draft, sized together; `contexts`: each row's context length (tokens), which
        prices its draft tokens (`budget.row_prices`; None: every row at the reference context)."""
        if not candidates:
            return []
        lengths = np.array([len(c.tokens) if c else 0 for c in candidates])
        width = max(1, int(lengths.max()))
        alphas = np.zeros((len(candidates), width))  # per row and draft position
        for i, c in enumerate(candidates):
            if c is not None:
                conf = self._confidences(c)
                alphas[i, : len(conf)] = conf
        price = self._prices(len(candidates), contexts)
        if self.plan.budget:
            sizes = allocate(alphas, price, self.step_budget, self.gamma, lengths)
        else:
            sizes = fixed(alphas[:, 0], price, self.gamma, lengths, gate=self.plan.gate)
        scale = self._rate()
        self.rate.observe(len(candidates), self._accepted_now, float(np.dot(price / scale, sizes)))
        return [c.tokens[: int(k)] if c and k else [] for c, k in zip(candidates, sizes, strict=True)]

    def _rate(self) -> float:
        """What the budget multiplies each token's price by: the run's tokens per unit of pass cost
        (`budget.TokenRate`) under budget_rule "rate", 1 under "value"."""
        return self.rate.value() if self.plan.budget_rule == "rate" else 1.0

    def _prices(self, rows: int, contexts=None) -> np.ndarray:
        """The price of one draft token per row of a step of `rows` rows, each row by its context
        length (`contexts`; None: every row at the reference context). The reference is the context
        delta holds at: the learned one's mean drafted context once learned, else the plan's ctx_ref,
        else (ctx_ref None) the mean context of the last step's rows (`step_ctx`; before any step,
        the mean of `contexts`)."""
        terms = self.cost.terms() if self.plan.learn_delta else None  # the learned pass cost terms
        if contexts is None:
            return row_prices(self.price, rows, [0.0] * rows, 0.0, 0.0, terms) * self._rate()
        ref = self.cost.ref_ctx() if self.plan.learn_delta and self.cost.learned else None
        if ref is None:
            ref = self.plan.ctx_ref
        if ref is None and self.step_ctx is not None:
            ref = self.step_ctx
        if ref is None:
            ref = float(np.mean(contexts)) if len(contexts) else 0.0
        return row_prices(self.price, rows, contexts, self.plan.delta_ctx, float(ref), terms) * self._rate()

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
                "continued": self.continued, "parked": len(self.parked),
                "choice_bias": {f"{kind}/{source}": round(v, 3)
                                for (kind, source), v in self.choice_bias.items()},
                "grammar_error": self.grammar_error, "delta": self.price - self.plan.d,
                "delta_learned": self.plan.learn_delta and self.cost.learned,
                "delta_fit": self.cost.delta_raw(), "delta_fit_se": self.cost.delta_se(),
                "token_rate": self.rate.value(),
                "last_error": self.last_error}

    def reset_stats(self) -> None:
        self.accounting.reset()

    def flush(self) -> None:
        self.accounting.flush()
