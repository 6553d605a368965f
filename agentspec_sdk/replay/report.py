"""Aggregate replay/bench runs into report.json and report.md (schema in docs/replay.md).

The public entry points: `build_report` (runs + turn logs + step and pass logs -> the report dict)
and `write_report` (report.json, report.md, the law plots). The work is done by
`replay.aggregate` (run totals, speedups, composition cells, lossless check), `replay.passes` (the
pass table), `replay.predict` (the Draft Law fitted to the runs and its predictions) and
`replay.render` (markdown, plots).

A *run* is one (arm, mode, gamma, batch, prefix cache) configuration measured over the same
prompts. Its summary holds totals and per-class (S, R, F) counts: output tokens, drafted,
accepted, rounds. The Draft Law is fitted from the round records of the speculative runs.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from agentspec_sdk import law
from agentspec_sdk.errors import LawInputError
from agentspec_sdk.law.closed_forms import CLASSES
from agentspec_sdk.replay import accounting
from agentspec_sdk.replay.aggregate import (
    SPECULATIVE,
    add_speedups,
    clean_json,
    composition_checks,
    lossless_check,
    machine,
    round_records,
    run_key,
)
from agentspec_sdk.replay.loop import TurnLog
from agentspec_sdk.replay.passes import mean_pass, pass_cycle, pass_table, passes_from_steps
from agentspec_sdk.replay.predict import (
    decisions,
    fit_costs_from_turns,
    fit_law,
    fit_pass_costs,
    law_costs,
    predict,
    run_composition,
    speedup_check,
    tau_rounds,
)
from agentspec_sdk.replay.render import markdown, write_law_plots
from agentspec_sdk.replay.trace import atomic_write_text

SCHEMA = "agentspec-report/1"


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
    accounting.add_steady_rates(runs, passes or {}, lambda r: (run_key(r), r["mode"]))
    gamma = int(primary["gamma"])
    spec_logs = [log for (key, mode), ls in logs.items() if mode.startswith("structure") for log in ls]
    if not spec_logs:
        spec_logs = [log for (key, mode), ls in logs.items() if mode in SPECULATIVE for log in ls]
    timing_logs = {f"{key}/{mode}": ls for (key, mode), ls in logs.items() if mode in ("off", "structure")}
    tables, joined, pass_source = _pass_tables(runs, logs, steps or {}, passes or {})
    model = _PassModel(tables, joined, pass_source, primary, gamma)
    costs = model.costs(timing_logs)
    fit = fit_law(spec_logs, costs, gamma, entropies) if any(log.records for log in spec_logs) else None
    measured, speedup, checks = _predict_runs(runs, logs, fit, costs, model, entropies, primary, gamma)
    compositions = list(compositions) + composition_checks(runs, gamma)
    compared, mismatched, first = lossless_check(logs)
    arms = [law.ArmSaving(m["arm"] + "/" + m["mode"], m["w_s"], m["saving"]) for m in measured
            if m["mode"] == "structure"]
    verdicts = law.verdicts(round_records(spec_logs), gamma=gamma, arms=arms, compositions=list(compositions),
                            compared=compared, mismatched=mismatched, first_mismatch=first, speedups=checks)
    law_section, breakeven = _law_section(runs, fit, primary, gamma)
    report = {
        "schema": SCHEMA, "partial": partial,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "meta": {**machine(), **meta}, "primary": dict(primary),
        "speedup": speedup, "peers": accounting.peer_table(runs), "verify_price": price,
        "tau_by_class": _tau_by_class(logs), "law": law_section, "breakeven": breakeven, "law_fit": fit,
        "measured": measured, "verdicts": [v.to_dict() for v in verdicts],
        "decisions": decisions(runs, fit, primary) if fit is not None else [],
        "lossless": {"compared": compared, "mismatched": mismatched, "first_mismatch": first},
        "runs": runs,
    }
    return clean_json(report)


def _pass_tables(runs: list[dict], logs: Mapping[tuple, list[TurnLog]], steps: Mapping[tuple, list[Mapping]],
                 passes: Mapping[tuple, list[Mapping]]) -> tuple[dict[tuple, list[dict]], set, str]:
    """Per run key + mode, the pass table; the runs whose drafts per pass are known (their drafter's
    step log); where the passes came from."""
    tables: dict[tuple, list[dict]] = {}
    joined: set = set()  # runs whose drafts per pass are known (their drafter's step log)
    pass_source = "engine pass log joined with the drafters' step logs"
    for k in logs:
        engine_passes, proposer_steps = passes.get(k) or [], steps.get(k) or []
        if engine_passes:
            tables[k] = pass_table(engine_passes, proposer_steps if k[1] != "off" else [])
            if k[1] != "off" and proposer_steps:
                joined.add(k)
                if not any("drafted_s" in st for st in proposer_steps):  # a stock drafter: no segment class
                    w_s = next((float(r["w"].get("S") or 0.0) for r in runs if (run_key(r), r["mode"]) == k),
                               0.0)
                    for p in tables[k]:
                        p["drafted_s"] = p["drafted"] * w_s
    if not tables:  # reports of engines without a pass log: the proposer's step gaps
        pass_source = "proposer step gaps (no engine pass log)"
        tables = {k: passes_from_steps(v) for k, v in steps.items() if k[1].startswith("structure") and v}
        joined = set(tables)
    return tables, joined, pass_source


class _PassModel:
    """The pass cost model fitted over the pass tables, each table's mean pass, and the proposers'
    fits per mode: what the law's costs and each run's check are computed from."""

    def __init__(self, tables: dict[tuple, list[dict]], joined: set, source: str, primary: Mapping,
                 gamma: int):
        self.tables, self.joined, self.source = tables, joined, source
        self.comps = {k: mean_pass(t) for k, t in tables.items()}
        self.model, self.method = fit_pass_costs(tables, joined) if tables else (None, "no pass or step log")
        self.proposers = {}
        for mode in {k[1] for k in joined}:
            self.proposers[mode] = law.fit_proposer([pass_cycle(p) for k in joined if k[1] == mode
                                                     for p in tables[k]])
        self.primary_key = next((k for k in self.comps if k[1] == "structure" and k[0][1] == primary["batch"]
                                 and k[0][2] == gamma and self.comps[k]), None)

    def costs(self, timing_logs: Mapping[str, list[TurnLog]]) -> dict:
        """The law's cost terms at the primary structure run's mean pass, else the per-turn fit (the
        model is then not used for the runs' checks either)."""
        try:
            law_terms = (law_costs(self.model, self.comps[self.primary_key])
                         if self.model is not None and self.primary_key is not None else None)
        except LawInputError as exc:
            law_terms, self.method = None, str(exc)
        if law_terms is not None:
            return {**law_terms, "model": self.model.to_dict(), "source": self.source,
                    "method": f"pass cost model ({self.method}, {self.source}); law terms at the primary "
                              f"structure run's mean pass"}
        self.model = None
        return {**fit_costs_from_turns(timing_logs), "model_error": self.method}


def _predict_runs(runs: list[dict], logs: Mapping[tuple, list[TurnLog]], fit: dict | None, costs: Mapping,
                  pm: _PassModel, entropies: Mapping[str, list] | None, primary: Mapping,
                  gamma: int) -> tuple[list[dict], dict, list]:
    """Each speculative run's prediction and speedup check (in the run's dict); the measured savings,
    the top-level speedup table and the checks the verdicts weigh."""
    measured, speedup, checks = [], {}, []
    offs = {(k[0][0], k[0][1], k[0][3]): pm.comps[k] for k in pm.comps if k[1] == "off" and pm.comps[k]}
    for r in runs:
        key = (run_key(r), r["mode"])
        if fit is not None and r["mode"] in SPECULATIVE and r["output_tokens"] and r["rounds"]:
            check = _predict_run(r, key, logs, fit, costs, pm, entropies, gamma,
                                 offs.get((r["arm"], r["batch"], r["prefix_cache"])))
            if check is not None:
                checks.append(check)
        if r["mode"] != "off" and r["saving_measured"] is not None and r["w"]["S"] is not None:
            measured.append({"arm": r["arm"], "mode": r["mode"], "gamma": r["gamma"], "batch": r["batch"],
                             "w_s": r["w"]["S"], "saving": r["saving_measured"],
                             "predicted": (r.get("predicted") or {}).get("saving")})
        if r["batch"] == primary["batch"] and (r["mode"] == "off"
                                               or r["gamma"] == gamma) and r["prefix_cache"]:
            speedup.setdefault(r["arm"], {})[r["mode"]] = {
                "decode": r["speedup_decode"], "e2e": r["speedup_e2e"], "decode_tok_s": r["decode_tok_s"],
                "batch": r["batch"], "gamma": r["gamma"]}
    return measured, speedup, checks


def _predict_run(r: dict, key: tuple, logs: Mapping[tuple, list[TurnLog]], fit: dict, costs: Mapping,
                 pm: _PassModel, entropies: Mapping[str, list] | None, gamma: int,
                 off: dict | None) -> law.SpeedupCheck | None:
    """`r["predicted"]`: the law at this run's own acceptance (a drafter's κ, and at κ = 1 its ρ per
    class, is its own on its own traffic, so each run's prediction is fitted on that run's rounds;
    the pooled `fit`, structure's rounds, stays the report's law section), with its speedup check
    when the pass model allows one. Returns the check the verdicts weigh, if it was measured."""
    comp = pm.comps.get(key)
    try:
        run_costs = law_costs(pm.model, run_composition(comp, r, key in pm.joined),
                              pm.proposers.get(r["mode"])) if pm.model is not None and comp else None
    except LawInputError:
        run_costs = None
    own = logs.get(key) or []
    own_fit = fit_law(own, costs, gamma, entropies) if any(log.records for log in own) else fit
    r["predicted"] = predict(own_fit, r["w"], max(1, round(r["drafted"] / r["rounds"])), run_costs)
    if r["predicted"]:
        r["predicted"].update(kappa=own_fit["kappa"], rho=dict(own_fit["rho"]))
        per_class = tau_rounds(own_fit, r, r["predicted"])
        if per_class is not None:
            r["predicted"]["tau_rounds"] = per_class
    chk, out = None, None
    if pm.model is not None and comp:
        try:
            chk = speedup_check(r, r["predicted"], pm.model, comp, off, pm.proposers.get(r["mode"]),
                                key in pm.joined)
        # a fit that predicts a non-positive pass here: no check, and why
        except LawInputError as exc:
            r["predicted"]["check_error"] = str(exc)
    if chk is not None:
        r["predicted"].update(speedup=chk["speedup"], saving=chk["saving"], check=chk)
        if chk["measured"]:
            name = f"{r['arm']}/{r['mode']}/γ{r['gamma']}/b{r['batch']}" + ("" if r["prefix_cache"]
                                                                            else "/no-cache")
            out = law.SpeedupCheck(name, chk["speedup"], chk["measured"], chk["factors"])
    r["predicted_error"] = r["predicted"].get("check", {}).get("error")
    return out


def _tau_by_class(logs: Mapping[tuple, list[TurnLog]]) -> dict[str, list]:
    """Per law class, structure's measured τ at each γ run (with its confidence interval)."""
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
    return tau_by_class


def _law_section(runs: list[dict], fit: dict | None, primary: Mapping, gamma: int) -> tuple[dict, dict]:
    """The report's law section (the pooled fit at the primary run's class shares) and the breakeven
    at the primary run's measured draft length and costs."""
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
            breakeven.update({"delta": pred["delta"], "d": pred["d"],"gamma_drafted": pred["gamma"],
                              "overhead": pred.get("overhead", 0.0),
                              "draft_share": (pred.get("check") or {}).get("draft_share"),
                              "w_s_star_exact": pred["w_s_star"],
                              "w_s_star_exact_reason": pred["w_s_star_reason"],
                              "w_s_star_approx": pred["w_s_star_approx"],
                              "w_s_star_approx_reason": pred["w_s_star_approx_reason"]})
    return law_section, breakeven


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
