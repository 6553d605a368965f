"""Cost fits of the Draft Law: what a target pass, a drafted token and the drafter's own step cost,
fitted from what the engine measures (per-step times, the engine's pass log, per-turn decode times,
the proposer's step gaps). The acceptance and kappa fits are in `agentspec_sdk.law.estimators`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from agentspec_sdk.errors import LawInputError

# ---------------------------------------------------------------- costs

@dataclass(frozen=True)
class CostFit:
    """Least-squares fit of step time t = c_T [1 + delta (n_verified - n_rows) + d n_drafted]
    (+ c_row (n_rows - 1) when rows vary). Standard errors by the delta method."""

    c_t: float
    delta: float
    d: float
    c_t_se: float
    delta_se: float
    d_se: float
    row_cost: float | None
    r2: float
    residual_sd: float
    steps: int

    def to_dict(self) -> dict:
        return asdict(self)


def fit_costs(step_times, n_verified, n_drafted=None, n_rows=None) -> CostFit:
    """Fit c_T, delta and d from per-step wall times.

    n_verified: tokens the target scored in the step (gamma + 1 per speculating row);
    n_drafted: tokens the drafter paid to produce (for a model-free drafter, use its cost units;
    None: the drafter costs nothing apart from the step, d = 0 and only delta is fitted);
    n_rows: rows in the step (1 if omitted). delta and d are only separable when n_drafted is not
    a fixed function of n_verified - n_rows (e.g. some verified tokens were forced, not drafted).
    """
    t = np.asarray(step_times, dtype=float)
    v = np.asarray(n_verified, dtype=float)
    fit_d = n_drafted is not None
    dr = np.asarray(n_drafted if fit_d else np.zeros_like(t), dtype=float)
    rows = np.ones_like(t) if n_rows is None else np.asarray(n_rows, dtype=float)
    if not (t.shape == v.shape == dr.shape == rows.shape) or t.ndim != 1:
        raise LawInputError(f"step_times, n_verified, n_drafted, n_rows must be 1-D of equal length, "
                            f"got shapes {t.shape}, {v.shape}, {dr.shape}, {rows.shape}")
    if np.any(t <= 0) or np.any(v < rows) or np.any(dr < 0) or np.any(rows < 1):
        raise LawInputError("need step_times > 0, n_rows >= 1, n_verified >= n_rows, n_drafted >= 0")
    columns = [np.ones_like(t), v - rows] + ([dr] if fit_d else [])
    names = ["intercept", "n_verified - n_rows"] + (["n_drafted"] if fit_d else [])
    vary_rows = bool(np.ptp(rows) > 0)
    if vary_rows:
        columns.append(rows - 1.0)
        names.append("n_rows - 1")
    X = np.stack(columns, axis=1)
    if len(t) <= X.shape[1]:
        raise LawInputError(f"need more than {X.shape[1]} steps to fit costs, got {len(t)}")
    rank = np.linalg.matrix_rank(X)
    if rank < X.shape[1]:
        raise LawInputError(
            f"cost regressors {names} are collinear (rank {rank} < {X.shape[1]}): delta and d are not "
            "separable; vary the drafted count independently of the verified count (forced drafts) "
            "or measure the drafter's time separately")
    beta, *_ = np.linalg.lstsq(X, t, rcond=None)
    resid = t - X @ beta
    dof = len(t) - X.shape[1]
    sigma2 = float(resid @ resid) / dof
    cov = sigma2 * np.linalg.inv(X.T @ X)
    c_t = float(beta[0])
    if c_t <= 0:
        raise LawInputError(f"fitted target pass cost c_T = {c_t:.3g} <= 0: the timings do not fit the model")

    def ratio_se(i: int) -> float:
        # delta method for beta_i / beta_0
        g = np.zeros(len(beta))
        g[0] = -beta[i] / c_t**2
        g[i] = 1.0 / c_t
        return float(math.sqrt(max(g @ cov @ g, 0.0)))

    total = float(((t - t.mean()) ** 2).sum())
    rows_at = 3 if fit_d else 2
    return CostFit(
        c_t=c_t, delta=float(beta[1] / c_t), d=float(beta[2] / c_t) if fit_d else 0.0,
        c_t_se=float(math.sqrt(cov[0, 0])), delta_se=ratio_se(1), d_se=ratio_se(2) if fit_d else 0.0,
        row_cost=float(beta[rows_at] / c_t) if vary_rows else None,
        r2=1.0 - float(resid @ resid) / total if total > 0 else 1.0,
        residual_sd=math.sqrt(sigma2), steps=len(t),
    )


# ---------------------------------------------------------------- online

class OnlineStepCost:
    """The verify cost delta, learned from the drafter's own step times while it runs.

    The gap between two consecutive `propose` calls is the target pass that verified the first call's
    drafts, so `seconds = a + b rows + c drafted` is fitted by least squares with exponential
    forgetting (memory about 1 / (1 - decay) steps). Gaps over `max_gap_factor` times the typical gap
    are skipped (the engine idled while every agent waited on a tool, or a long prefill ran). The
    law's delta for one sequence is c / (a + b); with a single batch size seen, a and b cannot be told
    apart and the pass is taken as proportional to its rows. Until `min_steps` usable gaps with spread
    in the drafted counts, `delta()` is the prior. O(1) per step; a 3×3 solve every `solve_every`.

    Step gaps are noisy (other processes on the cores, a pass that waited on the scheduler), and with
    few rows the drafted counts spread little, so the fitted c can be far off for a while; the budget
    prices every draft token with it. So the fit is not taken as it is: `delta()` is the fitted
    delta shrunk toward the prior by their precisions (a normal prior with sd `prior_sd`, default
    the prior itself, at least 0.01; the fit's standard error from the weighted residuals), and
    `terms()` carries the shrunk c. Clean step times learn the fit (its error is small); noisy ones
    stay near the prior (`delta_raw()`, `delta_se()` say what the fit alone gave)."""

    __slots__ = ("prior", "prior_sd", "decay", "min_steps", "max_gap_factor", "solve_every", "_xtx",
                 "_xty", "_yy", "_weight", "_n", "_last", "_typical", "_estimate", "_raw", "_since_solve",
                 "_rows_seen", "_drafted_seen", "_terms", "_ctx_sums")

    def __init__(self, prior_delta: float, *, decay: float = 0.995, min_steps: int = 64,
                 max_gap_factor: float = 4.0, solve_every: int = 16, prior_sd: float | None = None):
        if not 0.0 < decay <= 1.0:
            raise LawInputError(f"decay must be in (0, 1], got {decay}")
        if not math.isfinite(prior_delta) or prior_delta < 0:
            raise LawInputError(f"prior delta must be a finite number >= 0, got {prior_delta}")
        if prior_sd is not None and not (math.isfinite(prior_sd) and prior_sd > 0):
            raise LawInputError(f"prior sd must be a finite number > 0, got {prior_sd}")
        self.prior = float(prior_delta)
        self.prior_sd = None if prior_sd is None else float(prior_sd)
        self.decay, self.min_steps = decay, min_steps
        self.max_gap_factor, self.solve_every = max_gap_factor, solve_every
        self._xtx = np.zeros((3, 3))
        self._xty = np.zeros(3)
        self._yy = 0.0  # decayed Σ gap², Σ weight: the residuals' variance for the fit's error
        self._weight = 0.0
        self._n = 0
        self._last: tuple[float, int, int] | None = None
        self._typical: float | None = None
        self._estimate: float | None = None
        self._raw: tuple[float, float] | None = None  # the fit alone: (delta, its standard error)
        self._since_solve = 0
        self._rows_seen: set[int] = set()
        self._drafted_seen: set[int] = set()
        self._terms: tuple[float, float, float] | None = None
        self._ctx_sums = [0.0, 0.0]  # decayed Σ drafted·context, Σ drafted (the context c is learned at)

    def observe(self, at: float, rows: int, drafted: int, drafted_ctx: float = 0.0) -> None:
        """A step that began at `at` (seconds, any clock) with `rows` rows and `drafted` draft tokens;
        `drafted_ctx`: Σ over its rows of drafted tokens × the row's context length."""
        if drafted > 0:
            sums = self._ctx_sums
            sums[0] = sums[0] * self.decay + float(drafted_ctx)
            sums[1] = sums[1] * self.decay + float(drafted)
        last, self._last = self._last, (float(at), int(rows), int(drafted))
        if last is None or last[1] <= 0:
            return
        gap = float(at) - last[0]
        if gap <= 0:
            return
        if self._typical is not None and gap > self.max_gap_factor * self._typical:
            return
        self._typical = gap if self._typical is None else 0.95 * self._typical + 0.05 * gap
        x = np.array([1.0, float(last[1]), float(last[2])])
        self._xtx = self.decay * self._xtx + np.outer(x, x)
        self._xty = self.decay * self._xty + gap * x
        self._yy = self.decay * self._yy + gap * gap
        self._weight = self.decay * self._weight + 1.0
        self._n += 1
        if len(self._rows_seen) < 2:
            self._rows_seen.add(last[1])
        if len(self._drafted_seen) < 2:
            self._drafted_seen.add(last[2])
        self._since_solve += 1
        if self._n >= self.min_steps and self._since_solve >= self.solve_every:
            self._since_solve = 0
            self._solve()

    def _solve(self) -> None:
        if len(self._drafted_seen) < 2:
            return
        idx = [0, 1, 2] if len(self._rows_seen) >= 2 else [0, 2]
        xtx, xty = self._xtx[np.ix_(idx, idx)], self._xty[idx]
        if np.linalg.cond(xtx) > 1e10:  # drafted counts move with the rows: c not identifiable
            return
        beta = np.linalg.solve(xtx, xty)
        rss = max(self._yy - float(beta @ xty), 0.0)
        dof = self._weight - len(idx)
        if dof <= 0:
            return
        c = float(beta[-1])
        c_se = math.sqrt(rss / dof * float(np.linalg.inv(xtx)[-1, -1]))
        if len(idx) == 3:
            a, b = float(beta[0]), float(beta[1])
            one_row = a + b
            if not (one_row > 0 and a + b * 8 > 0):
                return
        else:  # one batch size: y = A + c k, one row's share of the pass is A / rows
            one_row = float(beta[0]) / max(next(iter(self._rows_seen)), 1)
            if not one_row > 0:
                return
        raw, raw_se = c / one_row, c_se / one_row
        if not (math.isfinite(raw) and math.isfinite(raw_se)):
            return
        self._raw = (raw, raw_se)
        shrunk = min(max(self._shrink(raw, raw_se), 0.0), 0.9)
        self._estimate = shrunk
        if len(idx) == 3:
            self._terms = (a, b, shrunk * one_row)

    def _shrink(self, raw: float, raw_se: float) -> float:
        """The fitted delta and the prior weighed by their precisions (normal prior, sd `prior_sd`)."""
        sd = self.prior_sd if self.prior_sd is not None else max(self.prior, 0.01)
        if raw_se <= 0:
            return raw
        w_fit, w_prior = 1.0 / raw_se ** 2, 1.0 / sd ** 2
        return (raw * w_fit + self.prior * w_prior) / (w_fit + w_prior)

    def delta(self) -> float:
        return self.prior if self._estimate is None else self._estimate

    def delta_raw(self) -> float | None:
        """The fitted delta before it is shrunk toward the prior (None before a fit)."""
        return None if self._raw is None else self._raw[0]

    def delta_se(self) -> float | None:
        """The fitted delta's standard error (None before a fit)."""
        return None if self._raw is None else self._raw[1]

    def ref_ctx(self) -> float | None:
        """The mean context (tokens) of the rows whose drafted tokens the learned delta is an average
        over (drafted-weighted, with the same forgetting); None before any drafted token."""
        total, drafted = self._ctx_sums
        return total / drafted if drafted > 0 else None

    def terms(self) -> tuple[float, float, float] | None:
        """(a, b, c): seconds per pass, per row and per drafted token, once learned with rows that
        vary (the budget prices a draft token per row of an n-row pass as c n / (a + b n)); else None."""
        return self._terms

    @property
    def learned(self) -> bool:
        return self._estimate is not None


# ---------------------------------------------------------------- pass cost model

PASS_TERMS = ("base", "no_spec", "row", "grammar", "verified", "verified_ctx", "schema", "prefill",
              "prefill_ctx", "ctx")
PASS_TERM_TEXT = {
    "base": "per pass",
    "no_spec": "per pass of an engine without speculative decoding (vLLM's plain sampling path)",
    "row": "per row", "grammar": "per row under a grammar (its token mask each pass)",
    "verified": "per verified draft token",
    "verified_ctx": "per verified draft token per 1k tokens of its row's context",
    "schema": "per verified draft token of a schema (S) row: grammar-mask work",
    "prefill": "per prompt token other requests prefill in the pass",
    "prefill_ctx": "per prefilled prompt token per 1k tokens it attends over (cached prefix included)",
    "ctx": "per 1k tokens of context of the rows in the pass",
}
PROPOSER_TERMS = ("base", "row", "drafted", "ctx")


@dataclass(frozen=True)
class PassCosts:
    """What one target pass costs, term by term (seconds per unit), fitted by least squares over a
    run's passes:

        seconds - proposer_s = base + no_spec no_spec + row rows + grammar grammar_rows + verified drafted
                               + verified_ctx drafted_ctx / 1000
                               + schema drafted_s + prefill prefill + prefill_ctx prefill_ctx
                               + ctx ctx / 1000

    (`prefill_ctx`: Σ over prefilled prompt tokens of their position / 1000, the attention a chunk
    does over the prompt before it, cached prefix included.) `proposer` is the drafter's own time per
    step, fitted the same way on `proposer_s` (base, row, drafted, ctx). Terms without spread in the
    data are not fitted and stay 0 (`dropped` says which and why). `residual_sd` / `r2` are over the
    passes used."""

    coef: dict
    se: dict
    proposer: dict
    dropped: dict
    r2: float
    residual_sd: float
    mean_s: float
    passes: int

    def seconds(self, rows=1.0, drafted=0.0, drafted_ctx=0.0, drafted_s=0.0, prefill=0.0, ctx=0.0,
                grammar=0.0, prefill_ctx=0.0, no_spec=0.0, proposer: bool | Mapping = True) -> float:
        """Predicted seconds of a pass of this composition, with the proposer's time (`proposer`: True =
        the fitted one, a mapping = another drafter's terms from `fit_proposer`, False = none)."""
        c = self.coef
        t = (c["base"] + c.get("no_spec", 0.0) * no_spec + c["row"] * rows
             + c.get("grammar", 0.0) * grammar + c["verified"] * drafted
             + c["verified_ctx"] * drafted_ctx / 1000.0
             + c["schema"] * drafted_s + c["prefill"] * prefill + c.get("prefill_ctx", 0.0) * prefill_ctx
             + c["ctx"] * ctx / 1000.0)
        p = self.proposer if proposer is True else (proposer or {})
        if p:
            t += p["base"] + p["row"] * rows + p["drafted"] * drafted + p["ctx"] * ctx / 1000.0
        return float(t)

    def to_dict(self) -> dict:
        return asdict(self)


def _lsq(y: np.ndarray, cols: dict[str, np.ndarray]) -> tuple[dict, dict, dict, np.ndarray]:
    """Least squares on the columns that carry information, every cost >= 0: a column with no spread
    (other than the intercept) or that would make the design rank-deficient is dropped, then the most
    negative fitted cost is dropped (set to 0) and the rest refitted until none is negative."""
    coef, se, dropped, resid = _lsq_once(y, cols)
    while True:
        negative = [(v, k) for k, v in coef.items() if k != "base" and k not in dropped and v < 0]
        if not negative:
            return coef, se, dropped, resid
        value, name = min(negative)
        kept = {k: v for k, v in cols.items() if k not in dropped and k != name}
        coef, se, more, resid = _lsq_once(y, kept)
        dropped = {**dropped, **more, name: f"fitted {value:.3g} < 0: set to 0"}
        coef = {k: coef.get(k, 0.0) for k in cols}
        se = {k: se.get(k, 0.0) for k in cols}


def _lsq_once(y: np.ndarray, cols: dict[str, np.ndarray]) -> tuple[dict, dict, dict, np.ndarray]:
    names, kept, dropped = [], [], {}
    for name, col in cols.items():
        if name != "base" and float(np.ptp(col)) == 0.0:
            dropped[name] = "no spread in the data"
            continue
        trial = np.stack(kept + [col], axis=1)
        scale = np.maximum(np.abs(trial).max(axis=0), 1e-12)
        if np.linalg.matrix_rank(trial / scale, tol=1e-8) < trial.shape[1]:
            dropped[name] = f"collinear with {names}"
            continue
        kept.append(col)
        names.append(name)
    X = np.stack(kept, axis=1)
    if len(y) <= X.shape[1]:
        raise LawInputError(f"need more than {X.shape[1]} passes to fit {names}, got {len(y)}")
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ beta
    sigma2 = float(resid @ resid) / (len(y) - X.shape[1])
    cov = sigma2 * np.linalg.pinv(X.T @ X)
    coef = {n: 0.0 for n in cols}
    se = {n: 0.0 for n in cols}
    for i, n in enumerate(names):
        coef[n], se[n] = float(beta[i]), float(math.sqrt(max(cov[i, i], 0.0)))
    return coef, se, dropped, resid


def fit_proposer(passes: Sequence[Mapping]) -> dict:
    """The drafter's own seconds per step, `proposer_s` = base + row rows + drafted made + ctx ctx/1000,
    by least squares over the passes in which it ran (`made`: drafts made there, default `drafted`);
    {} when it ran in too few."""
    ran = [p for p in passes if float(p.get("proposer_s", 0.0) or 0.0) > 0 and int(p.get("rows", 0)) > 0]
    if len(ran) <= 2 * len(PROPOSER_TERMS):
        return {}

    def col(key: str, scale: float = 1.0) -> np.ndarray:
        return np.array([float(p.get(key, 0.0) or 0.0) for p in ran]) / scale

    y = col("proposer_s")
    made = np.array([float(p.get("made", p.get("drafted", 0.0)) or 0.0) for p in ran])
    pc, _, _, _ = _lsq(y,
                       {"base": np.ones(len(ran)), "row": col("rows"), "drafted": made,
                        "ctx": col("ctx", 1000.0)})
    return {**{k: pc[k] for k in PROPOSER_TERMS}, "mean_s": float(y.mean()), "steps": len(ran)}


def fit_pass_costs(passes: Sequence[Mapping], min_passes: int = 30,
                   proposer_passes: Sequence[Mapping] | None = None) -> PassCosts:
    """Fit `PassCosts` from passes: mappings with `s` (seconds of the pass) and `rows`, optionally
    `drafted` (draft tokens verified in the pass), `drafted_ctx` (sum over rows of drafted x the row's
    context), `drafted_s` (drafted tokens of schema rows), `prefill` (uncached prompt tokens computed),
    `prefill_ctx` (Σ over them of their position / 1000), `no_spec` (1 for a pass of an engine without
    speculative decoding),
    `ctx` (sum of the rows' context lengths), `grammar` (rows under a grammar) and `proposer_s` (the drafter's
    own seconds in the pass).
    `made` (drafts the proposer made in the pass, verified in the next; default `drafted`) is what the
    proposer's own time is fitted on (over `proposer_passes` when given: one drafter's passes while the
    target's terms use every drafter's). Missing fields count as 0. Passes without rows are skipped."""
    rows = [p for p in passes if int(p.get("rows", 0)) > 0 and float(p.get("s", 0.0)) > 0]
    if len(rows) < min_passes:
        raise LawInputError(f"need at least {min_passes} passes with rows to fit pass costs, got {len(rows)}")

    def col(key: str, scale: float = 1.0) -> np.ndarray:
        return np.array([float(p.get(key, 0.0) or 0.0) for p in rows]) / scale

    prop = col("proposer_s")
    y = col("s") - prop
    cols = {"base": np.ones(len(rows)), "no_spec": col("no_spec"), "row": col("rows"),
            "grammar": col("grammar"),
            "verified": col("drafted"),
            "verified_ctx": col("drafted_ctx", 1000.0), "schema": col("drafted_s"), "prefill": col("prefill"),
            "prefill_ctx": col("prefill_ctx"), "ctx": col("ctx", 1000.0)}
    coef, se, dropped, resid = _lsq(y, cols)
    if coef["base"] + coef["row"] <= 0:
        raise LawInputError(f"fitted one-row pass = {coef['base'] + coef['row']:.3g} s <= 0: "
                            "the pass times do not fit the model")
    proposer = fit_proposer(rows if proposer_passes is None else proposer_passes)
    total = float(((y - y.mean()) ** 2).sum())
    return PassCosts(coef=coef, se=se, proposer=proposer, dropped=dropped,
                     r2=1.0 - float(resid @ resid) / total if total > 0 else 1.0,
                     residual_sd=float(math.sqrt(float(resid @ resid) / max(len(y) - 1, 1))),
                     mean_s=float(col("s").mean()), passes=len(rows))


# ---------------------------------------------------------------- step gaps and turns

STEP_PRICE_MIN_STEPS = 30


def _nonnegative_lsq(y: np.ndarray, cols: Mapping[str, np.ndarray], intercept: str) -> dict | None:
    """Least squares, dropping the most negative coefficient until none is negative (a per-row or
    per-token cost below zero is noise from other work on the machine, not a property of the pass).
    Columns without spread (other than `intercept`) are left out; None when the design is rank-deficient."""
    keep = [k for k, v in cols.items() if np.ptp(v) > 0 or k == intercept]
    while keep:
        X = np.stack([cols[k] for k in keep], axis=1)
        if np.linalg.matrix_rank(X) < X.shape[1]:
            return None
        beta, *_ = np.linalg.lstsq(X, y, rcond=None)
        if (beta >= 0).all():
            out = dict.fromkeys(cols, 0.0)
            out.update({k: float(b) for k, b in zip(keep, beta, strict=True)})
            return out
        keep.pop(int(np.argmin(beta)))
    return None


def fit_step_price(gaps: Sequence[Mapping], min_steps: int = STEP_PRICE_MIN_STEPS) -> dict | None:
    """Seconds of a step = a + b·rows + c·drafted (every term ≥ 0) over `gaps`: mappings with `s`
    (seconds between two consecutive proposer steps: the target pass that verified the first step's
    drafts), `rows` and `drafted` of the first step. The price of a drafted token per row of an n-row
    step is δ(n) = c·n / (a + b·n). None with fewer than `min_steps` gaps or no positive one-row pass.

    Unlike `fit_pass_costs` (eight terms over the engine's pass log, the intercept always kept, a
    collinear term dropped) the intercept may be dropped too and a rank-deficient design gives None:
    the two fits are kept apart so that the reported δ̂ and pass cost model stay what they were."""
    if len(gaps) < min_steps:
        return None
    y = np.asarray([float(g["s"]) for g in gaps])
    cols = {"a_s": np.ones_like(y), "b_s_per_row": np.asarray([g["rows"] for g in gaps], float),
            "c_s_per_token": np.asarray([g["drafted"] for g in gaps], float)}
    coef = _nonnegative_lsq(y, cols, "a_s")
    if coef is None or coef["a_s"] + coef["b_s_per_row"] <= 0:
        return None
    resid = y - sum(coef[k] * v for k, v in cols.items())
    total = float(((y - y.mean()) ** 2).sum())
    return {**coef, "steps": len(y), "r2": 1.0 - float(resid @ resid) / total if total > 0 else 1.0,
            "dropped": sorted(k for k, v in coef.items() if v == 0.0),
            "method": "step log: seconds = a + b·rows + c·drafted, least squares with every term ≥ 0 "
                      "(a negative term is dropped and the rest refitted); δ(n) = c·n / (a + b·n)"}


def fit_turn_costs(drafted_per_step: Sequence[float], step_seconds: Sequence[float]) -> dict:
    """c_T and delta from per-turn decode time without pass or step logs: seconds per step =
    c_T (1 + delta k), k = drafted tokens per step of a turn (0 when speculation is off), by least
    squares of step time on k (intercept c_T; the fastest turn's step time when the intercept is not
    positive). d = 0 (the drafters' time is inside delta). With fewer than 3 turns or one k, delta = 0."""
    xs, ys = list(drafted_per_step), list(step_seconds)
    if len(xs) != len(ys):
        raise LawInputError(f"drafted_per_step and step_seconds differ in length: {len(xs)} != {len(ys)}")
    if len(xs) < 3 or float(np.ptp(xs)) == 0.0:
        return {"c_t": float(np.mean(ys)) if ys else None, "delta": 0.0, "d": 0.0, "overhead": 0.0,
                "turns": len(xs),
                "method": "too few turns with different draft sizes: delta set to 0"}
    slope, intercept = np.polyfit(np.asarray(xs), np.asarray(ys), 1)
    c_t = float(intercept) if intercept > 0 else float(np.min(ys))
    return {"c_t": c_t, "delta": max(float(slope) / c_t, 0.0), "d": 0.0, "overhead": 0.0, "turns": len(xs),
            "method": "per-turn least squares of step time on drafted tokens per step; d = 0"}
