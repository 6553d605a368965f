"""Drafting in the native tool-call formats: structure vs vLLM's suffix decoding, per call syntax.

`benchmarks/offline_drafting.py` replays only the SDK's own formats (react / tool_calls / code_agent),
so this runs the engine: one engine per drafter (`structure`, `suffix`; γ = 8), each decoding the same
BFCL prompts (tools with Python-identifier names, so that the Python-call syntaxes can name them) as
call-only turns (`tool_choice="call"`) in each native format, the format's turn grammar forcing its
syntax, at temperature 0, all prompts of a format submitted together.

    flock /tmp/agentspec-engine.lock env VLLM_CPU_KVCACHE_SPACE=1 \
        python benchmarks/native_drafting.py [--prompts 6] [--max-tokens 64] [--json out.json]

`--replay FILE` (no engine, a minute): the turns of a `--json` file replayed offline through the
structure drafter and vLLM's suffix proposer with `offline_drafting.simulate` (greedy verification
simulated against the recorded outputs, no grammar trim), e.g. to compare two versions of the drafter
on the same turns (`PYTHONPATH=<other tree>`).

Per format and drafter: the deterministic counts, target passes (Σ output tokens − accepted: every
pass writes its accepted tokens plus one), drafted and accepted tokens, cost = passes + 0.05·drafted,
and how many outputs are token-identical between the two drafters (greedy: all should be).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

MODES = ("structure", "suffix")
DELTA = 0.05  # cost of one drafted token, in target passes (the project's reporting convention)
ENGINE_KWARGS = {"max_model_len": 2048, "kv_cache_gb": 1.0, "seed": 0}
_PY_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def prompts(n: int):
    from agentspec_sdk.bfcl import tool_call_prompts

    pool = tool_call_prompts(8 * n)
    return [p for p in pool if all(_PY_NAME.fullmatch(t["function"]["name"]) for t in p.tools)][:n]


def run_mode(mode: str, n: int, max_tokens: int, gamma: int) -> dict:
    """One engine: every native format's turns, counts per format (deltas of the engine's totals)."""
    from agentspec_sdk.backends.embedded.vllm_engine import Engine
    from agentspec_sdk.backends.types import TurnRequest
    from agentspec_sdk.structure.formats import NATIVE_FORMATS

    chosen = prompts(n)
    engine = Engine(speculation=mode, gamma_max=gamma, formats=list(NATIVE_FORMATS), **ENGINE_KWARGS)
    try:
        def requests(fmt, n_tokens):
            return [TurnRequest(messages=p.messages, tools=p.tools, fmt=fmt.name, tool_choice="call",
                                max_tokens=n_tokens, request_id=f"{fmt.name}/{p.id}") for p in chosen]

        for fmt in NATIVE_FORMATS:  # warm-up: grammars compiled, prompt prefixes cached
            engine.generate(requests(fmt, 1))
        out = {}
        for fmt in NATIVE_FORMATS:
            before = engine.stats()["vllm"]
            results = engine.generate(requests(fmt, max_tokens))
            bad = [r.error for r in results if r.error]
            if bad:
                raise RuntimeError(f"{mode}/{fmt.name}: {bad[0]}")
            after = engine.stats()["vllm"]
            accepted = after["num_accepted_tokens"] - before["num_accepted_tokens"]
            drafted = after["num_draft_tokens"] - before["num_draft_tokens"]
            tokens = sum(len(r.token_ids) for r in results)
            passes = sum(r.passes for r in results)  # the engine's count per turn
            out[fmt.name] = {"turns": len(results), "output_tokens": tokens, "passes": passes,
                             "drafted": drafted, "accepted": accepted,
                             "cost": passes + DELTA * drafted,
                             "outputs": {r.request_id: r.token_ids for r in results},
                             "sample": results[0].text[:160]}
        return out
    finally:
        engine.close()


def replay(path: str, n: int, gamma: int) -> dict:
    """The recorded turns of `path` (its first drafter's outputs) replayed offline, per format."""
    import offline_drafting as od
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.embedded.vllm_engine import prompt_token_ids
    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.backends.types import TurnRequest
    from agentspec_sdk.drafting.drafter import StructureDrafter
    from agentspec_sdk.drafting.plan import DraftPlan
    from agentspec_sdk.structure.formats import NATIVE_FORMATS
    from agentspec_sdk.structure.tools import ToolRegistry

    with open(path, encoding="utf-8") as fh:
        recorded = next(iter(json.load(fh).values()))
    model = resolve_model(None)
    tok = AutoTokenizer.from_pretrained(model)
    chosen = prompts(n)
    tools = list({t["function"]["name"]: t for p in chosen for t in p.tools}.values())
    out = {}
    for fmt in NATIVE_FORMATS:
        turns = []
        for p in chosen:
            req = TurnRequest(messages=p.messages, tools=p.tools, fmt=fmt.name, tool_choice="call")
            turns.append({"prompt": prompt_token_ids(tok, req, fmt, ToolRegistry(p.tools), 1 << 20),
                          "out": recorded[fmt.name]["outputs"][f"{fmt.name}/{p.id}"], "fmt": fmt.name})
        plan = DraftPlan(formats=list(NATIVE_FORMATS), tools=tools, tokenizer=model, gamma_max=gamma,
                         learn_delta=False)
        drafters = {"structure": od.StructureCall(StructureDrafter(plan, tok)),
                    "suffix": od.SuffixDrafter(gamma)}
        for mode, propose in drafters.items():
            r = od.simulate(turns, propose, batch=len(turns), gamma=gamma)
            out.setdefault(mode, {})[fmt.name] = {
                "turns": len(turns), "output_tokens": sum(len(t["out"]) for t in turns),
                "passes": r["passes"], "drafted": r["drafted"], "accepted": r["accepted"],
                "cost": r["passes"] + DELTA * r["drafted"], "outputs": {}}
    return out


def run_in_subprocess(mode: str, args) -> dict:
    """One engine per process (vLLM 0.32 on CPU does not start a second engine cleanly in one)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "mode.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--one", mode, "--out", path, "--prompts",
               str(args.prompts), "--max-tokens", str(args.max_tokens), "--gamma", str(args.gamma)]
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{mode} failed:\n{done.stderr[-3000:]}")
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)


def table(results: dict, modes: tuple[str, ...] = MODES) -> str:
    lines = [f"{'format':<16} {'drafter':<10} {'turns':>5} {'tokens':>6} {'passes':>6} {'drafted':>7} "
             f"{'accepted':>8} {'cost':>7} {'same':>5}"]
    for name in results[modes[0]]:
        ref = results[modes[0]][name]["outputs"]
        for mode in modes:
            r = results[mode][name]
            same = sum(ids == ref.get(k) for k, ids in r["outputs"].items())  # 0 in a replay
            lines.append(f"{name:<16} {mode:<10} {r['turns']:>5} {r['output_tokens']:>6} {r['passes']:>6} "
                         f"{r['drafted']:>7} {r['accepted']:>8} {r['cost']:>7.1f} {same:>5}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=8)
    ap.add_argument("--modes", default=",".join(MODES), help="drafters to run (first: the reference)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--replay", metavar="FILE", help="replay a --json file offline (no engine)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # child: run one drafter
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        got = run_mode(args.one, args.prompts, args.max_tokens, args.gamma)
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(got, fh)
        return 0
    modes = tuple(args.modes.split(","))
    if args.replay:
        results = replay(args.replay, args.prompts, args.gamma)
        print(table(results, tuple(m for m in modes if m in results)))
        return 0
    results = {}
    for mode in modes:
        print(f"== {mode}", file=sys.stderr, flush=True)
        results[mode] = run_in_subprocess(mode, args)
    print(table(results, modes))
    for name, r in results[modes[0]].items():
        print(f"{name}: {r['sample']!r}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
