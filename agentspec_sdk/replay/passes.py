"""The pass table of a run: the engine's passes (`Engine.pass_log`) joined with the structure
proposer's steps (`Engine.step_log`), or, without a pass log, the gaps between proposer steps; and the
mean pass a decoding row sees. Feeds the pass cost model (`law.fit_pass_costs`) and the step price
(`accounting.verify_price`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

import numpy as np

from agentspec_sdk.replay.trace import atomic_write_text

PASS_LOGS = "passes.jsonl"  # beside report.json: the passes and steps the cost model was fitted on
COST_KEYS = ("rows", "drafted", "drafted_ctx", "drafted_s", "prefill", "prefill_ctx", "ctx", "grammar",
             "no_spec")


def pass_table(passes: Iterable[Mapping], steps: Iterable[Mapping] = ()) -> list[dict]:
    """The engine's passes (`Engine.pass_log`) joined with the structure proposer's steps
    (`Engine.step_log`): the proposer runs inside pass j (its step began during it: `proposer_s` of
    pass j) and the drafts it made there are verified in pass j + 1 (`drafted`, `drafted_ctx`,
    `drafted_s` of pass j + 1).

    Where the pass log carries vLLM's scheduler view (`scheduler_probe.FIELDS`) it replaces the
    attributed counts: the draft tokens the pass verified (`spec_drafted`, any drafter, trimmed to
    the grammar) and the prefill chunks it computed (`prefill_tokens`, `prefill_ctx`: a long prompt
    is prefilled over several passes, the output-based log puts it all in the pass of the first
    token); a structure step's schema share of its drafts is kept."""
    table = sorted((dict(p) for p in passes), key=lambda p: p["t"])
    ordered = sorted(steps, key=lambda s: s["t"])
    i, made = 0, None
    for p in table:
        for k in ("drafted", "drafted_ctx", "drafted_s", "proposer_s", "made"):
            p[k] = 0
        if made is not None:
            p.update(drafted=made.get("drafted", 0), drafted_ctx=made.get("drafted_ctx", 0),
                     drafted_s=made.get("drafted_s", 0))
        made = None
        while i < len(ordered) and ordered[i]["t"] < p["t"]:
            i += 1
        if i < len(ordered) and ordered[i]["t"] <= p["t"] + p["s"]:
            made = ordered[i]
            p["proposer_s"], p["made"] = float(made.get("proposer_s", 0.0)), made.get("drafted", 0)
            i += 1
    # the engine loop's own work until the next pass (outputs, finished turns, admissions) is time the
    # rows still decoding wait too; before a pass of new rows only, the engine may have been idle
    for p, nxt in zip(table, table[1:], strict=False):
        busy = nxt.get("rows", 0) - nxt.get("new", 0) > 0
        p["loop_s"] = max(nxt["t"] - (p["t"] + p["s"]), 0.0) if busy and "new" in nxt else 0.0
    if table:
        table[-1]["loop_s"] = 0.0
    for p in table:
        if "spec_drafted" not in p:
            p.setdefault("prefill_ctx", 0.0)
            continue
        share = p["drafted_s"] / p["drafted"] if p["drafted"] else 0.0
        p["drafted"], p["drafted_ctx"] = p["spec_drafted"], p["spec_drafted_ctx"]
        p["drafted_s"] = p["drafted"] * share
        p["prefill"], p["prefill_ctx"] = p["prefill_tokens"], p["prefill_ctx"]
    return table


def pass_cycle(p: Mapping) -> dict:
    """A pass with its seconds up to the next pass (the pass + the engine loop's work after it)."""
    return dict(p, s=p["s"] + p.get("loop_s", 0.0))


def steady_decode(table: Iterable[Mapping]) -> dict:
    """Decode tok/s apart from the waits on other requests' prefills, from a pass table (`pass_table`).

    A row that is decoding when another agent's next turn arrives waits through that turn's prefill
    (a pass of a few hundred prompt tokens costs 4-8 decode passes here). Every mode prefills the same
    prompts, but when they land among the decoding rows depends on when earlier turns ended, so that
    wait moves decode tok/s by chance between modes and repeats. Returns `steady_tok_s`: the decoding
    rows' tokens per second of their time in passes that prefilled nothing; `prefill_wait_share`: the
    share of the decoding rows' time spent in passes that prefilled a prompt (each pass with the engine
    loop after it, weighted by its decoding rows, as per-turn decode time counts it); None without
    passes."""
    steady_s = steady_tokens = wait_s = 0.0
    for p in table:
        decoding = p.get("rows", 0) - p.get("new", 0)
        if decoding <= 0:
            continue
        seconds = decoding * pass_cycle(p)["s"]
        if float(p.get("prefill", 0) or 0) > 0:
            wait_s += seconds
        else:
            steady_s += seconds
            steady_tokens += p.get("tokens", 0) - p.get("new", 0)
    total = steady_s + wait_s
    return {"steady_tok_s": steady_tokens / steady_s if steady_s > 0 else None,
            "prefill_wait_share": wait_s / total if total > 0 else None}


def passes_from_steps(steps: Iterable[Mapping]) -> list[dict]:
    """Without an engine pass log: the gap between two consecutive proposer steps is the pass that
    verified the first step's drafts (the proposer's own time is inside it). Gaps over 3x the median
    are dropped (idle time while every agent waits on a tool)."""
    ordered = sorted(steps, key=lambda s: s["t"])
    gaps = [dict({k: a.get(k, 0) for k in COST_KEYS}, s=b["t"] - a["t"])
            for a, b in zip(ordered, ordered[1:], strict=False) if a["rows"] > 0 and b["t"] > a["t"]]
    if not gaps:
        return []
    cut = 3.0 * float(np.median([g["s"] for g in gaps]))
    return [g for g in gaps if g["s"] <= cut]


def mean_pass(table: Iterable[Mapping]) -> dict | None:
    """The pass a decoding row sees on average (each pass weighted by its rows that were already
    decoding, as per-sequence decode time counts it: a request's own first-token pass is its prefill,
    `new` in the pass log): mean rows, drafted, ..., seconds; `row_passes` = those rows summed."""
    table = [p for p in table if p.get("rows", 0) - p.get("new", 0) > 0]
    if not table:
        return None
    w = np.array([p["rows"] - p.get("new", 0) for p in table], dtype=float)
    out = {k: float(np.average([float(p.get(k, 0) or 0) for p in table], weights=w))
           for k in (*COST_KEYS, "s", "proposer_s", "loop_s")}
    out["s"] += out["loop_s"]  # what a decoding row waits per pass: the pass and the loop after it
    out["passes"], out["row_passes"] = len(table), int(w.sum())
    return out


def write_logs(path, steps: Mapping[tuple, list[Mapping]], passes: Mapping[tuple, list[Mapping]]) -> None:
    """Every run's engine passes and proposer steps as JSON lines (`{"run": [arm, batch, gamma,
    prefix_cache], "mode", "kind": "pass" | "step", ...}`), beside report.json: the raw data the
    pass cost model was fitted on, to refit or inspect it (`read_logs`)."""
    lines = [json.dumps({"run": list(key), "mode": mode, "kind": kind, **rec})
             for kind, logs in (("pass", passes), ("step", steps))
             for (key, mode), recs in logs.items() for rec in recs]
    atomic_write_text(path, "".join(line + "\n" for line in lines))


def read_logs(path) -> tuple[dict[tuple, list[dict]], dict[tuple, list[dict]]]:
    """(steps, passes) per (run key, mode), as `write_logs` wrote them."""
    steps: dict[tuple, list[dict]] = {}
    passes: dict[tuple, list[dict]] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            key = (tuple(rec.pop("run")), rec.pop("mode"))
            (passes if rec.pop("kind") == "pass" else steps).setdefault(key, []).append(rec)
    return steps, passes
