"""Report aggregation, the law fit and its predictions, atomic writes and interrupted runs."""

import json
import math
import types
from concurrent.futures import Future

import pytest

from agentspec_sdk import law
from agentspec_sdk.replay import loop
from agentspec_sdk.replay.aggregate import composition_checks, summarize
from agentspec_sdk.replay.arms import Arm
from agentspec_sdk.replay.loop import TurnLog
from agentspec_sdk.replay.passes import PASS_LOGS, mean_pass, pass_table
from agentspec_sdk.replay.render import markdown
from agentspec_sdk.replay.report import build_report, write_report
from agentspec_sdk.replay.runner import ModeConfig, Plan, run_plan
from agentspec_sdk.replay.trace import Episode, Turn


def log(ep="e", seg=0, step=0, records=(), tokens=None, decode_s=1.0, prompt_hash="p", token_ids=None):
    tokens = tokens or {"S": 6, "R": 3, "F": 1}
    n = sum(tokens.values())
    return TurnLog(episode=ep, segment=seg, step=step, text="x" * n, output_tokens=n, prompt_tokens=50,
                   tokens_by_class=dict(tokens), acceptance={}, records=[dict(r) for r in records],
                   timings={"decode_s": decode_s, "prefill_s": 0.2, "e2e_s": decode_s + 0.2},
                   finish_reason="stop", error=None, token_ids=token_ids or list(range(n)),
                   prompt_hash=prompt_hash)


def rec(cls, drafted, accepted, source="forced"):
    return {"law_class": cls, "kind": "k", "source": source, "drafted": drafted, "accepted": accepted,
            "position": 0}


def spec_records():
    return ([rec("S", 8, 8)] * 30 + [rec("S", 8, 5)] * 10 + [rec("R", 4, 2)] * 25 + [rec("R", 4, 4)] * 5
            + [rec("F", 4, 0)] * 25 + [rec("F", 4, 1)] * 5)


def test_summary_per_class_sums_equal_totals():
    logs = [log(records=spec_records()[:40]), log(records=spec_records()[40:], seg=1)]
    s = summarize(logs, arm="D", mode="structure", gamma=8, batch=8, wall_s=2.0)
    for field in ("drafted", "accepted", "rounds"):
        assert s[field] == sum(c[field] for c in s["by_class"].values())
    assert s["output_tokens"] == sum(c["tokens"] for c in s["by_class"].values()) == 20
    assert s["accepted"] <= s["drafted"]
    assert s["w"]["S"] == pytest.approx(0.6)
    assert s["decode_tok_s"] == pytest.approx(10.0) and s["e2e_tok_s"] == pytest.approx(10.0)
    assert s["by_class"]["S"]["tau_mean"] == pytest.approx((30 * 8 + 10 * 5) / 40)


def report_from(off_decode=2.0, spec_decode=1.0, mismatch=False):
    off = [log(decode_s=off_decode, prompt_hash=f"p{i}") for i in range(4)]
    spec = [log(decode_s=spec_decode, prompt_hash=f"p{i}", records=spec_records()[i::4],
                token_ids=([99] * 10 if (mismatch and i == 2) else None)) for i in range(4)]
    runs = [summarize(off, arm="D", mode="off", gamma=8, batch=8, wall_s=4 * off_decode),
            summarize(spec, arm="D", mode="structure", gamma=8, batch=8, wall_s=4 * spec_decode)]
    logs = {(("D", 8, 8, True), "off"): off, (("D", 8, 8, True), "structure"): spec}
    return build_report(runs, logs, meta={"model": "fake"}, primary={"batch": 8, "gamma": 8})


def test_report_structure_speedup_and_law():
    rep = report_from()
    assert rep["schema"] == "agentspec-report/1" and rep["partial"] is False
    assert rep["speedup"]["D"]["structure"]["decode"] == pytest.approx(2.0)
    assert rep["speedup"]["D"]["off"]["decode"] == pytest.approx(1.0)
    assert {"w_s", "w_r", "rho_s", "rho_r", "rho_f", "kappa", "delta", "d", "gamma"} == set(rep["law"])
    assert rep["breakeven"]["w_s_star_exact"] is not None or rep["breakeven"]["w_s_star_exact_reason"]
    assert rep["breakeven"]["w_s_star_approx"] is not None or rep["breakeven"]["w_s_star_approx_reason"]
    # tau_by_class comes from per-position acceptance: S accepted 290 of 290 + 10 rejections
    s_points = rep["tau_by_class"]["S"]
    assert s_points[0]["gamma"] == 8 and s_points[0]["alpha"] == pytest.approx(290 / 300)
    # the prediction recomputed from the fitted parameters matches the report
    lw = rep["law"]
    run = next(r for r in rep["runs"] if r["mode"] == "structure")
    mix = law.ClassMix.from_shares(lw["w_s"], lw["w_r"], lw["rho_s"], lw["rho_r"], lw["rho_f"])
    eps = law.eps_bar(law.LawParams(lw["kappa"], lw["delta"], lw["d"]), mix)
    g = run["predicted"]["gamma"]
    assert g == round(run["drafted"] / run["rounds"])  # the mean drafted length, not gamma_max
    assert run["predicted"]["tau"] == pytest.approx(float(law.tau(g, eps)))
    assert run["predicted"]["saving"] == pytest.approx(
        float(law.saving(g, law.tau(g, eps), lw["delta"], lw["d"])))
    # per class at its own drafted length (S drafts 8 per round, R and F 4), weighted by its rounds
    params = law.LawParams(lw["kappa"], lw["delta"], lw["d"])
    by = law.tau_by_class(params, mix, 8)["S"] * 40 + (law.tau_by_class(params, mix, 4)["R"]
                                                      + law.tau_by_class(params, mix, 4)["F"]) * 30
    assert run["predicted"]["tau_rounds"] == pytest.approx(float(by) / 100)
    names = [v["name"] for v in rep["verdicts"]]
    assert names == ["P1", "R1", "R2", "R3", "R4", "R5"]
    assert rep["verdicts"][5]["status"] == "insufficient data"  # no pass log: no speedup prediction
    r1 = rep["verdicts"][1]
    assert r1["status"] == "pass"  # S accepts far more than F in these records
    assert rep["lossless"] == {"compared": 4, "mismatched": 0, "first_mismatch": None}
    assert rep["measured"][0]["saving"] == pytest.approx(0.5)
    assert "| D | structure | 8 | 8 | on | all |" in markdown(rep)


TERMS = {"base": 0.03, "row": 0.004, "grammar": 0.0006, "verified": 0.002, "verified_ctx": 0.0008,
         "schema": 0.0005, "prefill": 0.0001, "ctx": 0.002}


def engine_passes(n=300, seed=0, drafts=True, t0=1000.0):
    """Engine passes and the proposer steps inside them whose seconds follow TERMS (drafts made in
    pass j are verified in pass j + 1), with other requests' prefills now and then."""
    import numpy as np

    rng = np.random.default_rng(seed)
    t, passes, steps, made = t0, [], [], None
    for _ in range(n):
        rows = int(rng.integers(1, 9))
        ctx = int(rows * rng.integers(300, 3000))
        prefill = int(rng.integers(100, 1500)) if rng.random() < 0.15 else 0
        grammar = int(rng.integers(0, rows + 1))
        k, kctx, ks = (made or (0, 0, 0))
        new_k = int(rng.integers(0, 6 * rows + 1)) if drafts else 0
        prop = (0.0005 + 0.0001 * rows + 0.00002 * new_k) if drafts else 0.0
        s = (TERMS["base"] + TERMS["row"] * rows + TERMS["grammar"] * grammar + TERMS["verified"] * k
             + TERMS["verified_ctx"] * kctx / 1000
             + TERMS["schema"] * ks + TERMS["prefill"] * prefill + TERMS["ctx"] * ctx / 1000 + prop
             + rng.normal(0, 0.0005))
        passes.append({"t": t, "s": s, "rows": rows, "tokens": rows, "ctx": ctx, "prefill": prefill, "new": 0,
                       "grammar": grammar})
        made = None
        if drafts:
            k = new_k
            kctx = int(k * ctx / rows * rng.uniform(0.7, 1.3))
            ks = int(k * rng.uniform(0, 1))
            steps.append({"t": t + s - prop, "rows": rows, "drafted": k, "drafted_ctx": kctx, "drafted_s": ks,
                          "proposer_s": prop, "ctx": ctx})
            made = (k, kctx, ks)
        t += s + 0.001
    return passes, steps


def test_engine_passes_are_joined_with_the_proposer_steps():
    passes, steps = engine_passes(n=5)
    table = pass_table(passes, steps)
    assert table[0]["drafted"] == 0  # nothing was drafted before the first pass
    for j in range(1, 5):  # drafts made during pass j - 1 are verified in pass j
        assert table[j]["drafted"] == steps[j - 1]["drafted"]
        assert table[j]["drafted_s"] == steps[j - 1]["drafted_s"]
        assert table[j - 1]["proposer_s"] == pytest.approx(steps[j - 1]["proposer_s"])
        assert table[j - 1]["loop_s"] == pytest.approx(0.001)  # the engine loop's work until the next pass
    assert table[-1]["loop_s"] == 0.0
    idle = [dict(p) for p in passes]
    idle[3]["new"] = idle[3]["rows"]  # only new rows in pass 3: the engine may have idled before it
    assert pass_table(idle, steps)[2]["loop_s"] == 0.0


def test_mean_pass_is_what_decoding_rows_see():
    # a request's own first-token pass (with its prefill) is its prefill time, not decode time
    table = [{"s": 0.1, "rows": 2, "new": 0, "prefill": 0}, {"s": 0.5, "rows": 3, "new": 1, "prefill": 900},
             {"s": 0.1, "rows": 1, "new": 1, "prefill": 300}]
    m = mean_pass(table)
    assert m["row_passes"] == 4 and m["passes"] == 2  # the last pass had no row already decoding
    assert m["s"] == pytest.approx((2 * 0.1 + 2 * 0.5) / 4) and m["prefill"] == pytest.approx(2 * 900 / 4)
    assert mean_pass([{"s": 0.1, "rows": 1, "new": 1}]) is None


def test_report_fits_the_pass_cost_model_and_checks_each_prediction():
    spec_passes, spec_steps = engine_passes(seed=1)
    off_passes, _ = engine_passes(seed=2, drafts=False, t0=5000.0)
    off = [log(decode_s=2.0, prompt_hash=f"p{i}") for i in range(4)]
    spec = [log(decode_s=1.0, prompt_hash=f"p{i}", records=spec_records()[i::4]) for i in range(4)]
    runs = [summarize(off, arm="D", mode="off", gamma=8, batch=8, wall_s=8.0),
            summarize(spec, arm="D", mode="structure", gamma=8, batch=8, wall_s=4.0)]
    k_off, k_spec = (("D", 8, 8, True), "off"), (("D", 8, 8, True), "structure")
    logs = {k_off: off, k_spec: spec}
    rep = build_report(runs, logs, meta={}, primary={"batch": 8, "gamma": 8}, steps={k_spec: spec_steps},
                       passes={k_off: off_passes, k_spec: spec_passes})
    model = rep["law_fit"]["costs"]["model"]
    for term, value in TERMS.items():
        assert model["coef"][term] == pytest.approx(value, rel=0.15, abs=2e-5), term
    assert model["proposer"]["base"] == pytest.approx(0.0005, abs=1e-4)
    assert model["proposer"]["drafted"] == pytest.approx(0.00002, abs=5e-6)
    run = next(r for r in rep["runs"] if r["mode"] == "structure")
    check = run["predicted"]["check"]
    assert check["speedup"] == pytest.approx(run["predicted"]["speedup"])
    # the factors multiply to predicted / measured
    product = math.prod(f["error"] for f in check["factors"].values())
    assert product == pytest.approx(check["speedup"] / check["measured"], rel=1e-6)
    r5 = next(v for v in rep["verdicts"] if v["name"] == "R5")
    assert r5["status"] in ("pass", "rejected") and r5["numbers"]["checks"][0]["name"] == "D/structure/γ8/b8"
    assert (r5["status"] == "rejected") == (check["error"] > 0.15)
    md = markdown(rep)
    assert "## Predicted vs measured decode speedup" in md and "## Pass cost model" in md
    assert md.rstrip().splitlines()[-1].startswith("- arm D, all:")  # the report ends with the decisions
    del model["coef"]["grammar"]  # a report written before that term existed still renders
    assert "- row (per row)" in markdown(rep) and "- grammar" not in markdown(rep)
    assert {d["class"] for d in rep["decisions"]} == {"S", "R", "F", "all"}


def test_each_run_is_predicted_at_its_own_acceptance():
    """A stock drafter accepts differently from structure on the same traffic: its prediction takes
    its own rounds (κ = 1: ρ per class = its per-position acceptance), not structure's."""
    off = [log(decode_s=2.0, prompt_hash=f"p{i}") for i in range(4)]
    spec = [log(decode_s=1.0, prompt_hash=f"p{i}", records=spec_records()[i::4]) for i in range(4)]
    weak = [rec("S", 8, 2, "ngram")] * 30 + [rec("R", 4, 0, "ngram")] * 30 + [rec("F", 4, 0, "ngram")] * 30
    stock = [log(decode_s=1.5, prompt_hash=f"p{i}", records=weak[i::4]) for i in range(4)]
    runs = [summarize(off, arm="D", mode="off", gamma=8, batch=8, wall_s=8.0),
            summarize(spec, arm="D", mode="structure", gamma=8, batch=8, wall_s=4.0),
            summarize(stock, arm="D", mode="ngram", gamma=8, batch=8, wall_s=6.0)]
    key = ("D", 8, 8, True)
    rep = build_report(runs, {(key, "off"): off, (key, "structure"): spec, (key, "ngram"): stock},
                       meta={}, primary={"batch": 8, "gamma": 8})
    by_mode = {r["mode"]: r for r in rep["runs"]}
    own, other = by_mode["structure"]["predicted"], by_mode["ngram"]["predicted"]
    assert own["rho"] == pytest.approx(rep["law_fit"]["rho"])  # the law section is structure's
    assert other["rho"]["S"] == pytest.approx(2 / 3)  # 60 accepted, 30 rejections: 60 / 90
    assert other["rho"]["S"] < own["rho"]["S"] and other["tau"] < own["tau"]


def test_kappa_is_fitted_when_the_report_has_entropies():
    off = [log(decode_s=2.0, prompt_hash=f"p{i}") for i in range(4)]
    spec = [log(decode_s=1.0, prompt_hash=f"p{i}", records=spec_records()[i::4]) for i in range(4)]
    runs = [summarize(off, arm="D", mode="off", gamma=8, batch=8, wall_s=8.0),
            summarize(spec, arm="D", mode="structure", gamma=8, batch=8, wall_s=4.0)]
    logs = {(("D", 8, 8, True), "off"): off, (("D", 8, 8, True), "structure"): spec}
    entropies = {"S": [0.02] * 40, "R": [0.6] * 40, "F": [1.6] * 40}
    rep = build_report(runs, logs, meta={}, primary={"batch": 8, "gamma": 8}, entropies=entropies)
    fit = rep["law_fit"]
    assert fit["method"].startswith("rho = exp(-H)")
    assert fit["rho"]["R"] == pytest.approx(math.exp(-0.6))
    assert fit["entropy_mean"] == pytest.approx({"S": 0.02, "R": 0.6, "F": 1.6})
    assert 0.0 < fit["kappa"] < 2.0 and fit["kappa"] != 1.0
    assert fit["kappa_fit"]["ci_low"] <= fit["kappa"] <= fit["kappa_fit"]["ci_high"]
    # a class with rho = 1 (zero entropy) that shows rejections cannot be fitted: kappa falls back to 1
    rep = build_report(runs, logs, meta={}, primary={"batch": 8, "gamma": 8},
                       entropies={"S": [0.0] * 40, "R": [0.6] * 40, "F": [1.6] * 40})
    assert rep["law_fit"]["kappa"] == 1.0 and "kappa not fitted" in rep["law_fit"]["method"]


def test_class_entropies_on_the_real_model():
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.embedded.target_entropy import class_entropies
    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.structure.token_labels import TokenClassifier

    hf_tokenizer = AutoTokenizer.from_pretrained(resolve_model())
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = hf_tokenizer.encode(hf_tokenizer.apply_chat_template(msgs, tokenize=False,
                                                                  add_generation_prompt=True))
    text = 'Paris. <tool_call>{"name":"f","arguments":{}}</tool_call>'
    out = hf_tokenizer.encode(text)
    spans = [{"start": 0, "end": 7, "law_class": "R"}, {"start": 7, "end": len(text), "law_class": "S"}]
    labels = TokenClassifier(hf_tokenizer).labels(text, out, spans)
    assert len(labels) == len(out) and labels[0] == "R" and labels[-1] == "S"
    turn = log(token_ids=out)
    turn.prompt_ids, turn.token_classes = prompt, labels
    ent = class_entropies(None, [turn, turn])  # the duplicate is scored once
    assert {c: len(v) for c, v in ent.items()} == {c: labels.count(c) for c in set(labels)}
    assert all(h >= 0.0 and math.isfinite(h) for v in ent.values() for h in v)
    assert all(h <= math.log(len(hf_tokenizer)) + 1e-6 for v in ent.values() for h in v)  # at most uniform
    # under a grammar that allows only this text, the masked distribution is (nearly) certain
    constrained = log(token_ids=out, prompt_hash="q")
    constrained.prompt_ids, constrained.token_classes = prompt, labels
    constrained.grammar = "start: " + json.dumps(text) + ' "<|im_end|>"'
    masked = class_entropies(None, [constrained])
    assert sum(masked["S"]) < 0.1 * sum(ent["S"]) and max(masked["S"]) < 0.7


def test_headline_compares_structure_with_the_best_stock_drafter():
    from agentspec_sdk.replay import accounting
    from agentspec_sdk.replay.cli import headline

    def run(arm, mode, gamma, tok_s, passes, drafted):
        return {"arm": arm, "mode": mode, "gamma": gamma, "batch": 8, "prefix_cache": True,
                "decode_tok_s": tok_s, "passes": passes, "drafted": drafted, "cost": passes + 0.1 * drafted,
                "oracle_cost": 50 + 0.1 * 150}

    runs = [run("D", "off", 8, 10.0, 200, 0), run("D", "ngram", 8, 14.0, 120, 100),
            run("D", "suffix", 8, 15.0, 110, 100), run("D", "structure", 8, 21.0, 80, 120),
            run("A", "off", 8, 10.0, 100, 0), run("A", "suffix", 8, 10.5, 98, 10),
            run("A", "structure", 8, 9.9, 100, 0)]
    rep = {"primary": {"batch": 8, "gamma": 8}, "verdicts": [], "peers": accounting.peer_table(runs)}
    lines = headline(rep)
    arm_a, arm_d = lines
    assert arm_d.startswith("Arm D, b=8, γ=8: structure 2.17× off in cost, 2.10× in decode tok/s")
    assert "1.30× the best stock drafter in cost (suffix), 1.40× in decode tok/s (suffix)" in arm_d
    assert "oracle 1.85× the best stock drafter in cost, structure captures 51% of the oracle's gain" in arm_d
    assert arm_a.startswith("Arm A, b=8, γ=8: structure 1.00× off in cost")
    assert "0.94× in decode tok/s (suffix)" in arm_a


def test_lossless_mismatch_rejects_r4():
    rep = report_from(mismatch=True)
    assert rep["lossless"]["mismatched"] == 1
    r4 = next(v for v in rep["verdicts"] if v["name"] == "R4")
    assert r4["status"] == "rejected" and "D/structure/e/0/0" in rep["lossless"]["first_mismatch"]


def test_composition_check_from_four_cells():
    def run(cache, mode, pre, dec):
        return {"arm": "D", "batch": 8, "gamma": 8, "prefix_cache": cache, "mode": mode,
                "prefill_s": pre, "decode_s": dec}

    runs = [run(False, "off", 10, 20), run(True, "off", 2, 20), run(False, "structure", 10, 10),
            run(True, "structure", 2, 10)]
    (check,) = composition_checks(runs, 8)
    assert check.predicted == pytest.approx(12.0) and check.measured == pytest.approx(12.0)
    runs[-1]["decode_s"] = 20
    assert composition_checks(runs, 8)[0].residual == pytest.approx(10 / 22)


def test_write_report_is_atomic_and_plots(tmp_path):
    rep = report_from()
    paths = write_report(rep, tmp_path)
    names = sorted(p.name for p in paths)
    assert names == ["report.json", "report.md", "saving_vs_schema_share.png", "tau_by_class.png"]
    assert json.loads((tmp_path / "report.json").read_text())["speedup"]["D"]["structure"]["decode"] == 2.0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    from agentspec_sdk.law.plots import read_report

    assert read_report(tmp_path / "report.json")["law"] == rep["law"]


class FakeEngine:
    """Answers every request with a fixed text; raises KeyboardInterrupt after `interrupt_after`."""

    def __init__(self, mode, interrupt_after=None):
        self.mode, self.calls, self.interrupt_after, self.closed = mode, 0, interrupt_after, False

    def submit(self, req):
        self.calls += 1
        fut = Future()
        if self.interrupt_after is not None and self.calls > self.interrupt_after:
            fut.set_exception(KeyboardInterrupt())
            return fut
        spec = self.mode != "off"
        fut.set_result(types.SimpleNamespace(
            text="hello world", token_ids=[1, 2, 3, 4], prompt_token_ids=[len(req["messages"])],
            finish_reason="stop", error=None, spans=[{"start": 0, "end": 11, "law_class": "F"}],
            records=[rec("F", 3, 1)] if spec else [], acceptance={},
            timings={"decode_s": 0.1 if spec else 0.2, "prefill_s": 0.01, "e2e_s": 0.2}))
        return fut

    def generate(self, reqs):
        return [self.submit(r).result() for r in reqs]

    def mark_idle(self, agent):
        pass

    def mark_active(self, agent):
        pass

    def close(self):
        self.closed = True


class Tok:
    def decode(self, ids):
        return "xx"


@pytest.fixture
def fake_requests(monkeypatch):
    monkeypatch.setattr(loop, "make_request", lambda **kw: kw)
    monkeypatch.setattr(loop, "turn_calls", lambda fmt, text: [])
    import agentspec_sdk.replay.runner as runner

    monkeypatch.setattr(runner, "_warm_up", lambda engine: None)


def plan():
    eps = [Episode(f"e{i}", {"name": "t"}, "sys", [], "prose", [Turn("user", f"q{i}")]) for i in range(4)]
    return Plan(configs=[ModeConfig("off", 8), ModeConfig("structure", 8)],
                arms=[Arm("A", eps, "", 16, 1)], batches=[2], primary={"batch": 2, "gamma": 8})


def test_run_plan_with_fake_engine(tmp_path, fake_requests):
    engines = []

    def factory(p, cfg):
        engines.append(FakeEngine(cfg.mode))
        return engines[-1]

    rep = run_plan(plan(), tmp_path, tokenizer=Tok(), engine_factory=factory, plots=False)
    assert all(e.closed for e in engines) and len(engines) == 2
    assert rep["partial"] is False and [r["mode"] for r in rep["runs"]] == ["off", "structure"]
    assert rep["speedup"]["A"]["structure"]["decode"] == pytest.approx(2.0)
    assert rep["lossless"]["compared"] == 4 and rep["lossless"]["mismatched"] == 0


def test_every_batch_size_gets_fresh_engines(tmp_path, fake_requests):
    # a second batch size on the engine that has just answered the same prompts would measure its
    # memory (prefix cache, drafters copying their own outputs), not the drafter
    built = []

    def factory(p, cfg):
        built.append(FakeEngine(cfg.mode))
        return built[-1]

    two = plan()
    two.batches = [1, 2]
    rep = run_plan(two, tmp_path, tokenizer=Tok(), engine_factory=factory, plots=False)
    assert len(built) == 4 and all(e.closed for e in built)
    assert [(r["mode"], r["batch"]) for r in rep["runs"]] == [("off", 1), ("off", 2), ("structure", 1),
                                                             ("structure", 2)]


def test_interrupted_run_leaves_valid_partial_report(tmp_path, fake_requests):
    engines = []

    def factory(p, cfg):
        engines.append(FakeEngine(cfg.mode, interrupt_after=None if cfg.mode == "off" else 1))
        return engines[-1]

    with pytest.raises(KeyboardInterrupt):
        run_plan(plan(), tmp_path, tokenizer=Tok(), engine_factory=factory, plots=False)
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["partial"] is True
    assert [r["mode"] for r in rep["runs"]] == ["off", "structure"]
    assert rep["runs"][1]["interrupted"] is True and rep["runs"][0]["turns"] == 4
    assert all(e.closed for e in engines)
    assert "PARTIAL" in (tmp_path / "report.md").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_ctrl_c_during_a_report_write_is_held_until_the_write_ends(tmp_path, fake_requests, monkeypatch):
    import os
    import signal

    from agentspec_sdk.replay import runner

    writes = []

    def write_then_interrupted(rep, out, plots=True):  # Ctrl-C lands inside the first write
        if not writes:
            os.kill(os.getpid(), signal.SIGINT)
        write_report(rep, out, plots=plots)
        writes.append(rep["partial"])

    monkeypatch.setattr(runner, "write_report", write_then_interrupted)
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (CI may ignore it)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_plan(plan(), tmp_path, tokenizer=Tok(), engine_factory=lambda p, cfg: FakeEngine(cfg.mode),
                     plots=False)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # an ignored Ctrl-C stays ignored
        with runner._ctrl_c_held():
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, outer)
    assert writes == [True, True]  # the interrupted write finished, then the partial report after it
    assert json.loads((tmp_path / "report.json").read_text())["partial"] is True
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_report_names_live_in_their_homes_and_one_class_tuple():
    from agentspec_sdk.law import closed_forms
    from agentspec_sdk.replay import aggregate, passes, predict, render, report

    assert closed_forms.CLASSES is law.CLASSES == ("S", "R", "F")
    assert not hasattr(report, "__all__")  # report.py re-exports none of its helpers' names
    assert (aggregate.summarize.__module__, passes.pass_table.__module__, predict.fit_law.__module__,
            render.markdown.__module__) == ("agentspec_sdk.replay.aggregate", "agentspec_sdk.replay.passes",
                                            "agentspec_sdk.replay.predict", "agentspec_sdk.replay.render")
    # the per-turn fallback fit is the law's (no fit of its own in the report)
    spec = [log(decode_s=1.0, records=[rec("S", 4, 2)]), log(decode_s=1.6, records=[rec("S", 4, 2)] * 2)]
    fit = predict.fit_costs_from_turns({"off": [log(decode_s=0.8)], "structure": spec})
    # 10 tokens per turn: steps 10, 8, 6; drafted per step 0, 4/8, 8/6
    assert fit == law.fit_turn_costs([0.0, 0.5, 8 / 6], [0.08, 1.0 / 8, 1.6 / 6])
    assert fit["turns"] == 3 and "least squares" in fit["method"]


def test_repeats_measure_the_plan_again_on_fresh_engines_with_unique_run_keys(tmp_path, fake_requests):
    built = []

    class Logged(FakeEngine):  # one engine pass per run, to see the run keys in the pass log
        def pass_log(self, began, ended):
            return [{"t": ended, "s": 0.01, "rows": 1, "tokens": 1, "ctx": 10, "prefill": 0, "new": 0,
                     "grammar": 0}]

    def factory(p, cfg):
        built.append(Logged(cfg.mode))
        return built[-1]

    three = plan()
    three.repeats = 3
    assert three.expected_turns() == 3 * plan().expected_turns()
    rep = run_plan(three, tmp_path, tokenizer=Tok(), engine_factory=factory, plots=False)
    # a fresh engine per config and repeat, the configs' order rotating from one repeat to the next
    assert [e.mode for e in built] == ["off", "structure", "structure", "off", "off", "structure"]
    assert all(e.closed for e in built)
    # the report proper is the first repeat's; every repeat is in the repeats table
    assert [(r["mode"], r["repeat"]) for r in rep["runs"]] == [("off", 0), ("structure", 0)]
    rows = {r["mode"]: r for r in rep["repeats"]}
    assert rows["structure"]["repeats"] == [0, 1, 2] and len(rows["structure"]["decode_tok_s"]) == 3
    assert rows["structure"]["passes"] == [rep["runs"][1]["passes"]] * 3
    assert rep["meta"]["repeats"] == 3
    logged = [json.loads(line) for line in (tmp_path / PASS_LOGS).read_text().splitlines()]
    # every (run, repeat, mode) is its own entry: nothing overwritten by a later repeat
    assert sorted((tuple(x["run"]), x["mode"]) for x in logged) == sorted(
        (("A", 2, 8, True, r), m) for r in range(3) for m in ("off", "structure"))
    md = (tmp_path / "report.md").read_text()
    assert "## Repeats: decode tok/s over 3 interleaved repeats" in md


def test_one_repeat_leaves_the_report_as_it_was(tmp_path, fake_requests):
    rep = run_plan(plan(), tmp_path, tokenizer=Tok(), engine_factory=lambda p, cfg: FakeEngine(cfg.mode),
                   plots=False)
    assert "repeats" not in rep and "repeats" not in rep["meta"] and "repeat" not in rep["runs"][0]
    assert "## Repeats" not in (tmp_path / "report.md").read_text()
    with pytest.raises(Exception, match="repeats must be an integer >= 1"):
        Plan(configs=[], arms=[], batches=[1], primary={}, repeats=0)


def test_interleaved_rounds_rotate_per_round_and_per_repeat():
    from agentspec_sdk.replay.runner import interleaved_rounds

    assert interleaved_rounds(2, [8], 3) == [(0, 8, [0, 1, 2]), (1, 8, [1, 2, 0])]
    assert interleaved_rounds(2, [8], 3, repeat=1) == [(0, 8, [1, 2, 0]), (1, 8, [2, 0, 1])]
    # over 3 repeats every worker goes first on arm 0 once
    assert sorted(interleaved_rounds(2, [8], 3, repeat=r)[0][2][0] for r in range(3)) == [0, 1, 2]


def test_repeat_table_medians_ranges_and_costs():
    from agentspec_sdk.replay import accounting
    from agentspec_sdk.replay.aggregate import run_key
    from agentspec_sdk.replay.render import markdown

    def run(mode, repeat, tok_s, passes=100, drafted=50):
        return {"arm": "D", "mode": mode, "gamma": 8, "batch": 8, "prefix_cache": True, "repeat": repeat,
                "decode_tok_s": tok_s, "passes": passes, "drafted": drafted, "accepted": 40}

    runs = [run("suffix", 0, 10.0), run("suffix", 1, 14.0), run("suffix", 2, 11.0),
            run("suffix-tuned", 0, 12.0), run("suffix-tuned", 1, 13.0), run("suffix-tuned", 2, 20.0),
            run("structure", 0, 15.0, 90), run("structure", 1, 12.0, 90), run("structure", 2, 16.0, 91)]
    price = {"a_s": 0.02, "b_s_per_row": 0.0, "c_s_per_token": 0.001}  # δ̂ at 8 rows: 0.4
    rows = accounting.repeat_table(runs, {}, price, lambda r: (run_key(r), r["mode"]))
    by = {r["mode"]: r for r in rows}
    assert [r["mode"] for r in rows] == ["suffix", "suffix-tuned", "structure"]
    assert by["suffix"]["decode_tok_s_median"] == 11.0 and by["suffix"]["decode_tok_s_min"] == 10.0
    assert by["suffix"]["decode_tok_s_max"] == 14.0 and by["suffix"]["cost"] == [pytest.approx(120.0)] * 3
    # the tuned peer counts as a stock drafter: its median 13 beats suffix's 11
    assert by["structure"]["best_stock_by_tok_s_median"] == "suffix-tuned"
    assert by["structure"]["tok_s_median_vs_best_stock"] == pytest.approx(15.0 / 13.0)
    md = markdown({"runs": [], "repeats": rows})
    assert "| D | structure | 8 | 8 | on | 3 | 90–91 | 50 | 40 | 110–111 | 15.0 | 12.0–16.0 | 1.15× " \
           "(suffix-tuned) |" in md
    assert "| D | suffix | 8 | 8 | on | 3 | 100 | 50 | 40 | 120 | 11.0 | 10.0–14.0 |  |" in md


def test_the_tuned_suffix_peer_is_a_stock_drafter_in_the_peer_table():
    from agentspec_sdk.replay import accounting

    def run(mode, passes, tok_s):
        return {"arm": "D", "mode": mode, "gamma": 8, "batch": 8, "prefix_cache": True, "passes": passes,
                "cost": float(passes), "decode_tok_s": tok_s}

    (row,) = accounting.peer_table([run("suffix", 120, 10.0), run("suffix-tuned", 110, 11.0),
                                    run("structure", 100, 12.0)])
    assert row["best_stock_by_cost"] == row["best_stock_by_tok_s"] == "suffix-tuned"
    assert row["cost_vs_best_stock"] == pytest.approx(1.1)


def test_bench_plans_repeats_and_the_tuned_suffix_pair(monkeypatch, tmp_path, capsys):
    import typer

    from agentspec_sdk.replay import cli

    plans = []
    monkeypatch.setattr(cli, "_execute", lambda plan, out, desc, *_: plans.append(plan) or {"runs": []})
    monkeypatch.setattr(cli, "_headline", lambda report: None)
    common = {"out": tmp_path, "arms": "B", "modes": "suffix,suffix-tuned,structure", "gammas": "4",
              "batches": "1", "n": 2, "prefix_check": False, "entropies": False}
    cli.bench(**common, repeats=3, suffix_tuned="2,0.3")
    (plan,) = plans
    assert plan.repeats == 3 and plan.suffix_tuned == (2.0, 0.3)
    assert [c.mode for c in plan.configs] == ["suffix", "suffix-tuned", "structure"]
    with pytest.raises(typer.Exit) as exit_:  # a probability outside [0, 1]: the CLI's error, exit 2
        cli.bench(**common, suffix_tuned="4,1.3")
    assert exit_.value.exit_code == 2
    assert "suffix_min_token_prob must be a number in [0, 1], got 1.3" in capsys.readouterr().err
    with pytest.raises(typer.BadParameter, match="max_spec_factor,min_token_prob"):
        cli.bench(**common, suffix_tuned="4")


def test_engines_start_while_memory_holds_one_more(monkeypatch):
    """A further engine starts only where the memory available holds 1.5× the largest footprint
    measured; the configs left over come back for a later group, the first always starts."""
    from agentspec_sdk.replay import memory, runner

    started = []

    class FakeWorker:
        def __init__(self, plan, cfg, handle):
            started.append(cfg.mode)
            self.proc = type("P", (), {"pid": len(started)})()

        def pump(self, until):
            assert until == "started"

    sizes = {1: 6 * 2**30, 2: 7 * 2**30}
    available = iter([20 * 2**30, 9 * 2**30])  # room for a second 6 GB engine, not for a third 7 GB one
    monkeypatch.setattr(runner, "_Worker", FakeWorker)
    monkeypatch.setattr(memory, "tree_rss", lambda pid: sizes[pid])
    monkeypatch.setattr(memory, "mem_available", lambda: next(available))
    configs = [runner.ModeConfig(m, 8) for m in ("off", "structure", "ngram", "suffix")]
    workers = []
    rest = runner._start_group(None, configs, lambda cfg: None, workers)
    assert started == ["off", "structure"] and [c.mode for c in rest] == ["ngram", "suffix"]
    assert memory.room_for_another(None, None) and not memory.room_for_another(4, 5)


def test_memory_reads_this_process():
    """On the real /proc: this process's resident size is part of what the machine has."""
    import os

    from agentspec_sdk.replay import memory

    rss, available = memory.tree_rss(os.getpid()), memory.mem_available()
    assert rss is not None and available is not None and 10 * 2**20 < rss
    assert memory.tree_rss(2**22 + 12345) is None  # no such process
