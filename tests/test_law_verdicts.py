"""Verdicts P1 and R1-R5 on synthetic measurements built to pass, to be rejected, and to be thin."""

import json

import numpy as np
import pytest

from agentspec_sdk.law import (
    ArmSaving,
    ClassMix,
    CompositionCheck,
    LawParams,
    RoundRecord,
    SpeedupCheck,
    acceptance_by_class,
    composition_cost,
    cost_ratio,
    evaluate,
    token_mismatches,
    verdict_p1,
    verdict_r1,
    verdict_r2,
    verdict_r3,
    verdict_r4,
    verdict_r5,
    verdicts,
)


def rounds(rng, alpha_by_class, n_per_class, gamma=8):
    out = []
    for c, alpha in alpha_by_class.items():
        for _ in range(n_per_class):
            ok = rng.random(gamma) < alpha
            out.append(RoundRecord(c, "model", gamma, int(np.cumprod(ok).sum())))
    return out


def test_p1_and_r1_pass_when_structure_orders_acceptance():
    recs = rounds(np.random.default_rng(0), {"S": 0.95, "R": 0.7, "F": 0.4}, 400)
    acc = acceptance_by_class(recs)
    p1, r1 = verdict_p1(acc, 8), verdict_r1(acc, 8)
    assert p1.status == "pass" and p1.passed and not p1.rejected
    assert p1.numbers["tau_S_over_tau_F"] > 1.5
    assert p1.numbers["classes"]["S"]["tau"] > p1.numbers["classes"]["R"]["tau"]
    assert p1.numbers["S_F_intervals_separated"]
    assert r1.status == "pass"
    json.dumps([p1.to_dict(), r1.to_dict()])  # the numbers are JSON-able


def test_p1_rejected_on_wrong_order_or_small_ratio_and_r1_rejects_the_law():
    acc = acceptance_by_class(rounds(np.random.default_rng(1), {"S": 0.4, "R": 0.6, "F": 0.7}, 400))
    assert verdict_p1(acc, 8).status == "rejected"
    r1 = verdict_r1(acc, 8)
    assert r1.rejected and "rejected" in r1.text
    close = acceptance_by_class(rounds(np.random.default_rng(2), {"S": 0.72, "R": 0.7, "F": 0.68}, 400))
    p1 = verdict_p1(close, 8)
    assert p1.status == "rejected" and p1.numbers["tau_S_over_tau_F"] < 1.5
    assert verdict_r1(close, 8).status == "pass"


def test_p1_r1_insufficient_data():
    acc = acceptance_by_class(rounds(np.random.default_rng(3), {"S": 0.9, "F": 0.5}, 400)
                              + rounds(np.random.default_rng(4), {"R": 0.7}, 5))
    p1 = verdict_p1(acc, 8)
    assert p1.status == "insufficient data" and "R" in p1.text
    assert verdict_r1(acc, 8).status == "pass"
    assert verdict_r1({}, 8).status == "insufficient data"


def test_r2_breakeven_model():
    # arms whose measured saving is the law's own prediction pass
    params = LawParams(0.8, 0.05, 0.02)
    mix = ClassMix.from_shares(0.7, 0.2, 0.95, 0.6, 0.4)
    predicted = evaluate(params, mix, 8).saving
    assert verdict_r2([ArmSaving("B", 0.7, predicted), ArmSaving("A", 0.05, -0.1)]).status == "pass"
    r2 = verdict_r2([ArmSaving("B", 0.7, -0.02), ArmSaving("D", 0.65, 0.1)])
    assert r2.rejected and r2.numbers["losing_arms"] == ["B"]
    assert verdict_r2([ArmSaving("A", 0.1, -0.3)]).status == "insufficient data"


def test_r3_composition_residual():
    ratio = float(cost_ratio(8, 4.0, 0.05, 0.02))
    predicted = float(composition_cost(100.0, 300.0, h=0.5, c_hit=0.2, nu=1.1, cost_ratio_value=ratio))
    ok = verdict_r3([CompositionCheck("b1", predicted, predicted * 1.10)])
    assert ok.status == "pass" and ok.numbers["checks"][0]["residual"] == pytest.approx(0.1 / 1.1)
    bad = verdict_r3([CompositionCheck("b1", predicted, predicted * 1.05),
                      CompositionCheck("b8", predicted, predicted * 1.30)])
    assert bad.rejected and bad.numbers["worst"] == "b8"
    assert verdict_r3([]).status == "insufficient data"


def test_r4_lossless():
    compared, mismatched, first = token_mismatches([([1, 2, 3], [1, 2, 3]), ([4, 5], [4, 6]), ([7], [7, 8])])
    assert (compared, mismatched) == (3, 2) and first == "output 1 at token 1"
    r4 = verdict_r4(compared, mismatched, first)
    assert r4.rejected and r4.numbers["first_mismatch"] == first
    assert verdict_r4(10, 0).status == "pass"
    assert verdict_r4(0, 0).status == "insufficient data"


def speedup_check(name, tau_pred, tau_meas, spec_pred, spec_meas, off_pred, off_meas, outside=1.0):
    """A run whose speedup is (1 + tau) * off pass / spec pass * outside, predicted and measured."""
    factors = {"tokens per row-pass (tau)": {"predicted": 1 + tau_pred, "measured": 1 + tau_meas},
               "speculative pass (s)": {"predicted": spec_pred, "measured": spec_meas},
               "off pass (s)": {"predicted": off_pred, "measured": off_meas},
               "time outside passes": {"predicted": 1.0, "measured": outside}}
    for k, f in factors.items():  # predicted / measured contribution to the speedup
        f["error"] = (f["measured"] / f["predicted"] if k == "speculative pass (s)"
                      else f["predicted"] / f["measured"])
    predicted = (1 + tau_pred) * off_pred / spec_pred
    measured = (1 + tau_meas) * off_meas / spec_meas * outside
    return SpeedupCheck(name, predicted, measured, factors)


def test_r5_passes_when_prediction_matches_and_names_the_term_that_is_off():
    good = speedup_check("D/structure", 2.0, 2.05, 0.120, 0.118, 0.100, 0.101)
    assert good.error < 0.05
    v = verdict_r5([good])
    assert v.status == "pass" and "within 15%" in v.text and v.numbers["worst"] == "D/structure"
    # the speculative pass costs 40% more than the model says: predicted 2.5x, measured 1.8x
    slow = speedup_check("D/ngram", 2.0, 2.0, 0.120, 0.168, 0.100, 0.100)
    assert slow.error > 0.15 and slow.off_term == "speculative pass (s)"
    v = verdict_r5([good, slow])
    assert v.rejected and v.numbers["failed"] == ["D/ngram"]
    assert "D/ngram" in v.text and "speculative pass (s) off: predicted 0.12 vs measured 0.168" in v.text
    # tau over-predicted: the acceptance factor is named
    tau_off = speedup_check("A/structure", 3.0, 1.5, 0.120, 0.120, 0.100, 0.100)
    assert verdict_r5([tau_off]).rejected and tau_off.off_term == "tokens per row-pass (tau)"
    # time outside the passes (scheduler gaps) is a factor of its own
    gaps = speedup_check("B/structure", 2.0, 2.0, 0.120, 0.120, 0.100, 0.100, outside=0.7)
    assert verdict_r5([gaps]).rejected and gaps.off_term == "time outside passes"
    # exactly at the threshold passes, just past it is rejected
    assert verdict_r5([SpeedupCheck("x", 1.15, 1.0)]).status == "pass"
    assert verdict_r5([SpeedupCheck("x", 1.151, 1.0)]).rejected
    assert verdict_r5([]).status == "insufficient data"


def test_verdicts_returns_all_six_in_order():
    recs = rounds(np.random.default_rng(5), {"S": 0.95, "R": 0.7, "F": 0.4}, 100)
    out = verdicts(recs, gamma=8, arms=[ArmSaving("B", 0.8, 0.3)], compared=4, mismatched=0)
    assert [v.name for v in out] == ["P1", "R1", "R2", "R3", "R4", "R5"]
    assert [v.status for v in out] == ["pass", "pass", "pass", "insufficient data", "pass",
                                       "insufficient data"]
    assert all(v.text for v in out)
