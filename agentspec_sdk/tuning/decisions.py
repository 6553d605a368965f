"""The Draft Law's operator decision per law class of the captured traffic: speculate or not, the
expected accepted prefix tau, the schema share against its breakeven, the predicted saving at the given
prices delta and d.

The acceptance alpha_c per class comes from the structure drafter's replayed rounds (accepted positions
over accepted positions plus rejections, estimators' `ClassAcceptance`); kappa is not identifiable from
acceptance alone, so it is fixed at 1 and rho_c = alpha_c (as the report's law fit does without
entropies). The shares w_c are the output tokens per class.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from agentspec_sdk import law

__all__ = ["RHO_FLOOR", "class_decisions", "token_shares"]

RHO_FLOOR = 1e-3  # rho must be > 0: a class that never accepted is floored here


def token_shares(turns: list[dict]) -> dict[str, int]:
    """Output tokens per law class (each turn's first token excluded: it comes with the prefill)."""
    out = {c: 0 for c in law.CLASSES}
    for t in turns:
        for c in t.get("classes", "")[1:]:
            out[c] = out.get(c, 0) + 1
    return out


def _clean(x) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def class_decisions(rounds: Mapping[str, Mapping[str, int]], tokens: Mapping[str, int], gamma: int,
                    delta: float, d: float) -> dict:
    """Per class (S, R, F), at the class's mean drafted length, and for the whole mix at draft length
    `gamma`: the law at prices `delta`, `d`.
    `rounds[c]`: rounds, drafted, accepted, rejections of class c; `tokens[c]`: output tokens of c."""
    total = sum(tokens.get(c, 0) for c in law.CLASSES)
    if total == 0:
        return {"classes": {}, "mix": None, "note": "no output tokens"}
    w = {c: tokens.get(c, 0) / total for c in law.CLASSES}
    alpha, assumed = {}, []
    for c in law.CLASSES:
        r = rounds.get(c)
        trials = (r["accepted"] + r["rejections"]) if r else 0
        if trials:
            alpha[c] = r["accepted"] / trials
    floor = min(alpha.values()) if alpha else 0.5
    for c in law.CLASSES:
        if c not in alpha:
            alpha[c], assumed = floor, [*assumed, c]
    rho = {c: min(max(alpha[c], RHO_FLOOR), 1.0) for c in law.CLASSES}
    params = law.LawParams(1.0, delta, d)
    mix = law.ClassMix(w, rho)
    report = law.evaluate(params, mix, gamma)
    classes = {}
    for c in law.CLASSES:
        r = rounds.get(c) or {}
        # as the drafter drafts: at the class's mean drafted length (the budget and the grammar end
        # most drafts before gamma), as the report's decisions do (replay.predict.decisions)
        g = max(1, round(r["drafted"] / r["rounds"])) if r.get("rounds") else gamma
        t = float(law.tau_by_class(params, mix, g)[c])
        s = float(law.saving(g, t, delta, d))
        classes[c] = {"share": w[c], "tokens": tokens.get(c, 0), "alpha": alpha[c],
                      "alpha_assumed": c in assumed, "rounds": r.get("rounds", 0), "drafted_per_round": g,
                      "tau": t, "saving": s, "tau_at_gamma": float(report.tau_by_class[c]),
                      "speculate": s > 0 if tokens.get(c, 0) else None}  # None: no tokens of the class
    be = report.breakeven
    mix_out = {"w_s": w["S"], "w_s_breakeven": _clean(be.exact), "w_s_breakeven_approx": _clean(be.approx),
               "breakeven_reason": be.exact_reason, "tau": _clean(report.tau),
               "saving": _clean(report.saving),
               "speedup": _clean(report.speedup), "speculate": report.saving > 0,
               "gamma": gamma, "delta": delta, "d": d, "kappa": 1.0,
               "method": "kappa fixed at 1: rho_c = per-position acceptance of the structure "
                         "drafter's replay"}
    return {"classes": classes, "mix": mix_out}
