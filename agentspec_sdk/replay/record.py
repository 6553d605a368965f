"""Record agent traces: a real agent loop on the engine, tools executed for real.

Source `bfcl-multi-turn`: BFCL v4 multi-turn entries; each entry's executable tool classes are
loaded with its initial_config, the model writes every assistant turn under the per-turn grammar
(format `tool_calls`, or `react` with `--format react`), each tool call runs against the live
classes and its result and wall time are recorded.

Source `humaneval`: HumanEval tasks as a code agent (format `code_agent`): the model writes the
function in a code block, the sandbox runs it against the task's tests, the result comes back in
<result>…</result>; up to `max_steps` turns per task, a pass ends the episode.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from agentspec_sdk import bfcl
from agentspec_sdk.errors import TraceError
from agentspec_sdk.replay import humaneval
from agentspec_sdk.replay.loop import Observation, TurnLog, run_episode
from agentspec_sdk.replay.trace import Episode, Turn
from agentspec_sdk.structure.token_labels import TokenClassifier

SOURCES = ("bfcl-multi-turn", "humaneval")
FORMAT = "tool_calls"
SOURCE_FORMATS = {"bfcl-multi-turn": ("tool_calls", "react"), "humaneval": ("code_agent",)}


def pick_entries(entries: list[dict], n: int, max_tools: int = 24) -> list[dict]:
    """n entries with at most `max_tools` tools (prompt length), spreading over the distinct sets
    of involved classes first (deterministic)."""
    if n < 1:
        raise TraceError(f"--n must be >= 1, got {n}")
    groups: dict[tuple, list[dict]] = {}
    for e in entries:
        if len(bfcl.entry_tools(e)) <= max_tools:
            groups.setdefault(tuple(sorted(e["involved_classes"])), []).append(e)
    chosen: list[dict] = []
    for round_ in range(max((len(g) for g in groups.values()), default=0)):
        for group in groups.values():  # round-robin over the class sets, in data order
            if round_ < len(group) and len(chosen) < n:
                chosen.append(group[round_])
    return chosen


def bfcl_episode_stub(entry: dict, category: str, max_segments: int, fmt: str = FORMAT) -> Episode:
    """The episode as the data gives it (user turns only), ready to be run in format `fmt`."""
    long_context = bfcl.is_long_context(category)
    tools = bfcl.entry_tools(entry, slim=not long_context)
    users = []
    for messages in entry["question"][:max_segments]:
        text = "\n".join(m["content"] for m in messages if m.get("role") == "user")
        if text:
            users.append(Turn("user", text))
    if not users:
        raise TraceError(f"BFCL entry {entry['id']} has no user message")
    source = {"name": "bfcl-multi-turn", "dataset": f"BFCL_v4_multi_turn_{category}", "entry_id": entry["id"],
              "license": bfcl.LICENSE, "url": bfcl.DATASET_URL,
              "initial_config": entry.get("initial_config", {}),
              "involved_classes": entry["involved_classes"]}
    if long_context:
        source.update(long_context=True, tool_docs="full BFCL documentation")
    prefix = "bfcl" if fmt == FORMAT else f"bfcl-{fmt}"
    return Episode(id=f"{prefix}/{entry['id']}", source=source, system=bfcl.system_prompt(), tools=tools,
                   format=fmt, turns=users)


def environment_for(episode: Episode) -> bfcl.BfclEnvironment | humaneval.HumanEvalEnvironment | None:
    """The executable environment of a recorded episode (BFCL classes, or a HumanEval task)."""
    src = episode.source
    if src.get("name") == humaneval.SOURCE:
        return humaneval.environment_for(episode)
    if src.get("name") != "bfcl-multi-turn" or "involved_classes" not in src:
        return None
    return bfcl.BfclEnvironment(src.get("initial_config", {}), src["involved_classes"],
                                long_context=bool(src.get("long_context", False)))


def check_source_format(source: str, fmt: str | None) -> str:
    """The format to record `source` in (its first by default); TraceError if it has no such format."""
    if source not in SOURCES:
        raise TraceError(f"unknown trace source {source!r}; known: {list(SOURCES)}")
    formats = SOURCE_FORMATS[source]
    if fmt is None:
        return formats[0]
    if fmt not in formats:
        raise TraceError(f"source {source!r} records formats {list(formats)}, not {fmt!r}")
    return fmt


def record(engine: Any, *, source: str = "bfcl-multi-turn", n: int = 12, category: str = "base",
           max_segments: int = 3, max_steps: int = 3, max_tokens: int = 160, concurrency: int = 8,
           tokenizer: Any, on_turn: Callable[[TurnLog], None] | None = None,
           model_name: str = "", fmt: str | None = None, instructions: str = "") -> list[Episode]:
    """`instructions`: the format's instructions in every prompt instead of its own (kept in each
    episode, so that the recording replays with them)."""
    fmt = check_source_format(source, fmt)
    if source == humaneval.SOURCE:
        stubs = [humaneval.episode_stub(t) for t in humaneval.pick_tasks(n)]
    else:
        stubs = [bfcl_episode_stub(e, category, max_segments, fmt)
                 for e in pick_entries(bfcl.multi_turn_entries(category), n)]
    if instructions:
        stubs = [replace(s, instructions=instructions) for s in stubs]
    classifier = TokenClassifier(tokenizer)
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")

    def run(stub: Episode) -> Episode:
        env = environment_for(stub)
        done_on_pass = getattr(env, "done_on_pass", False)

        def observe(name: str, arguments: dict, segment: int) -> Observation:
            ran = env.execute(name, arguments)
            return Observation(ran.result, ran.latency_s, "real", done=done_on_pass and ran.ok)

        logs, turns = run_episode(engine, stub, observe, classifier=classifier, max_tokens=max_tokens,
                                  max_steps=lambda seg: max_steps, sleep=False, on_turn=on_turn)
        meta = {"model": model_name, "recorded_at": stamp, "max_tokens": max_tokens, "max_steps": max_steps,
                "temperature": 0.0, "output_tokens": sum(log.output_tokens for log in logs)}
        if done_on_pass:
            meta["passed"] = any(t.role == "tool" and t.content == humaneval.PASSED for t in turns)
        return Episode(id=stub.id, source=stub.source, system=stub.system, tools=stub.tools,
                       format=stub.format, turns=turns, meta=meta, instructions=stub.instructions)

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        return list(pool.map(run, stubs))
