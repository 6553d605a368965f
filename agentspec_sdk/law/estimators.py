"""Estimators of the Draft Law's constants from what the engine measures.

Acceptance model: inside a round of `drafted` = gamma tokens, each position is accepted with
probability 1 - eps independently until the first rejection, so the accepted count A is
truncated-geometric: P(A = a) = (1 - eps)^a eps for a < gamma and (1 - eps)^gamma for a = gamma.
The likelihood of a set of rounds of one class is (1 - eps)^A_tot eps^N_rej, with A_tot the
accepted tokens and N_rej the rounds that ended in a rejection: every estimator below works on
these two sufficient statistics per class.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from agentspec_sdk.errors import LawInputError
from agentspec_sdk.law.closed_forms import tau

Z95 = 1.959963984540054
CHI2_95_HALF = 1.920729410347062  # chi-square(1) 95% quantile / 2: likelihood-ratio interval drop


@dataclass(frozen=True)
class RoundRecord:
    """One speculation round of one row: the law class where drafting started, what drafted it
    (forced / lookup / model / ngram ...), how many tokens were drafted and how many accepted."""

    law_class: str
    source: str
    drafted: int
    accepted: int

    def __post_init__(self) -> None:
        if self.drafted < 0 or self.accepted < 0 or self.accepted > self.drafted:
            raise LawInputError(
                f"round record needs 0 <= accepted <= drafted, got accepted={self.accepted}, "
                f"drafted={self.drafted} ({self.law_class}/{self.source})")

    @property
    def rejected(self) -> bool:
        return self.accepted < self.drafted

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> RoundRecord:
        try:
            return cls(str(data["law_class"]), str(data["source"]), int(data["drafted"]), int(data["accepted"]))
        except KeyError as missing:
            raise LawInputError(f"round record lacks field {missing}: {dict(data)}") from None


@dataclass(frozen=True)
class Counts:
    rounds: int
    drafted: int
    accepted: int
    rejections: int


def counts_by(records: Iterable[RoundRecord], key=lambda r: r.law_class) -> dict:
    """Sufficient statistics per key (rounds with drafted = 0 carry no information and are skipped)."""
    table: dict = {}
    for r in records:
        if r.drafted == 0:
            continue
        n, dr, ac, rj = table.get(key(r), (0, 0, 0, 0))
        table[key(r)] = (n + 1, dr + r.drafted, ac + r.accepted, rj + (1 if r.rejected else 0))
    return {k: Counts(*v) for k, v in table.items()}


# ---------------------------------------------------------------- per-class acceptance

def wilson_interval(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    denom = 1.0 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class ClassAcceptance:
    """Per-position acceptance alpha = 1 - eps of one class: maximum likelihood A/(A + N) with a
    95% Wilson score interval over the A + N observed positions (accepted positions and the
    positions that rejected; positions after a rejection are not observed). `mean_accepted` is the
    raw mean accepted prefix per round at the drafted lengths actually used."""

    law_class: str
    alpha: float
    ci_low: float
    ci_high: float
    rounds: int
    drafted: int
    accepted: int
    rejections: int
    mean_accepted: float
    mean_drafted: float

    def tau_at(self, gamma: int) -> tuple[float, float, float]:
        """Expected accepted prefix at `gamma` implied by alpha, with its interval."""
        return (float(tau(gamma, 1 - self.alpha)), float(tau(gamma, 1 - self.ci_low)),
                float(tau(gamma, 1 - self.ci_high)))

    def to_dict(self) -> dict:
        return asdict(self)


def acceptance_by_class(records: Iterable[RoundRecord], key=lambda r: r.law_class) -> dict:
    """ClassAcceptance per law class (or per any `key` of the records, e.g. (class, source))."""
    out = {}
    for k, c in counts_by(records, key).items():
        trials = c.accepted + c.rejections
        alpha = c.accepted / trials if trials else 1.0
        lo, hi = wilson_interval(c.accepted, trials)
        out[k] = ClassAcceptance(k if isinstance(k, str) else "/".join(map(str, k)), alpha, lo, hi,
                                 c.rounds, c.drafted, c.accepted, c.rejections,
                                 c.accepted / c.rounds, c.drafted / c.rounds)
    return out


# ---------------------------------------------------------------- kappa

@dataclass(frozen=True)
class KappaFit:
    """Maximum-likelihood kappa given rho per class, with a 95% profile-likelihood interval
    (log-likelihood within chi2_1(0.95)/2 of the maximum) and the observed-information SE."""

    kappa: float
    ci_low: float
    ci_high: float
    se: float
    log_likelihood: float
    rounds: int
    classes: tuple[str, ...]
    kappa_max: float

    def to_dict(self) -> dict:
        return asdict(self)


def _kappa_loglik(kappa: np.ndarray, x: np.ndarray, acc: np.ndarray, rej: np.ndarray) -> np.ndarray:
    """Sum_c A_c log(1 - kappa x_c) + N_c log(kappa x_c), over an array of kappa values."""
    k = np.asarray(kappa, dtype=float)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = k * x
        ll = np.where(acc > 0, acc * np.log1p(-np.minimum(eps, 1.0)), 0.0)
        ll = ll + np.where(rej > 0, rej * np.log(eps), 0.0)
    return ll.sum(axis=-1)


def _score(kappa: float, x, acc, rej) -> float:
    eps = kappa * x
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.sum(rej / kappa - acc * x / (1.0 - eps)))


def fit_kappa(records: Iterable[RoundRecord], rho: Mapping[str, float]) -> KappaFit:
    """Fit kappa in eps_c = kappa (1 - rho_c) by maximum likelihood over all rounds."""
    counts = counts_by(records)
    missing = sorted(set(counts) - set(rho))
    if missing:
        raise LawInputError(f"no rho given for law class(es) {missing}")
    for c, r in rho.items():
        if not 0.0 < r <= 1.0:
            raise LawInputError(f"rho_{c} must be in (0, 1], got {r}")
    classes = tuple(sorted(c for c in counts if rho[c] < 1.0))
    bad = [c for c in counts if rho[c] == 1.0 and counts[c].rejections > 0]
    if bad:
        raise LawInputError(f"class(es) {bad} have rho = 1 (no mismatch possible) but show rejections")
    if not classes:
        raise LawInputError("no rounds with drafted > 0 in a class with rho < 1: kappa is not identifiable")
    x = np.array([1.0 - rho[c] for c in classes])
    acc = np.array([counts[c].accepted for c in classes], dtype=float)
    rej = np.array([counts[c].rejections for c in classes], dtype=float)
    rounds = int(sum(counts[c].rounds for c in classes))
    kappa_max = float(1.0 / x.max())

    # The log-likelihood is concave in kappa: bisect on the score.
    if rej.sum() == 0:
        k_hat = 0.0
    elif acc.sum() == 0:
        k_hat = kappa_max
    else:
        lo, hi = 0.0, kappa_max
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if _score(mid, x, acc, rej) > 0:
                lo = mid
            else:
                hi = mid
        k_hat = 0.5 * (lo + hi)
    ll_hat = float(_kappa_loglik(k_hat, x, acc, rej))

    def crossing(a: float, b: float) -> float:
        """The point between a (inside) and b (outside) where the LR drop reaches its limit."""
        if float(_kappa_loglik(b, x, acc, rej)) >= ll_hat - CHI2_95_HALF:
            return b
        for _ in range(200):
            mid = 0.5 * (a + b)
            if float(_kappa_loglik(mid, x, acc, rej)) >= ll_hat - CHI2_95_HALF:
                a = mid
            else:
                b = mid
        return 0.5 * (a + b)

    ci_low, ci_high = crossing(k_hat, 0.0), crossing(k_hat, kappa_max)
    if 0.0 < k_hat < kappa_max:
        eps = k_hat * x
        info = float(np.sum(rej / k_hat**2 + acc * x**2 / (1.0 - eps) ** 2))
        se = 1.0 / math.sqrt(info)
    else:
        se = math.nan
    return KappaFit(k_hat, ci_low, ci_high, se, ll_hat, rounds, classes, kappa_max)


# ---------------------------------------------------------------- predictability

def entropy_from_logprobs(logprobs) -> np.ndarray:
    """Next-token entropy in nats per position from rows of log-probabilities (shape (n, k)).
    Rows that hold only the top-k logprobs are renormalised over those k tokens, which
    under-states the entropy of the truncated tail."""
    lp = np.asarray(logprobs, dtype=float)
    if lp.ndim == 1:
        lp = lp[None, :]
    lp = np.where(np.isfinite(lp), lp, -np.inf)
    norm = lp - np.logaddexp.reduce(lp, axis=-1, keepdims=True)
    p = np.exp(norm)
    return -np.sum(p * np.where(p > 0, norm, 0.0), axis=-1)


def rho_from_entropies(entropies: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """rho_c = exp(-mean H_c) from measured per-position entropies (nats) of each class."""
    out = {}
    for c, h in entropies.items():
        arr = np.asarray(h, dtype=float)
        if arr.size == 0:
            raise LawInputError(f"no entropy measurements for class {c}")
        if np.any(arr < -1e-9) or not np.all(np.isfinite(arr)):
            raise LawInputError(f"entropies of class {c} must be finite and >= 0 nats")
        out[c] = float(math.exp(-max(float(arr.mean()), 0.0)))
    return out


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

class OnlineAcceptance:
    """Per (class, source) acceptance for the decode-time allocator: a Beta posterior over the
    per-position acceptance alpha whose counts decay by `decay` at every update of that key
    (exponential forgetting, effective memory about 1 / (1 - decay) rounds). Keys without data
    fall back to the class pooled over sources, then to the prior. O(1) per call."""

    __slots__ = ("decay", "prior_strength", "prior", "_cells")

    def __init__(self, prior: Mapping[str, float] | None = None, *, prior_strength: float = 4.0,
                 decay: float = 0.98, default_alpha: float = 0.5):
        if not 0.0 < decay <= 1.0:
            raise LawInputError(f"decay must be in (0, 1], got {decay}")
        if prior_strength <= 0:
            raise LawInputError(f"prior_strength must be > 0, got {prior_strength}")
        self.decay = decay
        self.prior_strength = prior_strength
        self.prior = {"": default_alpha, **(prior or {})}
        for c, a in self.prior.items():
            if not 0.0 <= a <= 1.0:
                raise LawInputError(f"prior alpha of class {c!r} must be in [0, 1], got {a}")
        self._cells: dict = {}  # key -> [accepted, rejections] (decayed)

    @classmethod
    def from_law(cls, kappa: float, rho: Mapping[str, float], **kwargs) -> OnlineAcceptance:
        """Prior alpha_c = 1 - kappa (1 - rho_c)."""
        return cls({c: min(1.0, max(0.0, 1.0 - kappa * (1.0 - r))) for c, r in rho.items()}, **kwargs)

    def _bump(self, key, accepted: int, rejected: int) -> None:
        cell = self._cells.get(key)
        if cell is None:
            self._cells[key] = [float(accepted), float(rejected)]
        else:
            cell[0] = cell[0] * self.decay + accepted
            cell[1] = cell[1] * self.decay + rejected

    def update(self, cls: str, source: str, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        if not 0 <= accepted <= drafted:
            raise LawInputError(f"accepted={accepted} outside [0, drafted={drafted}] for {cls}/{source}")
        rejected = 1 if accepted < drafted else 0
        self._bump((cls, source), accepted, rejected)
        self._bump((cls, None), accepted, rejected)

    def alpha(self, cls: str, source: str | None = None) -> float:
        """Posterior mean per-position acceptance of (cls, source)."""
        prior = self.prior.get(cls, self.prior[""])
        a0 = prior * self.prior_strength
        b0 = self.prior_strength - a0
        cell = self._cells.get((cls, source)) or self._cells.get((cls, None))
        if cell is None:
            return prior
        return (cell[0] + a0) / (cell[0] + cell[1] + a0 + b0)

    def tau(self, cls: str, source: str | None, gamma) -> float:
        return tau(gamma, 1.0 - self.alpha(cls, source))

    def snapshot(self) -> dict:
        return {f"{c}/{s if s is not None else '*'}": self.alpha(c, s) for (c, s) in self._cells}


class OnlineStepCost:
    """The verify cost delta, learned from the drafter's own step times while it runs.

    The gap between two consecutive `propose` calls is the target pass that verified the first call's
    drafts, so `seconds = a + b rows + c drafted` is fitted by least squares with exponential
    forgetting (memory about 1 / (1 - decay) steps). Gaps over `max_gap_factor` times the typical gap
    are skipped (the engine idled while every agent waited on a tool, or a long prefill ran). The
    law's delta for one sequence is c / (a + b); with a single batch size seen, a and b cannot be told
    apart and the pass is taken as proportional to its rows. Until `min_steps` usable gaps with spread
    in the drafted counts, `delta()` is the prior. O(1) per step; a 3×3 solve every `solve_every`."""

    __slots__ = ("prior", "decay", "min_steps", "max_gap_factor", "solve_every", "_xtx", "_xty", "_n",
                 "_last", "_typical", "_estimate", "_since_solve", "_rows_seen", "_drafted_seen", "_terms")

    def __init__(self, prior_delta: float, *, decay: float = 0.995, min_steps: int = 64,
                 max_gap_factor: float = 4.0, solve_every: int = 16):
        if not 0.0 < decay <= 1.0:
            raise LawInputError(f"decay must be in (0, 1], got {decay}")
        if not math.isfinite(prior_delta) or prior_delta < 0:
            raise LawInputError(f"prior delta must be a finite number >= 0, got {prior_delta}")
        self.prior = float(prior_delta)
        self.decay, self.min_steps = decay, min_steps
        self.max_gap_factor, self.solve_every = max_gap_factor, solve_every
        self._xtx = np.zeros((3, 3))
        self._xty = np.zeros(3)
        self._n = 0
        self._last: tuple[float, int, int] | None = None
        self._typical: float | None = None
        self._estimate: float | None = None
        self._since_solve = 0
        self._rows_seen: set[int] = set()
        self._drafted_seen: set[int] = set()
        self._terms: tuple[float, float, float] | None = None

    def observe(self, at: float, rows: int, drafted: int) -> None:
        """A step that began at `at` (seconds, any clock) with `rows` rows and `drafted` draft tokens."""
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
        if len(self._rows_seen) >= 2:
            if np.linalg.cond(self._xtx) > 1e10:  # drafted counts move with the rows: c not identifiable
                return
            a, b, c = np.linalg.solve(self._xtx, self._xty)
            one_row = a + b
            if one_row > 0 and a + b * 8 > 0 and c >= 0:
                self._terms = (float(a), float(b), float(c))
        else:  # one batch size: y = A + c k, one row's share of the pass is A / rows
            idx = [0, 2]
            xtx = self._xtx[np.ix_(idx, idx)]
            if np.linalg.cond(xtx) > 1e10:
                return
            big_a, c = np.linalg.solve(xtx, self._xty[idx])
            one_row = big_a / max(next(iter(self._rows_seen)), 1)
        if one_row > 0 and c >= 0 and math.isfinite(c / one_row):
            self._estimate = float(min(c / one_row, 0.9))

    def delta(self) -> float:
        return self.prior if self._estimate is None else self._estimate

    def terms(self) -> tuple[float, float, float] | None:
        """(a, b, c): seconds per pass, per row and per drafted token, once learned with rows that
        vary (the budget prices a draft token per row of an n-row pass as c n / (a + b n)); else None."""
        return self._terms

    @property
    def learned(self) -> bool:
        return self._estimate is not None


# ---------------------------------------------------------------- pass cost model

PASS_TERMS = ("base", "row", "grammar", "verified", "verified_ctx", "schema", "prefill", "ctx")
PASS_TERM_TEXT = {
    "base": "per pass", "row": "per row", "grammar": "per row under a grammar (its token mask each pass)",
    "verified": "per verified draft token",
    "verified_ctx": "per verified draft token per 1k tokens of its row's context",
    "schema": "per verified draft token of a schema (S) row: grammar-mask work",
    "prefill": "per prompt token other requests prefill in the pass",
    "ctx": "per 1k tokens of context of the rows in the pass",
}
PROPOSER_TERMS = ("base", "row", "drafted", "ctx")


@dataclass(frozen=True)
class PassCosts:
    """What one target pass costs, term by term (seconds per unit), fitted by least squares over a
    run's passes:

        seconds - proposer_s = base + row rows + grammar grammar_rows + verified drafted + verified_ctx drafted_ctx / 1000
                               + schema drafted_s + prefill prefill + ctx ctx / 1000

    `proposer` is the drafter's own time per step, fitted the same way on `proposer_s` (base, row,
    drafted, ctx). Terms without spread in the data are not fitted and stay 0 (`dropped` says
    which and why). `residual_sd` / `r2` are over the passes used."""

    coef: dict
    se: dict
    proposer: dict
    dropped: dict
    r2: float
    residual_sd: float
    mean_s: float
    passes: int

    def seconds(self, rows=1.0, drafted=0.0, drafted_ctx=0.0, drafted_s=0.0, prefill=0.0, ctx=0.0,
                grammar=0.0, proposer: bool | Mapping = True) -> float:
        """Predicted seconds of a pass of this composition, with the proposer's time (`proposer`: True =
        the fitted one, a mapping = another drafter's terms from `fit_proposer`, False = none)."""
        c = self.coef
        t = (c["base"] + c["row"] * rows + c.get("grammar", 0.0) * grammar + c["verified"] * drafted + c["verified_ctx"] * drafted_ctx / 1000.0
             + c["schema"] * drafted_s + c["prefill"] * prefill + c["ctx"] * ctx / 1000.0)
        p = self.proposer if proposer is True else (proposer or {})
        if p:
            t += p["base"] + p["row"] * rows + p["drafted"] * drafted + p["ctx"] * ctx / 1000.0
        return float(t)

    def token_cost(self, ctx_per_row: float = 0.0, schema_share: float = 0.0) -> float:
        """Seconds one more verified draft token adds to a pass (target + drafter), at a row context
        of `ctx_per_row` tokens with `schema_share` of the drafted tokens in S rows."""
        c = self.coef
        t = c["verified"] + c["verified_ctx"] * ctx_per_row / 1000.0 + c["schema"] * schema_share
        return float(t + (self.proposer.get("drafted", 0.0) if self.proposer else 0.0))

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
    pc, _, _, _ = _lsq(y, {"base": np.ones(len(ran)), "row": col("rows"), "drafted": made, "ctx": col("ctx", 1000.0)})
    return {**{k: pc[k] for k in PROPOSER_TERMS}, "mean_s": float(y.mean()), "steps": len(ran)}


def fit_pass_costs(passes: Sequence[Mapping], min_passes: int = 30,
                   proposer_passes: Sequence[Mapping] | None = None) -> PassCosts:
    """Fit `PassCosts` from passes: mappings with `s` (seconds of the pass) and `rows`, optionally
    `drafted` (draft tokens verified in the pass), `drafted_ctx` (sum over rows of drafted x the row's
    context), `drafted_s` (drafted tokens of schema rows), `prefill` (uncached prompt tokens computed),
    `ctx` (sum of the rows' context lengths), `grammar` (rows under a grammar) and `proposer_s` (the drafter's own seconds in the pass).
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
    cols = {"base": np.ones(len(rows)), "row": col("rows"), "grammar": col("grammar"), "verified": col("drafted"),
            "verified_ctx": col("drafted_ctx", 1000.0), "schema": col("drafted_s"), "prefill": col("prefill"),
            "ctx": col("ctx", 1000.0)}
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
