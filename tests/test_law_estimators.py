"""Estimators recover the law's constants from synthetic measurements generated with known values."""

import json
import math

import numpy as np
import pytest

from agentspec_sdk.errors import LawInputError
from agentspec_sdk.law import (
    OnlineAcceptance,
    OnlineCalibration,
    RoundRecord,
    acceptance_by_class,
    entropy_from_logprobs,
    fit_costs,
    fit_kappa,
    rho_from_entropies,
    tau,
    wilson_interval,
)

RHO = {"S": 0.95, "R": 0.6, "F": 0.4}


def synthetic_rounds(rng, kappa, rho, n, gammas=(2, 4, 8, 16), sources=("model",)):
    """Rounds whose accepted count is truncated-geometric with eps_c = kappa (1 - rho_c)."""
    out = []
    classes = list(rho)
    for _ in range(n):
        c = classes[rng.integers(len(classes))]
        g = int(rng.choice(gammas))
        ok = rng.random(g) < 1 - kappa * (1 - rho[c])
        out.append(RoundRecord(c, str(rng.choice(sources)), g, int(np.cumprod(ok).sum())))
    return out


def test_round_record_roundtrips_through_json_and_checks_counts():
    r = RoundRecord("S", "forced", 5, 3)
    assert RoundRecord.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    assert r.rejected and not RoundRecord("S", "lookup", 4, 4).rejected
    with pytest.raises(LawInputError, match="accepted"):
        RoundRecord("S", "model", 2, 3)
    with pytest.raises(LawInputError, match="lacks field"):
        RoundRecord.from_dict({"law_class": "S", "drafted": 1})


def test_fit_kappa_recovers_kappa_within_its_interval():
    rng = np.random.default_rng(11)
    true_kappa = 0.8
    fit = fit_kappa(synthetic_rounds(rng, true_kappa, RHO, 4000), RHO)
    assert fit.ci_low < true_kappa < fit.ci_high
    assert abs(fit.kappa - true_kappa) < 3 * fit.se
    assert abs(fit.kappa - true_kappa) < 0.03  # stated error for 4000 rounds
    assert fit.ci_high - fit.ci_low == pytest.approx(2 * 1.96 * fit.se, rel=0.15)
    assert fit.classes == ("F", "R", "S")


def test_fit_kappa_single_class_equals_the_geometric_mle():
    rng = np.random.default_rng(3)
    rho = {"F": 0.5}
    recs = synthetic_rounds(rng, 0.7, rho, 500)
    acc = sum(r.accepted for r in recs)
    rej = sum(r.rejected for r in recs)
    eps_hat = rej / (acc + rej)
    assert fit_kappa(recs, rho).kappa == pytest.approx(eps_hat / 0.5, rel=1e-9)


def test_fit_kappa_interval_coverage_over_seeds():
    """The 95% profile-likelihood interval covers the true kappa in most of 40 replications."""
    covered = 0
    for seed in range(40):
        rng = np.random.default_rng(1000 + seed)
        fit = fit_kappa(synthetic_rounds(rng, 0.5, RHO, 300), RHO)
        covered += fit.ci_low <= 0.5 <= fit.ci_high
    assert covered >= 34  # binomial(40, 0.95): P(< 34) < 1%


def test_fit_kappa_edge_cases():
    assert fit_kappa([RoundRecord("S", "m", 4, 4)] * 10, RHO).kappa == 0.0
    all_fail = fit_kappa([RoundRecord("F", "m", 4, 0)] * 10, RHO)
    assert all_fail.kappa == pytest.approx(1 / 0.6)
    with pytest.raises(LawInputError, match="no rho"):
        fit_kappa([RoundRecord("X", "m", 4, 1)], RHO)
    with pytest.raises(LawInputError, match="rho = 1"):
        fit_kappa([RoundRecord("S", "m", 4, 1)], {"S": 1.0})
    with pytest.raises(LawInputError, match="not identifiable"):
        fit_kappa([RoundRecord("S", "m", 0, 0)], RHO)


def test_acceptance_by_class_wilson_intervals_cover_truth():
    rng = np.random.default_rng(5)
    kappa = 0.8
    acc = acceptance_by_class(synthetic_rounds(rng, kappa, RHO, 3000))
    for c, rho in RHO.items():
        alpha = 1 - kappa * (1 - rho)
        a = acc[c]
        assert a.ci_low < alpha < a.ci_high
        assert a.alpha == pytest.approx(a.accepted / (a.accepted + a.rejections))
        t, lo, hi = a.tau_at(8)
        assert lo < float(tau(8, 1 - alpha)) < hi
    by_source = acceptance_by_class(synthetic_rounds(rng, kappa, RHO, 300, sources=("forced", "model")),
                                    key=lambda r: (r.law_class, r.source))
    assert ("S", "forced") in by_source and by_source[("S", "forced")].law_class == "S/forced"


def test_wilson_interval_known_values():
    lo, hi = wilson_interval(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_fit_costs_recovers_ct_delta_d():
    rng = np.random.default_rng(42)
    c_t, delta, d, steps = 0.025, 0.05, 0.02, 600
    gamma = rng.integers(0, 17, steps)
    forced = rng.binomial(gamma, 0.5)  # forced drafts cost the drafter nothing
    n_verified = gamma + 1
    n_drafted = gamma - forced
    t = c_t * (1 + delta * gamma + d * n_drafted) * rng.lognormal(0.0, 0.02, steps)
    fit = fit_costs(t, n_verified, n_drafted)
    assert fit.c_t == pytest.approx(c_t, rel=0.01)
    for est, se, true in ((fit.delta, fit.delta_se, delta), (fit.d, fit.d_se, d)):
        assert abs(est - true) < 4 * se
        assert abs(est - true) < 0.005  # stated error: 2% timing noise, 600 steps
    assert fit.r2 > 0.9 and fit.row_cost is None


def test_fit_costs_with_batches_reports_row_cost():
    rng = np.random.default_rng(9)
    steps = 800
    rows = rng.integers(1, 9, steps)
    extra = rng.integers(0, 8 * 8, steps)
    drafted = rng.binomial(extra, 0.6)
    t = 0.03 * (1 + 0.04 * extra + 0.015 * drafted + 0.1 * (rows - 1)) + rng.normal(0, 2e-4, steps)
    fit = fit_costs(t, rows + extra, drafted, rows)
    assert fit.delta == pytest.approx(0.04, abs=0.003)
    assert fit.d == pytest.approx(0.015, abs=0.003)
    assert fit.row_cost == pytest.approx(0.1, abs=0.01)


def test_fit_costs_rejects_collinear_or_bad_data():
    gamma = np.arange(1, 30) % 9 + 1
    with pytest.raises(LawInputError, match="collinear"):
        fit_costs(0.01 * (1 + 0.07 * gamma), gamma + 1, gamma)
    with pytest.raises(LawInputError, match="equal length"):
        fit_costs([1.0, 2.0], [1, 2, 3], [0, 1])
    with pytest.raises(LawInputError, match="step_times > 0"):
        fit_costs([-1.0, 1.0, 1.0, 1.0, 1.0], [1, 2, 3, 4, 5], [0, 1, 0, 1, 2])


def test_rho_from_entropies_and_logprobs():
    uniform = np.log(np.full((3, 4), 0.25))
    np.testing.assert_allclose(entropy_from_logprobs(uniform), math.log(4))
    with np.errstate(divide="ignore"):
        peaked = np.log(np.array([[1.0, 0.0, 0.0]]))
    assert entropy_from_logprobs(peaked)[0] == pytest.approx(0.0)
    p = np.array([0.7, 0.2, 0.1])
    assert entropy_from_logprobs(np.log(p))[0] == pytest.approx(-(p * np.log(p)).sum())
    rho = rho_from_entropies({"S": [0.0, 0.1], "F": [2.0, 3.0]})
    assert rho["S"] == pytest.approx(math.exp(-0.05)) and rho["F"] == pytest.approx(math.exp(-2.5))
    with pytest.raises(LawInputError, match="no entropy"):
        rho_from_entropies({"S": []})


def test_online_acceptance_prior_then_data_then_forgetting():
    online = OnlineAcceptance.from_law(0.8, RHO, prior_strength=4.0, decay=0.98)
    assert online.alpha("S", "model") == pytest.approx(1 - 0.8 * 0.05)
    assert online.alpha("unknown", "x") == pytest.approx(0.5)
    rng = np.random.default_rng(1)
    for _ in range(2000):
        g = 8
        ok = rng.random(g) < 0.3
        online.update("S", "model", g, int(np.cumprod(ok).sum()))
    # effective memory ~ 50 rounds: the estimate is near 0.3 despite the optimistic prior
    assert online.alpha("S", "model") == pytest.approx(0.3, abs=0.08)
    # a source with no data of its own falls back to the class pooled over sources
    assert online.alpha("S", "lookup") == pytest.approx(online.alpha("S", "model"))
    for _ in range(400):
        online.update("S", "model", 8, 8)
    assert online.alpha("S", "model") > 0.95  # the old regime is forgotten
    assert online.tau("S", "model", 8) == pytest.approx(float(tau(8, 1 - online.alpha("S", "model"))))
    assert "S/model" in online.snapshot()
    with pytest.raises(LawInputError):
        online.update("S", "model", 2, 3)
    with pytest.raises(LawInputError, match="decay"):
        OnlineAcceptance(decay=0.0)


def test_online_calibration_learns_per_depth_how_far_estimates_hold():
    """Tree estimates of 1.0 borne out 0.7 of the time at a run's second token and always from its
    fifth on: the factors learn each depth apart, per source; a kind without data takes its class's;
    bad input names the key."""
    cal = OnlineCalibration(prior_strength=8.0, decay=0.995)
    assert cal.factor("F", "prose", "suffix", 1) == 1.0  # no data: the estimates as given
    rng = np.random.default_rng(3)
    for _ in range(1500):
        # a run of 8 tokens: the first estimated 0.5 and accepted half the time, the second "certain"
        # but accepted 0.7, the rest certain and accepted
        ok = [rng.random() < 0.5, rng.random() < 0.7] + [True] * 6
        cal.update("F", "prose", "suffix", [0.5] + [1.0] * 7, int(np.cumprod(ok).sum()))
    assert cal.factor("F", "prose", "suffix", 0) == pytest.approx(1.0, abs=0.1)
    assert cal.factor("F", "prose", "suffix", 1) == pytest.approx(0.7, abs=0.08)
    assert cal.factor("F", "prose", "suffix", 2) == pytest.approx(1.0, abs=0.02)
    # one bucket from the fifth token on
    assert cal.factor("F", "prose", "suffix", 9) == cal.factor("F", "prose", "suffix", 4)
    assert cal.factor("F", "other", "suffix", 1) == cal.factor("F", None, "suffix", 1)  # the class's
    assert cal.factor("F", "prose", "lookup", 1) == 1.0  # another source learns apart
    assert cal.factor("R", "thought", "suffix", 1) == 1.0
    by_depth = tuple(cal.factor("F", "prose", "suffix", j) for j in (0, 1, 2, 4))
    assert cal.factors("F", "prose", "suffix") == by_depth
    assert "F/prose/suffix/1" in cal.snapshot()
    with pytest.raises(LawInputError, match="accepted=3 outside .* F/prose/lookup"):
        cal.update("F", "prose", "lookup", [0.5, 0.5], 3)
    with pytest.raises(LawInputError, match="F/prose/suffix must be in"):
        cal.update("F", "prose", "suffix", [1.5], 0)
    with pytest.raises(LawInputError, match="decay"):
        OnlineCalibration(decay=0.0)


def _step_times(cost, a, b, c, n, seed=0, rows=(1, 4, 8), idle_every=40):
    rng = np.random.default_rng(seed)
    t = 100.0
    for i in range(n):
        r = int(rng.choice(rows))
        k = int(rng.integers(0, 8 * r + 1))
        cost.observe(t, r, k)
        t += a + b * r + c * k + rng.normal(0, 0.0005)
        if i % idle_every == idle_every - 1:
            t += 3.0  # every agent waited on a tool: no pass ran
    return cost


def test_online_step_cost_learns_delta_from_step_times():
    from agentspec_sdk.law import OnlineStepCost

    cost = OnlineStepCost(0.02)
    assert cost.delta() == 0.02 and not cost.learned
    _step_times(cost, 0.04, 0.002, 0.003, 30)
    assert cost.delta() == 0.02  # too few steps: still the prior
    _step_times(cost, 0.04, 0.002, 0.003, 600, seed=1)
    assert cost.learned and cost.delta() == pytest.approx(0.003 / 0.042, rel=0.1)
    a, b, c = cost.terms()  # the terms the budget prices a batch's draft tokens with
    assert (a, b, c) == pytest.approx((0.04, 0.002, 0.003), rel=0.15)
    # one batch size: the pass is taken as proportional to its rows
    one = _step_times(OnlineStepCost(0.02), 0.0, 0.01, 0.003, 400, rows=(8,))
    assert one.delta() == pytest.approx(0.003 / 0.01, rel=0.1) and one.terms() is None
    # drafts of one size only: c cannot be fitted, the prior stays
    flat = OnlineStepCost(0.05)
    for i in range(200):
        flat.observe(i * 0.05, 4, 3)
    assert flat.delta() == 0.05 and not flat.learned
    with pytest.raises(LawInputError):
        OnlineStepCost(-1.0)


def test_noisy_step_times_keep_the_learned_delta_near_its_prior():
    """One row, drafts of 0–8 tokens, and step gaps with contention noise as large as the pass: the fit
    alone wanders (it prices every draft token of the budget), the learned delta is shrunk toward
    the prior by the fit's standard error; clean gaps still learn a delta far from the prior."""
    from agentspec_sdk.law import OnlineStepCost

    def run(seed, noise, c=0.00024, prior=0.02):
        rng = np.random.default_rng(seed)
        cost, t = OnlineStepCost(prior), 0.0
        for _ in range(400):
            k = int(rng.integers(0, 9))
            cost.observe(t, 1, k)
            t += 0.012 + c * k + rng.exponential(noise)  # another process on the cores: positive, heavy
        return cost

    noisy = [run(seed, 0.024) for seed in range(30)]
    raw = np.array([cost.delta_raw() for cost in noisy])
    learned = np.array([cost.delta() for cost in noisy])
    assert all(cost.delta_se() > 0.01 for cost in noisy)
    assert learned.max() - 0.02 < 0.6 * (raw.max() - 0.02)  # a price too high sends nothing
    assert np.abs(learned - 0.02).mean() < 0.6 * np.abs(raw - 0.02).mean()
    clean = run(0, 0.0002, c=0.0012)  # true delta 0.1, five times the prior
    assert clean.delta_se() < 0.005 and clean.delta() == pytest.approx(0.1, rel=0.05)
    with pytest.raises(LawInputError, match="prior sd"):
        OnlineStepCost(0.02, prior_sd=0.0)


def test_fit_costs_without_a_drafter_cost_fits_delta_alone():
    from agentspec_sdk.law import fit_costs

    rng = np.random.default_rng(3)
    rows = rng.integers(1, 9, 300)
    drafted = rng.integers(0, 6, 300) * rows  # a model-free drafter: verified - rows == drafted
    t = 0.03 * (1 + 0.08 * drafted) + 0.002 * (rows - 1) + rng.normal(0, 0.0005, 300)
    fit = fit_costs(t, rows + drafted, None, rows)
    assert fit.d == 0.0 and fit.d_se == 0.0
    assert fit.c_t == pytest.approx(0.03, rel=0.03) and fit.delta == pytest.approx(0.08, rel=0.05)
    assert fit.row_cost * fit.c_t == pytest.approx(0.002, rel=0.1)
    with pytest.raises(LawInputError, match="collinear"):
        fit_costs(t, rows + drafted, drafted, rows)  # d cannot be told from delta here


def test_fit_turn_costs_recovers_ct_and_delta_from_per_turn_step_times():
    from agentspec_sdk.law import fit_turn_costs

    rng = np.random.default_rng(5)
    k = rng.uniform(0.0, 6.0, 80)  # drafted tokens per step of each turn
    fit = fit_turn_costs(k, 0.04 * (1 + 0.07 * k) + rng.normal(0, 1e-4, 80))
    assert fit["c_t"] == pytest.approx(0.04, rel=0.01) and fit["delta"] == pytest.approx(0.07, rel=0.03)
    assert fit["d"] == 0.0 and fit["turns"] == 80 and "least squares" in fit["method"]
    # all turns at one draft size: delta is not identifiable and is set to 0, c_T is the mean step time
    flat = fit_turn_costs([2.0] * 5, [0.1, 0.2, 0.3, 0.2, 0.2])
    assert flat["delta"] == 0.0 and flat["c_t"] == pytest.approx(0.2) and "too few" in flat["method"]
    assert fit_turn_costs([], [])["c_t"] is None
    # a non-positive intercept falls back to the fastest turn's step time
    neg = fit_turn_costs([1.0, 2.0, 3.0], [0.1, 0.3, 0.5])
    assert neg["c_t"] == pytest.approx(0.1) and neg["delta"] == pytest.approx(2.0)
    with pytest.raises(LawInputError, match="differ in length: 2 != 1"):
        fit_turn_costs([1.0, 2.0], [0.1])


def test_fit_step_price_keeps_every_term_nonnegative():
    from agentspec_sdk.law import fit_step_price

    rng = np.random.default_rng(6)
    rows = rng.integers(1, 9, 200)
    drafted = rng.integers(0, 9, 200) * rows
    gaps = [{"s": 0.05 + 0.006 * n + 0.003 * k, "rows": int(n), "drafted": int(k)}
            for n, k in zip(rows, drafted, strict=True)]
    price = fit_step_price(gaps)
    assert price["a_s"] == pytest.approx(0.05) and price["b_s_per_row"] == pytest.approx(0.006)
    assert price["c_s_per_token"] == pytest.approx(0.003) and price["dropped"] == [] and price["steps"] == 200
    # a per-row cost below zero is noise: dropped
    noisy = [dict(g, s=g["s"] - 0.01 * g["rows"]) for g in gaps]
    assert fit_step_price(noisy)["b_s_per_row"] == 0.0 and fit_step_price(noisy)["dropped"] == ["b_s_per_row"]
    assert fit_step_price(gaps[:29]) is None  # fewer than 30 gaps
    collinear = [dict(g, drafted=4 * g["rows"]) for g in gaps]
    assert fit_step_price(collinear) is None  # c cannot be told from b
