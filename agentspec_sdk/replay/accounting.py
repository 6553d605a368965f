"""Noise-proof accounting: what each mode cost in target passes, not only in wall time.

On a shared machine identical runs of one mode differ by up to 25% in decode tok/s, while what the
target had to compute does not move at temperature 0. So every run also reports

    passes = Σ over requests (output tokens − accepted draft tokens)   (each pass emits accepted + 1)
    cost   = passes + δ̂ · drafted

in units of one request's share of a target pass, with δ̂ — the price of one drafted (verified) token
in those units — fitted from the same invocation's step log (`verify_price`). Ratios of costs between
modes of one run are the headline next to ratios of decode tok/s. The `oracle` drafts exactly the γ
tokens the target is about to write (all accepted): no drafter can need fewer passes at that γ.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from agentspec_sdk.backends.server import STOCK

MIN_STEPS = 30


def turn_passes(output_tokens: int, accepted: int) -> int:
    return max(int(output_tokens) - int(accepted), 0)


def oracle_passes(output_tokens: int, gamma: int) -> tuple[int, int]:
    """(passes, drafted) of a drafter that always drafts the target's next min(γ, what is left − 1)
    tokens: the prefill pass emits the first token, every later pass γ + 1."""
    n = int(output_tokens)
    if n <= 0:
        return 0, 0
    passes = 1 + math.ceil((n - 1) / (gamma + 1))
    return passes, n - passes


def verify_price(steps_by_run: Mapping[Any, list[Mapping]], min_steps: int = MIN_STEPS) -> dict | None:
    """Seconds of a step = a + b·rows + c·drafted (every term ≥ 0), fitted over the gaps between
    consecutive proposer steps — the target pass that verified the first step's drafts. Gaps over 3×
    a run's median (every agent waiting on a tool, long prefills) are dropped. The price of a drafted
    token per row of an n-row step is δ(n) = c·n / (a + b·n) (`price_at`). None when too few steps."""
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
    y = np.asarray(secs)
    cols = {"a_s": np.ones_like(y), "b_s_per_row": np.asarray(rows_, float), "c_s_per_token": np.asarray(drafted_, float)}
    coef = _nonnegative_fit(y, cols)
    if coef is None or coef["a_s"] + coef["b_s_per_row"] <= 0:
        return None
    resid = y - sum(coef[k] * v for k, v in cols.items())
    total = float(((y - y.mean()) ** 2).sum())
    return {**coef, "steps": len(y), "r2": 1.0 - float(resid @ resid) / total if total > 0 else 1.0,
            "dropped": sorted(k for k, v in coef.items() if v == 0.0),
            "method": "step log: seconds = a + b·rows + c·drafted, least squares with every term ≥ 0 "
                      "(a negative term is dropped and the rest refitted); δ(n) = c·n / (a + b·n)"}


def _nonnegative_fit(y: np.ndarray, cols: Mapping[str, np.ndarray]) -> dict | None:
    """Least squares, dropping the most negative coefficient until none is negative (a per-row or
    per-token cost below zero is noise from other work on the machine, not a property of the pass)."""
    keep = [k for k, v in cols.items() if np.ptp(v) > 0 or k == "a_s"]
    while keep:
        X = np.stack([cols[k] for k in keep], axis=1)
        if np.linalg.matrix_rank(X) < X.shape[1]:
            return None
        beta, *_ = np.linalg.lstsq(X, y, rcond=None)
        if (beta >= 0).all():
            out = dict.fromkeys(cols, 0.0)
            out.update({k: float(b) for k, b in zip(keep, beta, strict=True)})
            return out
        keep.pop(int(np.argmin(beta)))
    return None


def price_at(price: Mapping, rows: float) -> float:
    a, b, c = price["a_s"], price["b_s_per_row"], price["c_s_per_token"]
    n = max(float(rows), 1.0)
    return c * n / (a + b * n) if a + b * n > 0 else 0.0


def add_costs(runs: list[dict], steps: Mapping[tuple, list[Mapping]], key_of) -> dict | None:
    """Adds `cost` (and the δ̂ used, at the run's own mean rows per step) to every run, and the oracle's
    passes / drafted / cost at the run's γ. `steps`: per (run key, mode) the proposer step log; `key_of`:
    run -> that key. Returns the price fit (None: too few steps; cost then counts passes alone, δ̂ 0)."""
    price = verify_price({k: v for k, v in steps.items() if v})
    for r in runs:
        own = steps.get(key_of(r)) or []
        rows = float(np.mean([s["rows"] for s in own])) if own else float(r.get("batch") or 1)
        delta = price_at(price, rows) if price else 0.0
        r["delta_hat"] = delta
        r["cost"] = r["passes"] + delta * r["drafted"]
        op, od = r.get("oracle_passes"), r.get("oracle_drafted")
        if op is not None:
            r["oracle_cost"] = op + delta * od
    return price


def peer_table(runs: Iterable[Mapping]) -> list[dict]:
    """Per (arm, batch, γ, prefix cache): structure against `off`, the best stock drafter (by cost and
    by decode tok/s, each picked on its own measure) and the oracle; `oracle_share` = the share of the
    oracle's cost saving over the best stock drafter that structure captures."""
    cells: dict[tuple, dict[str, Mapping]] = {}
    offs: dict[tuple, Mapping] = {}
    for r in runs:
        if r["mode"] == "off":
            offs[(r["arm"], r["batch"], r["prefix_cache"])] = r
        else:
            cells.setdefault((r["arm"], r["batch"], r["gamma"], r["prefix_cache"]), {})[r["mode"]] = r
    out = []
    for (arm, batch, gamma, cache), modes in sorted(cells.items()):
        st = modes.get("structure")
        stock = [modes[m] for m in STOCK if m in modes]
        off = offs.get((arm, batch, cache))
        if st is None:
            continue
        row: dict[str, Any] = {"arm": arm, "batch": batch, "gamma": gamma, "prefix_cache": cache,
                               "structure_cost": st.get("cost"), "structure_tok_s": st.get("decode_tok_s"),
                               "oracle_cost": st.get("oracle_cost")}
        if off is not None and st.get("cost"):
            row["cost_vs_off"] = off["passes"] / st["cost"]
            row["tok_s_vs_off"] = _ratio(st.get("decode_tok_s"), off.get("decode_tok_s"))
        if stock:
            by_cost = min(stock, key=lambda r: r.get("cost") or float("inf"))
            by_speed = max(stock, key=lambda r: r.get("decode_tok_s") or 0.0)
            row.update({"best_stock_by_cost": by_cost["mode"], "best_stock_cost": by_cost.get("cost"),
                        "best_stock_by_tok_s": by_speed["mode"], "best_stock_tok_s": by_speed.get("decode_tok_s"),
                        "cost_vs_best_stock": _ratio(by_cost.get("cost"), st.get("cost")),
                        "tok_s_vs_best_stock": _ratio(st.get("decode_tok_s"), by_speed.get("decode_tok_s"))})
            oc = st.get("oracle_cost")
            if oc is not None and by_cost.get("cost"):
                row["oracle_vs_best_stock"] = by_cost["cost"] / oc if oc else None
                gain = by_cost["cost"] - oc
                row["oracle_share"] = (by_cost["cost"] - st["cost"]) / gain if gain > 0 else None
        out.append(row)
    return out


def _ratio(a, b):
    return a / b if a and b else None
