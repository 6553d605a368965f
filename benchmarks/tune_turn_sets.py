"""`agentspec tune` on the bundled turn sets: each capture (tests/data/*.capture.jsonl, or a turns file of
the format before captures, `*_turns.json`, converted here), tuned at each γ and batch, and the held-out
result per set: the policy chosen per segment kind and best stock ÷ structure-tuned in cost (> 1:
structure-tuned cheaper; each tuned on the fitting part). `--repeat N` copies the turns N times as
distinct episodes (the scale check: `agentspec tune` on 10,000 captured turns).

  python benchmarks/tune_turn_sets.py tests/data/tool_calls.capture.jsonl ... [--gammas 8,16] [--batches 1,8]
  python benchmarks/tune_turn_sets.py tests/data/code.capture.jsonl --repeat 323 --gammas 8 --batches 8
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from agentspec_sdk.backends.capture import CaptureWriter, Grammar, read_capture
from agentspec_sdk.backends.model_bundle import resolve_model
from agentspec_sdk.drafting.plan import DraftPlan
from agentspec_sdk.tuning.choose import CLEAR_WIN_SE
from agentspec_sdk.tuning.episodes import episodes_of, turn_set
from agentspec_sdk.tuning.tuner import TuneOptions, tune


def source_turns(path: str) -> list[dict]:
    """The turns of a capture, or of a turns file of the earlier format (`{"turns", "grammars", "tools"}`,
    Lark grammars by index), as {prompt, out, grammar, fmt, tools}."""
    if not path.endswith(".json"):
        return [{"prompt": t.prompt, "out": t.out, "grammar": t.grammar, "fmt": t.format, "tools": t.tools}
                for t in read_capture([path]).turns]
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    grammars = data.get("grammars", [])
    out = []
    for t in data["turns"]:
        text = grammars[t["grammar"]] if grammars and t.get("grammar") is not None else ""
        grammar = Grammar("lark", text) if text else None
        out.append({"prompt": t["prompt"], "out": t["out"], "grammar": grammar,
                    "fmt": t.get("fmt"), "tools": data.get("tools") or None})
    return out


def write_capture(turns: list[dict], directory: Path, repeat: int = 1) -> int:
    """The turns as a capture in `directory`; with `repeat` > 1, each copy's episodes keyed apart."""
    episode = episodes_of([{"prompt": t["prompt"], "out": t["out"]} for t in turns])
    writer = CaptureWriter(directory, writer="replay", model=resolve_model(None), max_bytes=1 << 30)
    n = 0
    for copy in range(repeat):
        for j, t in enumerate(turns):
            writer.write_turn(id=f"{copy}-{j}", episode=f"{copy}-{episode[j]}" if repeat > 1 else None,
                              prompt=t["prompt"], out=t["out"], temperature=0.0, grammar=t["grammar"],
                              format=t["fmt"], tools=t["tools"], started=None, finished=None,
                              finish_reason=None)
            n += 1
    writer.close()
    return n


def base_plan(turns: list[dict]) -> DraftPlan | None:
    """Arm A's prose format for prose turns (the bench's engine adds it the same way)."""
    if not any(t["fmt"] == "prose" for t in turns):
        return None
    from agentspec_sdk.replay.arms import PROSE
    from agentspec_sdk.structure.formats import TOOL_CALLS
    return DraftPlan(formats=[TOOL_CALLS.to_dict(), PROSE.to_dict()])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("turns", nargs="+")
    ap.add_argument("--gammas", default="8,16")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--delta", type=float, default=0.2)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--oracle", action="store_true",
                    help="also the bound: each kind's cheapest policy chosen on the held-out part itself")
    ap.add_argument("--clear-win-se", type=float, default=CLEAR_WIN_SE,
                    help="the clear-win rule's constant (agentspec_sdk/tuning/choose.py)")
    ap.add_argument("--kind-default", default="class", choices=("class", "trees"),
                    help="the policy a kind keeps unless another clearly wins (TuneOptions.kind_default)")
    ap.add_argument("--json", help="write every result here")
    args = ap.parse_args()
    results = []
    print("| set | γ | b | turns | held-out: structure-tuned | best stock | best stock ÷ tuned "
          "| chosen per kind | least cost would choose | differs on held-out | oracle: best stock ÷ it | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for path in args.turns:
        with tempfile.TemporaryDirectory() as tmp:
            turns = source_turns(path)
            n = write_capture(turns, Path(tmp), args.repeat)
            base = base_plan(turns)
            known = [] if base is None else [f for f in base.agent_formats()]
            for gamma in (int(g) for g in args.gammas.split(",")):
                for batch in (int(b) for b in args.batches.split(",")):
                    ts = turn_set(read_capture([tmp]), known)
                    began = time.perf_counter()
                    r = tune(ts, TuneOptions(gamma=gamma, batch=batch, delta=args.delta, jobs=args.jobs,
                                             model=resolve_model(None), oracle=args.oracle,
                                             clear_win_se=args.clear_win_se,
                                             kind_default=args.kind_default), base)
                    h, o = r["held_out_summary"], r["held_out_oracle"]
                    bound = f"{o['best_stock_over_oracle']:.3f} ({o['plan']})" if o else "–"
                    name = Path(path).name.split(".")[0]
                    print(f"| {name} | {gamma} | {batch} | {n} | {h['structure_tuned']:.1f} | "
                          f"{h['best_stock']} {h['best_stock_cost']:.1f} | "
                          f"{h['best_stock_over_tuned']:.3f} | "
                          f"{r['plan_choice']}: {r['choice']} | {r['least_cost_choice']} | "
                          f"{r['stability'] or '–'} | {bound} | "
                          f"{time.perf_counter() - began:.0f} |",
                          flush=True)
                    results.append({"set": path, **r})
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
