"""report.md and the law plots, rendered from a report (the dict `report.build_report` returns, or
a report.json read back)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentspec_sdk import law
from agentspec_sdk.law.closed_forms import CLASSES


def _f(x: Any, spec: str = ".2f") -> str:
    return "–" if x is None else format(x, spec)


def markdown(report: Mapping) -> str:
    """report.md: the runs, the peers, the fitted law, predicted against measured speedups, verdicts,
    the lossless check and the speculate-or-not decisions."""
    lines = [f"# AgentSpec report{' (PARTIAL: interrupted)' if report.get('partial') else ''}", ""]
    meta = report.get("meta", {})
    lines.append(f"Model: {meta.get('model', '?')} · machine: {meta.get('platform', '?')}, "
                 f"{meta.get('cpus', '?')} CPUs · seed {meta.get('seed', '?')} · versions: "
                 + ", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items()))
    lines += _run_lines(report)
    lines += _peer_lines(report)
    lines += _repeat_lines(report)
    lines += _fit_lines(report)
    lines += _check_lines(report)
    lines += _outcome_lines(report)
    return "\n".join(lines) + "\n"


def _run_lines(report: Mapping) -> list[str]:
    lines = ["", "## Runs", "",
              "| arm | mode | γ | b | cache | class | tokens | drafted | accepted | τ (mean acc./round) "
              "| decode tok/s | e2e s | speedup decode | speedup e2e | pred. τ | pred. s | w_S | w_S* |",
              "|" + "---|" * 18]
    for r in report.get("runs", []):
        pred = r.get("predicted") or {}
        lines.append(f"| {r['arm']} | {r['mode']} | {r['gamma']} | {r['batch']} | "
                     f"{'on' if r['prefix_cache'] else 'off'} "
                     f"| all | {r['output_tokens']} | {r['drafted']} | {r['accepted']} | {_f(r['tau_mean'])} "
                     f"| {_f(r['decode_tok_s'], '.1f')} | {_f(r['wall_s'], '.1f')} | "
                     f"{_f(r['speedup_decode'])}× "
                     f"| {_f(r['speedup_e2e'])}× | {_f(pred.get('tau'))} | {_f(pred.get('saving'))} "
                     f"| {_f(r['w']['S'])} | {_f(pred.get('w_s_star'))} |")
        if r["mode"] != "off":
            for c in CLASSES:
                b = r["by_class"].get(c, {})
                pt = (pred.get("tau_by_class") or {}).get(c)
                lines.append(f"| | | | | | {c} | {b.get('tokens', 0)} | {b.get('drafted', 0)} | "
                             f"{b.get('accepted', 0)} "
                             f"| {_f(b.get('tau_mean'))} | | | | | {_f(pt)} | | {_f(r['w'].get(c))} | |")
    return lines


def _fit_lines(report: Mapping) -> list[str]:
    lines: list[str] = []
    fit = report.get("law_fit")
    if fit:
        lines += ["", "## Fitted law", "",
                  f"κ = {fit['kappa']:.3f}, ρ_S/ρ_R/ρ_F = {fit['rho']['S']:.3f}/{fit['rho']['R']:.3f}/"
                  f"{fit['rho']['F']:.3f}, δ = {fit['delta']:.4f}, d = {fit['d']:.3f} ({fit['method']}; "
                  f"costs: {fit['costs']['method']})"]
        lw = report.get("breakeven") or {}
        if "w_s_star_exact" in lw:
            lines.append("")
            lines.append(f"Breakeven schema share at the primary run (γ = {lw['gamma_drafted']} drafted per "
                         f"round, δ = {lw['delta']:.3f}, d = {lw['d']:.3f}): w_S* exact "
                         f"{_share(lw, 'exact')}, small-ε̄ approx {_share(lw, 'approx')}")
        lines += _cost_model_lines(fit.get("costs") or {})
    return lines


def _check_lines(report: Mapping) -> list[str]:
    lines: list[str] = []
    checks = [(r, r["predicted"]["check"]) for r in report.get("runs", [])
              if (r.get("predicted") or {}).get("check")]
    if checks:
        lines += ["", "## Predicted vs measured decode speedup", "",
                  "| arm | mode | γ | b | cache | predicted | measured | error | term most off | 1 + fτ "
                  "pred./meas. | spec pass ms pred./meas. | off pass ms pred./meas. | outside passes |",
                  "|" + "---|" * 13]
        for r, c in checks:
            fa = c["factors"]
            tau_f = fa.get("tokens per row-pass (tau)", {})
            sp, op, out = (fa.get("speculative pass (s)", {}), fa.get("off pass (s)", {}),
                           fa.get("time outside passes", {}))
            worst = (law.SpeedupCheck("", c["speedup"], c["measured"] or 1.0, fa).off_term if c["measured"]
                     else None)
            lines.append(f"| {r['arm']} | {r['mode']} | {r['gamma']} | {r['batch']} | "
                         f"{'on' if r['prefix_cache'] else 'off'} "
                         f"| {_f(c['speedup'])}× | {_f(c['measured'])}× | {_f(c['error'], '.1%')} | "
                         f"{worst or '–'} | {_f(tau_f.get('predicted'))}/{_f(tau_f.get('measured'))} "
                         f"| {_ms(sp.get('predicted'))}/{_ms(sp.get('measured'))} "
                         f"| {_ms(op.get('predicted'))}/{_ms(op.get('measured'))} | "
                         f"{_f(out.get('measured'))} |")
    return lines


def _outcome_lines(report: Mapping) -> list[str]:
    lines = ["", "## Verdicts", ""]
    for v in report.get("verdicts", []):
        lines.append(f"- **{v['name']}**: {v['status']} — {v['text']}")
    ll = report.get("lossless", {})
    lines += ["",
              f"Lossless check: {ll.get('mismatched')} of {ll.get('compared')} speculative outputs differ "
              "from `off` for the same prompt."]
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
                     f"{d['rounds']} rounds at γ {d['gamma']}") if d["class"] != "all" \
                else " (decode, whole arm)"
            lines.append(f"- arm {d['arm']}, {d['class']}: **{what}** — saving predicted "
                         f"{_f(d['saving_predicted'])}, measured {_f(d['saving_measured'])}{extra}")
    return lines


def _peer_lines(report: Mapping) -> list[str]:
    """Deterministic counts beside wall time (docs/replay.md, "Noise-proof accounting")."""
    runs = [r for r in report.get("runs", []) if "passes" in r]
    if not runs:
        return []
    price = report.get("verify_price")
    how = (f"δ̂ from this run's step log ({price['steps']} steps: {1000 * price['a_s']:.1f} ms per pass + "
           f"{1000 * price['b_s_per_row']:.2f} ms per row + {1000 * price['c_s_per_token']:.2f} ms per "
           "drafted token; δ̂ at each run's mean rows)") if price \
        else "δ̂ = 0 (too few proposer steps to fit it)"
    lines = ["", "## Target passes and cost (deterministic at temperature 0)", "",
             "cost = passes + δ̂ · drafted, passes = the target passes the engine counted per turn "
             f"(a server: Σ (output tokens − accepted)); {how}. The oracle drafts "
             "exactly the γ tokens the target writes next.", "",
             "| arm | mode | γ | b | cache | passes | drafted | accepted | δ̂ | cost | oracle cost | decode "
             "tok/s | steady tok/s | waiting on prefills |",
             "|" + "---|" * 14]
    for r in runs:
        lines.append(f"| {r['arm']} | {r['mode']} | {r['gamma']} | {r['batch']} | "
                     f"{'on' if r['prefix_cache'] else 'off'} "
                     f"| {r['passes']} | {r['drafted']} | {r['accepted']} | {_f(r.get('delta_hat'), '.3f')} "
                     f"| {_f(r.get('cost'), '.0f')} | {_f(r.get('oracle_cost'), '.0f')} | "
                     f"{_f(r['decode_tok_s'], '.1f')} | {_f(r.get('steady_tok_s'), '.1f')} "
                     f"| {_f(r.get('prefill_wait_share'), '.0%')} |")
    peers = report.get("peers") or []
    if peers:
        lines += ["",
                  "| arm | mode | γ | b | mode ÷ off (cost / tok/s) | best stock by cost | mode ÷ best "
                  "stock, cost | best stock by tok/s | mode ÷ best stock, tok/s | oracle ÷ best stock "
                  "(cost) | share of the oracle's gain | mode ÷ best stock, steady tok/s |",
                  "|" + "---|" * 12]
        for p in peers:
            lines.append(f"| {p['arm']} | {p.get('mode', 'structure')} | {p['gamma']} | {p['batch']} "
                         f"| {_f(p.get('cost_vs_off'))}× / "
                         f"{_f(p.get('tok_s_vs_off'))}× | {p.get('best_stock_by_cost', '–')} "
                         f"| {_f(p.get('cost_vs_best_stock'))}× | {p.get('best_stock_by_tok_s', '–')} "
                         f"| {_f(p.get('tok_s_vs_best_stock'))}× | {_f(p.get('oracle_vs_best_stock'))}× "
                         f"| {_f(p.get('oracle_share'), '.0%')} "
                         f"| {_f(p.get('steady_vs_best_stock'))}× ({p.get('best_stock_by_steady', '–')}) |")
    return lines


def _repeat_lines(report: Mapping) -> list[str]:
    """`bench --repeats`: decode tok/s median and range over the repeats beside the counts (a count
    that differs between repeats shows as its range)."""
    rows = report.get("repeats") or []
    if not rows:
        return []
    n = max(len(r["repeats"]) for r in rows)
    lines = ["", f"## Repeats: decode tok/s over {n} interleaved repeats (fresh engines each)", "",
             "The tables above are the first repeat's. Counts are deterministic at temperature 0; one that "
             "differs between repeats shows as min–max.", "",
             "| arm | mode | γ | b | cache | repeats | passes | drafted | accepted | cost | decode tok/s "
             "median | min–max | structure ÷ best stock, median tok/s | steady tok/s median | structure ÷ "
             "best stock, median steady tok/s |",
             "|" + "---|" * 15]
    for r in rows:
        vs = (f"{_f(r['tok_s_median_vs_best_stock'])}× ({r['best_stock_by_tok_s_median']})"
              if r.get("tok_s_median_vs_best_stock") else "")
        steady = (f"{_f(r['steady_median_vs_best_stock'])}× ({r['best_stock_by_steady_median']})"
                  if r.get("steady_median_vs_best_stock") else "")
        lines.append(f"| {r['arm']} | {r['mode']} | {r['gamma']} | {r['batch']} | "
                     f"{'on' if r['prefix_cache'] else 'off'} | {len(r['repeats'])} | {_span(r['passes'])} "
                     f"| {_span(r['drafted'])} | {_span(r['accepted'])} | {_span(r['cost'], '.0f')} "
                     f"| {_f(r['decode_tok_s_median'], '.1f')} | {_f(r['decode_tok_s_min'], '.1f')}–"
                     f"{_f(r['decode_tok_s_max'], '.1f')} | {vs} | {_f(r.get('steady_tok_s_median'), '.1f')} "
                     f"| {steady} |")
    return lines


def _span(values: list, spec: str = "d") -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "–"
    lo, hi = min(known), max(known)
    return format(lo, spec) if format(lo, spec) == format(hi, spec) else f"{lo:{spec}}–{hi:{spec}}"


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
             f"{m['passes']} passes, mean {1000 * m['mean_s']:.1f} ms, residual SD "
             f"{1000 * m['residual_sd']:.1f} ms, R² {m['r2']:.2f} ({costs.get('source', '')})", ""]
    for k in law.PASS_TERMS:
        if k not in m["coef"]:  # a report written before this term existed
            continue
        if k in m["dropped"]:
            lines.append(f"- {k} ({law.PASS_TERM_TEXT[k]}): not fitted — {m['dropped'][k]}")
        else:
            lines.append(f"- {k} ({law.PASS_TERM_TEXT[k]}): {1000 * m['coef'][k]:.3f} ± "
                         f"{1000 * m['se'][k]:.3f} ms")
    p = m.get("proposer") or {}
    if p:
        lines.append(f"- proposer: {1000 * p['mean_s']:.2f} ms per step on average = {1000 * p['base']:.2f} "
                     f"ms + {1000 * p['row']:.3f} ms per row + {1000 * p['drafted']:.3f} ms per drafted "
                     f"token + {1000 * p['ctx']:.3f} ms per 1k context tokens")
    lines.append(f"- law terms at the primary structure run's mean pass ({costs['rows']:.1f} rows, "
                 f"{costs['ctx_per_row']:.0f} context tokens per row): c_T = {1000 * costs['c_t']:.1f} ms, "
                 f"δ = {costs['delta']:.3f}, d = {costs['d']:.3f}, proposer overhead {costs['overhead']:.3f} "
                 "c_T per pass")
    return lines


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
