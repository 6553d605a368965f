"""Replicas behind vllm-router against one server: the bundled agent traces replayed through each.

    flock /tmp/agentspec-engine.lock python benchmarks/replicas.py [--n 12] [--concurrency 4]

Each configuration starts its own fresh deployment (nothing learned or cached carries over), replays
the same episodes with `RemoteEngine` (the episode key as `x-session-id` and `user`) and reads every
replica's /metrics before and after: requests, output tokens, vLLM's accepted draft tokens, the
proposer's accepted tokens per class (structure), passes (output tokens - accepted: each target pass
emits its accepted tokens + 1), prefix-cache hits / queries. Configurations, interleaved in one run:
for each deployment (one server with the machine's cores; 2 replicas, one core share each, behind the
router under each policy) the structure proposer, then vLLM's `suffix` drafter as the peer.

Prints one table (a row per configuration and replica, and the configuration's total) and writes it
as JSON to --out. Ratios to read: the 2-replica totals against the single server's, per drafter.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

POLICIES = ("cache_aware", "consistent_hash", "round_robin")


def scrape(url: str) -> dict[str, float]:
    """The counters this benchmark reads from one server's /metrics (summed over label sets)."""
    import httpx

    from agentspec_sdk.backends.inside_vllm.prom_metrics import parse_agentspec

    text = httpx.get(url + "/metrics", timeout=30).text
    wanted = {"vllm:request_success_total": "requests", "vllm:generation_tokens_total": "output_tokens",
              "vllm:spec_decode_num_accepted_tokens_total": "accepted",
              "vllm:spec_decode_num_draft_tokens_total": "drafted",
              "vllm:prefix_cache_hits_total": "prefix_hits",
              "vllm:prefix_cache_queries_total": "prefix_queries"}
    out = dict.fromkeys(wanted.values(), 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in wanted:
            out[wanted[name]] += float(line.rsplit(" ", 1)[1])
    for key, value in parse_agentspec(text).items():
        if key[0] == "accepted":
            out[f"accepted_{key[1]}"] = out.get(f"accepted_{key[1]}", 0.0) + value
    return out


def delta(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


@contextmanager
def deployment(peer: str, policy: str, port: int, work: Path):
    """(router or server URL, replica URLs, plan path or None) of a fresh deployment."""
    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.backends.serving.replicas import ReplicaSet
    from agentspec_sdk.backends.serving.serve_cli import write_plan
    from agentspec_sdk.backends.serving.server import ServerProcess, ServerSpec

    model = resolve_model()
    plan = None
    if peer == "structure":  # a fresh plan per configuration: no tools learned by an earlier one
        plan = write_plan(model, work / f"plan-{peer}-{policy}.json", gamma_max=8)
    spec = ServerSpec(model=model, port=port, speculation=peer, gamma_max=8, plan_path=plan,
                      max_model_len=4096, extra_args=["--enforce-eager"], metrics_dir=work / f"prom-{port}")
    if policy == "single":
        cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
        server = ServerProcess(dataclasses.replace(spec, cpu_cores=cores),
                               log_path=work / f"{peer}-single.log")
        with server:
            server.start().wait_ready(900)
            yield server.base_url, [server.base_url], plan
        return
    replicas = ReplicaSet(spec, 2, policy, log_dir=work / f"{peer}-{policy}")
    with replicas:
        replicas.start(900)
        yield replicas.base_url, [r.base_url for r in replicas.replicas], plan


def run_config(peer: str, policy: str, args, episodes, tokenizer, port: int) -> list[dict]:
    from agentspec_sdk.backends.remote.openai_backend import RemoteEngine
    from agentspec_sdk.replay.aggregate import summarize
    from agentspec_sdk.replay.replayer import replay

    started = time.monotonic()
    with deployment(peer, policy, port, args.out) as (url, replica_urls, plan):
        start_s = time.monotonic() - started
        before = [scrape(u) for u in replica_urls]
        with RemoteEngine(url, plan_path=plan, metrics_urls=replica_urls, timeout=600) as eng:
            run = replay(eng, episodes, tokenizer=tokenizer, concurrency=args.concurrency,
                         max_tokens=args.max_tokens)
        after = [scrape(u) for u in replica_urls]
    total = summarize(run.logs, arm="D", mode=peer, gamma=8, batch=args.concurrency, wall_s=run.wall_s)
    rows = []
    for i, (a, b) in enumerate(zip(after, before, strict=True), start=1):
        d = delta(a, b)
        rows.append({"peer": peer, "deployment": policy, "replica": i, **d,
                     "passes": d["output_tokens"] - d["accepted"],
                     "prefix_hit_rate": _rate([d], "prefix_hits", "prefix_queries")})
    # per class: the proposer's counters of the replicas (a server's responses carry no classes)
    by_class = {c: sum(r.get(f"accepted_{c}", 0) for r in rows) for c in "SRF"}
    rows.append({"peer": peer, "deployment": policy, "replica": "all", "turns": total["turns"],
                 "errors": total["errors"], "output_tokens": total["output_tokens"],
                 "accepted": total["accepted"], "passes": total["passes"], "by_class": by_class,
                 "wall_s": run.wall_s, "start_s": start_s,
                 "prefix_hit_rate": _rate(rows, "prefix_hits", "prefix_queries")})
    return rows


def _rate(rows: list[dict], hits: str, queries: str) -> float | None:
    q = sum(r[queries] for r in rows)
    return sum(r[hits] for r in rows) / q if q else None


def table(rows: list[dict]) -> str:
    lines = ["| drafter | deployment | replica | requests | output | accepted | S | R | F | passes | "
             "prefix hit | wall s |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cls = r.get("by_class") or {c: r.get(f"accepted_{c}", 0) for c in "SRF"}
        hit = r.get("prefix_hit_rate")
        cells = [r["peer"], r["deployment"], r["replica"], int(r.get("requests", r.get("turns", 0))),
                 int(r["output_tokens"]), int(r["accepted"]), *(int(cls.get(c, 0)) for c in "SRF"),
                 int(r["passes"]), "" if hit is None else f"{100 * hit:.1f} %",
                 f"{r['wall_s']:.0f}" if "wall_s" in r else ""]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=Path, default=None, help="JSONL traces (default: bfcl_multi_turn)")
    parser.add_argument("--n", type=int, default=12, help="episodes")
    parser.add_argument("--concurrency", type=int, default=4, help="agents in flight")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--peers", default="structure,suffix")
    parser.add_argument("--deployments", default="single," + ",".join(POLICIES))
    parser.add_argument("--port", type=int, default=18400)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/replicas"))
    args = parser.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)

    from agentspec_sdk.backends.model_bundle import load_tokenizer
    from agentspec_sdk.replay.arms import arm_d

    episodes = arm_d(args.n, args.traces)
    tokenizer = load_tokenizer()
    rows: list[dict] = []
    for policy in args.deployments.split(","):
        for peer in args.peers.split(","):  # interleaved: each deployment with both drafters in turn
            began = time.monotonic()
            rows += run_config(peer, policy, args, episodes, tokenizer, args.port)
            print(f"# {peer} {policy}: {time.monotonic() - began:.0f} s", flush=True)
            (args.out / "replicas.json").write_text(json.dumps(rows, indent=1, default=str))
            print(table([r for r in rows if r["peer"] == peer and r["deployment"] == policy]), flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
