"""Plain OpenAI clients on `agentspec serve`: structure vs `--speculation suffix`, same 16 tool-call requests.

Each setting starts its own server (`ServerSpec`, same model, dtype, max_model_len, prefix caching,
grammar backend, tool parser and chat template; only the speculation differs), warms it (every request
once with max_tokens=1: grammars compiled, prompt prefixes cached, the tools in the structure
proposer's plan), then sends the same 16 BFCL tool-call requests with the OpenAI client, one at a time,
`tool_choice="required"`, `parallel_tool_calls=False`, temperature 0. Per setting: target passes
(Σ completion tokens − Σ accepted draft tokens, from the responses' `metrics.speculative_decoding`),
drafted, accepted, decode time (Σ `metrics.generation_time_ms`), the calls valid against their tool's
schema, and how many outputs equal the other setting's.

    flock /tmp/agentspec-engine.lock python benchmarks/openai_tool_calls.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import socket
import tempfile
import time
from pathlib import Path

REQUESTS = 16


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_setting(speculation: str, prompts, gamma: int, max_tokens: int, work: Path) -> dict:
    import jsonschema
    import openai

    from agentspec_sdk.backends.inside_vllm.tool_prompt import write_chat_template
    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.backends.serving.serve_cli import write_plan
    from agentspec_sdk.backends.serving.server import ServerProcess, ServerSpec

    model = resolve_model()
    plan = write_plan(model, work / f"plan-{speculation}.json", formats="tool_calls", gamma_max=gamma) \
        if speculation == "structure" else None
    template = write_chat_template(model, "tool_calls", work / "chat-template.jinja")
    spec = ServerSpec(model=model, port=free_port(), speculation=speculation, gamma_max=gamma, plan_path=plan,
                      max_model_len=2048, extra_args=["--enforce-eager"], chat_template=template,
                      metrics_dir=work / f"prom-{speculation}")
    started = time.perf_counter()
    proc = ServerProcess(spec, log_path=work / f"server-{speculation}.log").start()
    try:
        proc.wait_ready(timeout=900)
        startup_s = time.perf_counter() - started
        client = openai.OpenAI(base_url=proc.base_url + "/v1", api_key="EMPTY", max_retries=0, timeout=600)
        served = client.models.list().data[0].id

        def ask(p, n):
            return client.chat.completions.create(
                model=served, messages=p.messages, tools=p.tools, tool_choice="required",
                parallel_tool_calls=False, max_tokens=n, temperature=0)

        for p in prompts:  # warm-up
            ask(p, 1)
        time.sleep(1.5)  # the structure proposer re-reads its plan (now with every request's tools)
        rows = []
        for p in prompts:
            t0 = time.perf_counter()
            resp = ask(p, max_tokens)
            e2e = time.perf_counter() - t0
            metrics = resp.model_extra.get("metrics") or {}
            sd = metrics.get("speculative_decoding") or {}
            schemas = {t["function"]["name"]: t["function"]["parameters"] for t in p.tools}
            calls = resp.choices[0].message.tool_calls or []
            valid = 0
            for c in calls:
                try:
                    jsonschema.validate(json.loads(c.function.arguments), schemas[c.function.name])
                    valid += 1
                except (KeyError, ValueError, jsonschema.ValidationError):
                    pass
            rows.append({"id": p.id, "tokens": resp.usage.completion_tokens,
                         "drafted": int(sd.get("num_draft_tokens", 0)),
                         "accepted": int(sd.get("num_accepted_draft_tokens", 0)),
                         "decode_s": float(metrics.get("generation_time_ms", 0.0)) / 1000.0, "e2e_s": e2e,
                         "calls": [(c.function.name, c.function.arguments) for c in calls], "valid": valid})
        return {"speculation": speculation, "gamma": gamma, "startup_s": startup_s, "rows": rows}
    finally:
        proc.stop()


def summary(result: dict) -> dict:
    rows = result["rows"]
    tokens = sum(r["tokens"] for r in rows)
    accepted = sum(r["accepted"] for r in rows)
    return {"setting": f"{result['speculation']}-g{result['gamma']}", "requests": len(rows),
            "output_tokens": tokens, "target_passes": tokens - accepted,
            "drafted": sum(r["drafted"] for r in rows), "accepted": accepted,
            "decode_s": sum(r["decode_s"] for r in rows), "e2e_s": sum(r["e2e_s"] for r in rows),
            "calls": sum(len(r["calls"]) for r in rows), "valid_calls": sum(r["valid"] for r in rows)}


def table(results: list[dict]) -> str:
    sums = [summary(r) for r in results]
    same = sum(a["calls"] == b["calls"] for a, b in zip(results[0]["rows"], results[-1]["rows"], strict=True))
    head = ("| setting | requests | output tokens | target passes | drafted | accepted | decode s | e2e s "
            "| calls (schema-valid) |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head] + [f"| {s['setting']} | {s['requests']} | {s['output_tokens']} | {s['target_passes']} | "
                      f"{s['drafted']} | {s['accepted']} | {s['decode_s']:.2f} | {s['e2e_s']:.2f} | "
                      f"{s['calls']} ({s['valid_calls']}) |" for s in sums]
    if len(sums) == 2 and sums[0]["target_passes"]:
        a, b = sums
        ratio = b["target_passes"] / a["target_passes"]
        lines.append(f"\n{b['setting']} / {a['setting']}: target passes {ratio:.2f}x, "
                     f"decode time {b['decode_s'] / max(a['decode_s'], 1e-9):.2f}x; same calls in "
                     f"{same}/{len(results[0]['rows'])} requests")
    return "\n".join(lines)


def main() -> None:
    from agentspec_sdk.bfcl import tool_call_prompts

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--requests", type=int, default=REQUESTS)
    ap.add_argument("--settings", default="structure,suffix")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    prompts = tool_call_prompts(args.requests)
    with tempfile.TemporaryDirectory(prefix="agentspec-openai-bench-") as tmp:
        results = [run_setting(s.strip(), prompts, args.gamma, args.max_tokens, Path(tmp))
                   for s in args.settings.split(",")]
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
