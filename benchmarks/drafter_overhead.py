"""Drafter cost and coverage on BFCL tool calls, without vLLM.

Simulates greedy verification against a known target (the canonical tokenization of the BFCL ground
truth call written in the tool-call grammar's serialisation): each step the drafter proposes, the
draft's common prefix with the target is accepted, plus one token from the "target". Reports

- coverage: share of call tokens that arrived as accepted draft tokens, per source (forced / lookup),
  against llguidance's own `compute_ff_tokens` fed with the same tokens (the conservative baseline);
- forward passes per call (tokens ÷ passes = ideal speedup from these drafts alone);
- proposer time in µs per row per step at b=1 and b=8, and as a share of a decode step
  (`--step-ms`, default from docs measured on this machine: 100 ms at b=1, 195 ms at b=8).

    python benchmarks/drafter_overhead.py [--cases 35] [--json]

`--contexts 1000,3000,6000`: proposer ms per step by context length instead. The longest prompt of the
long-context traces (agentspec_sdk/replay/traces/bfcl_long_context.jsonl, 7k tokens as the engine
renders it) is cut in the middle to each length (its head, the system prompt and tools, and its last
400 tokens, the latest messages and the assistant prefix, kept); `--batch` rows each replay one
recorded assistant turn of those traces after it with greedy verification simulated. Reported: the
proposer's time per step after the first (which builds each row's state), and the work counters of
`context_work` (tokens decoded, characters segmented, corpus characters searched, ...), which are what
the test of per-step work independent of context length counts. `--profile`: cProfile's top entries.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


def bfcl_cases(per_category: int):
    from agentspec_sdk.bfcl import openai_tool, read_jsonl
    from agentspec_sdk.structure.tools import ToolRegistry

    cases = []
    for cat in ("simple_python", "multiple", "live_multiple"):
        questions = read_jsonl(f"BFCL_v4_{cat}.json")
        answers = {a["id"]: a for a in read_jsonl(f"possible_answer/BFCL_v4_{cat}.json")}
        taken = 0
        for q in questions:
            if taken >= per_category or q["id"] not in answers:
                continue
            try:
                tools = [openai_tool(doc) for doc in q["function"]]
                registry = ToolRegistry(tools)
            except Exception:
                continue
            (name, args), = answers[q["id"]]["ground_truth"][0].items()
            if name not in registry:
                continue
            props = registry.get(name).parameters.get("properties", {})
            arguments = {}
            for key in props:
                options = args.get(key)
                if options and options[0] != "":
                    arguments[key] = options[0]
            user = q["question"][0][-1]["content"]
            cases.append({"id": q["id"], "tools": tools, "registry": registry, "user": user,
                          "call": {"name": name, "arguments": arguments}})
            taken += 1
    return cases


def serialise(call: dict, grammar: str, ll) -> str | None:
    """The call in whichever JSON spacing the grammar accepts (None if none)."""
    import llguidance

    for seps in ((", ", ": "), (",", ":")):
        text = json.dumps(call, ensure_ascii=False, separators=seps)
        m = llguidance.LLMatcher(ll, grammar, log_level=0)
        toks = ll.tokenize_str(text)
        if m.try_consume_tokens(toks) == len(toks) and m.is_accepting():
            return text
    return None


def ff_tokens_baseline(grammar: str, ll, call_tokens: list[int]) -> tuple[int, int]:
    """(accepted forced tokens, passes) when drafting only llguidance's compute_ff_tokens."""
    import llguidance

    m = llguidance.LLMatcher(ll, grammar, log_level=0)
    k = accepted = passes = 0
    while k < len(call_tokens):
        draft = m.compute_ff_tokens()
        a = 0
        while a < len(draft) and k + a < len(call_tokens) and draft[a] == call_tokens[k + a]:
            a += 1
        step = call_tokens[k:k + a + 1]
        if m.try_consume_tokens(step) != len(step):
            break
        accepted += a
        passes += 1
        k += len(step)
    return accepted, passes


def simulate(drafter_cls, row_input, plan_cls, tok, case, grammar_fn, *, batch: int, lookup: bool,
             gamma: int = 8):
    from agentspec_sdk.bfcl import system_prompt

    plan = plan_cls(tools=case["tools"], gamma_max=gamma)
    drafter = drafter_cls(plan, tok)
    if not lookup:
        drafter.choice.own._lookup = lambda *a, **k: ("", "", 0)  # (text, follow, matched chars): no match
    msgs = [{"role": "system", "content": system_prompt()},
            {"role": "user", "content": case["user"]}]
    prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    body = serialise(case["call"], grammar_fn(case["registry"]), drafter.ll)
    if body is None:
        return None
    out = f"<tool_call>{body}</tool_call><|im_end|>"
    target = tok.encode(prompt + out)
    start = len(tok.encode(prompt))
    # b rows of the same call, staggered so they sit at different positions
    ks = [start + (i * 3) % max(1, len(target) - start - 1) for i in range(batch)]
    passes = [0] * batch
    by_source: dict[str, int] = {}
    steps_time = []
    while any(k < len(target) for k in ks):
        live = [i for i, k in enumerate(ks) if k < len(target)]
        rows = [row_input(np.array(target[:ks[i]], dtype=np.int32)) for i in live]
        t0 = time.perf_counter()
        drafts = drafter.propose(rows)
        steps_time.append((time.perf_counter() - t0, len(rows)))
        for i, draft in zip(live, drafts, strict=True):
            k = ks[i]
            a = 0
            while a < len(draft) and k + a < len(target) and draft[a] == target[k + a]:
                a += 1
            ks[i] = k + a + 1
            passes[i] += 1
    drafter.propose([row_input(np.array(target, dtype=np.int32))] * 1)
    # the JSON object's tokens in the target (between <tool_call> and </tool_call>)
    json_lo = len(tok.encode(prompt + "<tool_call>"))
    json_hi = json_lo + len(tok.encode(body))
    in_json = 0
    for r in drafter.records:
        by_source[r.source] = by_source.get(r.source, 0) + r.accepted
        lo, hi = r.position, r.position + r.accepted
        in_json += max(0, min(hi, json_hi) - max(lo, json_lo))
    call_tokens = target[start:]
    base_acc, base_passes = ff_tokens_baseline(
        grammar_fn(case["registry"]), drafter.ll, tok.encode(body))
    return {
        "tokens": len(call_tokens), "passes": passes[0], "accepted": by_source,
        "json_tokens": len(tok.encode(body)), "ff_baseline_accepted": base_acc, "accepted_in_json": in_json,
        "us_per_row": [1e6 * t / n for t, n in steps_time[2:]],
        "stats": drafter.stats(),
    }


LONG_TRACES = "bfcl_long_context.jsonl"


def long_context_rows(lengths: list[int], batch: int, tail: int = 400):
    """{length: (prompt ids, [output ids per row])} from the long-context traces (see the docstring)."""
    from pathlib import Path

    from agentspec_sdk.backends.model_bundle import load_tokenizer
    from agentspec_sdk.backends.prompts import chat_messages
    from agentspec_sdk.replay.trace import load_traces
    from agentspec_sdk.structure.formats import get_format
    from agentspec_sdk.structure.tools import ToolRegistry

    path = Path(__file__).resolve().parent.parent / "agentspec_sdk" / "replay" / "traces" / LONG_TRACES
    tok, fmt = load_tokenizer(None), get_format("tool_calls")
    best, outs, tools = None, [], []
    for ep in load_traces(path):
        msgs = [{"role": "system", "content": ep.system}]
        for t in ep.turns:
            if t.role == "assistant":
                text = tok.apply_chat_template(chat_messages(msgs, fmt, ToolRegistry(ep.tools)),
                                               tokenize=False, add_generation_prompt=True)
                ids = tok(text, add_special_tokens=False)["input_ids"]
                if best is None or len(ids) > len(best):
                    best, tools = ids, ep.tools
                outs.append(tok(t.content, add_special_tokens=False)["input_ids"])
            msgs.append({"role": t.role, "content": t.content})
    outs = sorted(outs, key=len, reverse=True)[:batch]
    rows = {}
    for n in lengths:
        if n > len(best):
            raise SystemExit(f"the longest long-context prompt has {len(best)} tokens, asked for {n}")
        rows[n] = (best[: n - tail] + best[-tail:], outs)
    return rows, tools


def context_profile(lengths: list[int], batch: int, gamma: int, profile: bool = False) -> dict:
    import cProfile
    import pstats

    from agentspec_sdk.backends.model_bundle import load_tokenizer, resolve_model
    from agentspec_sdk.drafting.drafter import StructureDrafter
    from agentspec_sdk.drafting.plan import DraftPlan
    from agentspec_sdk.drafting.rows import RowInput
    from agentspec_sdk.structure.formats import CODE_AGENT, REACT, TOOL_CALLS

    tok = load_tokenizer(None)
    rows, tools = long_context_rows(lengths, batch)
    out = {}
    for n, (prompt, outs) in rows.items():
        plan = DraftPlan(formats=[REACT, TOOL_CALLS, CODE_AGENT], tools=tools,
                         tokenizer=str(resolve_model(None)), gamma_max=gamma, learn_delta=False)
        drafter = StructureDrafter(plan, tok)
        pos = [1] * len(outs)
        steps, seconds, prof = 0, 0.0, cProfile.Profile() if profile else None
        while True:
            active = [i for i, o in enumerate(outs) if pos[i] < len(o)]
            if not active:
                break
            inputs = [RowInput(np.asarray(prompt + outs[i][:pos[i]], dtype=np.int64)) for i in active]
            before = drafter.stats()["proposer_s"]
            if prof is not None and steps:
                prof.enable()
            drafts = drafter.propose(inputs)
            if prof is not None:
                prof.disable()
            if steps:  # the first step builds every row's state
                seconds += drafter.stats()["proposer_s"] - before
            steps += 1
            for i, d in zip(active, drafts, strict=True):
                truth = outs[i][pos[i]:]
                a = 0
                while a < len(d) and a < len(truth) and d[a] == truth[a]:
                    a += 1
                pos[i] += a + 1
        out[n] = {"steps": steps, "ms_per_step": 1000 * seconds / max(1, steps - 1), "rows": len(outs),
                  "prompt": len(prompt)}
        if prof is not None:
            print(f"--- {n} tokens")
            pstats.Stats(prof).sort_stats("cumulative").print_stats(18)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=35, help="cases per BFCL category (3 categories)")
    ap.add_argument("--step-ms", type=float, nargs=2, default=(100.0, 195.0),
                    help="decode step time at b=1 and b=8 (ms) for the overhead ratio")
    ap.add_argument("--gamma", type=int, default=8, help="gamma_max of the plan")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--contexts", help="comma list of context lengths: proposer ms per step by context")
    ap.add_argument("--batch", type=int, default=8, help="rows of the --contexts replay")
    ap.add_argument("--profile", action="store_true", help="with --contexts: cProfile's top entries")
    args = ap.parse_args()
    if args.contexts:
        lengths = [int(x) for x in args.contexts.split(",")]
        res = context_profile(lengths, args.batch, args.gamma, args.profile)
        if args.json:
            print(json.dumps(res, indent=1))
        else:
            for n, r in res.items():
                print(f"context {n:>5} tokens: {r['ms_per_step']:.2f} ms per step ({r['rows']} rows, "
                      f"{r['steps']} steps)")
        return

    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.drafting.drafter import StructureDrafter
    from agentspec_sdk.drafting.grammars import call_grammar
    from agentspec_sdk.drafting.plan import DraftPlan
    from agentspec_sdk.drafting.rows import RowInput

    tok = AutoTokenizer.from_pretrained(resolve_model())
    cases = bfcl_cases(args.cases)
    report: dict = {"cases": 0, "gamma_max": args.gamma}
    totals = dict.fromkeys(("tokens", "passes", "forced", "lookup", "forced_only", "forced_only_passes",
                            "forced_only_json", "json_tokens", "ff_baseline"), 0)
    us = {1: [], 8: []}
    for case in cases:
        full = simulate(StructureDrafter, RowInput, DraftPlan, tok, case, call_grammar,
                        batch=1, lookup=True, gamma=args.gamma)
        if full is None:
            continue
        only = simulate(StructureDrafter, RowInput, DraftPlan, tok, case, call_grammar,
                        batch=1, lookup=False, gamma=args.gamma)
        report["cases"] += 1
        totals["tokens"] += full["tokens"]
        totals["passes"] += full["passes"]
        totals["forced"] += full["accepted"].get("forced", 0)
        totals["lookup"] += full["accepted"].get("lookup", 0)
        totals["forced_only"] += only["accepted"].get("forced", 0)
        totals["forced_only_json"] += only["accepted_in_json"]
        totals["forced_only_passes"] += only["passes"]
        totals["json_tokens"] += full["json_tokens"]
        totals["ff_baseline"] += full["ff_baseline_accepted"]
        us[1].extend(full["us_per_row"])
    for case in cases[:: max(1, len(cases) // 12)]:
        res = simulate(StructureDrafter, RowInput, DraftPlan, tok, case, call_grammar,
                       batch=8, lookup=True, gamma=args.gamma)
        if res:
            us[8].extend(res["us_per_row"])
    t = totals
    report.update({
        "call_tokens_mean": t["tokens"] / max(1, report["cases"]),
        "coverage_forced_plus_lookup": (t["forced"] + t["lookup"]) / t["tokens"],
        "coverage_forced_only": t["forced_only"] / t["tokens"],
        "coverage_ff_tokens_baseline_json": t["ff_baseline"] / t["json_tokens"],
        "coverage_forced_only_json": t["forced_only_json"] / t["json_tokens"],
        "ideal_speedup_forced_plus_lookup": t["tokens"] / t["passes"],
        "ideal_speedup_forced_only": t["tokens"] / t["forced_only_passes"],
        "us_per_row_step_b1_median": statistics.median(us[1]),
        "us_per_row_step_b8_median": statistics.median(us[8]) if us[8] else None,
        "us_per_row_step_b1_p90": float(np.percentile(us[1], 90)),
    })
    report["overhead_share_b1"] = report["us_per_row_step_b1_median"] / (1000 * args.step_ms[0])
    if us[8]:
        report["overhead_share_b8"] = 8 * report["us_per_row_step_b8_median"] / (1000 * args.step_ms[1])
    if args.json:
        print(json.dumps(report, indent=1))
        return
    for key, value in report.items():
        print(f"{key:40s} {value:.4g}" if isinstance(value, float) else f"{key:40s} {value}")


if __name__ == "__main__":
    main()
