"""The two figures of the Draft Law as PNG files (matplotlib, Agg canvas, imported lazily).

Measured points come from a report JSON (see docs/law.md):
    {"law": {"w_s", "w_r", "rho_s", "rho_r", "rho_f", "kappa", "delta", "d", "gamma"},   optional
     "measured": [{"w_s": 0.7, "saving": 0.21, "arm": "B", "gamma": 8}, ...],            optional
     "tau_by_class": {"S": [{"gamma": 8, "tau": 5.1, "ci": [4.8, 5.4]}], "R": ..., "F": ...}}  optional
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from agentspec_sdk.errors import LawInputError
from agentspec_sdk.law.closed_forms import (
    CLASSES,
    ClassMix,
    LawParams,
    breakeven_w_s,
    check_mismatch,
    eps_bar,
    mismatch,
    pass_cost_ratio,
    saving_vs_w_s,
    schema_ceiling,
    tau,
    tau_vs_w_s,
)

CLASS_STYLE = {"S": ("tab:blue", "S (schema-bound)"), "R": ("tab:orange", "R (reasoning)"),
               "F": ("tab:green", "F (free prose)")}
LAW_KEYS = ("w_s", "w_r", "rho_s", "rho_r", "rho_f", "kappa", "delta", "d", "gamma")


def _figure(height: float = 4.6):
    from matplotlib.figure import Figure  # lazy: the law's closed forms never need matplotlib

    return Figure(figsize=(7.0, height), dpi=110, layout="constrained")


def _points(value) -> list[dict]:
    if value is None:
        return []
    return [value] if isinstance(value, Mapping) else list(value)


def figure_tau_by_class(params: LawParams, mix: ClassMix, gamma_max: int = 16,
                        measured_tau: Mapping[str, object] | None = None):
    """Expected accepted prefix tau_c(gamma) per class and mixed, gamma = 1..gamma_max."""
    check_mismatch(params, mix)
    g = np.arange(1, gamma_max + 1)
    fig = _figure()
    ax = fig.add_subplot()
    ax.plot(g, g, color="0.7", linestyle=":", label="ceiling tau = gamma")
    for c in CLASSES:
        color, label = CLASS_STYLE[c]
        ax.plot(g, tau(g, mismatch(params.kappa, mix.rho[c])), color=color, marker="o", markersize=3,
                label=f"{label}, rho={mix.rho[c]:.2f}")
        for p in _points((measured_tau or {}).get(c)):
            ci = p.get("ci")
            # a CI bound computed a rounding error past τ (τ = γ: upper 3.9999999999999973 at τ 4)
            yerr = None if ci is None else [[max(p["tau"] - ci[0], 0.0)], [max(ci[1] - p["tau"], 0.0)]]
            ax.errorbar([p["gamma"]], [p["tau"]], yerr=yerr, color=color, marker="D", markersize=7,
                        markeredgecolor="black", linestyle="none", capsize=3)
    ax.plot(g, tau(g, eps_bar(params, mix)), color="black", linewidth=2,
            label=f"mixed, rho_bar={mix.rho_bar:.2f}")
    ax.set_xlabel("draft length gamma (tokens)")
    ax.set_ylabel("expected accepted prefix tau")
    ax.set_title(f"Expected accepted prefix by position class (kappa={params.kappa:.3g})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")  # tau <= gamma: no curve or point ever reaches that corner
    return fig


def _point_label(p: Mapping) -> str:
    parts = [str(p[k]) for k in ("arm", "mode") if k in p]
    if "batch" in p:
        parts.append(f"b{p['batch']}")
    return " ".join(parts)


def figure_saving_vs_w_s(params: LawParams, mix: ClassMix, gammas: Sequence[int] = (8,),
                         measured: Sequence[Mapping] | None = None, model_curve: Mapping | None = None):
    """Net saving s against the schema share w_S (R:F ratio and rho fixed), breakevens marked.

    `model_curve` ({"gamma", "draft_share", "overhead"}): also draw the saving the pass cost model
    predicts, s = 1 - (1 + o + f gamma (delta + d)) / (1 + f tau(w_S)), with f the share of
    row-passes that draft and o the proposer's fixed cost per pass (law.pass_cost_ratio). Measured
    points are labelled by arm, mode and batch; a point's `predicted` saving is drawn as a hollow
    circle joined to it."""
    check_mismatch(params, mix)
    w = np.linspace(0.0, 1.0, 201)
    fig = _figure(6.0)  # the legend below the axes
    ax = fig.add_subplot()
    ax.axhline(0.0, color="0.4", linewidth=1)
    colors = ["tab:purple", "tab:red", "tab:brown", "tab:cyan", "tab:olive"]
    for i, g in enumerate(gammas):
        color = colors[i % len(colors)]
        ax.plot(w, saving_vs_w_s(params, mix, g, w), color=color, linewidth=2, label=f"gamma={g}")
        be = breakeven_w_s(params, mix, g)
        if be.exact is not None:
            ax.axvline(be.exact, color=color, linestyle="--", linewidth=1)
            ax.plot([be.exact], [0.0], marker="o", color=color, markersize=8,
                    label=f"breakeven w_S*={be.exact:.3f} (exact)")
        if be.approx is not None:
            ax.plot([be.approx], [0.0], marker="x", color=color, markersize=9, markeredgewidth=2,
                    label=f"w_S*={be.approx:.3f} (small-eps rule)")
        if be.exact is None:
            ax.plot([], [], " ", label=f"gamma={g}: no exact breakeven ({be.exact_reason.split(' (')[0]})")
        ceiling = schema_ceiling(g, params.delta, params.d)
        ax.axhline(ceiling.saving, color=color, linestyle=":", linewidth=1,
                   label=f"schema ceiling s={ceiling.saving:.3f}")
    if model_curve:
        g = int(model_curve["gamma"])
        f = float(model_curve.get("draft_share") or 1.0)
        o = float(model_curve.get("overhead") or 0.0)
        t = tau_vs_w_s(params, mix, g, w)
        ratio = pass_cost_ratio(t, 1.0, 1.0 + o + f * g * (params.delta + params.d), f)
        ax.plot(w, 1.0 - ratio, color="black", linewidth=2, linestyle="-.",
                label=f"pass cost model: gamma={g} drafted, f={f:.2f} drafting, overhead={o:.3f}")
    pts = _points(measured)
    if pts:
        color_of = {g: colors[i % len(colors)] for i, g in enumerate(gammas)}
        ax.scatter([p["w_s"] for p in pts], [p["saving"] for p in pts], marker="D", s=50,
                   c=[color_of.get(p.get("gamma"), "black") for p in pts], edgecolors="black",
                   zorder=5, label="measured (colour = gamma)")
        pred = [p for p in pts if p.get("predicted") is not None]
        if pred:
            ax.scatter([p["w_s"] for p in pred], [p["predicted"] for p in pred], marker="o", s=50,
                       facecolors="none", edgecolors="black", zorder=5, label="predicted for that run")
            for p in pred:
                ax.plot([p["w_s"], p["w_s"]], [p["saving"], p["predicted"]], color="0.5", linewidth=0.8)
    ax.set_xlim(0.0, 1.0)
    ax.set_xlabel("schema share w_S")
    ax.set_ylabel("net saving s = 1 - c_net / c_1")
    ax.set_title(f"Net saving vs schema share (R:F = {mix.rf_share:.2f}:{1 - mix.rf_share:.2f}, "
                 f"delta={params.delta:.3g}, d={params.d:.3g})")
    ax.grid(alpha=0.3)
    # below the axes: every curve spans the whole width, so a legend inside would cover some of it
    fig.legend(fontsize=8, loc="outside lower center")
    _label_points(fig, ax, pts)
    return fig


def _label_points(fig, ax, pts: Sequence[Mapping]) -> None:
    """Each measured point's arm, mode and batch beside it; labels that would overlap (two modes of an
    arm at nearly the same saving) are moved down until none does. Placed on the figure's final
    layout, which they do not change (not in the layout)."""
    labelled = [(p, _point_label(p)) for p in pts]
    labelled = [(p, label) for p, label in labelled if label]
    if not labelled:
        return
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    fig.draw_without_rendering()  # the layout, so data-to-pixel positions are final
    renderer = canvas.get_renderer()
    texts = []
    for p, label in labelled:
        right = p["w_s"] > 0.75  # near the right edge the label goes left of its point
        t = ax.annotate(label, (p["w_s"], p["saving"]), textcoords="offset points",
                        xytext=(-5 if right else 5, 5), ha="right" if right else "left", fontsize=7)
        t.set_in_layout(False)
        texts.append(t)
    placed = []
    to_points = 72.0 / fig.dpi
    for t in sorted(texts, key=lambda t: -ax.transData.transform(t.xy)[1]):  # top first
        box = t.get_window_extent(renderer)
        for other in sorted(placed, key=lambda b: -b.y1):
            if box.overlaps(other):
                shift = box.y1 - other.y0 + 1.0  # pixels down so its top clears the other's bottom
                box = box.translated(0, -shift)
                t.xyann = (t.xyann[0], t.xyann[1] - shift * to_points)
        placed.append(box)


def read_report(path: str | Path) -> dict:
    """The fields of a report JSON the plots read; checks their shape."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise LawInputError(f"measured report {path} does not exist") from None
    except json.JSONDecodeError as err:
        raise LawInputError(f"measured report {path} is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise LawInputError(f"measured report {path} must hold a JSON object")
    law = data.get("law", {})
    unknown = sorted(set(law) - set(LAW_KEYS) - {"w_f", "gamma_max"})
    if unknown:
        raise LawInputError(f"{path}: unknown key(s) in 'law': {unknown}; known: {list(LAW_KEYS)}")
    for i, p in enumerate(_points(data.get("measured"))):
        if not {"w_s", "saving"} <= set(p):
            raise LawInputError(f"{path}: measured[{i}] needs 'w_s' and 'saving'")
    for c, pts in (data.get("tau_by_class") or {}).items():
        if c not in CLASSES:
            raise LawInputError(f"{path}: tau_by_class has unknown class {c!r}")
        for i, p in enumerate(_points(pts)):
            if not {"gamma", "tau"} <= set(p):
                raise LawInputError(f"{path}: tau_by_class.{c}[{i}] needs 'gamma' and 'tau'")
    return data


def write_plots(out_dir: str | Path, params: LawParams, mix: ClassMix, gamma: int, gamma_max: int = 16,
                report: Mapping | None = None) -> list[Path]:
    """Write tau_by_class.png and saving_vs_schema_share.png into `out_dir`; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = report or {}
    gammas = sorted({gamma, *(int(p["gamma"]) for p in _points(report.get("measured")) if "gamma" in p)})
    be = report.get("breakeven") or {}
    curve = ({"gamma": be["gamma_drafted"], "draft_share": be.get("draft_share"),
              "overhead": be.get("overhead")}
             if be.get("gamma_drafted") else None)
    figures = {
        "tau_by_class.png": figure_tau_by_class(params, mix, gamma_max, report.get("tau_by_class")),
        "saving_vs_schema_share.png": figure_saving_vs_w_s(params, mix, gammas, report.get("measured"),
                                                           curve),
    }
    paths = []
    for name, fig in figures.items():
        fig.savefig(out / name, format="png")
        paths.append(out / name)
    return paths
