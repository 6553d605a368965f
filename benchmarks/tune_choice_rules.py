"""Choice rules of `agentspec tune` compared on the bundled turn sets, from one set of replays per cell.

Per set, γ and batch: the candidates of `agentspec tune` replayed on the fitting and held-out halves
(seed 0, half held out, δ 0.2), then per rule the plan it would write and that plan's held-out cost
against the best stock drafter (best stock ÷ plan, > 1: the plan is cheaper). The rules:

- `least/least`: least cost per kind, then the cheapest of the composition and the one-policy plans on
  the fitting part (the rule before the clear-win rule);
- `<default><z>/composed`: the clear-win rule per kind (the default policy kept unless another's mean
  paired per-episode saving exceeds z standard errors; default `trees`, `structure`, or `class`:
  structure in law-class-S kinds, trees elsewhere), the composition as the plan;
- `<default><z>/vs-comp`: the same, a one-policy plan replacing the composition only where it clearly
  beats it over whole episodes (what `agentspec tune` writes: `class1/vs-comp`);
- `<default><z>/vs-default`: whole plans only: the default policy everywhere (`class`: trees) unless
  the composition or a one-policy plan clearly beats it;
- `oracle`: each kind's cheapest policy chosen on the held-out half itself, or the cheapest one-policy
  plan there (the bound).

  python benchmarks/tune_choice_rules.py tests/data/tool_calls.capture.jsonl ... [--json rules.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from pathlib import Path

from transformers import AutoTokenizer

from agentspec_sdk.backends.capture import read_capture
from agentspec_sdk.backends.model_bundle import resolve_model
from agentspec_sdk.tuning.candidates import Candidate, kind_candidates, stock_candidates, suffix_grid
from agentspec_sdk.tuning.choose import (
    best_stock,
    choose_clear_wins,
    choose_per_kind,
    clear_winner,
    composed_kinds,
    cost,
)
from agentspec_sdk.tuning.episodes import split_episodes, turn_set
from agentspec_sdk.tuning.labels import TurnLabeller
from agentspec_sdk.tuning.replays import ReplayPool, ReplaySetting
from agentspec_sdk.tuning.tuner import _plan_fields, kind_defaults, suffix_tuned

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tune_turn_sets import base_plan, source_turns, write_capture  # noqa: E402

DEFAULTS = ("trees", "class", "structure")  # "class": structure in S kinds, trees elsewhere
ZS = (1.0, 1.5, 2.0)


def _rules(pool: ReplayPool, fit_rows: dict, held_rows: dict, policies: dict, delta: float,
           by_class: dict) -> dict:
    """{rule: the plan's name and held-out row} (see the module doc)."""
    out = {}
    composed: dict[str, tuple[dict, dict]] = {}

    def replayed(choice: dict, default: str | None) -> tuple[dict, dict]:
        kinds = composed_kinds(choice, policies, default=default)
        key = json.dumps(kinds, sort_keys=True)
        if key not in composed:
            rows = pool.run([(Candidate("composed", "structure", kinds=kinds), p) for p in ("fit", "held")])
            composed[key] = (rows[("composed", "fit")], rows[("composed", "held")])
        return composed[key]

    fit, held = replayed(choose_per_kind(fit_rows, delta), None)
    plans_fit, plans_held = {"composed": fit, **fit_rows}, {"composed": held, **held_rows}
    name = min(plans_fit, key=lambda n: cost(plans_fit[n], delta))
    out["least/least"] = (name, plans_held[name])
    for default, z in itertools.product(DEFAULTS, ZS):
        tag = f"{default}{z:g}"
        defaults = by_class if default == "class" else default
        default = "trees" if default == "class" else default  # the whole-plan default and "*"
        fit, held = replayed(choose_clear_wins(fit_rows, delta, default=defaults, z=z)[0], default)
        plans_fit, plans_held = {"composed": fit, **fit_rows}, {"composed": held, **held_rows}
        out[f"{tag}/composed"] = ("composed", held)
        name = clear_winner("composed", plans_fit, delta, z=z)[0]
        out[f"{tag}/vs-comp"] = (name, plans_held[name])
        order = {default: plans_fit[default], **{k: v for k, v in plans_fit.items() if k != default}}
        name = clear_winner(default, order, delta, z=z)[0]
        out[f"{tag}/vs-default"] = (name, plans_held[name])
    _, held = replayed(choose_per_kind(held_rows, delta), "trees")
    oracle = {"composed": held, **held_rows}
    name = min(oracle, key=lambda n: cost(oracle[n], delta))
    out["oracle"] = (name, oracle[name])
    return out


def cell(ts, base, gamma: int, batch: int, delta: float, model: str, labeller: TurnLabeller,
         knob_rule: str = "clear") -> dict:
    qualified = len(ts.formats) > 1
    for t in ts.turns:
        labeller.label(t, ts.formats[t["fmt"]], qualified)
    fit, held = split_episodes(ts.turns, 0.5, 0)
    setting = ReplaySetting(gamma, batch, delta, model, _plan_fields(ts, base, model), "agents", qualified)
    with ReplayPool(ts, {"fit": fit, "held": held}, setting, 1) as pool:
        grid = suffix_grid()
        rows = pool.run([(c, "fit") for c in grid])
        ngram, suffix = stock_candidates()
        if knob_rule == "least":
            knobs = dict(min(grid, key=lambda c: (cost(rows[(c.name, "fit")], delta), grid.index(c))).knobs)
        else:  # vLLM's defaults unless a grid point clearly wins at one standard error (`agentspec
            # tune` applies the rule at CLEAR_WIN_SE)
            default = next(c for c in grid if c.knobs == suffix.knobs)
            knobs = suffix_tuned(rows, delta, default.name, 1.0)[1]
        rows.update(pool.run([(ngram, "held"), (suffix, "held"),
                              (Candidate("suffix-tuned", "suffix", knobs), "held")]))
        stock = {n: rows[(n, "held")] for n in ("ngram", "suffix", "suffix-tuned")}
        stock_name, stock_cost = best_stock(stock, delta)
        candidates = kind_candidates(knobs)
        rows.update(pool.run([(c, p) for c in candidates for p in ("fit", "held")]))
        fit_rows = {c.name: rows[(c.name, "fit")] for c in candidates}
        held_rows = {c.name: rows[(c.name, "held")] for c in candidates}
        policies = {c.name: c.kinds["*"] for c in candidates}
        by_class = kind_defaults(setting.plan_fields, qualified, "class")
        rules = _rules(pool, fit_rows, held_rows, policies, delta, by_class)
    return {"best_stock": stock_name, "best_stock_cost": stock_cost,
            "rules": {r: {"plan": n, "cost": cost(row, delta), "ratio": stock_cost / cost(row, delta)}
                      for r, (n, row) in rules.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("turns", nargs="+")
    ap.add_argument("--delta", type=float, default=0.2)
    ap.add_argument("--knobs", choices=("clear", "least"), default="clear",
                    help="suffix-tuned's knobs: vLLM's defaults unless a grid point clearly wins "
                         "(`agentspec tune`), or the grid point of least cost on the fitting half")
    ap.add_argument("--json", help="write every result here")
    args = ap.parse_args()
    model = resolve_model(None)
    labeller = TurnLabeller(AutoTokenizer.from_pretrained(model))
    results = []
    for path in args.turns:
        with tempfile.TemporaryDirectory() as tmp:
            turns = source_turns(path)
            write_capture(turns, Path(tmp))
            base = base_plan(turns)
            known = [] if base is None else base.agent_formats()
            for gamma, batch in itertools.product((8, 16), (1, 8)):
                ts = turn_set(read_capture([tmp]), known)
                r = cell(ts, base, gamma, batch, args.delta, model, labeller, args.knobs)
                r.update(set=Path(path).name.split(".")[0], gamma=gamma, batch=batch)
                results.append(r)
                print(r["set"], gamma, batch, {k: round(v["ratio"], 3) for k, v in r["rules"].items()},
                      flush=True)
    rules = list(results[0]["rules"])
    print("\n| rule | cells below 1.00 | lowest | mean | " + " | ".join(
        sorted({r["set"] for r in results}, key=[r["set"] for r in results].index)) + " |")
    print("|---|---|---|---|" + "---|" * len({r["set"] for r in results}))
    for rule in rules:
        ratios = [r["rules"][rule]["ratio"] for r in results]
        per_set = {}
        for r in results:
            per_set.setdefault(r["set"], []).append(f"{r['rules'][rule]['ratio']:.3f}")
        cells = " | ".join("/".join(v) for v in per_set.values())
        print(f"| {rule} | {sum(x < 0.9995 for x in ratios)} | {min(ratios):.3f} | "
              f"{sum(ratios) / len(ratios):.4f} | {cells} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
