"""Per-step draft lengths: greedy marginal value under a step budget, and the law's gate.

The j-th draft token of row r is accepted with probability alpha_r^j (acceptance is a prefix), so its
expected value is alpha_r^j tokens; verifying it costs `price` = delta + d of a target pass. Tokens are
taken in order of value while value >= price and the step budget lasts. Because alpha^j falls with j,
each row gets a prefix 1..gamma_r of its draft. A draft that chains sources (grammar-forced text,
then a lookup) has a per-position acceptance alpha_{r,i}; the j-th token's value is then the product
alpha_{r,1} ... alpha_{r,j}, which still falls with j.
"""

from __future__ import annotations

import numpy as np

from agentspec_sdk.errors import LawInputError
from agentspec_sdk.law.closed_forms import saving, tau


def batch_price(price: float, rows: int, terms: tuple[float, float, float] | None = None) -> float:
    """The price of one draft token in a step of `rows` sequences, from `price` = delta + d measured
    for one sequence (the law's units: a fraction of one target pass).

    With `terms` = (a, b, c), the pass cost model's seconds per pass, per row and per verified draft
    token (`law.PassCosts` offline, `law.OnlineStepCost.terms()` while drafting), the verify part is
    priced with them: c n / (a + b n) per row of an n-row pass, plus the drafter's part of `price`
    (price - c / (a + b)).

    When a pass is dominated by per-token work (a CPU, a large batch), one pass over b rows costs about
    c0 (1 + r b) with r = price / (1 - price), and an extra verified token c0 r; measured per row, as
    throughput counts it, the extra token costs r b / (1 + r b) of that row's share of the pass. With
    one row this is `price`; it grows with the batch (here: 0.02 at b=1 is 0.14 at b=8, as measured)."""
    if terms is not None:
        a, b, c = (float(x) for x in terms)
        n = max(int(rows), 1)
        if a + b > 0 and a + b * n > 0 and c >= 0:
            drafter = max(price - c / (a + b), 0.0)
            return min(c * n / (a + b * n) + drafter, 1.0)
    if not 0.0 <= price < 1.0:
        return min(max(price, 0.0), 1.0)
    r = price / (1.0 - price)
    b = max(int(rows), 1)
    return r * b / (1.0 + r * b)


def sequence_price(row_price: float, rows: int) -> float:
    """The inverse of `batch_price` (without pass cost terms): the one-sequence price whose per-row
    price in a step of `rows` rows is `row_price`. Prices a drafter as a cost per row charges it (the
    offline replay, which has no passes to learn the price from)."""
    if not 0.0 <= row_price < 1.0:
        raise LawInputError(f"a per-row price must be in [0, 1), got {row_price}")
    r = row_price / (max(int(rows), 1) * (1.0 - row_price))
    return r / (1.0 + r)


def row_prices(price: float, rows: int, contexts, delta_ctx: float, ref_ctx: float,
               terms: tuple[float, float, float] | None = None) -> np.ndarray:
    """The price of one draft token per row of a step, each row priced by its own context length.

    A verified draft token attends over its row's whole context, so it costs more in a long row:
    the pass cost model's `verified_ctx` term (seconds per verified token per 1k tokens of the
    row's context, `law.PassCosts`). `delta_ctx` is that term in the law's units (a fraction of one
    sequence's pass per 1k tokens of context); `price` = delta + d holds at `ref_ctx` tokens of
    context (where delta was measured or learned), so a row of L tokens costs, for one sequence,
    price + delta_ctx (L - ref_ctx) / 1000 (at least 0), then `batch_price` for the step's rows.
    With `terms` = (a, b, c) the context part in seconds is e = delta_ctx (a + b) per 1k tokens,
    priced per row of an n-row pass like c: e (L - ref_ctx) / 1000 · n / (a + b n).
    `delta_ctx` = 0 gives every row `batch_price(price, rows, terms)`."""
    ctx = np.asarray(contexts, dtype=float).reshape(-1)
    base = batch_price(price, rows, terms)
    if delta_ctx <= 0 or ctx.size == 0:
        return np.full(ctx.size, base)
    shift = delta_ctx * (ctx - float(ref_ctx)) / 1000.0  # one sequence's price, relative to ref_ctx
    if terms is not None:
        a, b, _ = (float(x) for x in terms)
        n = max(int(rows), 1)
        if a + b > 0 and a + b * n > 0:
            return np.clip(base + shift * (a + b) * n / (a + b * n), 0.0, 1.0)
    return np.array([batch_price(max(price + s, 0.0), rows) for s in shift])


class TokenRate:
    """The run's output tokens per unit of pass cost, learned from what the drafts got accepted:

        rate = Σ (rows + accepted) / Σ (rows + Σ_r price_r · drafted_r)      (over steps, decayed)

    in units of a row's share of a pass without drafts (1 with no drafts). A pass of n rows costs
    n + Σ_r p_r γ_r row shares (p_r: the row's price, `row_prices`) and yields n + accepted tokens,
    so the run's cost per token is (Σ passes' costs) / (Σ tokens), and one more draft token of value
    v (expected accepted tokens) lowers it only when v > rate · p_r: a token worth its price at a rate
    of one token per pass is not worth it when every pass already yields `rate` tokens per row share.
    That is the law's saving s = 1 - (1 + γ(δ + d)) / (τ + 1) at its optimum (ds/dγ = 0 at
    v = (δ + d)(τ + 1) / (1 + γ(δ + d))), taken over the run rather than per row or step: the budget
    prices each token at `rate` times its price (lab switch budget_rule "rate"). Measured from realised
    acceptance, not the drafts' own estimates; 1 until `min_steps` steps."""

    __slots__ = ("decay", "min_steps", "_tokens", "_cost", "_steps")

    def __init__(self, decay: float = 0.99, min_steps: int = 16):
        if not 0.0 < decay <= 1.0:
            raise LawInputError(f"decay must be in (0, 1], got {decay}")
        self.decay, self.min_steps = decay, min_steps
        self._tokens = self._cost = 0.0
        self._steps = 0

    def observe(self, rows: int, accepted: int, priced: float) -> None:
        """One step: `rows` rows each got a pass, `accepted` draft tokens were accepted (the previous
        step's drafts, resolved in this one), `priced` = Σ_r p_r γ_r of the drafts sent now."""
        if rows <= 0:
            return
        self._tokens = self.decay * self._tokens + rows + max(int(accepted), 0)
        self._cost = self.decay * self._cost + rows + max(float(priced), 0.0)
        self._steps += 1

    def value(self) -> float:
        if self._steps < self.min_steps or self._cost <= 0:
            return 1.0
        return max(self._tokens / self._cost, 1.0)


def sent_length(confidences, price: float, gamma_max: int) -> int:
    """How many tokens of a draft the budget sends a row without a step cap: the prefix whose
    values v_j = Π_{i≤j} confidence_i are ≥ `price`, at most `gamma_max`."""
    return _sent(confidences, price, gamma_max)[0]


def sent_value(confidences, price: float, gamma_max: int) -> float:
    """Expected accepted tokens of the part of a draft the budget sends: Σ_j v_j over the prefix
    with v_j = Π_{i≤j} confidence_i ≥ `price`, at most `gamma_max` tokens (what `allocate` gives a
    row without a step cap). Comparing candidates by this, not by Σ over the whole candidate, weighs
    them as they will be sent."""
    return _sent(confidences, price, gamma_max)[1]


def _sent(confidences, price: float, gamma_max: int) -> tuple[int, float]:
    """(sent length, sent value); a loop in Python floats: drafts are at most γ tokens, where numpy's
    per-call cost was most of the time (it ran for every row's candidates, every step)."""
    value, total, n = 1.0, 0.0, 0
    for c in confidences[: max(int(gamma_max), 0)]:
        value *= float(c)
        if not value >= price:  # as numpy compares: a NaN estimate is not paid for
            break
        total += value
        n += 1
    return n, total


def predicted_saving(alphas: np.ndarray, gammas: np.ndarray, delta: float, d: float) -> np.ndarray:
    """The law's net saving s = 1 - (1 + gamma (delta + d)) / (tau + 1), tau from alpha (eps = 1 - alpha)."""
    alphas = np.asarray(alphas, dtype=float)
    gammas = np.asarray(gammas, dtype=float)
    t = tau(np.maximum(gammas, 0.0), 1.0 - np.clip(alphas, 0.0, 1.0))
    return np.asarray(saving(gammas, t, delta, d), dtype=float)


def allocate(
    alphas,
    price: float,
    step_budget: int | None,
    gamma_max: int,
    max_len_per_row=None,
    *,
    gate: bool = True,
) -> np.ndarray:
    """Draft length per row (int array, 0..min(gamma_max, max_len_per_row[r])).

    `alphas`: per-row acceptance estimates in [0, 1], or a (rows, width) array of per-position
    acceptance (positions past width count as 0). `price`: delta + d, one for every row or one per
    row (`row_prices`: a long row's tokens cost more). `step_budget`: total draft tokens this step
    (None = unlimited).

    The law's gate (no draft where the predicted saving s = 1 - (1 + gamma price) / (tau + 1) is
    negative) holds by construction: every token given has alpha^j >= price, so
    tau = sum_j alpha^j >= gamma price and s >= 0. `gate=False` is accepted for symmetry with `fixed`.
    """
    a = np.clip(np.asarray(alphas, dtype=float), 0.0, 1.0)
    per_position = a.ndim == 2
    if not per_position:
        a = a.reshape(-1)
    rows = a.shape[0]
    if rows == 0:
        return np.zeros(0, dtype=np.int64)
    prices = np.asarray(price, dtype=float)
    if prices.ndim and prices.size != rows:
        raise LawInputError(f"allocate got {prices.size} prices for {rows} rows")
    if gamma_max < 0 or (step_budget is not None and step_budget < 0) or np.any(prices < 0):
        raise LawInputError(
            f"allocate needs gamma_max >= 0, step_budget >= 0, price >= 0; "
            f"got {gamma_max}, {step_budget}, {price}")
    caps = _caps(rows, gamma_max, max_len_per_row)
    width = int(caps.max()) if rows else 0
    if width == 0:
        return np.zeros(rows, dtype=np.int64)
    j = np.arange(1, width + 1, dtype=float)
    if per_position:
        padded = np.zeros((rows, width))
        n = min(width, a.shape[1])
        padded[:, :n] = a[:, :n]
        values = np.cumprod(padded, axis=1)
    else:
        values = a[:, None] ** j[None, :]
    limit = prices.reshape(-1, 1) if prices.ndim else prices
    usable = (j[None, :] <= caps[:, None]) & (values >= limit)
    counts = usable.sum(axis=1)
    if step_budget is not None and counts.sum() > step_budget:
        flat = np.where(usable, values, -1.0).ravel()
        # highest value first; among equal values, lower j first keeps each row's allocation a prefix
        order = np.lexsort((np.tile(j, rows), -flat))[: int(step_budget)]
        order = order[flat[order] >= 0]
        counts = np.bincount(order // width, minlength=rows)
    return counts.astype(np.int64)


def fixed(alphas, price: float, gamma_max: int, max_len_per_row=None, *, gate: bool = True) -> np.ndarray:
    """Ablation "structure-without-budget": every row drafts min(gamma_max, available) tokens."""
    a = np.clip(np.asarray(alphas, dtype=float).reshape(-1), 0.0, 1.0)
    counts = _caps(a.size, gamma_max, max_len_per_row)
    if gate:
        counts[predicted_saving(a, counts, price, 0.0) < 0] = 0
    return counts


def _caps(rows: int, gamma_max: int, max_len_per_row) -> np.ndarray:
    if max_len_per_row is None:
        return np.full(rows, int(gamma_max), dtype=np.int64)
    caps = np.asarray(max_len_per_row, dtype=np.int64).reshape(-1)
    if caps.size != rows:
        raise LawInputError(f"max_len_per_row has {caps.size} entries for {rows} rows")
    return np.minimum(np.maximum(caps, 0), int(gamma_max))
