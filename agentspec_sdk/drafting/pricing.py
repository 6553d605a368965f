"""What a draft is worth and what it costs: per-token estimates of a candidate (`Estimates`) and the
step's pricing and sizing of all rows' drafts together (`Sizer`).

`Estimates` turns a candidate's sources into per-token acceptance (a tree's own confidences, or the
acceptance learned per class, source and kind, calibrated online) and values it at a row's price.
`Sizer` prices each row's draft tokens by its context (`budget.row_prices`, the pass cost learned
online or the plan's) and sizes the step's drafts with the budget allocator (`budget.allocate`, or
`budget.fixed` without the budget).
"""

from __future__ import annotations

import numpy as np

from agentspec_sdk.drafting.budget import TokenRate, allocate, fixed, row_prices, sent_value
from agentspec_sdk.drafting.lab import LabSwitches
from agentspec_sdk.drafting.plan import DraftPlan
from agentspec_sdk.drafting.records import CALIBRATED_SOURCES, Accounting
from agentspec_sdk.drafting.rows import Candidate
from agentspec_sdk.law.cost_fits import OnlineStepCost

_DEPTH_BUCKET = (0, 1, 2, 2)  # law.OnlineCalibration.depth below 4


class Estimates:
    """Per-token acceptance estimates of candidates under a plan, the lab switches (`calibrate`) and
    draft length `gamma`, from the acceptance and calibration the accounting learns."""

    def __init__(self, plan: DraftPlan, gamma: int, accounting: Accounting, lab: LabSwitches | None = None):
        self.plan, self.gamma, self.accounting = plan, gamma, accounting
        self.lab = lab or LabSwitches()

    def worth(self, cand: Candidate, price: float) -> float:
        """What a candidate is worth at a row's price: `budget.sent_value` (only the tokens the
        budget would send count: a tree draft long in withheld `cross` tokens must not win the row)."""
        return sent_value(self.confidences(cand), price, self.gamma)

    def expected(self, cand: Candidate) -> float:
        """Expected accepted tokens of a candidate: Σ_j Π_{i≤j} confidence_i."""
        return float(np.cumprod(self.confidences(cand)).sum())

    def confidences(self, cand: Candidate) -> list[float]:
        """Per token, its acceptance given the ones before: `estimates`, those of `CALIBRATED_SOURCES`
        times the factor learned for their class, kind, source and depth in their source's run
        (`law.OnlineCalibration`; lab switch `calibrate`)."""
        if cand.priced is not None:  # a row's candidates are weighed and sized several times a step
            return cand.priced
        raw = self.estimates(cand)
        if not self.lab.calibrate:
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

    def estimates(self, cand: Candidate) -> list[float]:
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

    def lookup_pays(self, law_class: str, kind, price: float) -> bool:
        """Whether a lookup draft's first token is worth the row's `price`: its learned acceptance,
        calibrated at depth 0 as `confidences` counts it. Under the budget a draft whose first token
        is not is sent empty (`budget.allocate`), so where a lookup would begin the draft it is not
        tokenized (in free text a lookup's first token was accepted 4–5% of the time:
        docs/drafting.md, "Calibrated draft estimates"). Without the budget every draft is sent."""
        if not self.lab.budget:
            return True
        alpha = self.accounting.acceptance.alpha(law_class, "lookup", kind.name)
        if self.lab.calibrate:
            alpha = min(alpha * self.accounting.calibration.factor(law_class, kind.name, "lookup", 0), 1.0)
        return alpha >= price


class Sizer:
    """Prices and sizes a step's drafts under a plan. `cost` (the pass cost learned online) and
    `rate` (the run's tokens per unit of pass cost) outlive plans; `step_ctx` and `step_prices` are
    the step's (`begin_step`)."""

    def __init__(self, plan: DraftPlan, gamma: int, estimates: Estimates, cost: OnlineStepCost,
                 rate: TokenRate):
        self.plan, self.gamma, self.estimates, self.lab = plan, gamma, estimates, estimates.lab
        self.cost, self.rate = cost, rate
        self.step_budget = plan.effective_step_budget()
        # this step's mean row context (tokens, every row of the pass): where the prior delta holds
        # while it is not learned and the plan sets no ctx_ref (`prices`)
        self.step_ctx: float | None = None
        self.step_prices = np.zeros(0)  # this step's price of a draft token per row (`begin_step`)

    @property
    def price(self) -> float:
        """delta + d for one sequence: the learned delta once the step times allow, else the plan's."""
        return (self.cost.delta() if self.plan.learn_delta else self.plan.delta) + self.plan.d

    def begin_step(self, contexts: list[int], histories: list[int]) -> np.ndarray:
        """A step of rows whose contexts are `contexts` (vLLM's, every row of the pass) and whose
        histories are `histories` tokens long: each row's price of a draft token, what the row's
        source choice and the sizing both charge it."""
        self.step_ctx = float(np.mean(contexts)) if contexts else None
        self.step_prices = self.prices(len(histories), histories) if histories else np.zeros(0)
        return self.step_prices

    def size(self, candidates: list[Candidate | None], contexts=None, accepted: int = 0) -> list[list[int]]:
        """Each row's draft, sized together; `contexts`: each row's context length (tokens), which
        prices its draft tokens (`budget.row_prices`; None: every row at the reference context);
        `accepted`: draft tokens accepted among the drafts resolved this step (the rate learns it)."""
        if not candidates:
            return []
        lengths = np.array([len(c.tokens) if c else 0 for c in candidates])
        width = max(1, int(lengths.max()))
        alphas = np.zeros((len(candidates), width))  # per row and draft position
        for i, c in enumerate(candidates):
            if c is not None:
                conf = self.estimates.confidences(c)
                alphas[i, : len(conf)] = conf
        price = self.prices(len(candidates), contexts)
        if self.lab.budget:
            sizes = allocate(alphas, price, self.step_budget, self.gamma, lengths)
        else:
            sizes = fixed(alphas[:, 0], price, self.gamma, lengths, gate=self.lab.gate)
        scale = self._rate()
        self.rate.observe(len(candidates), accepted, float(np.dot(price / scale, sizes)))
        return [c.tokens[: int(k)] if c and k else [] for c, k in zip(candidates, sizes, strict=True)]

    def _rate(self) -> float:
        """What the budget multiplies each token's price by: the run's tokens per unit of pass cost
        (`budget.TokenRate`) under the lab's budget_rule "rate", 1 under "value"."""
        return self.rate.value() if self.lab.budget_rule == "rate" else 1.0

    def prices(self, rows: int, contexts=None) -> np.ndarray:
        """The price of one draft token per row of a step of `rows` rows, each row by its context
        length (`contexts`; None: every row at the reference context). The reference is the context
        delta holds at: the learned one's mean drafted context once learned, else the plan's ctx_ref,
        else (ctx_ref None) the mean context of the step's rows (`step_ctx`; before any step, the
        mean of `contexts`)."""
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
