"""The structure drafter: one draft per batch row from the row's token history and the plan.

vLLM's custom proposer hands over only token histories (no request ids, no grammar state), so each row
is tracked by its history: a cached `RowState` (decoded text, segmenter over the model's turn, lookup
corpora, tool-call matcher, pending draft) is reused when the row's history extends the cached one by
at most one round's worth of tokens, and rebuilt otherwise (rows finish, arrive, get reordered).

Per step and row: resolve the previous draft (accounting), find the open segment and its kind's policy
(`DraftPlan.kinds`: "off" drafts nothing there, "trees" sends exactly vLLM's suffix draft, unsized;
"structure" goes on as follows), build a candidate
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

from agentspec_sdk.drafting.budget import TokenRate
from agentspec_sdk.drafting.candidates import DraftSetup, OwnSource, TreeSource, opening_of
from agentspec_sdk.drafting.choice import ChoiceBias, RowChoice
from agentspec_sdk.drafting.grammars import CallGrammars
from agentspec_sdk.drafting.lab import LabSwitches
from agentspec_sdk.drafting.plan import DraftPlan, PlanWatcher
from agentspec_sdk.drafting.pricing import Estimates, Sizer
from agentspec_sdk.drafting.records import Accounting, PendingDraft
from agentspec_sdk.drafting.rows import Candidate, RowContext, RowInput, RowState, RowTracker
from agentspec_sdk.drafting.suffix_source import SuffixTrees
from agentspec_sdk.drafting.tokenizer import MemoTokenizer, ll_tokenizer, turn_markers
from agentspec_sdk.errors import AgentSpecError
from agentspec_sdk.law.cost_fits import OnlineStepCost
from agentspec_sdk.law.estimators import OnlineAcceptance
from agentspec_sdk.structure.format_detect import prompt_format
from agentspec_sdk.structure.formats import AgentFormat

__all__ = ["LOG_EVERY", "LOGGED_FAILURES", "StructureDrafter"]

log = logging.getLogger("agentspec.drafting")

_NO_TOKENS = np.zeros(0, dtype=np.int64)  # a new row's tokens gained this step: its whole history is built
LOGGED_FAILURES = 10  # failures (rows or steps) logged with their traceback; after them every LOG_EVERY-th
LOG_EVERY = 1000


def _context(row: RowInput) -> int:
    """A row's context as vLLM holds it this step (tokens)."""
    return row.num_tokens if row.num_tokens is not None else len(row.token_ids)


class StructureDrafter:
    """`propose(rows) -> list[list[int]]`: structure-isolated, budget-sized drafts for a batch.

    Its parts, one job each: `rows` (`rows.RowTracker`: the row states between steps), `choice`
    (`choice.RowChoice` over the sources `candidates.OwnSource` and `candidates.TreeSource`: a row's
    candidate), `sizer` (`pricing.Sizer`: the step's prices and sizing, with `estimates`) and
    `accounting` (`records.Accounting`: resolved rounds, learned acceptance, step log). What they
    learn outlives a plan (`accounting`, `choices`, `cost`, `rate`, the trees); the rest is rebuilt
    from each plan (`_apply_plan`)."""

    # whether the budget sizes the rows' candidates; False: each is sent as it is (a subclass's)
    budgeted = True

    def __init__(self, plan: DraftPlan, tokenizer, *, plan_path: str | None = None,
                 max_draft: int | None = None, max_model_len: int | None = None,
                 lab: LabSwitches | None = None):
        """`plan_path`: re-read the plan when this file changes. `max_draft`: hard cap on a draft's
        length whatever the plan says (vLLM's num_speculative_tokens); `max_model_len`: the context
        a "trees" draft must leave room in, as vLLM's suffix proposer does (None: no limit). `lab`:
        the bench's ablation switches (None: the drafter as it ships)."""
        self.max_draft, self.max_model_len = max_draft, max_model_len
        self.lab = LabSwitches.of(lab)
        self.ll, self.token_bytes = ll_tokenizer(tokenizer)
        # draft text tokenized once: the drafts' canonical tokens and the tool-call matchers' checks
        self.memo_tokenizer = MemoTokenizer(self.ll)
        self._watcher = PlanWatcher(plan_path) if plan_path else None
        self._turn_start_default, self.turn_end = turn_markers(tokenizer)
        end = self.turn_end.encode("utf-8") if self.turn_end else None
        self.end_ids = frozenset(i for i, b in enumerate(self.token_bytes.table) if end and b == end)
        self.rows = RowTracker()
        self.trees: SuffixTrees | None = None
        self.choices = ChoiceBias()
        self.accounting = Accounting(OnlineAcceptance(plan.prior_acceptance), plan.records_path)
        self.cost = OnlineStepCost(plan.delta)
        self.rate = TokenRate()  # the run's tokens per unit of pass cost (lab switch budget_rule "rate")
        self.last_error: str | None = None  # traceback of the last failing row or step
        self.failures = 0  # failing rows and steps, logged or not
        # explain mode (benchmarks/offline_drafting.py --explain): a list that gets, per step, one dict
        # per row with the candidates weighed (own, tree, tree_raw before the segment cut, rule) and
        # what was sent; None (the default): nothing recorded
        self.explain: list | None = None
        # per batch row of the last step, the segment kind its draft began in (None: not segmented)
        self.last_kinds: list[str | None] = []
        self._apply_plan(plan)

    @classmethod
    def from_env(cls, tokenizer) -> StructureDrafter:
        from agentspec_sdk.drafting.plan import PLAN_ENV

        plan = DraftPlan.from_env()
        return cls(plan, tokenizer, plan_path=os.environ[PLAN_ENV], lab=LabSwitches.from_env())

    # -- plan -----------------------------------------------------------------------------------

    def _apply_plan(self, plan: DraftPlan) -> None:
        self.plan = plan
        self.formats = plan.agent_formats()
        self.turn_start = plan.turn_start or self._turn_start_default
        self.gamma = plan.gamma_max if self.max_draft is None else min(plan.gamma_max, self.max_draft)
        self.cost.prior = plan.delta
        registry = plan.registry()
        self.grammar_error: str | None = None
        try:
            grammars = CallGrammars(registry, self.ll, self.memo_tokenizer) if len(registry) else None
        except AgentSpecError as exc:  # an unsupported schema: lookup still works, no forced drafts
            grammars, self.grammar_error = None, str(exc)
        self.trees = SuffixTrees.for_plan(plan, self.lab.suffix_trees, self.trees)
        # formats or tools changed: rebuild every row's state
        self.rows.reset(RowContext(self.trees, self.token_bytes, self.turn_start, self.turn_end,
                                   self.pick_format))
        rules = plan.kind_rules()
        self.policies = {key: rule.policy for key, rule in rules.items()}  # by (format, kind)
        self.default_policy = plan.kind_rule("").policy  # a kind no format of the plan names
        # where a kind sends vLLM's suffix draft, the trees are fed as vLLM's proposer feeds them: a new
        # row's tokens sampled in its step enter as its response
        self.vllm_feed = "trees" in self.policies.values() or self.default_policy == "trees"
        setup = self.setup = DraftSetup(plan, self.gamma, self.token_bytes, self.memo_tokenizer,
                                        self.end_ids, self.lab, rules, plan.kind_rule(""))
        self.estimates = Estimates(plan, self.gamma, self.accounting, self.lab)
        self.sizer = Sizer(plan, self.gamma, self.estimates, self.cost, self.rate)
        tree = self.tree = (TreeSource(setup, self.trees, self.accounting.acceptance)
                            if self.trees is not None else None)
        self.choice = RowChoice(setup, self.estimates, OwnSource(setup, grammars, self.estimates), tree,
                                self.choices)
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
            self.rows.forget()
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
        histories = [r.history() for r in rows]
        # what the row choice and the sizing charge each row's draft tokens (its context: its history)
        prices = self.sizer.begin_step([_context(r) for r in rows], [len(h) for h in histories])
        states, dropped = self.rows.match(histories, self.gamma + 1)
        self.accounting.dropped += dropped
        candidates, errors, accepted, notes, direct = self._candidates(rows, states, prices)
        self.rows.states = states
        contexts = [st.n if st is not None else 0 for st in states]
        if self.budgeted:
            drafts = self.sizer.size(candidates, contexts, accepted)
        else:
            drafts = [list(c.tokens) if c is not None else [] for c in candidates]
        for i, cand in direct.items():  # policy "trees": vLLM's suffix draft as it is, not sized
            candidates[i], drafts[i] = cand, list(cand.tokens)
        if notes is not None:
            for note, cand, draft in zip(notes, candidates, drafts, strict=True):
                note.update(chosen=cand, sent=draft)
            self.explain.append(notes)
        self._settle(rows, states, candidates, drafts, errors, started, at)
        return drafts

    def _candidates(self, rows: Sequence[RowInput], states: list[RowState | None], prices):
        """(each row's candidate to size, rows that failed, draft tokens accepted among the drafts
        resolved, explain notes or None, {row: its policy "trees" draft, sent unsized}); a failing
        row's state is dropped. After `_follow`, row after row: the row's last draft resolved, then its
        candidate chosen (each row reads the estimates the rows before it taught)."""
        candidates: list[Candidate | None] = [None] * len(rows)
        kinds: list[str | None] = [None] * len(rows)
        direct: dict[int, Candidate] = {}
        notes = [{} for _ in rows] if self.explain is not None else None
        policies, followed, errors = self._follow(rows, states, kinds)
        accepted = 0
        for i, policy in enumerate(policies):
            if policy is None:
                continue
            try:
                st = states[i]
                if followed[i] is not None:
                    accepted += self.accounting.resolve_row(st, followed[i], rows[i].sampled,
                                                            self.choices.judge)
                if policy != "structure":
                    st.contest = None
                    cand = self.tree.vllm_draft(st) if policy == "trees" and self.tree is not None else None
                    if cand is not None:
                        direct[i] = cand
                    continue
                candidates[i] = self._row_candidate(i, st, float(prices[i]),
                                                    notes[i] if notes is not None else None)
            except Exception:  # one bad row never takes the batch down: it gets no draft
                errors += 1
                states[i] = kinds[i] = None
                self._failed(f"row {i}")
        self.last_kinds = kinds
        return candidates, errors, accepted, notes, direct

    def _follow(self, rows: Sequence[RowInput], states: list[RowState | None], kinds: list):
        """The rows follow their histories (new rows built, text and segments advanced), each says
        what it wants of the trees, and one call adds every row's new tokens to the trees and drafts
        from them, row after row (`SuffixTrees.step`, into `st.tree_draft`). Returns (each row's
        policy, None for a row not drafted; the history where a row's last draft is to be resolved;
        rows that failed)."""
        policies: list[str | None] = [None] * len(rows)
        followed: list = [None] * len(rows)
        asks, asked, errors = [], [], 0
        for i, row in enumerate(rows):
            if not row.draftable:
                continue
            try:
                st = states[i]
                ids = row.history()
                if st is None:
                    response = (row.sampled or 1) if self.vllm_feed else 0
                    st = states[i] = self.rows.new_row(ids, response)
                    self.accounting.rebuilds += 1
                    new = _NO_TOKENS
                else:
                    followed[i] = ids
                    new = st.advance(ids)
                kind = kinds[i] = self._policy_kind(st)
                policy = policies[i] = self.policies.get((st.fmt.name, kind), self.default_policy)
                st.tree_draft = None
                if self.tree is not None:
                    room = self.gamma if self.max_model_len is None else \
                        min(self.gamma, self.max_model_len - st.n - 1)
                    asks.append(self.tree.ask(st, new, policy, kind, room))
                    asked.append(i)
            except Exception:  # one bad row never takes the batch down: it gets no draft
                errors += 1
                states[i] = kinds[i] = policies[i] = None
                self._failed(f"row {i}")
        if asks:
            for i, drafted in zip(asked, self.trees.step(asks), strict=True):
                if states[i] is not None:
                    states[i].tree_draft = drafted
        return policies, followed, errors

    def _policy_kind(self, st: RowState) -> str:
        """The segment kind whose policy governs the row's draft: the kind it is in, or the structured
        kind whose open marker the model has begun (the held-back text already belongs to it)."""
        kind = st.seg.kind
        if st.seg.pending and self.lab.isolation and not st.fmt.kind(kind).delimited:
            opening = opening_of(st)
            if opening is not None:
                return opening[0].name
        return kind

    def _row_candidate(self, i: int, st: RowState, price: float, note: dict | None) -> Candidate | None:
        """Batch row `i`'s candidate at its `price` (the hook a subclass overrides to weigh another
        source per row: drafting.hybrid)."""
        return self.choice.candidate(st, price, note)

    def _settle(self, rows, states, candidates, drafts, errors: int, started: float, at: float) -> None:
        """Account the step: the budget's decisions, the pass cost's observation, each drafted row's
        pending draft and the step's line."""
        self.accounting.sized([(c.law_class, len(c.tokens), len(d))
                               for c, d in zip(candidates, drafts, strict=True)
                               if c is not None])
        drafted_ctx = int(sum(len(d) * states[i].n for i, d in enumerate(drafts) if d))
        if self.plan.learn_delta:
            self.cost.observe(at, len(rows), sum(map(len, drafts)), drafted_ctx)
        for i, draft in enumerate(drafts):
            st, cand = states[i], candidates[i]
            if st is not None and draft and cand is not None:
                conf = self.estimates.estimates(cand)[: len(draft)]
                st.pending = PendingDraft(st.n, st.hash.value, cand.kind, cand.law_class, cand.source, draft,
                                          cand.sources[: len(draft)], conf)
        sizes = [len(d) for d in drafts]  # for the report's cost fit: context and class of the drafted tokens
        extra = {"ctx": int(sum(_context(r) for r in rows)),
                 "drafted_ctx": drafted_ctx,
                 "drafted_s": int(sum(k for k, c in zip(sizes, candidates, strict=True)
                                      if k and c.law_class == "S"))}
        self.accounting.end_step(len(rows), sum(sizes), time.perf_counter() - started, errors, at, extra)

    # -- reading --------------------------------------------------------------------------------

    @property
    def records(self):
        return self.accounting.records

    def pending_draft(self, row: int) -> PendingDraft | None:
        """The unresolved draft the last `propose` gave batch row `row` (position, prefix_hash, kind,
        law_class, source, tokens), or None."""
        states = self.rows.states
        state = states[row] if 0 <= row < len(states) else None
        return state.pending if state is not None else None

    @property
    def price(self) -> float:
        """delta + d for one sequence: the learned delta once the step times allow, else the plan's."""
        return self.sizer.price

    def stats(self) -> dict:
        return {**self.accounting.stats(), "plan_version": self.plan.version,
                "suffix_trees": self.trees is not None, "suffix_chosen": self.choices.suffix_chosen,
                "continued": self.rows.continued, "parked": len(self.rows.parked),
                "choice_bias": {f"{kind}/{source}": round(v, 3)
                                for (kind, source), v in self.choices.bias.items()},
                "grammar_error": self.grammar_error, "delta": self.price - self.plan.d,
                "delta_learned": self.plan.learn_delta and self.cost.learned,
                "delta_fit": self.cost.delta_raw(), "delta_fit_se": self.cost.delta_se(),
                "token_rate": self.rate.value(),
                "last_error": self.last_error}

    def flush(self) -> None:
        self.accounting.flush()
