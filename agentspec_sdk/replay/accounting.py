"""Noise-proof accounting: what each mode cost in target passes, not only in wall time.

On a shared machine identical runs of one mode differ by up to 25% in decode tok/s, while what the
target had to compute does not move at temperature 0. So every run also reports

    passes = Σ over requests of the target passes that gave it tokens   (the engine counts them)
    cost   = passes + δ̂ · drafted

Where the backend cannot count passes (a server) they are estimated as output tokens − accepted draft
tokens (each pass emits accepted + 1), which is one short for every turn whose last pass emitted only
accepted draft tokens: a drafter that drafts the turn's end token (suffix, ngram) has the end come
as an accepted token, not as the pass's own, while structure never drafts it (`turn_passes`).

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

from agentspec_sdk import law
from agentspec_sdk.backends.engine_config import STOCK
from agentspec_sdk.law.cost_fits import STEP_PRICE_MIN_STEPS
from agentspec_sdk.replay.passes import pass_table, passes_from_steps, steady_decode

MIN_STEPS = STEP_PRICE_MIN_STEPS
# the bench modes that are vLLM's own drafters: the peers' "best stock drafter" is the best of these
STOCK_MODES = (*STOCK, "suffix-tuned")
# the modes each compared with off and the best stock drafter (`peer_table`): ours as it ships, and
# with a plan tuned on other turns of the same traffic (`agentspec tune`, demo/bench `--plan`)
COMPARED_MODES = ("structure", "structure-tuned")


def turn_passes(output_tokens: int, accepted: int) -> int:
    """A turn's target passes estimated from its tokens: exact unless its last pass's kept tokens
    were all accepted draft tokens (then one more)."""
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
    """Seconds of a step = a + b·rows + c·drafted (every term ≥ 0, `law.fit_step_price`), fitted over
    the gaps between consecutive proposer steps — the target pass that verified the first step's
    drafts (`passes.passes_from_steps`: gaps over 3× a run's median, every agent waiting on a tool or
    a long prefill, are dropped). The price of a drafted token per row of an n-row step is
    δ(n) = c·n / (a + b·n) (`price_at`). None when too few steps."""
    gaps = [g for steps in steps_by_run.values() for g in passes_from_steps(steps)]
    return law.fit_step_price(gaps, min_steps)


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
        delta = run_delta(price, steps.get(key_of(r)) or [], r)
        r["delta_hat"] = delta
        r["cost"] = r["passes"] + delta * r["drafted"]
        op, od = r.get("oracle_passes"), r.get("oracle_drafted")
        if op is not None:
            r["oracle_cost"] = op + delta * od
    return price


def run_delta(price: Mapping | None, own: list[Mapping], run: Mapping) -> float:
    """δ̂ of one run: the price of a drafted token at the run's own mean rows per step (its batch
    size without a step log); 0 without a price fit."""
    rows = float(np.mean([s["rows"] for s in own])) if own else float(run.get("batch") or 1)
    return price_at(price, rows) if price else 0.0


def add_steady_rates(runs: list[dict], passes: Mapping[tuple, list[Mapping]], key_of) -> None:
    """Adds `steady_tok_s` and `prefill_wait_share` (`passes.steady_decode`) to every run with an
    engine pass log. `passes`: per (run key, mode) the engine's pass log; `key_of` as for `add_costs`."""
    for r in runs:
        log = passes.get(key_of(r))
        if log:
            r.update(steady_decode(pass_table(log)))


def repeat_table(runs: Iterable[Mapping], steps: Mapping[tuple, list[Mapping]], price: Mapping | None,
                 key_of) -> list[dict]:
    """`bench --repeats`: per (arm, mode, γ, b, prefix cache), in the order of `runs`, every repeat's
    passes, drafted, accepted, cost (δ̂ from `price`, the report's fit, at each run's own rows) and
    decode tok/s, with the median and range (min, max) of decode tok/s over the repeats, and the
    median of `steady_tok_s` (`add_steady_rates`); structure's rows also get both medians against the
    best stock drafter's (`STOCK_MODES`; among those measured in structure's `engine_group` in every
    repeat, where there are any, as `peer_table`).
    `steps` and `key_of` as for `add_costs`."""
    groups: dict[tuple, list[Mapping]] = {}
    for r in runs:
        groups.setdefault((r["arm"], r["mode"], r["gamma"], r["batch"], r["prefix_cache"]), []).append(r)
    out = []
    for (arm, mode, gamma, batch, cache), rs in groups.items():
        rs = sorted(rs, key=lambda r: r.get("repeat", 0))
        costs = []
        for r in rs:
            delta = run_delta(price, steps.get(key_of(r)) or [], r)
            costs.append(r["passes"] + delta * r["drafted"])
        speeds = [r["decode_tok_s"] for r in rs if r.get("decode_tok_s")]
        steady = [r["steady_tok_s"] for r in rs if r.get("steady_tok_s")]
        out.append({"arm": arm, "mode": mode, "gamma": gamma, "batch": batch, "prefix_cache": cache,
                    "repeats": [r.get("repeat", 0) for r in rs],
                    "engine_groups": [r.get("engine_group") for r in rs], "passes": [r["passes"] for r in rs],
                    "drafted": [r["drafted"] for r in rs], "accepted": [r["accepted"] for r in rs],
                    "cost": costs, "decode_tok_s": [r.get("decode_tok_s") for r in rs],
                    "decode_tok_s_median": float(np.median(speeds)) if speeds else None,
                    "decode_tok_s_min": min(speeds) if speeds else None,
                    "decode_tok_s_max": max(speeds) if speeds else None,
                    "steady_tok_s": [r.get("steady_tok_s") for r in rs],
                    "steady_tok_s_median": float(np.median(steady)) if steady else None,
                    "prefill_wait_share": [r.get("prefill_wait_share") for r in rs]})
    cells: dict[tuple, dict[str, dict]] = {}
    for row in out:
        cells.setdefault((row["arm"], row["gamma"], row["batch"], row["prefix_cache"]), {})[row["mode"]] = row
    for modes in cells.values():
        st = modes.get("structure")
        stock = [modes[m] for m in STOCK_MODES if m in modes and modes[m]["decode_tok_s_median"]]
        if st is not None:  # medians only of peers measured beside structure in every repeat (peer_table)
            stock = [row for row in stock if row["engine_groups"] == st["engine_groups"]] or stock
        if st is not None and stock:
            best = max(stock, key=lambda row: row["decode_tok_s_median"])
            st["best_stock_by_tok_s_median"] = best["mode"]
            st["tok_s_median_vs_best_stock"] = _ratio(st["decode_tok_s_median"], best["decode_tok_s_median"])
            steady = [row for row in stock if row["steady_tok_s_median"]]
            if st["steady_tok_s_median"] and steady:
                best = max(steady, key=lambda row: row["steady_tok_s_median"])
                st["best_stock_by_steady_median"] = best["mode"]
                st["steady_median_vs_best_stock"] = _ratio(st["steady_tok_s_median"],
                                                           best["steady_tok_s_median"])
    return out


def peer_table(runs: Iterable[Mapping]) -> list[dict]:
    """Per (arm, batch, γ, prefix cache) and compared mode (COMPARED_MODES): the mode against `off`,
    the best stock drafter (by cost and by decode tok/s and by steady decode tok/s (`add_steady_rates`),
    each picked on its own measure; by the two rates among the peers of the mode's own `engine_group`
    where there are any) and the oracle; `oracle_share` = the share of the oracle's cost saving over
    the best stock drafter that the mode captures."""
    cells: dict[tuple, dict[str, Mapping]] = {}
    offs: dict[tuple, Mapping] = {}
    for r in runs:
        if r["mode"] == "off":
            offs[(r["arm"], r["batch"], r["prefix_cache"])] = r
        else:
            cells.setdefault((r["arm"], r["batch"], r["gamma"], r["prefix_cache"]), {})[r["mode"]] = r
    out = []
    for (arm, batch, _gamma, cache), modes in sorted(cells.items()):
        off = offs.get((arm, batch, cache))
        out += [_peer_row(modes, name, off) for name in COMPARED_MODES if name in modes]
    return out


def _peer_row(modes: Mapping[str, Mapping], name: str, off: Mapping | None) -> dict:
    """One row of `peer_table`: mode `name` of one (arm, batch, γ, prefix cache) cell."""
    st = modes[name]
    stock = [modes[m] for m in STOCK_MODES if m in modes]
    arm, batch, gamma, cache = st["arm"], st["batch"], st["gamma"], st["prefix_cache"]
    row: dict[str, Any] = {"arm": arm, "mode": name, "batch": batch, "gamma": gamma, "prefix_cache": cache,
                           "structure_cost": st.get("cost"), "structure_tok_s": st.get("decode_tok_s"),
                           "oracle_cost": st.get("oracle_cost")}
    if off is not None and st.get("cost"):
        row["cost_vs_off"] = off["passes"] / st["cost"]
        row["tok_s_vs_off"] = _ratio(st.get("decode_tok_s"), off.get("decode_tok_s"))
    if stock:
        by_cost = min(stock, key=lambda r: r.get("cost") or float("inf"))
        # decode tok/s only against peers measured beside it (the same group of live engines,
        # their runs interleaved): a mode measured in a later group ran minutes later, alone
        group = st.get("engine_group")
        beside = [r for r in stock if r.get("engine_group") == group] or stock
        by_speed = max(beside, key=lambda r: r.get("decode_tok_s") or 0.0)
        by_steady = max(beside, key=lambda r: r.get("steady_tok_s") or 0.0)
        row.update({"best_stock_by_cost": by_cost["mode"], "best_stock_cost": by_cost.get("cost"),
                    "best_stock_by_tok_s": by_speed["mode"],
                    "best_stock_tok_s": by_speed.get("decode_tok_s"),
                    "cost_vs_best_stock": _ratio(by_cost.get("cost"), st.get("cost")),
                    "tok_s_vs_best_stock": _ratio(st.get("decode_tok_s"), by_speed.get("decode_tok_s")),
                    "structure_prefill_wait_share": st.get("prefill_wait_share")})
        if st.get("steady_tok_s") and by_steady.get("steady_tok_s"):
            row.update({"best_stock_by_steady": by_steady["mode"],
                        "steady_vs_best_stock": _ratio(st["steady_tok_s"], by_steady["steady_tok_s"])})
        oc = st.get("oracle_cost")
        if oc is not None and by_cost.get("cost"):
            row["oracle_vs_best_stock"] = by_cost["cost"] / oc if oc else None
            gain = by_cost["cost"] - oc
            row["oracle_share"] = (by_cost["cost"] - st["cost"]) / gain if gain > 0 else None
    return row


def _ratio(a, b):
    return a / b if a and b else None
