"""Estimators of the Draft Law's constants from what the engine measures.

Acceptance model: inside a round of `drafted` = gamma tokens, each position is accepted with
probability 1 - eps independently until the first rejection, so the accepted count A is
truncated-geometric: P(A = a) = (1 - eps)^a eps for a < gamma and (1 - eps)^gamma for a = gamma.
The likelihood of a set of rounds of one class is (1 - eps)^A_tot eps^N_rej, with A_tot the
accepted tokens and N_rej the rounds that ended in a rejection: every estimator below works on
these two sufficient statistics per class.

The cost fits (pass, step and turn costs) are in `agentspec_sdk.law.cost_fits` (and on the package:
`from agentspec_sdk.law import fit_costs, PassCosts, ...`).
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

__all__ = [
    "CHI2_95_HALF", "Z95", "ClassAcceptance", "Counts", "KappaFit", "OnlineAcceptance", "RoundRecord",
    "acceptance_by_class", "counts_by", "entropy_from_logprobs", "fit_kappa", "rho_from_entropies",
    "wilson_interval",
]


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
            return cls(str(data["law_class"]), str(data["source"]), int(data["drafted"]),
                       int(data["accepted"]))
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

    def update(self, cls: str, source: str, drafted: int, accepted: int, kind: str | None = None) -> None:
        """One judged run of `drafted` tokens of (cls, source), `accepted` of them; `kind`: the segment
        kind it was drafted in, learned apart as well (one class holds kinds that copy differently)."""
        if drafted <= 0:
            return
        if not 0 <= accepted <= drafted:
            raise LawInputError(f"accepted={accepted} outside [0, drafted={drafted}] for {cls}/{source}")
        rejected = 1 if accepted < drafted else 0
        self._bump((cls, source), accepted, rejected)
        self._bump((cls, None), accepted, rejected)
        if kind is not None:
            self._bump((cls, source, kind), accepted, rejected)

    def alpha(self, cls: str, source: str | None = None, kind: str | None = None) -> float:
        """Posterior mean per-position acceptance of (cls, source) in segment kind `kind` (None: over
        every kind); a key without data falls back to (cls, source), then to the class."""
        prior = self.prior.get(cls, self.prior[""])
        a0 = prior * self.prior_strength
        b0 = self.prior_strength - a0
        cell = (kind is not None and self._cells.get((cls, source, kind))) \
            or self._cells.get((cls, source)) or self._cells.get((cls, None))
        if cell is None:
            return prior
        return (cell[0] + a0) / (cell[0] + cell[1] + a0 + b0)

    def tau(self, cls: str, source: str | None, gamma) -> float:
        return tau(gamma, 1.0 - self.alpha(cls, source))

    def snapshot(self) -> dict:
        return {f"{c}/{s if s is not None else '*'}": self.alpha(c, s) for (c, s, *k) in self._cells if not k}


class OnlineCalibration:
    """How far the estimate a draft token is sized by is borne out, per (class, segment kind, source,
    depth in the source's run of tokens): factor = Σ accepted / Σ estimated over the tokens the target
    judged (each token's estimate given the ones before it, counted only where those were accepted),
    decayed by `decay` at every token counted in a key (a memory of about 100 tokens at 0.99), shrunk
    to 1 by `prior_strength` tokens of perfect calibration. An estimate c then counts as min(c · factor, 1).

    Both estimates in use miss by depth. The suffix trees' are counts: a continuation seen once is
    "certain"; such a token right after the draft's first was accepted 0.74 of the time on prose, 0.89
    in ReAct thoughts and 0.94 in code, and from the fifth token on 0.93-1.0 (captured turns, γ 16,
    b 8): once a draft has been accepted for a few tokens the model is copying. A lookup's is one
    learned acceptance per position, so its first token, where the match is weakest, was accepted
    0.04-0.05 against 0.17-0.35 estimated in free text (bundled, ReAct plain), its later ones more
    than estimated. Hence one factor per depth (`DEPTHS`: the first token, the second, the third and
    fourth, the rest), per source and kind (docs/drafting.md, "Calibrated draft estimates";
    docs/experiments/2026-12-05-calibrated-estimates.md)."""

    DEPTHS = (0, 1, 2, 4)  # a token at depth j is in the last bucket starting at or before j

    __slots__ = ("decay", "prior_strength", "max_factor", "_cells")

    def __init__(self, *, prior_strength: float = 8.0, decay: float = 0.99, max_factor: float = 1.5):
        if not 0.0 < decay <= 1.0:
            raise LawInputError(f"decay must be in (0, 1], got {decay}")
        if prior_strength <= 0:
            raise LawInputError(f"prior_strength must be > 0, got {prior_strength}")
        if max_factor < 1.0:
            raise LawInputError(f"max_factor must be >= 1, got {max_factor}")
        self.decay, self.prior_strength, self.max_factor = decay, prior_strength, max_factor
        # (cls, kind or None, source, depth bucket) -> [accepted, estimated] (decayed)
        self._cells: dict = {}

    @staticmethod
    def depth(j: int) -> int:
        """The bucket of depth `j` (the token's index in its source's run)."""
        return 3 if j >= 4 else 2 if j >= 2 else j

    def update(self, cls: str, kind: str | None, source: str, estimates, accepted: int) -> None:
        """One judged run of `source` tokens: `estimates` of them in order, the first `accepted`
        accepted; the token after them was rejected and later ones were never judged."""
        if not 0 <= accepted <= len(estimates):
            raise LawInputError(f"accepted={accepted} outside [0, {len(estimates)}] "
                                f"for {cls}/{kind}/{source}")
        for j, c in enumerate(estimates[: accepted + 1]):
            c = float(c)
            if not 0.0 <= c <= 1.0:
                raise LawInputError(f"estimates of {cls}/{kind}/{source} must be in [0, 1], got {c}")
            hit, bucket = float(j < accepted), self.depth(j)
            keys = ((cls, kind, source, bucket), (cls, None, source, bucket)) if kind is not None \
                else ((cls, None, source, bucket),)
            for key in keys:
                cell = self._cells.get(key)
                if cell is None:
                    self._cells[key] = [hit, c]
                else:
                    cell[0] = cell[0] * self.decay + hit
                    cell[1] = cell[1] * self.decay + c

    def factor(self, cls: str, kind: str | None, source: str, j: int = 0) -> float:
        """What the estimates of (cls, kind, source) at depth `j` are multiplied by (a kind without data
        there: its class's; none: 1)."""
        bucket = self.depth(j)
        cell = (kind is not None and self._cells.get((cls, kind, source, bucket))) \
            or self._cells.get((cls, None, source, bucket))
        if cell is None:
            return 1.0
        s = self.prior_strength
        return min((cell[0] + s) / (cell[1] + s), self.max_factor)

    def factors(self, cls: str, kind: str | None, source: str) -> tuple[float, ...]:
        """`factor` at each depth bucket (`DEPTHS`), in one pass over the cells (a row's candidate
        asks for them every step)."""
        cells, s, top = self._cells, self.prior_strength, self.max_factor
        out = []
        for bucket in range(len(self.DEPTHS)):
            cell = (kind is not None and cells.get((cls, kind, source, bucket))) \
                or cells.get((cls, None, source, bucket))
            out.append(1.0 if cell is None else min((cell[0] + s) / (cell[1] + s), top))
        return tuple(out)

    def snapshot(self) -> dict:
        return {f"{c}/{k if k is not None else '*'}/{src}/{self.DEPTHS[b]}":
                round(self.factor(c, k, src, self.DEPTHS[b]), 4) for (c, k, src, b) in self._cells}
