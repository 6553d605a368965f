"""`agentspec tune --report DIR`: report.md, report.json and one plot (cost per token of each candidate
policy per segment kind on the fitting part, the chosen one marked)."""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["PLOT_NAME", "markdown", "write_report"]

PLOT_NAME = "kind_costs.png"


def _row_line(name: str, r: dict, tokens: int) -> str:
    per = r["cost"] / tokens if tokens else 0.0
    return (f"| {name} | {r['passes']} | {r['drafted']} | {r['accepted']} | {r['cost']:.1f} | {per:.3f} "
            f"| {r.get('speedup_vs_off') or 0:.2f} |")


def _table(rows: dict, tokens: int) -> list[str]:
    out = ["| drafter | passes | drafted | accepted | cost | cost/token | × off |",
           "|---|---|---|---|---|---|---|"]
    out += [_row_line(name, r, tokens) for name, r in rows.items() if not name.startswith("suffix[")]
    return out


def _kind_table(result: dict) -> list[str]:
    fit = result["fit"]
    kinds = sorted({k for r in fit.values() for k in r.get("by_kind", {})})
    delta = result["settings"]["delta"]
    names = ["ngram", "suffix", "suffix-tuned"]
    names += [n for n in fit if n.startswith("structure") or n == "trees"] + ["off"]
    out = ["| kind | tokens (passes off) | " + " | ".join(names) + " | chosen | held-out choice |",
           "|---|---|" + "---|" * (len(names) + 2)]
    for kind in kinds:
        base = fit.get("off", {}).get("by_kind", {}).get(kind, {})
        cells = []
        for n in names:
            c = fit.get(n, {}).get("by_kind", {}).get(kind)
            cost = c["passes"] + delta * c["drafted"] if c else 0.0
            cells.append(f"{cost:.1f} ({c['drafted']}/{c['accepted']})" if c else "–")
        out.append(f"| {kind} | {base.get('passes', '–')} | " + " | ".join(cells)
                   + f" | {result['choice'].get(kind, '–')} | {result['choice_held_out'].get(kind, '–')} |")
    return out


def _class_table(result: dict) -> list[str]:
    """Held-out part, per law class of the token a draft began at: the composed plan, the plan's
    defaults and the best stock drafter."""
    held, delta = result["held_out"], result["settings"]["delta"]
    names = ["structure-tuned", "structure", result["held_out_summary"]["best_stock"]]
    out = ["| class | " + " | ".join(f"{n}: passes / drafted / accepted / cost" for n in names) + " |",
           "|---|" + "---|" * len(names)]
    for cls in sorted({c for n in names for c in held[n].get("by_class", {})}):
        cells = []
        for n in names:
            c = held[n].get("by_class", {}).get(cls)
            cost = c["passes"] + delta * c["drafted"] if c else 0.0
            cells.append(f"{c['passes']} / {c['drafted']} / {c['accepted']} / {cost:.1f}" if c else "–")
        out.append(f"| {cls} | " + " | ".join(cells) + " |")
    return out


def _law_lines(law: dict) -> list[str]:
    if not law.get("mix"):
        return [f"no law decision: {law.get('note', 'no data')}"]
    m = law["mix"]
    be = m["w_s_breakeven"]
    out = [f"At γ {m['gamma']}, δ {m['delta']}, d {m['d']} ({m['method']}):", "",
           "| class | share | α | drafted per round | τ | saving per round | speculate |",
           "|---|---|---|---|---|---|---|"]
    for c, v in law["classes"].items():
        assumed = " (assumed)" if v["alpha_assumed"] else ""
        out.append(f"| {c} | {v['share']:.3f} | {v['alpha']:.3f}{assumed} | {v['drafted_per_round']} "
                   f"| {v['tau']:.2f} "
                   f"| {v['saving']:+.3f} "
                   f"| {'–' if v['speculate'] is None else 'yes' if v['speculate'] else 'no'} |")
    out += ["", f"Mix: schema share w_S {m['w_s']:.3f} against its breakeven "
            f"{f'{be:.3f}' if be is not None else 'none'} ({m['breakeven_reason']}); τ {m['tau']:.2f}, "
            f"predicted saving {m['saving']:+.3f} (speedup {m['speedup']:.2f}×): "
            f"{'speculate' if m['speculate'] else 'do not speculate'}."]
    return out


def markdown(result: dict) -> str:
    s, h = result["settings"], result["held_out_summary"]
    out = ["# agentspec tune", "",
           f"{result['turns']} turns in {result['episodes']['all']} episodes: fitting part "
           f"{result['episodes']['fit']} episodes ({result['tokens']['fit']} tokens), held-out part "
           f"{result['episodes']['held']} episodes ({result['tokens']['held']} tokens); seed {s['seed']}, "
           f"held-out share {s['holdout']}. γ {s['gamma']}, batch {s['batch']}, "
           f"cost = passes + {s['delta']} × "
           f"drafted (schedule {s['schedule']}); {result['seconds']:.1f} s.", "", "## Notes", ""]
    out += [f"- {n}" for n in result["notes"]]
    plan = {"structure-per-kind": "the per-kind composition",
            "structure-per-format": f"per format, the per-kind composition or one policy "
                                    f"({result['plan_why']['reason']})"}.get(
        result["plan_choice"], f"{result['plan_choice']} in every kind ({result['plan_why']['reason']})")
    out += ["", "## Held-out result", "", f"The plan (structure-tuned): {plan}; kinds {result['kinds']}.", "",
            f"structure-tuned costs {h['structure_tuned']:.1f} passes on the held-out part; the best stock "
            f"drafter ({h['best_stock']}; suffix-tuned at {result['suffix_tuned_knobs']}, "
            f"tuned on the fitting part: {result['suffix_tuned_why']['reason']}) "
            f"{h['best_stock_cost']:.1f}: best stock ÷ structure-tuned = {h['best_stock_over_tuned']:.3f} "
            f"(> 1: structure-tuned is cheaper). structure at the plan's defaults: {h['structure']:.1f}.", ""]
    out += _table(result["held_out"], result["tokens"]["held"])
    out += ["", "Per law class of the token a draft began at (held-out part):", ""] + _class_table(result)
    out += ["", "## Per segment kind (fitting part: cost (drafted/accepted) of the passes whose draft began "
            "in the kind)", ""]
    out += _kind_table(result)
    out += ["", "Why each kind's policy (the clear-win rule, docs/tuning.md; least cost alone would choose "
            f"{result['least_cost_choice']}):", ""]
    out += [f"- {kind}: {why['chosen']}: {why['reason']}" for kind, why in result["choice_why"].items()]
    oracle = result.get("held_out_oracle")
    if oracle:
        out += ["", "The bound: each kind's cheapest policy chosen on the held-out part itself "
                f"({oracle['plan']}) costs {oracle['cost']:.1f} there: best stock ÷ it = "
                f"{oracle['best_stock_over_oracle']:.3f}."]
    if result["stability"]:
        out += ["", "Chosen differently on the held-out part: " + ", ".join(
            f"{k} ({v['fit']} → {v['held_out']})" for k, v in result["stability"].items()) + "."]
    else:
        out += ["", "The held-out part chooses the same policy in every kind."]
    deploy = result.get("deploy")
    if deploy:
        out += ["", "## Deploy", "", f"    {deploy['command']}", "", deploy["why"] + "."]
    out += ["", "## Fitting part", ""] + _table(result["fit"], result["tokens"]["fit"])
    out += ["", "## The law's decision per class (fitting part, structure at the plan's defaults)", ""]
    out += _law_lines(result["law"])
    out += ["", f"![cost per token by kind]({PLOT_NAME})", ""]
    return "\n".join(out)


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fit = result["fit"]
    delta = result["settings"]["delta"]
    kinds = sorted({k for r in fit.values() for k in r.get("by_kind", {})})
    names = [n for n in fit if n in ("ngram", "suffix-tuned", "trees", "off") or n.startswith("structure")]
    fig, ax = plt.subplots(figsize=(max(7.5, 1.4 * len(kinds) + 3.5), 4.0))
    width = 0.8 / max(len(names), 1)
    x = np.arange(len(kinds))
    for j, n in enumerate(names):
        vals = []
        for k in kinds:
            c = fit[n].get("by_kind", {}).get(k)
            base = fit.get("off", {}).get("by_kind", {}).get(k, {}).get("passes") or (c["passes"] if c else 1)
            vals.append((c["passes"] + delta * c["drafted"]) / base if c else np.nan)
        ax.bar(x + j * width, vals, width, label=n)
    for i, k in enumerate(kinds):
        if result["choice"].get(k) in names:
            j = names.index(result["choice"][k])
            ax.annotate("▼", (x[i] + j * width, 1.02), ha="center", fontsize=8)
    ax.set_xticks(x + 0.4 - width / 2, kinds, rotation=20)
    ax.set_ylabel("cost ÷ off (fitting part)")
    s = result["settings"]
    ax.set_title(f"cost per kind, γ {s['gamma']}, b {s['batch']} (▼ chosen)")
    ax.set_ylim(0, 1.15)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_report(result: dict, directory: str | os.PathLike) -> list[Path]:
    """report.md, report.json and the plot in `directory` (each file replaced whole)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    plot = d / PLOT_NAME
    tmp = d / f".{PLOT_NAME}.{os.getpid()}.tmp.png"
    _plot(result, tmp)
    os.replace(tmp, plot)
    _atomic_write(d / "report.json", json.dumps(result, indent=1).encode("utf-8"))
    _atomic_write(d / "report.md", markdown(result).encode("utf-8"))
    return [d / "report.md", d / "report.json", plot]
