"""The pass cost model: term-by-term recovery from synthetic pass logs (other requests' prefill
included), the law's delta and d from its terms, and the platform cost benchmark on tiny shapes."""

import numpy as np
import pytest

from agentspec_sdk import law
from agentspec_sdk.errors import LawInputError

TRUE = {"base": 0.040, "no_spec": 0.012, "row": 0.006, "grammar": 0.0007, "verified": 0.0025,
        "verified_ctx": 0.0009, "schema": 0.0004, "prefill": 0.00012, "prefill_ctx": 0.00004, "ctx": 0.0015}
PROPOSER = {"base": 0.0008, "row": 0.00015, "drafted": 0.00003, "ctx": 0.00005}


def synthetic_passes(n=800, seed=0, noise=0.0008, prefill_share=0.2):
    """Passes of a b <= 8 batch: rows arrive at different times (a new request's uncached prompt is
    prefilled in the pass that also verifies the others' drafts, after a cached prefix of 0-3000
    tokens it attends over), contexts of 200-3000 tokens."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        rows = int(rng.integers(1, 9))
        ctx_rows = rng.integers(200, 3000, size=rows)
        plain = rng.random() < 0.3  # a pass of an engine without speculation: no drafts, its own cost
        k_rows = rng.integers(0, 9, size=rows) * (not plain)
        schema_rows = rng.random(rows) < 0.6
        prefill = int(rng.integers(50, 2500)) if rng.random() < prefill_share else 0
        cached = int(rng.integers(0, 3000)) if prefill else 0
        grammar = int(rng.binomial(rows, 0.7))  # rows under a grammar pay its token mask each pass
        drafted = int(k_rows.sum())
        p = {"rows": rows, "ctx": int(ctx_rows.sum()), "drafted": drafted,
             "drafted_ctx": int((k_rows * ctx_rows).sum()), "drafted_s": int(k_rows[schema_rows].sum()),
             "prefill": prefill, "prefill_ctx": prefill * (cached + prefill / 2) / 1000, "made": drafted,
             "grammar": grammar, "no_spec": int(plain)}
        prop = 0.0 if plain else (PROPOSER["base"] + PROPOSER["row"] * rows + PROPOSER["drafted"] * drafted
                                  + PROPOSER["ctx"] * p["ctx"] / 1000)
        target = (TRUE["base"] + TRUE["no_spec"] * plain + TRUE["row"] * rows + TRUE["grammar"] * grammar
                  + TRUE["verified"] * drafted
                  + TRUE["verified_ctx"] * p["drafted_ctx"] / 1000 + TRUE["schema"] * p["drafted_s"]
                  + TRUE["prefill"] * prefill + TRUE["prefill_ctx"] * p["prefill_ctx"]
                  + TRUE["ctx"] * p["ctx"] / 1000)
        p["proposer_s"] = prop
        p["s"] = target + prop + float(rng.normal(0, noise))
        out.append(p)
    return out


def test_fit_recovers_every_term_including_other_rows_prefill():
    fit = law.fit_pass_costs(synthetic_passes())
    for term, value in TRUE.items():
        assert abs(fit.coef[term] - value) < max(4 * fit.se[term], 0.03 * value), term
    assert fit.coef["prefill"] == pytest.approx(TRUE["prefill"], rel=0.03)
    for term, value in PROPOSER.items():
        assert fit.proposer[term] == pytest.approx(value, rel=1e-6, abs=1e-9), term
    assert fit.r2 > 0.99 and fit.residual_sd == pytest.approx(0.0008, rel=0.1)
    assert not fit.dropped
    # the prediction of a pass is the sum of its terms
    p = synthetic_passes(n=1, seed=9, noise=0.0)[0]
    keys = ("rows", "drafted", "drafted_ctx", "drafted_s", "prefill", "prefill_ctx", "ctx", "grammar",
            "no_spec")
    assert fit.seconds(**{k: p[k] for k in keys}) == pytest.approx(p["s"], rel=0.01)


def test_without_prefill_the_other_terms_absorb_it_and_the_fit_says_so():
    clean = [dict(p, prefill=0) for p in synthetic_passes(prefill_share=0.0)]
    fit = law.fit_pass_costs(clean)
    assert fit.dropped == {"prefill": "no spread in the data", "prefill_ctx": "no spread in the data"}
    assert fit.coef["prefill"] == 0.0
    # a prefill the log cannot see (logged as 0) inflates the residual, not the drafted-token terms' truth
    hidden = [dict(p, prefill=0, prefill_ctx=0) for p in synthetic_passes(prefill_share=0.3)]
    assert law.fit_pass_costs(hidden).residual_sd > 5 * fit.residual_sd


def test_law_terms_from_the_fit():
    fit = law.fit_pass_costs(synthetic_passes())
    n, ctx_row = 6.0, 1500.0
    t_off = fit.seconds(rows=n, ctx=n * ctx_row, proposer=False)
    # seconds one more verified draft token adds to a pass (target + drafter), half of them in S rows
    c, p = fit.coef, fit.proposer
    per_token = c["verified"] + c["verified_ctx"] * ctx_row / 1000 + c["schema"] * 0.5 + p["drafted"]
    expected = TRUE["verified"] + TRUE["verified_ctx"] * 1.5 + TRUE["schema"] * 0.5 + PROPOSER["drafted"]
    assert per_token == pytest.approx(expected, rel=0.05)
    # one more drafted token in each of n rows, relative to the pass without drafts: delta + d
    t_spec = fit.seconds(rows=n, ctx=n * ctx_row, drafted=n, drafted_ctx=n * ctx_row, drafted_s=n / 2)
    fixed = fit.seconds(rows=n, ctx=n * ctx_row) - t_off  # the proposer's own time without drafts
    assert (t_spec - t_off - fixed) / t_off == pytest.approx(n * per_token / t_off, rel=1e-6)
    # the saving from pass costs reduces to the law's round formula when every row drafts
    gamma, tau, delta, d = 8, 4.0, 0.05, 0.02
    assert float(law.pass_cost_ratio(tau, 1.0, 1.0 + gamma * (delta + d), 1.0)) == pytest.approx(
        float(law.cost_ratio(gamma, tau, delta, d)))
    with pytest.raises(LawInputError, match="draft share"):
        law.pass_cost_ratio(tau, 1.0, 1.2, 1.5)


def test_fit_refuses_thin_or_degenerate_logs():
    with pytest.raises(LawInputError, match="at least 30 passes"):
        law.fit_pass_costs(synthetic_passes(n=10))
    same = [dict(p, rows=4, ctx=4000, drafted=0, drafted_ctx=0, drafted_s=0, prefill=0, prefill_ctx=0,
                 grammar=4, no_spec=0) for p in synthetic_passes()]
    fit = law.fit_pass_costs(same)  # nothing varies: only the per-pass cost is fitted
    assert set(fit.dropped) == {"no_spec", "row", "grammar", "verified", "verified_ctx", "schema", "prefill",
                                "prefill_ctx", "ctx"}
    assert fit.coef["base"] == pytest.approx(np.mean([p["s"] - p["proposer_s"] for p in same]))


def _gpu_costs():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_costs.py"
    spec = importlib.util.spec_from_file_location("gpu_costs", path)
    mod = importlib.util.module_from_spec(spec)
    import sys

    sys.modules["gpu_costs"] = mod  # dataclasses look their module up while the file runs
    spec.loader.exec_module(mod)
    return mod


def test_platform_costs_on_tiny_shapes(tmp_path):
    gc = _gpu_costs()
    out, md = tmp_path / "costs.json", tmp_path / "costs.md"
    result = gc.main(["--tiny", "--device", "cpu", "--ctx", "128", "--reps", "3", "--batches", "1,8",
                      "--out", str(out), "--markdown", str(md)])
    import json

    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert [c["batch"] for c in result["costs"]] == [1, 8]
    for c, p in zip(result["costs"], result["predictions"], strict=True):
        assert c["c_t_s"] > 0 and c["verify_s"] > 0 and c["draft_s"] > 0
        assert c["delta"] == pytest.approx(max((c["verify_s"] - c["c_t_s"]) / (8 * c["c_t_s"]), 0.0))
        assert c["d"] == pytest.approx(c["draft_s"] / c["c_t_s"])
        # the predictions are the law at the measured constants
        rep = law.evaluate(law.LawParams(0.64, c["delta"], c["d"]),
                           law.ClassMix({"S": 0.7, "R": 0.3, "F": 0.0}, {"S": 0.8, "R": 0.42, "F": 0.14}), 8)
        assert p["speedup"] == pytest.approx(rep.speedup) and p["tau"] == pytest.approx(rep.tau)
    assert md.read_text().count("\n| ") == 3 and "| 8 |" in md.read_text()


def test_platform_layers_have_the_declared_shapes():
    gc = _gpu_costs()
    import torch

    layer = gc.Layer(gc.TINY_TARGET, 2, 16, "cpu", torch.float32,
                     torch.Generator(device="cpu").manual_seed(0))
    s = gc.TINY_TARGET
    params = layer.qkv.numel() + layer.o.numel() + layer.gate_up.numel() + layer.down.numel()
    assert params == (s.hidden * (s.heads + 2 * s.kv_heads) * s.head_dim + s.heads * s.head_dim * s.hidden
                      + 3 * s.hidden * s.mlp)
    x = torch.randn(2, 3, s.hidden)
    assert layer(x).shape == (2, 3, s.hidden)
    # the declared platform: a 32B target (untied embeddings) and a 4B drafter (tied), within 5%
    for shape, billions, embeddings in ((gc.TARGET, 32.8, 2), (gc.DRAFTER, 4.0, 1)):
        per_layer = (shape.hidden * (shape.heads + 2 * shape.kv_heads) * shape.head_dim
                     + shape.heads * shape.head_dim * shape.hidden + 3 * shape.hidden * shape.mlp)
        total = shape.layers * per_layer + embeddings * shape.vocab * shape.hidden
        assert total / 1e9 == pytest.approx(billions, rel=0.05), shape.name


def test_each_drafter_gets_its_own_proposer_terms_and_the_target_terms_are_shared():
    a = synthetic_passes(seed=3)
    slow = {"base": 0.004, "row": 0.001, "drafted": 0.0002, "ctx": 0.0004}  # e.g. a suffix tree's own time
    b = []
    for p in synthetic_passes(seed=4):
        prop = (slow["base"] + slow["row"] * p["rows"] + slow["drafted"] * p["made"]
                + slow["ctx"] * p["ctx"] / 1000)
        b.append(dict(p, proposer_s=prop, s=p["s"] - p["proposer_s"] + prop))
    assert law.fit_proposer(b)["drafted"] == pytest.approx(slow["drafted"], rel=1e-6)
    fit = law.fit_pass_costs(a + b, proposer_passes=a)
    assert fit.proposer["drafted"] == pytest.approx(PROPOSER["drafted"], rel=1e-6)
    for term, value in TRUE.items():  # the target's terms do not absorb either drafter's time
        assert abs(fit.coef[term] - value) < max(4 * fit.se[term], 0.03 * value), term
    # the second drafter's pass, predicted with its own terms
    p = b[0]
    keys = ("rows", "drafted", "drafted_ctx", "drafted_s", "prefill", "prefill_ctx", "ctx", "grammar",
            "no_spec")
    assert (fit.seconds(**{k: p[k] for k in keys}, proposer=law.fit_proposer(b))
            == pytest.approx(p["s"], abs=0.004))
    assert law.fit_proposer(a[:5]) == {}


def test_a_cost_the_data_pulls_below_zero_is_set_to_zero_and_the_rest_refitted():
    passes = synthetic_passes(noise=0.0005)
    for p in passes:  # schema rows made passes 0.1 ms per drafted token faster: no cost can be negative
        p["s"] -= (TRUE["schema"] + 0.0001) * p["drafted_s"]
    fit = law.fit_pass_costs(passes)
    assert fit.coef["schema"] == 0.0 and fit.dropped["schema"].startswith("fitted -")
    assert float(fit.dropped["schema"].split()[1]) == pytest.approx(-0.0001, rel=0.1)
    assert all(v >= 0 for v in fit.coef.values())
    assert fit.coef["verified"] > 0 and fit.coef["prefill"] == pytest.approx(TRUE["prefill"], rel=0.05)


def test_without_an_off_pass_log_the_off_pass_is_predicted_on_the_plain_path():
    from agentspec_sdk.replay.predict import speedup_check

    model = law.fit_pass_costs(synthetic_passes())
    comp = {"rows": 1.0, "ctx": 1500.0, "prefill": 0.0, "grammar": 1.0, "drafted": 4.0,
            "drafted_ctx": 6000.0, "drafted_s": 2.0}
    run = {"output_tokens": 100, "accepted": 50, "rounds": 20, "drafted": 80, "w": {"S": 0.5}}
    check = speedup_check(run, {"tau": 2.5}, model, comp, comp_off=None)
    plain = model.seconds(rows=1.0, ctx=1500.0, grammar=1.0, no_spec=1.0, proposer=False)
    assert model.coef["no_spec"] > 0.005
    assert check["t_off_s"] == pytest.approx(plain)


def test_online_step_cost_knows_the_context_its_delta_is_learned_at():
    """`ref_ctx`: the drafted-weighted mean context of the steps (the context the learned delta holds
    at, which `budget.row_prices` prices each row's context against)."""
    from agentspec_sdk.law.cost_fits import OnlineStepCost

    cost = OnlineStepCost(0.02, decay=1.0)
    assert cost.ref_ctx() is None
    cost.observe(0.0, 2, 0, 0)  # no drafted token: no context to learn at
    cost.observe(0.1, 2, 4, 4 * 1000)  # 4 tokens drafted in rows of 1000 tokens
    cost.observe(0.2, 2, 2, 2 * 4000)  # 2 in rows of 4000
    assert cost.ref_ctx() == pytest.approx((4000 + 8000) / 6)
