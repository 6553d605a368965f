"""Candidates replayed on the parts of a turn set, in worker processes where asked.

A replay task is (candidate, part); the turns, grammars and the replay's setting are handed to each
worker once (`ReplayPool`), so a task carries only its names. Each replay builds a fresh drafter and
grammar trim (both learn as they go) and returns simulate's row with the structure drafter's rounds
per law class (accepted, drafted, rejections) for the law.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field

from agentspec_sdk.tuning.candidates import Candidate, build_drafter, priced
from agentspec_sdk.tuning.episodes import TurnSet, episodes_of
from agentspec_sdk.tuning.simulate import simulate
from agentspec_sdk.tuning.trim import GrammarTrim

__all__ = ["ReplayPool", "ReplaySetting", "replay_candidate"]


@dataclass(frozen=True)
class ReplaySetting:
    """The deployment a replay stands for: draft length cap `gamma`, `batch` rows, `delta` (a drafted
    token's verify cost per row of a pass, in passes), the schedule, the model whose tokenizer the
    turns were captured with, and the plan fields every structure candidate starts from;
    `qualified_kinds`: segment kinds attributed as "<format>.<kind>" (a capture of several formats)."""

    gamma: int
    batch: int
    delta: float
    model: str
    plan_fields: dict = field(default_factory=dict)
    schedule: str = "agents"
    qualified_kinds: bool = False

    def structure_fields(self) -> dict:
        return {**self.plan_fields, "tokenizer": self.model, **priced(self.delta, self.batch)}


@functools.lru_cache(maxsize=4)
def _tokenizers(model: str):
    import llguidance.hf
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    return tokenizer, llguidance.hf.from_tokenizer(tokenizer)


def _round_counts(records: list) -> dict:
    """Per law class: rounds that drafted, drafted and accepted tokens, rounds with a rejection."""
    out: dict[str, dict[str, int]] = {}
    for cls, _kind, drafted, accepted in records:
        if cls is None or drafted == 0:
            continue
        c = out.setdefault(cls, {"rounds": 0, "drafted": 0, "accepted": 0, "rejections": 0})
        c["rounds"] += 1
        c["drafted"] += drafted
        c["accepted"] += accepted
        c["rejections"] += accepted < drafted
    return dict(sorted(out.items()))


def _by_episode(by_turn: list[dict], episodes: list) -> dict[str, dict]:
    """simulate's per-turn counts summed per episode: {episode: {"all": counts, "kinds": {kind: counts}}}."""
    out: dict[str, dict] = {}
    for counts, episode in zip(by_turn, episodes, strict=True):
        e = out.setdefault(str(episode), {"all": {"passes": 0, "drafted": 0, "accepted": 0}, "kinds": {}})
        for key, value in counts["all"].items():
            e["all"][key] += value
        for kind, c in counts["kinds"].items():
            k = e["kinds"].setdefault(kind, {"passes": 0, "drafted": 0, "accepted": 0})
            for key, value in c.items():
                k[key] += value
    return out


def replay_candidate(candidate: Candidate, turns: list[dict], grammars: list, setting: ReplaySetting,
                     episodes: list | None = None) -> dict:
    """simulate's row of `candidate` on `turns` (copied: the replay keeps no state on them); with
    `episodes` (each turn's episode), also `by_episode` (`_by_episode`)."""
    tokenizer, ll = _tokenizers(setting.model)
    drafter = build_drafter(candidate, setting.gamma, tokenizer, setting.structure_fields(),
                            qualified=setting.qualified_kinds)
    records: list = []
    trim = GrammarTrim(grammars, ll_tokenizer=ll)
    row = simulate([dict(t) for t in turns], drafter, setting.batch, trim=trim,
                   schedule=setting.schedule, records=records, per_turn=episodes is not None)
    if episodes is not None:
        row["by_episode"] = _by_episode(row.pop("by_turn"), episodes)
    row["rounds_by_class"] = _round_counts(records)
    row["cost"] = row["passes"] + setting.delta * row["drafted"]
    return row


_WORKER: dict = {}


def _init_worker(turn_set: TurnSet, parts: dict[str, list[int]], setting: ReplaySetting) -> None:
    _WORKER.update(turn_set=turn_set, parts=parts, setting=setting, episodes=episodes_of(turn_set.turns))


def _run_task(candidate: Candidate, part: str) -> dict:
    ts: TurnSet = _WORKER["turn_set"]
    indices = _WORKER["parts"][part]
    turns = [ts.turns[i] for i in indices]
    episodes = [_WORKER["episodes"][i] for i in indices]
    return replay_candidate(candidate, turns, ts.grammars, _WORKER["setting"], episodes)


class ReplayPool:
    """Runs (candidate, part) replays, `jobs` at a time in worker processes (1: in this process);
    `progress(done_tokens)` is called as each finishes with the output tokens it replayed."""

    def __init__(self, turn_set: TurnSet, parts: dict[str, list[int]], setting: ReplaySetting, jobs: int = 1):
        self.turn_set, self.parts, self.setting, self.jobs = turn_set, parts, setting, max(1, jobs)
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> ReplayPool:
        _init_worker(self.turn_set, self.parts, self.setting)
        if self.jobs > 1:
            # fork: the workers inherit the loaded modules and the turn set without pickling them
            context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=context, initializer=_init_worker,
                                             initargs=(self.turn_set, self.parts, self.setting))
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def tokens(self, part: str) -> int:
        return sum(max(len(self.turn_set.turns[i]["out"]) - 1, 0) for i in self.parts[part])

    def run(self, tasks: Iterable[tuple[Candidate, str]],
            progress: Callable[[int], None] | None = None) -> dict[tuple[str, str], dict]:
        """{(candidate name, part): row} of every task."""
        tasks = list(tasks)
        out: dict[tuple[str, str], dict] = {}
        if self._pool is None:
            for candidate, part in tasks:
                out[(candidate.name, part)] = _run_task(candidate, part)
                if progress:
                    progress(self.tokens(part))
            return out
        futures = {self._pool.submit(_run_task, c, p): (c.name, p) for c, p in tasks}
        for future in as_completed(futures):
            name, part = futures[future]
            out[(name, part)] = future.result()
            if progress:
                progress(self.tokens(part))
        return out
