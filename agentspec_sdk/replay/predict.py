"""The Draft Law fitted to a report's runs and its predictions per run: kappa and rho from the round
records, c_T, delta and d from the pass cost model (or per-turn decode times), the law's tau, saving
and breakeven per run, the predicted-vs-measured speedup check and the speculate-or-not decisions."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from agentspec_sdk import law
from agentspec_sdk.errors import LawInputError
from agentspec_sdk.law import CLASSES
from agentspec_sdk.replay.aggregate import round_records
from agentspec_sdk.replay.loop import TurnLog
from agentspec_sdk.replay.passes import COST_KEYS, pass_cycle


def fit_pass_costs(tables: Mapping[Any, list[Mapping]], joined: set) -> tuple[law.PassCosts | None, str]:
    """`law.fit_pass_costs` over the passes of every run whose drafted tokens are known per pass
    (off: none; the runs in `joined`: their drafter's step log), the proposer's terms from the
    structure runs; with the method used, or None and why not."""
    keys = [k for k in tables if k[1] == "off" or k in joined]
    rows = [pass_cycle(p) for k in keys for p in tables[k]]
    structure = [pass_cycle(p) for k in keys if k[1].startswith("structure") for p in tables[k]]
    modes = sorted({k[1] for k in keys})
    try:
        return (law.fit_pass_costs(rows, proposer_passes=structure or None),
                f"least squares over {len(rows)} passes of the {', '.join(modes)} runs")
    except LawInputError as exc:
        return None, str(exc)


def law_costs(model: law.PassCosts, comp: Mapping, proposer: Mapping | None = None) -> dict:
    """The law's c_T, delta and d (and the proposer's fixed share `overhead`) from the fitted terms, at
    a pass of composition `comp` (mean rows n, context, prefill, schema share of the drafts): a pass
    without drafts costs c_T; one more draft token in each of the n rows adds n x (target's cost per
    verified token) = delta c_T and n x (the proposer's per drafted token) = d c_T."""
    n = max(float(comp["rows"]), 1.0)
    ctx_row = float(comp["ctx"]) / n
    schema = float(comp["drafted_s"]) / comp["drafted"] if comp.get("drafted") else 0.0
    t_off = model.seconds(rows=n, ctx=comp["ctx"], prefill=comp["prefill"], grammar=comp.get("grammar", 0.0),
                          prefill_ctx=comp.get("prefill_ctx", 0.0), proposer=False)
    if t_off <= 0:
        raise LawInputError(f"the pass cost model predicts {t_off:.3g} s for a pass of {n:.1f} rows: no law "
                            "terms")
    c = model.coef
    per_token = c["verified"] + c["verified_ctx"] * ctx_row / 1000.0 + c["schema"] * schema
    prop = (model.proposer if proposer is None else proposer) or {}
    fixed = (prop.get("base", 0.0) + prop.get("row", 0.0) * n + prop.get("ctx", 0.0) * comp["ctx"] / 1000.0)
    return {"c_t": t_off, "delta": max(n * per_token / t_off, 0.0),
            "d": max(n * prop.get("drafted", 0.0) / t_off, 0.0),
            "overhead": max(fixed / t_off, 0.0), "rows": n, "ctx_per_row": ctx_row, "schema_share": schema}


def fit_costs_from_turns(logs_by_mode: Mapping[str, list[TurnLog]]) -> dict:
    """Without pass or step logs: c_T and delta from per-turn decode time (`law.fit_turn_costs`),
    decode_s / steps = c_T (1 + delta k), k = drafted tokens per step (0 when speculation is off),
    steps = the turn's counted passes (else output tokens - accepted drafts). d = 0 (the drafters'
    time is inside delta)."""
    xs, ys = [], []
    for logs in logs_by_mode.values():
        for log in logs:
            drafted = sum(int(r["drafted"]) for r in log.records)
            steps = (log.passes if log.passes is not None
                     else log.output_tokens - sum(int(r["accepted"]) for r in log.records))
            dec = log.timings.get("decode_s", 0.0)
            if steps <= 0 or dec <= 0:
                continue
            xs.append(drafted / steps)
            ys.append(dec / steps)
    return law.fit_turn_costs(xs, ys)


def fit_law(spec_logs: list[TurnLog], costs: Mapping, gamma: int,
            entropies: Mapping[str, list] | None = None) -> dict:
    """kappa and rho per class from the round records. With per-class next-token entropies,
    rho_c = exp(-mean H_c) and kappa is fitted by maximum likelihood; without them kappa is not
    identifiable from acceptance alone and is fixed at 1, so rho_c is the per-position acceptance."""
    records = round_records(spec_logs)
    acc = law.acceptance_by_class(records)
    alpha = {c: acc[c].alpha for c in acc}
    kappa_fit = None
    entropy_mean = {c: float(np.mean(h)) for c, h in (entropies or {}).items() if h}
    if entropies and all(entropies.get(c) for c in alpha):
        rho = law.rho_from_entropies({c: entropies[c] for c in CLASSES if entropies.get(c)})
        try:
            fit = law.fit_kappa(records, rho)
            kappa, method = fit.kappa, "rho = exp(-H) from entropies; kappa by maximum likelihood"
            kappa_fit = fit.to_dict()
        except LawInputError as exc:
            kappa_fit = {"error": str(exc)}
    if kappa_fit is None or "error" in kappa_fit:
        why = f"kappa not fitted ({kappa_fit['error']})" if kappa_fit else "no entropies"
        rho = {c: min(max(a, 1e-3), 1.0) for c, a in alpha.items()}
        kappa, method = 1.0, f"kappa fixed at 1 ({why}): rho_c = per-position acceptance"
    missing = [c for c in CLASSES if c not in rho]
    floor = min(rho.values()) if rho else 0.5
    for c in missing:
        rho[c] = floor
    return {
        "kappa": kappa, "rho": {c: rho[c] for c in CLASSES}, "rho_assumed": missing, "method": method,
        "entropy_mean": entropy_mean,
        "kappa_fit": kappa_fit, "delta": costs["delta"], "d": costs["d"], "c_t": costs["c_t"],
        "costs": dict(costs), "gamma": gamma,
        "acceptance": {c: a.to_dict() for c, a in acc.items()},
    }


def predict(fit: Mapping, w: Mapping[str, float | None], gamma: int, costs: Mapping | None = None) -> dict:
    """The law's tau, per-round saving and breakeven w_S* (approx and exact) at schema mix `w` with
    the fitted kappa and rho, at draft length `gamma` (the mean drafted length per round, as measured:
    the budget and the grammar end many drafts before gamma_max) and the costs `costs` (`delta`, `d`
    from the pass cost model at the run's own composition; default: the fit's)."""
    shares = {c: float(w.get(c) or 0.0) for c in CLASSES}
    total = sum(shares.values())
    if total <= 0:
        return {}
    shares = {c: v / total for c, v in shares.items()}
    costs = costs or fit
    params = law.LawParams(fit["kappa"], costs["delta"], costs["d"])
    mix = law.ClassMix(shares, dict(fit["rho"]))
    rep = law.evaluate(params, mix, gamma).to_dict()
    return {"gamma": gamma, "delta": costs["delta"], "d": costs["d"], "overhead": costs.get("overhead", 0.0),
            "w_s": shares["S"], "tau": rep["tau"], "tau_by_class": rep["tau_by_class"],
            "saving": rep["saving"], "speedup": rep["speedup"], "saving_round": rep["saving"],
            "w_s_star": rep["w_s_star_exact"], "w_s_star_approx": rep["w_s_star_approx"],
            "w_s_star_reason": rep["w_s_star_exact_reason"],
            "w_s_star_approx_reason": rep["w_s_star_approx_reason"],
            "eps_bar": rep["eps_bar"]}


def _tau_at(params: law.LawParams, mix: law.ClassMix, cls: str, gamma: float) -> float:
    """The law's tau of class `cls` at a mean draft length `gamma` (linear between whole lengths)."""
    lo = max(int(math.floor(gamma)), 1)
    t_lo = float(law.tau_by_class(params, mix, lo)[cls])
    if gamma <= lo:
        return t_lo * gamma / lo
    t_hi = float(law.tau_by_class(params, mix, lo + 1)[cls])
    return t_lo + (gamma - lo) * (t_hi - t_lo)


def tau_rounds(fit: Mapping, run: Mapping, pred: Mapping) -> float | None:
    """The law's mean accepted prefix per round of a run: each class's tau at that class's own mean
    drafted length (as measured, not gamma_max), weighted by the class's rounds. None without rounds
    per class (then the mixed tau at the run's mean length stands)."""
    by = {c: b for c, b in run["by_class"].items() if c in CLASSES and b.get("rounds")}
    if not by or sum(b["rounds"] for b in by.values()) < run["rounds"]:
        return None
    shares = {c: float(run["w"].get(c) or 0.0) for c in CLASSES}
    total = sum(shares.values()) or 1.0
    params = law.LawParams(fit["kappa"], pred["delta"], pred["d"])
    mix = law.ClassMix({c: v / total for c, v in shares.items()}, dict(fit["rho"]))
    return sum(b["rounds"] * _tau_at(params, mix, c, b["drafted"] / b["rounds"])
               for c, b in by.items()) / run["rounds"]


def _row_passes(run: Mapping) -> int:
    """The run's target passes (row-passes: one row's share of a pass): the engine's count, or
    output tokens − accepted for a run summarised without it."""
    passes = run.get("passes")
    return max(int(passes) if passes is not None else run["output_tokens"] - run["accepted"], 1)


def run_composition(comp: Mapping, run: Mapping, measured_drafts: bool) -> dict:
    """The pass composition used for a prediction; without the drafter's step log (vLLM's per-request
    totals only) its drafts are spread evenly over the run's row-passes."""
    out = {k: float(comp.get(k, 0.0)) for k in COST_KEYS}
    if not measured_drafts:
        row_passes = _row_passes(run)
        out["drafted"] = run["drafted"] / row_passes * out["rows"]
        out["drafted_ctx"] = out["drafted"] * out["ctx"] / max(out["rows"], 1.0)
        out["drafted_s"] = out["drafted"] * float(run["w"].get("S") or 0.0)
    return out


def speedup_check(run: Mapping, pred: Mapping, model: law.PassCosts, comp: Mapping,
                  comp_off: Mapping | None, proposer: Mapping | None = None,
                  measured_drafts: bool = True) -> dict:
    """Predicted against measured decode speedup of one speculative run, as the product of three
    factors: tokens per row-pass (1 + f tau, f = the share of row-passes that drafted, tau from the
    law), the off pass over the speculative pass (the fitted pass costs at each run's measured
    composition; without an off pass log, the speculative run's composition without drafts on
    vLLM's plain path, `no_spec`), and the time outside passes (1 predicted). Each factor's
    `error` = predicted / measured contribution. `proposer`: this run's drafter's own terms
    (`law.fit_proposer`; None = none measured)."""
    row_passes = _row_passes(run)
    f = min(run["rounds"] / row_passes, 1.0)
    spec = run_composition(comp, run, measured_drafts)
    off = {k: float(v) for k, v in (comp_off or {}).items() if k in COST_KEYS} if comp_off else {**spec}
    off.update(drafted=0.0, drafted_ctx=0.0, drafted_s=0.0, no_spec=1.0)  # off runs vLLM's plain path
    t_spec = model.seconds(**spec, proposer=proposer or False)
    t_off = model.seconds(**off, proposer=False)
    tau = pred.get("tau_rounds", pred["tau"])  # per class at its own drafted length, as the rounds fell
    acc_pred = 1.0 + f * tau
    predicted = float(1.0 / law.pass_cost_ratio(tau, t_off, t_spec, f))
    acc_meas = run["output_tokens"] / row_passes
    factors = {"tokens per row-pass (tau)": {"predicted": acc_pred, "measured": acc_meas,
                                             "error": acc_pred / acc_meas}}
    measured = run.get("speedup_decode")
    if comp.get("s") and comp_off and comp_off.get("s"):
        factors["speculative pass (s)"] = {"predicted": t_spec, "measured": comp["s"],
                                           "error": comp["s"] / t_spec}
        factors["off pass (s)"] = {"predicted": t_off, "measured": comp_off["s"],
                                   "error": t_off / comp_off["s"]}
        if measured:
            rest = measured / (acc_meas * comp_off["s"] / comp["s"])
            factors["time outside passes"] = {"predicted": 1.0, "measured": rest, "error": 1.0 / rest}
    saving = 1.0 - 1.0 / predicted if predicted > 0 else None
    return {"speedup": predicted, "saving": saving, "draft_share": f, "t_spec_s": t_spec, "t_off_s": t_off,
            "measured": measured, "error": abs(predicted - measured) / measured if measured else None,
            "factors": factors}


def decisions(runs: list[dict], fit: Mapping, primary: Mapping) -> list[dict]:
    """The operator's decision per arm and class at the primary configuration (structure, primary γ
    and batch): speculate where the law's per-round saving s_c = 1 - (1 + γ_c (δ + d)) / (1 + τ_c) is
    positive, with τ_c predicted by the law and measured (accepted per round), γ_c the class's mean
    drafted length and δ, d from the pass cost model at the run's own passes; plus one line for the
    whole arm with its predicted and measured decode saving."""
    out = []
    for r in runs:
        if not (r["mode"] == "structure" and r["gamma"] == primary["gamma"] and r["batch"] == primary["batch"]
                and r["prefix_cache"] and r.get("predicted")):
            continue
        pred = r["predicted"]
        shares = {c: float(r["w"].get(c) or 0.0) for c in CLASSES}
        total = sum(shares.values()) or 1.0
        params = law.LawParams(fit["kappa"], pred["delta"], pred["d"])
        mix = law.ClassMix({c: v / total for c, v in shares.items()}, dict(fit["rho"]))
        for c in CLASSES:
            b = r["by_class"].get(c, {})
            if not b.get("tokens"):
                continue
            rounds = b.get("rounds", 0)
            g = max(1, round(b["drafted"] / rounds)) if rounds else 1
            t_pred = float(law.tau_by_class(params, mix, g)[c])
            s_pred = float(law.saving(g, t_pred, pred["delta"], pred["d"]))
            s_meas = (float(law.saving(g, b["accepted"] / rounds, pred["delta"], pred["d"])) if rounds
                      else None)
            out.append({"arm": r["arm"], "class": c, "speculate": s_pred > 0, "gamma": g, "rounds": rounds,
                        "tau_predicted": t_pred, "tau_measured": b["accepted"] / rounds if rounds else None,
                        "saving_predicted": s_pred, "saving_measured": s_meas})
        out.append({"arm": r["arm"], "class": "all", "speculate": (pred.get("saving") or 0) > 0,
                    "gamma": pred["gamma"], "rounds": r["rounds"], "saving_predicted": pred.get("saving"),
                    "saving_measured": r.get("saving_measured")})
    return out
