"""Closed forms of the Draft Law against independent computation (direct sums, Monte-Carlo, roots)."""

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agentspec_sdk.errors import LawInputError
from agentspec_sdk.law import (
    ClassMix,
    LawParams,
    best_gamma,
    breakeven_w_s,
    composition_cost,
    cost_ratio,
    dtau_deps,
    entropy_floor,
    eps_bar,
    eps_star,
    eps_star_exact,
    evaluate,
    extend_pays,
    gamma_opt,
    marginal_tau,
    saving,
    saving_at,
    saving_vs_w_s,
    schema_ceiling,
    speedup,
    tau,
    tau_by_class,
    tau_mixed,
    tau_vs_w_s,
    token_values,
)


def tau_direct(gamma, eps):
    return sum((1.0 - eps) ** i for i in range(1, gamma + 1))


def saving_direct(gamma, eps, delta, d):
    return 1.0 - (1.0 + gamma * (delta + d)) / (tau_direct(gamma, eps) + 1.0)


def mix_direct_eps(kappa, w, rho):
    return kappa * (1.0 - sum(w[c] * rho[c] for c in "SRF"))


PARAMS = LawParams(kappa=0.8, delta=0.05, d=0.02)
MIX = ClassMix.from_shares(0.5, 0.3, 0.95, 0.6, 0.4)


# ---------------------------------------------------------------- tau

@pytest.mark.parametrize("eps", [0.0, 1e-12, 1e-6, 0.01, 0.2, 0.5, 0.9, 0.999, 1.0])
@pytest.mark.parametrize("gamma", [1, 2, 5, 8, 16, 40])
def test_tau_matches_direct_sum(gamma, eps):
    assert tau(gamma, eps) == pytest.approx(tau_direct(gamma, eps), rel=1e-11, abs=1e-13)


def test_tau_broadcasts_over_gamma_and_eps():
    g = np.arange(1, 17)[:, None]
    e = np.linspace(0.0, 1.0, 11)[None, :]
    grid = tau(g, e)
    assert grid.shape == (16, 11)
    expected = np.array([[tau_direct(int(gi), float(ei)) for ei in e[0]] for gi in g[:, 0]])
    np.testing.assert_allclose(grid, expected, rtol=1e-11, atol=1e-13)


def test_tau_by_class_and_mixed_use_their_own_mismatch():
    by_class = tau_by_class(PARAMS, MIX, 8)
    for c in "SRF":
        assert by_class[c] == pytest.approx(tau_direct(8, 0.8 * (1 - MIX.rho[c])), rel=1e-12)
    e = mix_direct_eps(0.8, MIX.w, MIX.rho)
    assert eps_bar(PARAMS, MIX) == pytest.approx(e)
    assert tau_mixed(PARAMS, MIX, 8) == pytest.approx(tau_direct(8, e), rel=1e-12)
    assert by_class["S"] > by_class["R"] > by_class["F"]


def simulate_prefix(rng, gamma, accept_prob, rounds):
    """Accepted prefix of i.i.d. positions; accept_prob has shape (rounds, gamma)."""
    ok = rng.random((rounds, gamma)) < accept_prob
    return np.cumprod(ok, axis=1).sum(axis=1)


def test_tau_monte_carlo_of_iid_class_mixture():
    """Positions whose class is drawn i.i.d. from w and accepted with 1 - kappa(1 - rho_c)
    give the mixed law's tau and saving (within 4 standard errors, fixed seed)."""
    rng = np.random.default_rng(20261130)
    gamma, rounds = 8, 200_000
    classes = rng.choice(3, size=(rounds, gamma), p=[MIX.w[c] for c in "SRF"])
    alpha = np.array([1 - PARAMS.kappa * (1 - MIX.rho[c]) for c in "SRF"])
    accepted = simulate_prefix(rng, gamma, alpha[classes], rounds)
    mean, se = accepted.mean(), accepted.std(ddof=1) / math.sqrt(rounds)
    assert abs(mean - tau_mixed(PARAMS, MIX, gamma)) < 4 * se
    # net saving: total cost over total emitted tokens
    per_round = 1 + gamma * (PARAMS.delta + PARAMS.d)
    s_mc = 1 - per_round / (mean + 1)
    s_se = per_round / (mean + 1) ** 2 * se
    assert abs(s_mc - saving_at(PARAMS, MIX, gamma)) < 4 * s_se


@pytest.mark.parametrize("c", ["S", "R", "F"])
def test_tau_by_class_monte_carlo(c):
    rng = np.random.default_rng(7)
    gamma, rounds = 16, 100_000
    alpha = 1 - PARAMS.kappa * (1 - MIX.rho[c])
    accepted = simulate_prefix(rng, gamma, np.full((rounds, gamma), alpha), rounds)
    se = accepted.std(ddof=1) / math.sqrt(rounds)
    assert abs(accepted.mean() - tau_by_class(PARAMS, MIX, gamma)[c]) < 4 * se


# ---------------------------------------------------------------- cost, saving

@pytest.mark.parametrize("gamma,eps,delta,d", [(1, 0.3, 0.0, 0.0), (8, 0.1, 0.05, 0.02), (16, 0.6, 0.2, 0.3)])
def test_saving_speedup_and_cost_ratio(gamma, eps, delta, d):
    t = tau_direct(gamma, eps)
    s = saving_direct(gamma, eps, delta, d)
    assert saving(gamma, t, delta, d) == pytest.approx(s, rel=1e-12)
    assert speedup(gamma, t, delta, d) == pytest.approx(1 / (1 - s), rel=1e-12)
    assert cost_ratio(gamma, t, delta, d) == pytest.approx(1 - s, rel=1e-12)


# ---------------------------------------------------------------- breakeven

def test_eps_star_exact_is_the_root_of_the_saving():
    for gamma in (1, 4, 8, 16):
        for delta, d in ((0.05, 0.02), (0.2, 0.3), (0.0, 0.9)):
            e = float(eps_star_exact(gamma, delta, d))
            assert saving_direct(gamma, e, delta, d) == pytest.approx(0.0, abs=1e-10)
            assert (saving_direct(gamma, e - 1e-6, delta, d) > 0
                    > saving_direct(gamma, min(e + 1e-6, 1.0), delta, d))


def test_eps_star_exact_has_no_root_when_cost_exceeds_any_gain():
    assert math.isnan(eps_star_exact(8, 0.6, 0.5))


def test_small_eps_rule_is_conservative_and_converges_to_exact():
    """tau is convex in eps, so its tangent at 0 under-states it: eps* <= exact root, and the two agree
    as eps* -> 0 (delta + d -> 1)."""
    for gamma in (2, 4, 8, 16):
        for cost in (0.05, 0.3, 0.7, 0.95):
            assert eps_star(gamma, cost, 0.0) <= eps_star_exact(gamma, cost, 0.0) + 1e-12
    previous = math.inf
    for cost in (0.9, 0.99, 0.999, 0.9999):
        approx, exact = float(eps_star(8, cost, 0.0)), float(eps_star_exact(8, cost, 0.0))
        rel = abs(approx - exact) / exact
        assert rel < previous
        previous = rel
    assert previous < 1e-3


def brute_force_breakeven(params, mix, gamma):
    """Root of s(w_S) = 0 by bisection on direct sums, R:F ratio kept."""
    def s_of(w):
        m = mix.with_w_s(w)
        return saving_direct(gamma, mix_direct_eps(params.kappa, m.w, m.rho), params.delta, params.d)

    lo, hi = 0.0, 1.0
    assert s_of(lo) < 0 < s_of(hi)
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if s_of(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


@pytest.mark.parametrize("kappa,rho,delta,d,gamma", [
    (1.0, (0.9, 0.2, 0.1), 0.1, 0.3, 8),
    (0.9, (0.97, 0.3, 0.15), 0.08, 0.25, 4),
    (1.0, (0.99, 0.5, 0.3), 0.2, 0.5, 16),
])
def test_exact_breakeven_matches_brute_force_root(kappa, rho, delta, d, gamma):
    params = LawParams(kappa, delta, d)
    mix = ClassMix.from_shares(0.3, 0.3, *rho)
    be = breakeven_w_s(params, mix, gamma)
    assert be.exact == pytest.approx(brute_force_breakeven(params, mix, gamma), abs=1e-9)
    assert float(saving_vs_w_s(params, mix, gamma, be.exact)) == pytest.approx(0.0, abs=1e-9)
    # the small-eps breakeven is the paper's formula with rho_n at this mix's R:F ratio
    rho_n = (0.3 * rho[1] + 0.4 * rho[2]) / 0.7
    rho_star = 1 - 2 * (1 - delta - d) / (gamma + 1) / kappa
    assert be.rho_n == pytest.approx(rho_n)
    if be.approx is not None:
        assert be.approx == pytest.approx((rho_star - rho_n) / (rho[0] - rho_n))
        assert be.approx >= be.exact  # the rule is conservative
    else:
        assert not 0 <= (rho_star - rho_n) / (rho[0] - rho_n) <= 1


def test_breakeven_reasons_when_no_root_in_unit_interval():
    # the paper's example pays even at w_S = 0
    be = breakeven_w_s(PARAMS, MIX, 8)
    assert be.exact is None and "pays at every" in be.exact_reason
    assert be.approx == pytest.approx((1 - eps_star(8, 0.05, 0.02) / 0.8 - MIX.rho_n) / (0.95 - MIX.rho_n))
    # costs above any gain
    be = breakeven_w_s(LawParams(0.8, 0.6, 0.5), MIX, 8)
    assert be.exact is None and be.approx is None and "never pays" in be.exact_reason
    # no schema advantage
    flat = ClassMix.from_shares(0.3, 0.3, 0.5, 0.5, 0.5)
    assert "rho_S equals rho_n" in breakeven_w_s(LawParams(1.0, 0.3, 0.3), flat, 8).exact_reason
    # loses everywhere: a weak schema advantage with expensive drafting
    be = breakeven_w_s(LawParams(1.0, 0.3, 0.6), ClassMix.from_shares(0.3, 0.3, 0.6, 0.2, 0.1), 8)
    assert be.exact is None and "loses at every" in be.exact_reason
    assert breakeven_w_s(LawParams(0.0, 0.1, 0.1), MIX, 8).exact is None


# ---------------------------------------------------------------- limits

def test_schema_ceiling_limit():
    gamma, delta, d = 8, 0.05, 0.02
    ceiling = schema_ceiling(gamma, delta, d)
    assert ceiling.tau == gamma
    assert ceiling.speedup == pytest.approx((gamma + 1) / (1 + gamma * (delta + d)))
    params = LawParams(0.8, delta, d)
    values = []
    for gap in (1e-1, 1e-2, 1e-4, 1e-8):
        mix = ClassMix.from_shares(1 - gap, gap / 2, 1 - gap, 0.5, 0.3)
        values.append(abs(float(tau_mixed(params, mix, gamma)) - ceiling.tau))
        report = evaluate(params, mix, gamma)
    assert values == sorted(values, reverse=True) and values[-1] < 1e-6
    assert report.speedup == pytest.approx(ceiling.speedup, rel=1e-6)
    exact = evaluate(params, ClassMix.from_shares(1.0, 0.0, 1.0, 0.5, 0.3), gamma)
    assert exact.tau == gamma and exact.saving == pytest.approx(ceiling.saving)


def test_entropy_floor_limit():
    gamma, delta, d = 8, 0.05, 0.02
    floor = entropy_floor(gamma, delta, d)
    assert floor.tau == 0 and floor.saving == pytest.approx(-gamma * (delta + d))
    params = LawParams(1.0, delta, d)  # fully misaligned drafter: eps -> 1 as rho -> 0
    mix = ClassMix.from_shares(0.0, 0.5, 0.9, 1e-12, 1e-12)
    report = evaluate(params, mix, gamma)
    assert report.tau == pytest.approx(0.0, abs=1e-11)
    assert report.saving == pytest.approx(floor.saving, abs=1e-10)
    assert report.speedup == pytest.approx(floor.speedup, rel=1e-10)


# ---------------------------------------------------------------- monotonicity

@settings(max_examples=300, deadline=None)
@given(kappa=st.floats(0.05, 1.0), rho_s=st.floats(0.01, 1.0), rho_r=st.floats(0.01, 1.0),
       rho_f=st.floats(0.01, 1.0), rf=st.floats(0.0, 1.0), w1=st.floats(0.0, 1.0), w2=st.floats(0.0, 1.0),
       gamma=st.integers(1, 16), delta=st.floats(0.0, 0.5), d=st.floats(0.0, 0.5))
def test_tau_and_saving_increase_with_schema_share_when_rho_s_above_rho_bar(
        kappa, rho_s, rho_r, rho_f, rf, w1, w2, gamma, delta, d):
    lo, hi = sorted((w1, w2))
    assume(hi - lo > 1e-3)
    params = LawParams(kappa, delta, d)
    base = ClassMix.from_shares(lo, rf * (1 - lo), rho_s, rho_r, rho_f)
    assume(rho_s - base.rho_n > 1e-3)
    assert rho_s > base.rho_bar or lo == 1.0
    a, b = base, base.with_w_s(hi)
    assert float(tau_mixed(params, b, gamma)) > float(tau_mixed(params, a, gamma))
    assert float(saving_at(params, b, gamma)) > float(saving_at(params, a, gamma))


# ---------------------------------------------------------------- marginal value

def test_dtau_deps_matches_direct_sum_and_finite_difference():
    for gamma in (1, 3, 8, 16):
        for eps in (0.0, 1e-6, 9.9e-5, 1.01e-4, 0.01, 0.3, 0.9):
            q = 1 - eps
            direct = -sum(i * q ** (i - 1) for i in range(1, gamma + 1))
            assert dtau_deps(gamma, eps) == pytest.approx(direct, rel=1e-7)
        h = 1e-6
        fd = (tau_direct(gamma, 0.3 + h) - tau_direct(gamma, 0.3 - h)) / (2 * h)
        assert dtau_deps(gamma, 0.3) == pytest.approx(fd, rel=1e-6)


def test_marginal_tau_exact_is_the_derivative_and_approx_is_its_small_eps_limit():
    gamma, h = 8, 1e-6
    m = marginal_tau(PARAMS, MIX, gamma)
    assert m.approx == pytest.approx(gamma * (gamma + 1) / 2 * 0.8 * (0.95 - 0.4))

    def tau_at(shift):
        w = dict(MIX.w)
        w["S"] += shift
        w["F"] -= shift
        return tau_direct(gamma, mix_direct_eps(0.8, w, MIX.rho))

    assert m.exact == pytest.approx((tau_at(h) - tau_at(-h)) / (2 * h), rel=1e-6)
    small = LawParams(1e-5, 0.05, 0.02)
    ms = marginal_tau(small, MIX, gamma)
    assert ms.exact == pytest.approx(ms.approx, rel=1e-3)
    assert marginal_tau(PARAMS, MIX, gamma, source="n").approx == pytest.approx(
        gamma * (gamma + 1) / 2 * 0.8 * (0.95 - MIX.rho_n))
    with pytest.raises(LawInputError):
        marginal_tau(PARAMS, MIX, gamma, source="X")


# ---------------------------------------------------------------- composition, optimal gamma

def test_composition_cost():
    ratio = float(cost_ratio(8, 5.0, 0.05, 0.02))
    total = composition_cost(100.0, 400.0, h=0.6, c_hit=0.1, nu=1.25, cost_ratio_value=ratio)
    assert total == pytest.approx(1.25 * ((1 - 0.6 + 0.06) * 100.0 + ratio * 400.0))
    assert composition_cost(100.0, 400.0) == pytest.approx(500.0)
    np.testing.assert_allclose(composition_cost(np.array([1.0, 2.0]), 1.0, h=1.0, c_hit=0.5), [1.5, 2.0])
    with pytest.raises(LawInputError, match="h must be"):
        composition_cost(1.0, 1.0, h=1.5)
    with pytest.raises(LawInputError, match="nu"):
        composition_cost(1.0, 1.0, nu=0.5)


def test_gamma_opt_matches_brute_force():
    eps = np.array([0.0, 0.01, 0.05, 0.1, 0.2, 0.4, 0.7, 0.95])
    for delta, d in ((0.05, 0.02), (0.01, 0.0), (0.2, 0.2)):
        vec = gamma_opt(eps, delta, d, 16)
        for e, g in zip(eps, vec, strict=True):
            brute = max(range(1, 17), key=lambda k, e=e: (tau_direct(k, e) + 1) / (1 + k * (delta + d)))
            assert g == brute
    assert gamma_opt(0.0, 0.05, 0.02, 16) == 16  # a perfect drafter with cheap drafts: go deep
    choice = best_gamma(PARAMS, MIX, 16)
    assert choice.gamma == gamma_opt(eps_bar(PARAMS, MIX), 0.05, 0.02, 16)
    assert choice.pays and choice.speedup >= evaluate(PARAMS, MIX, 8).speedup


# ---------------------------------------------------------------- input checks

@pytest.mark.parametrize("build,match", [
    (lambda: ClassMix({"S": 0.5, "R": 0.3, "F": 0.3}, {"S": 0.9, "R": 0.5, "F": 0.4}), "sum to 1"),
    (lambda: ClassMix.from_shares(0.8, 0.3, 0.9, 0.5, 0.4), "exceeds 1"),
    (lambda: ClassMix.from_shares(0.5, 0.3, 1.2, 0.5, 0.4), "rho_S"),
    (lambda: ClassMix.from_shares(0.5, 0.3, 0.9, 0.0, 0.4), "rho_R"),
    (lambda: ClassMix.from_shares(-0.1, 0.3, 0.9, 0.5, 0.4), "w_S"),
    (lambda: LawParams(0.8, -0.01, 0.02), "delta"),
    (lambda: LawParams(0.8, 0.05, -1), "d must"),
    (lambda: LawParams(float("nan"), 0.05, 0.02), "kappa"),
    (lambda: tau_mixed(PARAMS, MIX, 0), "gamma"),
    (lambda: tau_mixed(PARAMS, MIX, 2.5), "gamma"),
    (lambda: tau_mixed(LawParams(3.0, 0.0, 0.0), MIX, 4), "kappa"),
    (lambda: evaluate(PARAMS, MIX, 8, gamma_max=0), "gamma_max"),
])
def test_bad_input_is_rejected_with_a_clear_error(build, match):
    with pytest.raises(LawInputError, match=match):
        build()


def test_report_keys():
    report = evaluate(PARAMS, MIX, 8).to_dict()
    for key in ("tau", "tau_by_class", "saving", "speedup", "eps_star", "w_s_star_approx",
                "w_s_star_exact", "gamma_opt"):
        assert key in report
    assert set(report["tau_by_class"]) == {"S", "R", "F"}


def test_law_package_stays_pure():
    """Importing the law pulls neither matplotlib, typer, torch nor vllm."""
    code = ("import sys, agentspec_sdk.law; "
            "bad = [m for m in ('matplotlib', 'typer', 'torch', 'vllm') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_token_values_and_extend_rule_match_the_speedup_curve():
    alphas = np.array([0.0, 0.3, 0.6, 0.9, 0.99, 1.0])
    values = token_values(alphas, 16)
    assert values.shape == (6, 16)
    # the values of the first gamma tokens add up to tau(gamma)
    np.testing.assert_allclose(values[:, :8].sum(axis=1), [tau_direct(8, 1 - a) for a in alphas], rtol=1e-12)
    for delta, d in ((0.05, 0.02), (0.2, 0.1)):
        for a in alphas:
            for g in range(1, 16):
                gain = (speedup(g + 1, tau_direct(g + 1, 1 - a), delta, d)
                        - speedup(g, tau_direct(g, 1 - a), delta, d))
                if abs(gain) > 1e-12:
                    assert bool(extend_pays(a, g, delta, d)) == (gain > 0)


def test_tau_vs_w_s_broadcasts_over_shares_and_gammas():
    w = np.linspace(0, 1, 5)
    grid = tau_vs_w_s(PARAMS, MIX, np.array([[4], [8]]), w)
    assert grid.shape == (2, 5)
    for j, ws in enumerate(w):
        m = MIX.with_w_s(float(ws))
        assert grid[1, j] == pytest.approx(tau_direct(8, mix_direct_eps(0.8, m.w, m.rho)), rel=1e-12)
    assert np.all(np.diff(grid, axis=1) > 0)
