"""Drafters compared offline on real agent turns: the structure drafter vs vLLM's ngram proposer.

Step 1 (`--capture`, needs the engine, ≈ 80 s): replay the bundled arm-D traces with speculation off
(b=8) and save every turn's prompt and output token ids and its grammar. Step 2 (no engine, seconds):
replay those turns through each drafter with greedy verification simulated against the recorded
outputs (at temperature 0 the target writes the same tokens whatever was drafted): each step every
active row gets a draft, trimmed to the request grammar as vLLM does before verifying (turns files
captured without grammars are replayed untrimmed); the draft's common prefix with the real
continuation is accepted, plus one token.

Reported per drafter: target passes (per row), drafted and accepted tokens, and a cost in passes,
`passes + delta * drafted` (delta = cost of one extra verified token per row of a pass: 0.2 at 8 rows
by the bench's step-log fit on 2 CPU cores, 3.2 ms per drafted token against 73 ms per pass + 6.6 ms
per row), whose ratio to `off` predicts the decode speedup. The `oracle` row drafts exactly the next
gamma tokens the target writes: no drafter can do better at that gamma, so `oracle ÷ ngram` bounds
what any drafter can gain over ngram on these turns.

    flock /tmp/agentspec-engine.lock python benchmarks/offline_drafting.py --capture turns.json
    python benchmarks/offline_drafting.py turns.json [--gamma 8] [--delta 0.2] [--json]
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def capture(path: str, episodes: int, segments: int, max_tokens: int) -> None:
    from agentspec_sdk.backends.model_bundle import load_tokenizer
    from agentspec_sdk.backends.vllm_engine import Engine
    from agentspec_sdk.replay.arms import build_arm
    from agentspec_sdk.replay.replayer import replay
    from agentspec_sdk.replay.runner import _unique_tools
    from agentspec_sdk.structure.formats import CODE_AGENT, REACT, TOOL_CALLS

    arm = build_arm("D", episodes, max_tokens=max_tokens, max_segments=segments)
    tools = _unique_tools([arm])
    engine = Engine(speculation="off", formats=[REACT, TOOL_CALLS, CODE_AGENT], enforce_eager=True)
    engine.register_tools(tools)
    turns: list[dict] = []
    grammars: list[str] = []
    submit = engine.submit

    def recording_submit(req):
        grammar = req.grammar if req.grammar is not None else engine.grammar_for(req.fmt, req.tools, req.tool_choice)
        if grammar not in grammars:
            grammars.append(grammar)
        index = grammars.index(grammar)
        future = submit(req)
        future.add_done_callback(lambda f: turns.append(
            {"prompt": f.result().prompt_token_ids, "out": f.result().token_ids, "grammar": index}))
        return future

    engine.submit = recording_submit
    try:
        replay(engine, arm.episodes, tokenizer=load_tokenizer(None), concurrency=8, max_tokens=max_tokens,
               max_segments=segments)
    finally:
        engine.close()
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"tools": tools, "grammars": grammars, "turns": turns}, fh)
    print(f"{len(turns)} turns, {sum(len(t['out']) for t in turns)} output tokens -> {path}")


def ngram_drafter(gamma: int, n_min: int = 2, n_max: int = 5):
    from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as find

    def propose(histories: list[np.ndarray]) -> list[list[int]]:
        return [list(find(h.astype(np.int32), n_min, n_max, 1 << 20, gamma)) for h in histories]
    return propose


class GrammarTrim:
    """What vLLM does to every draft before verifying it: keep the prefix the request's grammar accepts
    (`validate_tokens` on the turn's llguidance matcher, advanced over the tokens written so far)."""

    def __init__(self, grammars: list[str]):
        import llguidance
        import llguidance.hf
        from transformers import AutoTokenizer

        from agentspec_sdk.backends.model_bundle import resolve_model

        self._llguidance = llguidance
        self.ll = llguidance.hf.from_tokenizer(AutoTokenizer.from_pretrained(resolve_model(None)))
        self.grammars = grammars
        self._matchers: dict[int, tuple] = {}  # id(turn) -> (matcher, tokens consumed)

    def __call__(self, turn: dict, pos: int, draft: list[int]) -> list[int]:
        grammar = self.grammars[turn["grammar"]] if self.grammars and "grammar" in turn else ""
        if not grammar or not draft:
            return draft
        key = id(turn)
        if key not in self._matchers:
            self._matchers[key] = (self._llguidance.LLMatcher(self.ll, grammar, log_level=0), 0)
        matcher, done = self._matchers[key]
        if pos > done:
            matcher.consume_tokens(turn["out"][done:pos])
            self._matchers[key] = (matcher, pos)
        if matcher.is_stopped() or matcher.is_error():
            return []
        return draft[: matcher.validate_tokens(draft)]


def structure_drafter(gamma: int, tools: list[dict]):
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.drafting.drafter import RowInput, StructureDrafter
    from agentspec_sdk.drafting.plan import DraftPlan
    from agentspec_sdk.structure.formats import CODE_AGENT, REACT, TOOL_CALLS

    model = resolve_model(None)
    # learn_delta off: the simulated steps have no target pass to time
    plan = DraftPlan(formats=[REACT, TOOL_CALLS, CODE_AGENT], tools=tools, tokenizer=model, gamma_max=gamma,
                     learn_delta=False)
    drafter = StructureDrafter(plan, AutoTokenizer.from_pretrained(model))
    return lambda histories: drafter.propose([RowInput(h) for h in histories])


def simulate(turns: list[dict], propose, batch: int, gamma: int = 0, trim=None) -> dict:
    """`propose=None`: the oracle, which drafts the next `gamma` tokens the target will write (the
    bound no drafter can beat at this gamma). `trim(turn, pos, draft)`: what is left of a draft
    after the request grammar (GrammarTrim), as vLLM verifies it."""
    passes = drafted = accepted = 0
    for g in range(0, len(turns), batch):
        group = turns[g:g + batch]
        pos = [1] * len(group)  # the first output token comes from the prefill pass
        while True:
            active = [i for i, t in enumerate(group) if pos[i] < len(t["out"])]
            if not active:
                break
            histories = [np.asarray(group[i]["prompt"] + group[i]["out"][:pos[i]]) for i in active]
            drafts = propose(histories) if propose else [group[i]["out"][pos[i]:pos[i] + gamma] for i in active]
            for i, draft in zip(active, drafts, strict=True):
                if trim is not None:
                    draft = trim(group[i], pos[i], [int(t) for t in draft])
                truth = group[i]["out"][pos[i]:]
                a = 0
                while a < len(draft) and a < len(truth) and int(draft[a]) == truth[a]:
                    a += 1
                pos[i] = min(len(group[i]["out"]), pos[i] + a + 1)
                drafted += len(draft)
                accepted += a
                passes += 1
    return {"passes": passes, "drafted": drafted, "accepted": accepted}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("turns", help="turns file (written by --capture)")
    ap.add_argument("--capture", action="store_true", help="run the off engine and write the turns file")
    ap.add_argument("--episodes", type=int, default=12)
    ap.add_argument("--segments", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--delta", type=float, default=0.2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.capture:
        capture(args.turns, args.episodes, args.segments, args.max_tokens)
        return
    with open(args.turns, encoding="utf-8") as fh:
        data = json.load(fh)
    turns = data["turns"]
    tokens = sum(len(t["out"]) - 1 for t in turns)
    rows = {"off": {"passes": tokens, "drafted": 0, "accepted": 0}}
    grammars = data.get("grammars", [])  # one GrammarTrim per replay: its matchers advance with the turns
    rows["ngram"] = simulate(turns, ngram_drafter(args.gamma), args.batch, trim=GrammarTrim(grammars))
    rows["structure"] = simulate(turns, structure_drafter(args.gamma, data["tools"]), args.batch,
                                 trim=GrammarTrim(grammars))
    rows["oracle"] = simulate(turns, None, args.batch, args.gamma)
    for row in rows.values():
        row["cost"] = row["passes"] + args.delta * row["drafted"]
        row["predicted_speedup"] = rows["off"]["passes"] / row["cost"]
    if args.json:
        print(json.dumps({"turns": len(turns), "tokens": tokens, "gamma": args.gamma, "delta": args.delta,
                          "rows": rows}, indent=1))
        return
    print(f"{len(turns)} turns, {tokens} output tokens after the first, γ={args.gamma}, delta={args.delta}")
    print(f"{'drafter':<10} {'passes':>7} {'drafted':>8} {'accepted':>9} {'cost':>7} {'× off':>6}")
    for name, r in rows.items():
        print(f"{name:<10} {r['passes']:>7} {r['drafted']:>8} {r['accepted']:>9} {r['cost']:>7.0f} "
              f"{r['predicted_speedup']:>6.2f}")
    print(f"structure ÷ ngram (cost): {rows['ngram']['cost'] / rows['structure']['cost']:.2f}; "
          f"oracle ÷ ngram: {rows['ngram']['cost'] / rows['oracle']['cost']:.2f}")


if __name__ == "__main__":
    main()
