"""Closed forms of the Draft Law.

Notation (the paper's): position classes S (schema-bound), R (reasoning), F (free prose) with mass
shares w_c and predictability rho_c = exp(-H_c); per-position mismatch eps = kappa (1 - rho);
expected accepted prefix tau(gamma) = sum_{i=1..gamma} (1 - eps)^i; a round costs
c_T (1 + gamma (delta + d)) and emits tau + 1 tokens.

Every numeric function takes scalars or numpy arrays and broadcasts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from agentspec_sdk.errors import LawInputError

CLASSES = ("S", "R", "F")
SHARE_TOLERANCE = 1e-6
DEFAULT_GAMMA_MAX = 16


# ---------------------------------------------------------------- parameters

@dataclass(frozen=True)
class LawParams:
    """Drafter alignment constant kappa and cost ratios delta (verify overhead per extra
    candidate) and d (drafter cost per drafted token), both relative to one target pass c_T."""

    kappa: float
    delta: float
    d: float

    def __post_init__(self) -> None:
        for name in ("kappa", "delta", "d"):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise LawInputError(f"{name} must be a finite number, got {value}")
            if value < 0:
                raise LawInputError(f"{name} must be >= 0, got {value}")

    def to_dict(self) -> dict:
        return {"kappa": self.kappa, "delta": self.delta, "d": self.d}


@dataclass(frozen=True)
class ClassMix:
    """Mass shares `w` and predictabilities `rho` of the classes S, R, F."""

    w: dict[str, float]
    rho: dict[str, float]
    _check: bool = field(default=True, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self._check:
            return
        for name, table in (("w", self.w), ("rho", self.rho)):
            if set(table) != set(CLASSES):
                raise LawInputError(f"{name} needs exactly the classes S, R, F, got {sorted(table)}")
        for c in CLASSES:
            w, rho = self.w[c], self.rho[c]
            if not (math.isfinite(w) and 0.0 <= w <= 1.0):
                raise LawInputError(f"share w_{c} must be in [0, 1], got {w}")
            if not (math.isfinite(rho) and 0.0 < rho <= 1.0):
                raise LawInputError(f"predictability rho_{c} must be in (0, 1], got {rho}")
        total = sum(self.w.values())
        if abs(total - 1.0) > SHARE_TOLERANCE:
            raise LawInputError(f"shares w_S + w_R + w_F must sum to 1, got {total:.6g}")

    @classmethod
    def from_shares(cls, w_s: float, w_r: float, rho_s: float, rho_r: float, rho_f: float,
                    w_f: float | None = None) -> ClassMix:
        """Build a mix from w_S and w_R; w_F = 1 - w_S - w_R unless given."""
        if w_f is None:
            w_f = 1.0 - w_s - w_r
            if w_f < -SHARE_TOLERANCE:
                raise LawInputError(f"w_S + w_R = {w_s + w_r:.6g} exceeds 1, leaving w_F < 0")
            w_f = max(w_f, 0.0)
        return cls({"S": w_s, "R": w_r, "F": w_f}, {"S": rho_s, "R": rho_r, "F": rho_f})

    @property
    def rho_bar(self) -> float:
        """Mixed predictability sum_c w_c rho_c."""
        return sum(self.w[c] * self.rho[c] for c in CLASSES)

    @property
    def rf_share(self) -> float:
        """Fraction of the non-schema mass that is R (w_R / (w_R + w_F)); 1/2 when w_S = 1."""
        rest = self.w["R"] + self.w["F"]
        return self.w["R"] / rest if rest > 0 else 0.5

    @property
    def rho_n(self) -> float:
        """Predictability of the non-schema mass at this mix's R:F ratio."""
        r = self.rf_share
        return r * self.rho["R"] + (1.0 - r) * self.rho["F"]

    def with_w_s(self, w_s: float) -> ClassMix:
        """The same predictabilities and R:F ratio with schema share `w_s`."""
        if not 0.0 <= w_s <= 1.0:
            raise LawInputError(f"schema share must be in [0, 1], got {w_s}")
        r = self.rf_share
        rest = 1.0 - w_s
        return ClassMix({"S": w_s, "R": r * rest, "F": (1.0 - r) * rest}, dict(self.rho))

    def to_dict(self) -> dict:
        return {"w": dict(self.w), "rho": dict(self.rho)}


def check_gamma(gamma) -> np.ndarray:
    g = np.asarray(gamma)
    if g.size == 0 or not np.all(np.isfinite(g)) or np.any(g < 1) or np.any(g != np.round(g)):
        raise LawInputError(f"gamma must be an integer >= 1, got {gamma}")
    return g.astype(np.int64)


def check_mismatch(params: LawParams, mix: ClassMix) -> None:
    for c in CLASSES:
        eps = params.kappa * (1.0 - mix.rho[c])
        if eps > 1.0 + 1e-12:
            raise LawInputError(
                f"kappa (1 - rho_{c}) = {eps:.6g} exceeds 1: kappa={params.kappa} is too large "
                f"for rho_{c}={mix.rho[c]}")


# ---------------------------------------------------------------- acceptance

def mismatch(kappa, rho):
    """Per-position mismatch probability eps = kappa (1 - rho)."""
    return np.asarray(kappa, dtype=float) * (1.0 - np.asarray(rho, dtype=float))


def eps_bar(params: LawParams, mix: ClassMix) -> float:
    """Mixed mismatch kappa (1 - rho_bar)."""
    return float(params.kappa * (1.0 - mix.rho_bar))


def tau(gamma, eps):
    """Expected accepted prefix sum_{i=1..gamma} (1-eps)^i = q (1 - q^gamma) / (1 - q), q = 1 - eps;
    gamma when eps = 0 and 0 when eps = 1."""
    g = np.asarray(gamma, dtype=float)
    e = np.clip(np.asarray(eps, dtype=float), 0.0, 1.0)
    q = 1.0 - e
    with np.errstate(divide="ignore", invalid="ignore"):
        one_minus_qg = -np.expm1(g * np.log1p(-e))  # 1 - q^gamma, accurate for q near 1
        geometric = q * one_minus_qg / e
    out = np.where(e > 0.0, geometric, g)
    return out[()] if out.ndim == 0 else out


def dtau_deps(gamma, eps):
    """Exact derivative dtau/deps = -sum_{i=1..gamma} i q^(i-1), q = 1 - eps (closed form)."""
    g = np.asarray(gamma, dtype=float)
    e = np.clip(np.asarray(eps, dtype=float), 0.0, 1.0)
    q = 1.0 - e
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        qg = np.exp(g * np.log1p(-e))
        series = (1.0 - (g + 1.0) * qg + g * qg * q) / (e * e)
    # Below eps ~ 1e-4 the closed form loses digits to cancellation; expand instead:
    # g(g+1)/2 - eps (g+1)g(g-1)/3 + eps^2 (g+1)g(g-1)(g-2)/8 + O(eps^3 g^5).
    small = (g * (g + 1.0) / 2.0 - e * (g + 1.0) * g * (g - 1.0) / 3.0
             + e * e * (g + 1.0) * g * (g - 1.0) * (g - 2.0) / 8.0)
    out = -np.where(e > 1e-4, series, small)
    return out[()] if out.ndim == 0 else out


def tau_mixed(params: LawParams, mix: ClassMix, gamma):
    check_mismatch(params, mix)
    return tau(check_gamma(gamma), eps_bar(params, mix))


def tau_by_class(params: LawParams, mix: ClassMix, gamma) -> dict:
    """tau_c(gamma) with eps_c = kappa (1 - rho_c) for c in S, R, F."""
    check_mismatch(params, mix)
    g = check_gamma(gamma)
    return {c: tau(g, mismatch(params.kappa, mix.rho[c])) for c in CLASSES}


# ---------------------------------------------------------------- cost

def round_cost(gamma, delta, d):
    """Cost of one round in units of c_T: 1 + gamma (delta + d)."""
    return 1.0 + np.asarray(gamma, dtype=float) * (np.asarray(delta) + np.asarray(d))


def cost_ratio(gamma, tau_value, delta, d):
    """c_net / c_1: net per-token cost relative to plain decoding, (1 + gamma(delta+d)) / (tau + 1)."""
    return round_cost(gamma, delta, d) / (np.asarray(tau_value, dtype=float) + 1.0)


def net_cost(gamma, tau_value, delta, d, c_t=1.0):
    """c_net = c_T (1 + gamma (delta + d)) / (tau + 1)."""
    return c_t * cost_ratio(gamma, tau_value, delta, d)


def saving(gamma, tau_value, delta, d):
    """Net saving s = 1 - (1 + gamma (delta + d)) / (tau + 1)."""
    return 1.0 - cost_ratio(gamma, tau_value, delta, d)


def speedup(gamma, tau_value, delta, d):
    """Net speedup 1 / (1 - s) = (tau + 1) / (1 + gamma (delta + d))."""
    return 1.0 / cost_ratio(gamma, tau_value, delta, d)


def pass_cost_ratio(tau_value, t_off, t_spec, draft_share=1.0):
    """c_net / c_1 from measured pass costs: a speculative pass costs `t_spec` (seconds, or any unit)
    where plain decoding's costs `t_off`, and emits 1 + f tau tokens per row, f = `draft_share` the
    share of row-passes that drafted. With f = 1 and t_spec / t_off = 1 + gamma (delta + d) this is
    `cost_ratio`."""
    t_off, t_spec = np.asarray(t_off, dtype=float), np.asarray(t_spec, dtype=float)
    if np.any(t_off <= 0) or np.any(t_spec <= 0):
        raise LawInputError(f"pass costs must be > 0, got t_off={t_off}, t_spec={t_spec}")
    f = np.asarray(draft_share, dtype=float)
    if np.any(f < 0) or np.any(f > 1):
        raise LawInputError(f"draft share must be in [0, 1], got {draft_share}")
    return t_spec / (t_off * (1.0 + f * np.asarray(tau_value, dtype=float)))


def saving_at(params: LawParams, mix: ClassMix, gamma):
    g = check_gamma(gamma)
    return saving(g, tau_mixed(params, mix, g), params.delta, params.d)


def tau_vs_w_s(params: LawParams, mix: ClassMix, gamma, w_s):
    """Mixed tau over arrays of schema shares (R:F ratio and rho kept); broadcasts with gamma."""
    check_mismatch(params, mix)
    w = np.asarray(w_s, dtype=float)
    rho = w * mix.rho["S"] + (1.0 - w) * mix.rho_n
    return tau(check_gamma(gamma), mismatch(params.kappa, rho))


def saving_vs_w_s(params: LawParams, mix: ClassMix, gamma: int, w_s):
    """Net saving over an array of schema shares, keeping mix's R:F ratio and predictabilities."""
    check_mismatch(params, mix)
    g = int(check_gamma(gamma))
    w = np.asarray(w_s, dtype=float)
    rho = w * mix.rho["S"] + (1.0 - w) * mix.rho_n
    return saving(g, tau(g, mismatch(params.kappa, rho)), params.delta, params.d)


# ---------------------------------------------------------------- breakeven

def eps_star(gamma, delta, d):
    """Small-eps rule: s > 0 iff eps_bar < eps* = 2 (1 - delta - d) / (gamma + 1)."""
    return 2.0 * (1.0 - np.asarray(delta) - np.asarray(d)) / (np.asarray(gamma, dtype=float) + 1.0)


def eps_star_exact(gamma, delta, d, iterations: int = 80):
    """Exact root of s = 0 in eps, i.e. tau(gamma, eps) = gamma (delta + d), by bisection (tau is
    strictly decreasing in eps). nan where no root exists in [0, 1]."""
    g = np.asarray(gamma, dtype=float)
    target = g * (np.asarray(delta) + np.asarray(d))
    g, target = np.broadcast_arrays(g, target)
    lo, hi = np.zeros(g.shape), np.ones(g.shape)
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        above = tau(g, mid) > target
        lo = np.where(above, mid, lo)
        hi = np.where(above, hi, mid)
    root = 0.5 * (lo + hi)
    # tau(0) = gamma, tau(1) = 0: a root exists iff 0 <= target <= gamma
    out = np.where(target <= g, root, np.nan)
    return out[()] if out.ndim == 0 else out


@dataclass(frozen=True)
class Breakeven:
    """Schema share where the net saving crosses zero, small-eps (`approx`) and exact.
    A value is None when there is no crossing in [0, 1]; `*_reason` says why."""

    approx: float | None
    exact: float | None
    approx_reason: str
    exact_reason: str
    eps_star: float
    eps_star_exact: float | None
    rho_star: float
    rho_star_exact: float | None
    rho_n: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _share_for_rho(rho_target: float, rho_s: float, rho_n: float, pays) -> tuple[float | None, str]:
    if not math.isfinite(rho_target):
        return None, "speculation never pays at this gamma: gamma (delta + d) >= gamma"
    if abs(rho_s - rho_n) < 1e-15:
        return None, "rho_S equals rho_n: the schema share does not move the mismatch"
    w = (rho_target - rho_n) / (rho_s - rho_n)
    if 0.0 <= w <= 1.0:
        return float(w), "crossing in [0, 1]"
    at_zero, at_one = pays(0.0), pays(1.0)
    if at_zero and at_one:
        return None, f"pays at every schema share (w_S* = {w:.4g} outside [0, 1])"
    if not at_zero and not at_one:
        return None, f"loses at every schema share (w_S* = {w:.4g} outside [0, 1])"
    return None, f"w_S* = {w:.4g} outside [0, 1]"


def breakeven_w_s(params: LawParams, mix: ClassMix, gamma: int) -> Breakeven:
    """w_S* = (rho* - rho_n) / (rho_S - rho_n) with rho* = 1 - eps*/kappa, rho_n the predictability
    of the non-schema mass at mix's R:F ratio; exact version from the exact eps root."""
    check_mismatch(params, mix)
    g = int(check_gamma(gamma))
    rho_s, rho_n = mix.rho["S"], mix.rho_n
    e_approx = float(eps_star(g, params.delta, params.d))
    e_exact = float(eps_star_exact(g, params.delta, params.d))

    if params.kappa == 0:
        why = ("kappa = 0: no mismatch at any schema share; speculation "
               + ("pays everywhere" if params.delta + params.d < 1 else "never pays"))
        return Breakeven(None, None, why, why, e_approx, e_exact if math.isfinite(e_exact) else None,
                         math.nan, None, rho_n)

    def rho_for(e: float) -> float:
        if not math.isfinite(e) or e < 0:
            return math.nan
        return 1.0 - e / params.kappa

    r_approx, r_exact = rho_for(e_approx), rho_for(e_exact)

    def pays_approx(w: float) -> bool:
        return params.kappa * (1.0 - (w * rho_s + (1 - w) * rho_n)) < e_approx

    def pays_exact(w: float) -> bool:
        return float(saving_vs_w_s(params, mix, g, w)) > 0.0

    w_a, why_a = _share_for_rho(r_approx, rho_s, rho_n, pays_approx)
    w_e, why_e = _share_for_rho(r_exact, rho_s, rho_n, pays_exact)
    return Breakeven(
        approx=w_a, exact=w_e, approx_reason=why_a, exact_reason=why_e,
        eps_star=e_approx, eps_star_exact=e_exact if math.isfinite(e_exact) else None,
        rho_star=r_approx, rho_star_exact=r_exact if math.isfinite(r_exact) else None, rho_n=rho_n,
    )


# ---------------------------------------------------------------- limits

@dataclass(frozen=True)
class Limit:
    tau: float
    saving: float
    speedup: float


def schema_ceiling(gamma, delta, d) -> Limit:
    """w_S -> 1, rho_S -> 1: tau -> gamma, speedup -> (gamma + 1) / (1 + gamma (delta + d))."""
    g = float(check_gamma(gamma))
    return Limit(tau=g, saving=float(saving(g, g, delta, d)), speedup=float(speedup(g, g, delta, d)))


def entropy_floor(gamma, delta, d) -> Limit:
    """w_S = 0 and a fully misaligned drafter: tau -> 0, s -> -gamma (delta + d)."""
    g = float(check_gamma(gamma))
    return Limit(tau=0.0, saving=float(saving(g, 0.0, delta, d)), speedup=float(speedup(g, 0.0, delta, d)))


# ---------------------------------------------------------------- marginal value, composition

@dataclass(frozen=True)
class Marginal:
    """dtau/dw for mass moved into S from `source`: the small-eps value and the exact derivative."""

    approx: float
    exact: float
    source: str


def marginal_tau(params: LawParams, mix: ClassMix, gamma: int, source: str = "F") -> Marginal:
    """Moving dw of mass from `source` ("F", "R", or "n" = the non-schema mass at the current R:F
    ratio) to S raises tau by about gamma (gamma + 1)/2 * kappa (rho_S - rho_source) dw."""
    check_mismatch(params, mix)
    g = int(check_gamma(gamma))
    if source == "n":
        rho_src = mix.rho_n
    elif source in ("R", "F"):
        rho_src = mix.rho[source]
    else:
        raise LawInputError(f"marginal source must be 'F', 'R' or 'n', got {source!r}")
    slope = params.kappa * (mix.rho["S"] - rho_src)  # -d eps_bar / dw
    approx = g * (g + 1) / 2.0 * slope
    exact = float(-dtau_deps(g, eps_bar(params, mix)) * slope)
    return Marginal(approx=float(approx), exact=exact, source=source)


def composition_cost(c_pre, c_dec, *, h=0.0, c_hit=1.0, nu=1.0, cost_ratio_value=1.0):
    """C_total = nu [(1 - h + h c_hit) C_pre + (c_net / c_1) C_dec]."""
    for name, value in (("h", h), ("c_hit", c_hit)):
        if np.any(np.asarray(value) < 0) or np.any(np.asarray(value) > 1):
            raise LawInputError(f"{name} must be in [0, 1], got {value}")
    if np.any(np.asarray(nu) < 1):
        raise LawInputError(f"nu (expected draws) must be >= 1, got {nu}")
    for name, value in (("c_pre", c_pre), ("c_dec", c_dec), ("cost ratio", cost_ratio_value)):
        if np.any(np.asarray(value) < 0):
            raise LawInputError(f"{name} must be >= 0, got {value}")
    return np.asarray(nu) * ((1.0 - np.asarray(h) + np.asarray(h) * np.asarray(c_hit)) * np.asarray(c_pre)
                             + np.asarray(cost_ratio_value) * np.asarray(c_dec))


# ---------------------------------------------------------------- optimal gamma

@dataclass(frozen=True)
class GammaChoice:
    gamma: int
    speedup: float
    saving: float

    @property
    def pays(self) -> bool:
        return self.saving > 0.0


def speedup_curve(eps, delta, d, gamma_max: int = DEFAULT_GAMMA_MAX) -> np.ndarray:
    """Speedup for gamma = 1..gamma_max (last axis) over arrays of eps."""
    if gamma_max < 1:
        raise LawInputError(f"gamma_max must be >= 1, got {gamma_max}")
    g = np.arange(1, gamma_max + 1, dtype=float)
    e = np.asarray(eps, dtype=float)[..., None]
    return speedup(g, tau(g, e), delta, d)


def gamma_opt(eps, delta, d, gamma_max: int = DEFAULT_GAMMA_MAX):
    """Integer gamma in 1..gamma_max maximising the net speedup; arrays of eps give arrays."""
    best = np.argmax(speedup_curve(eps, delta, d, gamma_max), axis=-1) + 1
    return int(best) if np.ndim(best) == 0 else best


def token_values(alpha, gamma_max: int = DEFAULT_GAMMA_MAX) -> np.ndarray:
    """Expected gain in tau of the k-th drafted token, alpha^k for k = 1..gamma_max (last axis):
    the value side of the allocator's greedy marginal pricing."""
    if gamma_max < 1:
        raise LawInputError(f"gamma_max must be >= 1, got {gamma_max}")
    a = np.clip(np.asarray(alpha, dtype=float), 0.0, 1.0)[..., None]
    return a ** np.arange(1, gamma_max + 1, dtype=float)


def extend_pays(alpha, gamma, delta, d):
    """Exact rule: drafting token gamma+1 raises the net speedup iff
    alpha^(gamma+1) (1 + gamma (delta + d)) > (tau(gamma) + 1) (delta + d)."""
    g = np.asarray(gamma, dtype=float)
    a = np.clip(np.asarray(alpha, dtype=float), 0.0, 1.0)
    c = np.asarray(delta) + np.asarray(d)
    return a ** (g + 1.0) * (1.0 + g * c) > (tau(g, 1.0 - a) + 1.0) * c


def best_gamma(params: LawParams, mix: ClassMix, gamma_max: int = DEFAULT_GAMMA_MAX) -> GammaChoice:
    check_mismatch(params, mix)
    e = eps_bar(params, mix)
    g = gamma_opt(e, params.delta, params.d, gamma_max)
    t = tau(g, e)
    return GammaChoice(gamma=g, speedup=float(speedup(g, t, params.delta, params.d)),
                       saving=float(saving(g, t, params.delta, params.d)))


# ---------------------------------------------------------------- everything at once

@dataclass(frozen=True)
class LawReport:
    params: LawParams
    mix: ClassMix
    gamma: int
    gamma_max: int
    eps_bar: float
    tau: float
    tau_by_class: dict
    saving: float
    speedup: float
    eps_star: float
    breakeven: Breakeven
    gamma_opt: GammaChoice
    marginal: Marginal

    def to_dict(self) -> dict:
        """Flat JSON-able summary (nan/inf become None)."""

        def clean(x):
            if x is None:
                return None
            x = float(x)
            return x if math.isfinite(x) else None

        return {
            "tau": clean(self.tau),
            "tau_by_class": {c: clean(v) for c, v in self.tau_by_class.items()},
            "saving": clean(self.saving),
            "speedup": clean(self.speedup),
            "eps_star": clean(self.eps_star),
            "w_s_star_approx": clean(self.breakeven.approx),
            "w_s_star_exact": clean(self.breakeven.exact),
            "gamma_opt": self.gamma_opt.gamma,
            "speedup_at_gamma_opt": clean(self.gamma_opt.speedup),
            "w_s_star_approx_reason": self.breakeven.approx_reason,
            "w_s_star_exact_reason": self.breakeven.exact_reason,
            "eps_bar": clean(self.eps_bar),
            "eps_star_exact": clean(self.breakeven.eps_star_exact),
            "rho_bar": clean(self.mix.rho_bar),
            "rho_n": clean(self.mix.rho_n),
            "marginal_tau_approx": clean(self.marginal.approx),
            "marginal_tau_exact": clean(self.marginal.exact),
            "gamma": self.gamma,
            "gamma_max": self.gamma_max,
            "params": self.params.to_dict(),
            "mix": self.mix.to_dict(),
        }


def evaluate(params: LawParams, mix: ClassMix, gamma: int,
             gamma_max: int = DEFAULT_GAMMA_MAX) -> LawReport:
    """All the law's numbers for one operating point."""
    g = int(check_gamma(gamma))
    if gamma_max < 1:
        raise LawInputError(f"gamma_max must be >= 1, got {gamma_max}")
    check_mismatch(params, mix)
    t = float(tau_mixed(params, mix, g))
    return LawReport(
        params=params, mix=mix, gamma=g, gamma_max=gamma_max, eps_bar=eps_bar(params, mix), tau=t,
        tau_by_class={c: float(v) for c, v in tau_by_class(params, mix, g).items()},
        saving=float(saving(g, t, params.delta, params.d)),
        speedup=float(speedup(g, t, params.delta, params.d)),
        eps_star=float(eps_star(g, params.delta, params.d)),
        breakeven=breakeven_w_s(params, mix, g), gamma_opt=best_gamma(params, mix, gamma_max),
        marginal=marginal_tau(params, mix, g),
    )
