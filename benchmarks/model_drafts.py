"""Model drafters on this machine: per layer-truncated draft (`agentspec draft make --layers K`) the
measured draft cost d and the acceptance per law class, and the model drafter modes against `off`.

Each engine runs in a process of its own (vLLM tears down process-wide state when an engine closes),
on the BFCL tool-call prompts the engine tests use, at temperature 0.

d = (draft-model time per step ÷ γ) ÷ (target pass time), where the draft-model time is what vLLM's
draft model spent in `propose_draft_token_ids` (timed by our layer, backends.inside_vllm.vllm_hybrid) and the
target pass time is the mean decode-only engine step (no prefill in it) less the drafting time.

Run (the engine lock, one CPU engine at a time):
  flock /tmp/agentspec-engine.lock python benchmarks/model_drafts.py --layers 4,8,12 \
      --modes off,draft_model,suffix,structure,draft_model+cut,structure+draft_model --prompts 4 \
      --out model_drafts.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

MODEL_MODES = ("draft_model", "draft_model+cut", "structure+draft_model")
CHILD = r"""
import json, sys, time
from agentspec_sdk.backends.embedded.vllm_engine import Engine, TurnRequest
from agentspec_sdk.bfcl import tool_call_prompts

mode, draft = sys.argv[1], sys.argv[2]
n, max_tokens, gamma = (int(x) for x in sys.argv[3:6])
prompts = tool_call_prompts(n)
kw = {} if mode == "off" else {"gamma_max": gamma}
if draft != "-":
    kw["draft_model"] = draft
with Engine(speculation=mode, **kw) as engine:
    reqs = [TurnRequest(messages=p.messages, tools=p.tools, tool_choice="call", max_tokens=max_tokens,
                        request_id=p.id) for p in prompts]
    engine.generate(reqs[:1])  # warm-up, not timed
    began = time.time()
    results = engine.generate(reqs)
    wall = time.time() - began
    passes = engine.pass_log(began, time.time())
    prop = engine.proposer()
    stats = engine.stats()
    print(json.dumps({"results": [[r.request_id, r.error, r.token_ids, r.passes] for r in results],
                      "wall_s": wall,
                      "passes": passes, "vllm": stats["vllm"], "acceptance": stats["acceptance"],
                      "proposer": prop.stats() if prop is not None and hasattr(prop, "stats") else None},
                     default=str))
"""


def run_child(mode: str, draft: str, n: int, max_tokens: int, gamma: int) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, mode, draft, str(n), str(max_tokens), str(gamma)],
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{mode} {draft}: failed\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def draft_cost(out: dict, gamma: int) -> dict:
    """d and the times it comes from (None where the mode runs no draft model)."""
    prop = out.get("proposer") or {}
    decode = [p for p in out["passes"] if not p.get("prefill") and not p.get("new") and p.get("rows")]
    mean_pass = sum(p["s"] for p in decode) / len(decode) if decode else None
    steps = prop.get("model_draft_steps") or 0
    if not steps or not mean_pass:
        return {"mean_decode_pass_s": mean_pass}
    model_step = prop["model_draft_s"] / steps
    ours = prop.get("adapter_s", 0.0) / max(prop.get("adapter_steps") or 1, 1)
    target = mean_pass - model_step - ours
    return {"mean_decode_pass_s": mean_pass, "model_draft_step_s": model_step, "layer_step_s": ours,
            "target_pass_s": target, "d": (model_step / gamma) / target if target > 0 else None}


def summarize(mode: str, layers: int | None, out: dict, off: dict | None, gamma: int) -> dict:
    tokens = sum(len(r[2]) for r in out["results"])
    vllm = out["vllm"]
    drafted, accepted = vllm.get("num_draft_tokens", 0), vllm.get("num_accepted_tokens", 0)
    row = {"mode": mode, "layers": layers, "output_tokens": tokens, "drafted": drafted, "accepted": accepted,
           "passes": sum(r[3] for r in out["results"]), "wall_s": out["wall_s"],
           "tok_s": tokens / out["wall_s"] if out["wall_s"] else None,
           "by_class": out["acceptance"], **draft_cost(out, gamma)}
    if off is not None:
        row["identical_to_off"] = [a[2] == b[2] for a, b in zip(out["results"], off["results"], strict=True)]
    prop = out.get("proposer") or {}
    for key in ("model_chosen", "structure_chosen", "model_cut_tokens", "by_source"):
        if key in prop:
            row[key] = prop[key]
    return row


# the declared platform (docs/law.md): one H200, a 32B target and a 4B same-family draft; a draft pass
# costs about η × 4/32 of a target pass (memory-bound decode, η the draft's efficiency against the
# target's): d ≈ η/8. δ: the plan's prior (verify cost of one more token per row, in target passes).
H200_D = {"eta=1": 1 / 8, "eta=0.5": 1 / 16}
DELTA = 0.02


def law_table(rows: list[dict], gamma: int) -> list[dict]:
    """Per speculative run, from the run's own rounds (records): τ = accepted per round, γ̄ = sent per
    round. d = (draft-model time per step ÷ γ) ÷ c_T with c_T the off engine's mean decode pass (one
    target pass, no drafts). A model drafter spends γ draft passes per row-pass whatever is sent, so
    its drafted tokens are γ · passes. cost = passes + d · that; the law's speedup is
    (τ+1) / (1 + γ̄ δ + γ_m d) (γ_m = γ for a model drafter, 0 otherwise) against the cost speedup and
    the measured decode tok/s ratio; the declared platform's prediction takes the same τ, γ̄ at
    d ≈ η/8 (H200_D)."""
    off = next((r for r in rows if r["mode"] == "off"), None)
    c_t = off.get("mean_decode_pass_s") if off else None
    out = []
    for r in rows:
        if r["mode"] == "off":
            continue
        model = r.get("model_draft_step_s") is not None
        d = r["model_draft_step_s"] / gamma / c_t if model and c_t else 0.0
        model_drafted = gamma * r["passes"] if model else 0
        classes = (r.get("by_class") or {}).values()
        rounds = sum(c.get("rounds", 0) for c in classes)
        tau = sum(c.get("accepted", 0) for c in classes) / rounds if rounds else None
        g = sum(c.get("drafted", 0) for c in classes) / rounds if rounds else None
        cost = r["passes"] + d * model_drafted
        row = {"mode": r["mode"], "layers": r["layers"], "passes": r["passes"], "drafted": r["drafted"],
               "accepted": r["accepted"], "model_drafted": model_drafted, "d": d if model else None,
               "cost": cost, "cost_005": r["passes"] + 0.05 * r["drafted"], "tau": tau, "gamma_bar": g,
               "tok_s": r["tok_s"]}
        if off is not None:
            row["cost_speedup"] = off["output_tokens"] / cost if cost else None
            row["measured_speedup"] = r["tok_s"] / off["tok_s"] if off["tok_s"] else None
        if tau is not None:
            g_m = gamma if model else 0
            row["law_speedup"] = (tau + 1) / (1 + g * DELTA + g_m * d)
            row["h200_prediction"] = {k: (tau + 1) / (1 + g * DELTA + g_m * v) for k, v in H200_D.items()}
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="4,8,12", help="draft depths measured with speculation=draft_model")
    ap.add_argument("--modes", default="off,draft_model,draft_model+cut,structure+draft_model")
    ap.add_argument("--mode-layers", type=int, default=8, help="the draft the +cut / hybrid modes use")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("model_drafts.json"))
    args = ap.parse_args()
    from agentspec_sdk.backends.serving.draft_models import make_truncated_draft

    depths = [int(x) for x in args.layers.split(",") if x]
    modes = [m for m in args.modes.split(",") if m]
    plan = [("off", None)] if "off" in modes else []
    plan += [("draft_model", k) for k in depths] if "draft_model" in modes else []
    plan += [(m, args.mode_layers if m in MODEL_MODES else None) for m in modes
             if m not in ("off", "draft_model")]
    rows, off = [], None
    for mode, k in plan:
        draft = str(make_truncated_draft(k)) if k is not None else "-"
        started = time.time()
        out = run_child(mode, draft, args.prompts, args.max_tokens, args.gamma)
        if mode == "off":
            off = out
        rows.append(summarize(mode, k, out, off if mode != "off" else None, args.gamma))
        shown = {k2: v for k2, v in rows[-1].items() if k2 != "by_source"}
        print(json.dumps(shown), f"({time.time() - started:.0f} s)", flush=True)
    law = law_table(rows, args.gamma)
    for r in law:
        print(json.dumps(r), flush=True)
    args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "rows": rows, "law": law},
                                   indent=1))


if __name__ == "__main__":
    main()
