"""Replay recorded episodes concurrently through the embedded engine.

Each agent writes its own assistant turns; tool observations come from the trace. Matching
(documented in docs/replay.md), per call the model makes:

1. exact: a recorded observation with the same tool name and the same arguments (canonical JSON),
   preferring one not used yet and the nearest user segment;
2. name: the same tool name, different arguments → the recorded observation of the nearest call:
   most equal argument values, then nearest user segment, then not used yet, then earliest;
3. executed: no recorded call of that tool → the real BFCL tool, on an environment loaded with
   the episode's initial_config that has applied this agent's earlier calls (BFCL traces only);
4. missing: otherwise the observation is an error text "tool call not in trace: <name>".

Code agents (an environment with `exact_only`, HumanEval): code that differs from every recorded
code block is run in the sandbox against the task's tests ("executed"), never answered by a
recorded result of other code; a passing result ends the episode as it did when recorded.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from agentspec_sdk.replay.loop import Observation, TurnLog, run_episode
from agentspec_sdk.replay.trace import Episode, check_formats
from agentspec_sdk.structure.token_labels import TokenClassifier


def canonical(arguments: dict) -> str:
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class ObservationBook:
    """The recorded observations of one episode and the matching rules above."""

    def __init__(self, episode: Episode, env_factory: Callable[[], Any] | None = None):
        self.entries = [(seg, t) for seg, t in episode.observations()]
        self.used = [False] * len(self.entries)
        self._env_factory = env_factory
        self._env = None
        self._env_failed = False

    def _shadow(self):
        if self._env is None and not self._env_failed and self._env_factory is not None:
            try:
                self._env = self._env_factory()
            except Exception:  # no executable environment: fall through to 'missing'
                self._env_failed = True
        return self._env

    def lookup(self, name: str, arguments: dict, segment: int) -> Observation:
        env = self._shadow()
        runs = env is not None and env.has(name)
        exact_only = runs and getattr(env, "exact_only", False)
        # the shadow environment applies every call, so its state follows the agent's own actions
        shadow = env.execute(name, arguments) if runs and not exact_only else None
        key = canonical(arguments)
        exact = [i for i, (_, t) in enumerate(self.entries) if t.name == name
                 and canonical(t.arguments) == key]
        if exact:
            i = min(exact, key=lambda i: (self.used[i], abs(self.entries[i][0] - segment), i))
            obs = self._take(i, "exact")
            obs.done = exact_only and env.is_done(obs.result)
            return obs
        if exact_only:  # other code than recorded: run it (a recorded result of other code says nothing)
            ran = env.execute(name, arguments)
            return Observation(ran.result, ran.latency_s, "executed", done=env.is_done(ran.result))
        same = [i for i, (_, t) in enumerate(self.entries) if t.name == name]
        if same:
            def score(i: int):
                rec = self.entries[i][1].arguments or {}
                equal = sum(1 for k, v in arguments.items() if k in rec and rec[k] == v)
                return (-equal, abs(self.entries[i][0] - segment), self.used[i], i)
            return self._take(min(same, key=score), "name")
        if shadow is not None:
            return Observation(shadow.result, shadow.latency_s, "executed")
        return Observation(f"Error: tool call not in trace: {name}", 0.0, "missing")

    def _take(self, i: int, match: str) -> Observation:
        self.used[i] = True
        t = self.entries[i][1]
        return Observation(t.content, t.latency_s, match)


@dataclass
class ReplayRun:
    """Every assistant turn of one replay, with the wall time of the whole run."""

    logs: list[TurnLog]
    wall_s: float
    episodes: int
    concurrency: int
    interrupted: bool = False
    matches: dict[str, int] = field(default_factory=dict)


def replay(engine: Any, episodes: list[Episode], *, tokenizer: Any, concurrency: int = 8,
           max_tokens: int = 160,
           max_segments: int | None = None, max_steps: int | None = None, latency_scale: float = 1.0,
           on_turn: Callable[[TurnLog], None] | None = None, env_factory=None,
           grammar: str | None = None, tool_choice: str | None = None, fmt: str | None = None) -> ReplayRun:
    """Replay `episodes` with `concurrency` agents in flight. Per user segment an agent gets at most
    as many assistant turns as the trace recorded there (or `max_steps`). Every episode runs in its
    recorded format (episodes of several formats may share one replay, each in its own); `fmt` (a
    name, or "auto": the engine's `resolve_format`) says which one the caller means, and any other, or
    episodes of several formats with `fmt` given, is a TraceError (`trace.check_formats`)."""
    from agentspec_sdk.replay.record import environment_for

    if fmt is not None:
        check_formats(episodes, _resolved(engine, fmt))

    classifier = TokenClassifier(tokenizer)
    logs: list[TurnLog] = []
    lock = threading.Lock()
    stop = threading.Event()

    def collect(log: TurnLog) -> None:
        with lock:
            logs.append(log)
        if on_turn is not None:
            on_turn(log)

    def run(ep: Episode) -> None:
        if stop.is_set():
            return
        recorded = [sum(1 for t in seg if t.role == "assistant") for seg in ep.user_segments()]

        def steps(seg: int) -> int:
            n = recorded[seg] if seg < len(recorded) else 1
            return min(n, max_steps) if max_steps else n

        factory = env_factory or (lambda: environment_for(ep))
        book = ObservationBook(ep, factory)
        run_episode(engine, ep, book.lookup, classifier=classifier, max_tokens=max_tokens, max_steps=steps,
                    max_segments=max_segments, latency_scale=latency_scale, on_turn=collect, grammar=grammar,
                    tool_choice=tool_choice)

    start = time.perf_counter()
    pool = ThreadPoolExecutor(max_workers=max(1, concurrency))
    interrupted = False
    futures: list = []
    try:
        futures = [pool.submit(run, ep) for ep in episodes]
        for f in futures:
            f.result()
    except KeyboardInterrupt:
        interrupted = True
        stop.set()
        for f in futures:
            f.cancel()
    finally:
        pool.shutdown(wait=not interrupted, cancel_futures=True)
    wall = time.perf_counter() - start
    matches: dict[str, int] = {}
    for log in logs:
        for m in log.matches:
            matches[m] = matches.get(m, 0) + 1
    return ReplayRun(list(logs), wall, len(episodes), concurrency, interrupted, matches)


def _resolved(engine: Any, fmt: str | None) -> str | None:
    """`fmt` as a format name: "auto" through the engine (the format its model's template writes)."""
    from agentspec_sdk.errors import TraceError
    from agentspec_sdk.structure.formats import get_format

    if fmt is None:
        return None
    if hasattr(engine, "resolve_format"):
        return engine.resolve_format(fmt).name
    if fmt == "auto":
        raise TraceError("format 'auto' needs an engine that knows its model's chat template "
                         "(resolve_format); name the format")
    return get_format(fmt).name
