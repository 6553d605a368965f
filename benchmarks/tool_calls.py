"""Tool-call decoding speed: off vs vLLM's ngram and suffix (γ = 2, 4, 8) vs structure, at b=1 and b=8, same
engine settings.

Each setting starts its own engine (same model, dtype, max_model_len, prefix caching, grammar backend),
warms it (every prompt once with max_tokens=1: grammar compiled, prompt prefix cached), then decodes
BFCL prompts as call-only tool turns at temperature 0: half of them one at a time (b=1), the other half
in groups of 8 submitted together (b=8) — different prompts, so no drafter's memory of finished
responses (suffix decoding's global tree) holds the answers of the other batch size.

    flock /tmp/agentspec-engine.lock python benchmarks/tool_calls.py --quick [--json out.json]

Per setting and batch size: decode_tok_s (output tokens after the first, over the time from each
group's first token to its last finish), e2e_s (mean per turn), mean_accepted_len (vLLM: 1 + accepted
draft tokens per draft step), proposer_share (proposer seconds / engine step seconds), and how many
outputs are token-identical to `off`; and the deterministic counts: target passes (the engine's count per
turn, `TurnResult.passes`; beside it `passes_from_tokens`, Σ output tokens − accepted), drafted, accepted
and cost = passes + δ̂·drafted, δ̂ fitted from the step logs of this run (agentspec_sdk.replay.accounting).
Ratios against the best stock drafter are given in both measures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from agentspec_sdk.backends.embedded.vllm_engine import Engine
from agentspec_sdk.backends.engine_config import STOCK
from agentspec_sdk.backends.types import TurnRequest
from agentspec_sdk.bfcl import tool_call_prompts
from agentspec_sdk.replay.accounting import price_at, verify_price

BATCHES = (1, 8)
ENGINE_KWARGS = {"max_model_len": 2048, "kv_cache_gb": 1.0, "seed": 0}


def settings(gammas: list[int], structure_gamma: int) -> list[tuple[str, str, int]]:
    out = [("off", "off", structure_gamma)]
    out += [(f"{m}-g{g}", m, g) for m in STOCK for g in gammas]
    out.append((f"structure-g{structure_gamma}", "structure", structure_gamma))
    return out


def run_setting(mode: str, gamma: int, prompts, max_tokens: int, engine_kwargs: dict) -> tuple[list, dict]:
    started = time.perf_counter()
    engine = Engine(speculation=mode, gamma_max=gamma, **engine_kwargs)
    startup = time.perf_counter() - started
    try:
        def requests(n_tokens, part=None):
            return [TurnRequest(messages=p.messages, tools=p.tools, tool_choice="call", max_tokens=n_tokens,
                                request_id=f"{p.id}") for p in (prompts if part is None else part)]

        engine.generate(requests(1))  # warm-up: grammars compiled, prompt prefixes cached
        rows, outputs = [], {}
        for k, batch in enumerate(BATCHES):
            before, t_before = engine.stats(), time.time()
            # each batch size decodes its own half of the prompts: decoding the same prompts again would
            # hand suffix decoding's global tree (and ours) the answers it cached at the first batch size
            reqs = requests(max_tokens, prompts[k::len(BATCHES)])
            tokens = passes = 0
            decode_s = 0.0
            e2e = []
            for i in range(0, len(reqs), batch):
                group = engine.generate(reqs[i:i + batch])
                bad = [r.error for r in group if r.error]
                if bad:
                    raise RuntimeError(f"{mode}: {bad[0]}")
                first = min(r.timings["e2e_s"] - r.timings["decode_s"] for r in group)
                last = max(r.timings["e2e_s"] for r in group)
                decode_s += last - first
                tokens += sum(max(len(r.token_ids) - 1, 0) for r in group)
                e2e += [r.timings["e2e_s"] for r in group]
                passes += sum(r.passes for r in group)
                for r in group:
                    outputs[(batch, r.request_id)] = r.token_ids
            after = engine.stats()
            steps = engine.step_log(t_before, time.time())
            drafter = engine.proposer() if mode == "structure" else None
            drafter = drafter.stats() if drafter is not None and hasattr(drafter, "stats") else {}
            drafts = after["vllm"]["num_drafts"] - before["vllm"]["num_drafts"]
            accepted = after["vllm"]["num_accepted_tokens"] - before["vllm"]["num_accepted_tokens"]
            drafted = after["vllm"]["num_draft_tokens"] - before["vllm"]["num_draft_tokens"]
            step_s = after["step_s"] - before["step_s"]
            prop_s = after["proposer"]["proposer_s"] - before["proposer"]["proposer_s"]
            acc = {}
            for cls, c in after["acceptance"].items():
                b = before["acceptance"].get(cls, {"drafted": 0, "accepted": 0})
                acc[cls] = {"drafted": c["drafted"] - b["drafted"], "accepted": c["accepted"] - b["accepted"]}
            rows.append({
                "mode": mode, "gamma": gamma if mode != "off" else 0, "batch": batch, "prompts": len(reqs),
                "output_tokens": tokens, "decode_tok_s": tokens / decode_s if decode_s else 0.0,
                "e2e_s": sum(e2e) / len(e2e), "mean_accepted_len": 1.0 + accepted / drafts if drafts else 1.0,
                "draft_acceptance": accepted / drafted if drafted else 0.0,
                "proposer_share": prop_s / step_s if step_s and mode == "structure" else None,
                "acceptance_by_class": acc if mode != "off" else None, "startup_s": startup,
                # the engine's count of target passes per turn (prefill's included); beside it the older
                # estimate, output tokens − vLLM's accepted count, which misses the pass whose accepted
                # draft ended a turn and counts accepted tokens a stop dropped
                "passes": passes, "passes_from_tokens": tokens + len(reqs) - accepted,
                "drafted": drafted, "accepted": accepted,
                "steps": [{"t": st["t"], "rows": st["rows"], "drafted": st["drafted"]} for st in steps],
                # the budget's price of a draft token when the batch size ended (learned from step times)
                "drafter_delta": drafter.get("delta"), "drafter_delta_fit": drafter.get("delta_fit"),
                "drafter_delta_fit_se": drafter.get("delta_fit_se"), "drafter_errors": drafter.get("errors"),
            })
        return rows, outputs
    finally:
        engine.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--gammas", default="2,4,8", help="ngram draft lengths")
    ap.add_argument("--structure-gamma", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="32 prompts (16 per batch size), 64 tokens")
    ap.add_argument("--only", default="", help="comma-separated setting names to run (default: all)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON ('-' for stdout)")
    ap.add_argument("--one", metavar="SETTING", help=argparse.SUPPRESS)  # child: run one setting
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.max_tokens = 32, 64
    prompts = tool_call_prompts(args.prompts)
    todo = settings([int(g) for g in args.gammas.split(",")], args.structure_gamma)
    if args.one:
        _, mode, gamma = next(s for s in todo if s[0] == args.one)
        got, outputs = run_setting(mode, gamma, prompts, args.max_tokens, ENGINE_KWARGS)
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"rows": got, "outputs": {f"{b}/{rid}": ids for (b, rid), ids in outputs.items()}}, fh)
        return 0
    if args.only:
        keep = set(args.only.split(","))
        todo = [s for s in todo if s[0] in keep or s[0] == "off"]
    rows, reference = [], None
    for name, mode, _gamma in todo:
        print(f"== {name}", file=sys.stderr, flush=True)
        got, outputs = run_in_subprocess(name, args)
        if mode == "off":
            reference = outputs
        for row in got:
            row["setting"] = name
            if reference is not None:
                keys = [k for k in outputs if k.startswith(f"{row['batch']}/")]
                row["identical_to_off"] = sum(outputs[k] == reference.get(k) for k in keys)
        rows += got
    price = add_costs(rows)
    report = {"prompts": len(prompts), "max_tokens": args.max_tokens, "engine": ENGINE_KWARGS,
              "results": rows, "verify_price": price, "ratios": ratios(rows)}
    print_table(report)
    if args.json:
        text = json.dumps(report, indent=1)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
    return 0


def run_in_subprocess(name: str, args) -> tuple[list, dict]:
    """One engine per process: vLLM 0.32 on CPU cannot start a third engine in one process."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "setting.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--one", name, "--out", out,
               "--prompts", str(args.prompts), "--max-tokens", str(args.max_tokens), "--gammas", args.gammas,
               "--structure-gamma", str(args.structure_gamma)]
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"setting {name} failed:\n{done.stderr[-3000:]}")
        with open(out, encoding="utf-8") as fh:
            data = json.load(fh)
    return data["rows"], data["outputs"]


def add_costs(rows: list[dict]) -> dict | None:
    """cost = passes + δ̂·drafted per row, δ̂ at the row's own mean rows per step, fitted over every
    setting's step log of this run (the steps are dropped from the rows afterwards)."""
    price = verify_price({(r["setting"], r["batch"]): r["steps"] for r in rows if r.get("steps")})
    for r in rows:
        steps = r.pop("steps", None) or []
        delta = price_at(price, float(np.mean([s["rows"] for s in steps]))) if price and steps else 0.0
        r["delta_hat"], r["cost"] = delta, r["passes"] + delta * r["drafted"]
    return price


def ratios(rows: list[dict]) -> dict:
    """structure against off and against the best stock drafter (each measure picks its own best)."""
    out = {}
    for batch in BATCHES:
        by = {r["setting"]: r for r in rows if r["batch"] == batch}
        off = by.get("off")
        structure = next((v for k, v in by.items() if k.startswith("structure")), None)
        stock = [v for k, v in by.items() if k.split("-")[0] in STOCK]
        if structure is None:
            continue
        if off:
            out[f"b{batch}_structure_over_off_tok_s"] = structure["decode_tok_s"] / off["decode_tok_s"]
            out[f"b{batch}_structure_over_off_cost"] = off["cost"] / structure["cost"]
        if stock:
            fast = max(stock, key=lambda r: r["decode_tok_s"])
            cheap = min(stock, key=lambda r: r["cost"])
            out[f"b{batch}_structure_over_best_stock_tok_s ({fast['setting']})"] = \
                structure["decode_tok_s"] / fast["decode_tok_s"]
            out[f"b{batch}_structure_over_best_stock_cost ({cheap['setting']})"] = \
                cheap["cost"] / structure["cost"]
    return out


def print_table(report: dict) -> None:
    print(f"\nBFCL tool calls: {report['prompts']} prompts, max_tokens {report['max_tokens']}, "
          f"engine {report['engine']}")
    print(f"{'setting':16s} {'b':>2s} {'tok/s':>8s} {'e2e_s':>7s} {'acc_len':>7s} {'acc%':>6s} "
          f"{'prop%':>6s} {'same':>5s} {'passes':>7s} {'drafted':>7s} {'accept':>7s} {'cost':>8s}")
    for r in report["results"]:
        prop = f"{100 * r['proposer_share']:.1f}" if r["proposer_share"] is not None else "-"
        print(f"{r['setting']:16s} {r['batch']:>2d} {r['decode_tok_s']:8.1f} {r['e2e_s']:7.2f} "
              f"{r['mean_accepted_len']:7.2f} {100 * r['draft_acceptance']:6.1f} {prop:>6s} "
              f"{r.get('identical_to_off', '-')!s:>5s} {r['passes']:7d} {r['drafted']:7d} {r['accepted']:7d} "
              f"{r['cost']:8.1f}")
    for k, v in report["ratios"].items():
        print(f"{k}: {v:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
