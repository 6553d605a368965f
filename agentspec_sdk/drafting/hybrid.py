"""The structure layer over a model drafter: per row, vLLM's draft model proposes, then this drafter
cuts the model's draft at the end of the segment the segmenter sees and, in the full hybrid, takes
the structure drafter's own draft (grammar-forced text, lookup, suffix trees) instead when its value
priced by the budget is larger.

`HybridDrafter(plan, tokenizer, mode=...)` is a `StructureDrafter`: the same row states, segmenter,
candidates, acceptance estimates and records. It overrides the one hook `_row_candidate` (a row's
candidate: the model's, cut, or the larger of it and the structure's own) and, in observe and cut,
sends its candidates unsized (`budgeted`). A subclass rather than a strategy handed to the drafter:
its `propose` takes the model's drafts beside the rows and gives back which rows it replaced, and
that per-step state is the hybrid's own.

Modes (`MODEL_MODES`):
  observe  the model's draft untouched (vLLM's `draft_model` as a peer; drafts recorded per class)
  cut      the model's draft cut at the segment end only (the ablation of mechanism 1)
  hybrid   cut, then per row the larger of (model draft, structure draft) by the budget's value
           Σ_j Π_{i≤j} α_i − price · length, then sized by the budget like the structure drafter's

The model's tokens are source "model": their per-(class, source) acceptance is learned online from
the settled rounds like every other source's, so the choice follows what the draft model achieves.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentspec_sdk.drafting.candidates import tokens_inside
from agentspec_sdk.drafting.drafter import StructureDrafter
from agentspec_sdk.drafting.plan import DraftPlan
from agentspec_sdk.drafting.rows import Candidate, RowInput, RowState
from agentspec_sdk.errors import PlanError

MODEL_MODES = ("observe", "cut", "hybrid")
MODEL_SOURCE = "model"


class HybridDrafter(StructureDrafter):
    """`propose(rows, model_drafts) -> (drafts, replaced)`: one draft per row and, per row, whether the
    sent draft is not a prefix-cut of the model's (its draft probabilities must then be dropped)."""

    def __init__(self, plan: DraftPlan, tokenizer, *, mode: str, plan_path: str | None = None,
                 max_draft: int | None = None, **options):
        """`options`: `StructureDrafter`'s other keywords (max_model_len, lab)."""
        if mode not in MODEL_MODES:
            raise PlanError(f"model drafter mode must be one of {MODEL_MODES}, got {mode!r}")
        self.mode = mode
        self.budgeted = mode == "hybrid"  # observe / cut: the model's (cut) draft as vLLM made it, no budget
        self._model_drafts: Sequence[Sequence[int]] = ()
        self.replaced: list[bool] = []
        self.model_chosen = 0  # rows whose sent draft is the model's (cut or not)
        self.structure_chosen = 0  # rows whose sent draft is the structure drafter's
        self.model_cut_tokens = 0  # model tokens dropped at a segment end
        super().__init__(plan, tokenizer, plan_path=plan_path, max_draft=max_draft, **options)

    def propose(self, rows: Sequence[RowInput], model_drafts: Sequence[Sequence[int]] | None = None):
        if model_drafts is None or len(model_drafts) != len(rows):
            raise PlanError(f"HybridDrafter.propose needs one model draft per row ({len(rows)} rows, got "
                            f"{None if model_drafts is None else len(model_drafts)})")
        self._model_drafts = model_drafts
        self.replaced = [False] * len(rows)
        drafts = super().propose(rows)  # never raises: a failed step gives no drafts
        return drafts, list(self.replaced)

    def _row_candidate(self, i: int, st: RowState, price: float, note: dict | None) -> Candidate | None:
        model = self._model_candidate(st, [int(t) for t in self._model_drafts[i] if int(t) >= 0])
        if self.mode != "hybrid":
            return model
        own = self.choice.candidate(st, price, note)
        if own is not None and (model is None or self.value(own, price) > self.value(model, price)):
            self.replaced[i] = True
            self.structure_chosen += 1
            return own
        if model is not None:
            self.model_chosen += 1
        st.contest = None  # the sent draft is the model's: it judges no choice between own and the tree
        return model

    def _model_candidate(self, st: RowState, tokens: list[int]) -> Candidate | None:
        """The model's draft as a candidate of the row's open segment, cut at its end (not in observe)."""
        tokens = tokens[: self.gamma]
        if self.mode != "observe" and tokens:
            keep = tokens_inside(self.token_bytes, st.seg, tokens)
            self.model_cut_tokens += len(tokens) - keep
            tokens = tokens[:keep]
        if not tokens:
            return None
        kind = st.fmt.kind(st.seg.kind)
        return Candidate(tokens, [MODEL_SOURCE] * len(tokens), kind.name, kind.law_class.value)

    def value(self, cand: Candidate, price: float) -> float:
        """The budget's value of the candidate at the row's `price`: expected accepted tokens minus the
        price (verify cost + drafter cost, in target passes) of the tokens the budget would send
        (`budget.sent_value`, as the structure drafter weighs its own sources)."""
        return self.estimates.worth(cand, price)

    def stats(self) -> dict:
        return {**super().stats(), "model_mode": self.mode, "model_chosen": self.model_chosen,
                "structure_chosen": self.structure_chosen, "model_cut_tokens": self.model_cut_tokens}
