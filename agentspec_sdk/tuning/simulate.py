"""Greedy verification simulated against recorded outputs: a drafter replayed offline, no engine.

At temperature 0 the target writes the same tokens whatever was drafted, so a captured turn's output is
the truth every draft is checked against: each step every active row gets a draft (trimmed to the
request grammar as vLLM does before verifying, `trim`), its common prefix with the real continuation is
accepted, plus one token. Rows start as the engine starts agents' turns (schedule "agents": up to
`batch` rows, a turn once its episode's previous turn has finished) or `batch` at a time ("groups").
"""

from __future__ import annotations

import heapq

import numpy as np

from agentspec_sdk.drafting.fingerprint import prefix_hashes

__all__ = ["SCHEDULES", "agree", "predecessors", "simulate"]

SCHEDULES = ("agents", "groups")


def agree(draft: list[int], truth: list[int]) -> int:
    """Length of the common prefix of a draft and the real continuation (the accepted tokens)."""
    a = 0
    while a < len(draft) and a < len(truth) and int(draft[a]) == truth[a]:
        a += 1
    return a


def predecessors(turns: list[dict]) -> list[int | None]:
    """Each turn's previous turn in its episode (None for an episode's first): the earlier turn with
    the longest prompt that begins this turn's prompt (an episode's history only grows; the replay
    may write a recorded answer there instead of the live one, so the output is not compared).
    Turns are captured in the order they finished, so a turn's predecessor always comes before it.
    Turns with an `episode` key are linked within their episode only, each to the episode's
    previous turn."""
    out: list[int | None] = []
    last_of: dict = {}
    # prompt length -> prefix fingerprint of that length -> the earliest turn with that prompt
    seen: dict[int, dict[int, int]] = {}
    for j, t in enumerate(turns):
        key = t.get("episode")
        if key is not None:
            out.append(last_of.get(key))
            last_of[key] = j
            continue
        prompt = t["prompt"]
        hashes = prefix_hashes(prompt)
        best = None
        for n in sorted((n for n in seen if 0 < n < len(prompt)), reverse=True):
            i = seen[n].get(int(hashes[n - 1]))
            if i is not None and turns[i]["prompt"] == prompt[:n]:
                best = i
                break
        out.append(best)
        if len(prompt):
            seen.setdefault(len(prompt), {}).setdefault(int(hashes[-1]), j)
    return out


def simulate(turns: list[dict], propose, batch: int, gamma: int = 0, trim=None, choose=None,
             schedule: str = "groups", records: list | None = None, per_turn: bool = False) -> dict:
    """`propose`: a drafter `f(histories) -> drafts`; a keyed one (`keyed = True`, as vLLM's suffix
    proposer): called with rows (key, prompt length, history, tokens sampled since its last call)
    and told `retire(key, last tokens)` when a row finishes; a tuple of drafters, each called every
    step, whose grammar-trimmed drafts `choose(drafts, truth) -> index` picks from per row and step
    (`picks` counts the choices); or None: the oracle, which drafts the next `gamma` tokens the
    target will write (the bound no drafter can beat at this gamma). `trim(turn, pos, draft)`: what
    is left of a draft after the request grammar (GrammarTrim), as vLLM verifies it.

    `schedule`: "groups" replays the turns `batch` at a time, each group to its end; "agents" as the
    engine runs agents: up to `batch` rows at once, a row starting as soon as one is free and its
    episode's previous turn has finished and been called once more (`predecessors`; the engine's
    proposer sees a finished row's last tokens in the step that samples them, and the agent sends
    the next turn only after that), so that no turn runs beside its own episode's earlier turns.

    Per pass the draft is attributed to the law class (`turn["classes"]`) and the segment kind of the
    token it began at: the kind the first drafter reports for the row (`kinds`, the structure
    drafter's own segmentation), else `turn["kinds"]`. A drafter with `finished_first` is handed the
    rows that finished in the previous step before the active ones (`d(histories, first=n)` drafts
    for `histories[n:]`). `records`: a list that gets one
    (law class, kind, drafted, accepted) per pass. `per_turn`: the row also gets `by_turn`, per turn
    (in `turns`' order) its passes, drafted and accepted, in all (`"all"`) and per kind (`"kinds"`)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    return _Replay(turns, propose, batch, gamma, trim, choose, schedule, records, per_turn).run()


class _Replay:
    def __init__(self, turns, propose, batch, gamma, trim, choose, schedule, records, per_turn=False):
        self.turns, self.batch, self.gamma, self.trim, self.choose = turns, batch, gamma, trim, choose
        self.oracle = propose is None
        self.drafters = propose if isinstance(propose, tuple) else (propose,)
        self.records = records
        self.schedule = schedule
        self.pred = predecessors(turns) if schedule == "agents" else [None] * len(turns)
        self.pos = [1] * len(turns)  # the first output token comes from the prefill pass
        self.told = [0] * len(turns)  # output tokens keyed drafters have been given
        self.done = [len(t["out"]) <= 1 for t in turns]
        self.waiting = [j for j in range(len(turns)) if not self.done[j]]
        # agents: the waiting turns whose predecessor is done (a heap: they start in capture order) and,
        # per unfinished turn, the turns waiting for it; a turn's successors become ready once its
        # last tokens have reached the drafters (`_seen_finished`)
        self.ready: list[int] = []
        self.successors: dict[int, list[int]] = {}
        for j in self.waiting:
            p = self.pred[j]
            if p is None or self.done[p]:
                self.ready.append(j)
            else:
                self.successors.setdefault(p, []).append(j)
        heapq.heapify(self.ready)
        self.left = len(self.waiting)  # turns not started yet
        self.live: list[int] = []
        self.finishing: list[int] = []  # rows whose last pass was the previous step
        self.passes = self.drafted = self.accepted = 0
        self.picks = [0] * len(self.drafters)
        self.by_class: dict[str, dict[str, int]] = {}
        self.by_kind: dict[str, dict[str, int]] = {}
        self.by_turn = [{"all": {"passes": 0, "drafted": 0, "accepted": 0}, "kinds": {}} for _ in turns] \
            if per_turn else None

    def _start_rows(self) -> None:
        if self.schedule == "groups":
            if not self.live and not self.finishing:
                self.live, self.waiting = self.waiting[:self.batch], self.waiting[self.batch:]
                self.left = len(self.waiting)
            return
        # a turn starts once its episode's previous turn is done and has been called once more
        # (its last tokens reached the drafters): the agent sends it after the answer came back
        while self.ready and len(self.live) < self.batch:
            self.live.append(heapq.heappop(self.ready))
            self.left -= 1

    def _seen_finished(self) -> None:
        """The finished rows have been called once more: their episodes' next turns may start."""
        for i in self.finishing:
            for j in self.successors.pop(i, ()):
                heapq.heappush(self.ready, j)
        self.finishing = []

    def _drafts(self, active: list[int]) -> list[list[list[int]]] | None:
        """Per active row the drafts of every drafter; None when nothing was called this step."""
        turns, pos = self.turns, self.pos
        if self.oracle:
            self._seen_finished()  # the oracle learns nothing
            return [[turns[i]["out"][pos[i]:pos[i] + self.gamma]] for i in active] if active else None
        # vLLM calls the proposer after every pass with every row of that pass, a row that has just
        # finished included: its last tokens reach the drafter (structure's trees and lookups learn
        # them) and its draft is dropped. Keyed drafters get them by `retire`. The finished rows come
        # last, so that a drafter's row k (its kinds and classes) is still active row k.
        called = active + self.finishing
        if not called:
            return None
        histories = {i: np.asarray(turns[i]["prompt"] + turns[i]["out"][:pos[i]]) for i in called}
        per = []
        for d in self.drafters:
            if getattr(d, "keyed", False):
                per.append(d([(i, len(turns[i]["prompt"]), histories[i], turns[i]["out"][self.told[i]:pos[i]])
                              for i in active]))
            elif getattr(d, "finished_first", False):  # drafts for the active rows only
                per.append(d([histories[i] for i in self.finishing + active], first=len(self.finishing)))
            else:
                per.append(d([histories[i] for i in called])[:len(active)])
        for i in active:
            self.told[i] = pos[i]
        self._seen_finished()
        return [list(o) for o in zip(*per, strict=True)]

    def _kind(self, k: int, turn: dict, start: int) -> str | None:
        row_kinds = getattr(self.drafters[0], "kinds", None)
        if row_kinds is not None and k < len(row_kinds) and row_kinds[k] is not None:
            return row_kinds[k]
        return turn["kinds"][start] if "kinds" in turn else None

    def _count(self, table: dict, key: str, drafted: int, accepted: int) -> None:
        c = table.setdefault(key, {"passes": 0, "drafted": 0, "accepted": 0})
        c["passes"] += 1
        c["drafted"] += drafted
        c["accepted"] += accepted

    def _verify(self, k: int, i: int, drafts: list[list[int]]) -> None:
        turn, pos = self.turns[i], self.pos
        truth = turn["out"][pos[i]:]
        drafts = [[int(t) for t in dr] for dr in drafts]
        if self.trim is not None and not self.oracle:
            drafts = [self.trim(turn, pos[i], dr) for dr in drafts]
        pick = self.choose(drafts, truth, key=i, index=k) if len(drafts) > 1 else 0
        pick, n = pick if isinstance(pick, tuple) else (pick, None)
        self.picks[pick] += 1
        draft = drafts[pick][:n]
        a = agree(draft, truth)
        start = pos[i]
        pos[i] = min(len(turn["out"]), pos[i] + a + 1)
        self.drafted += len(draft)
        self.accepted += a
        self.passes += 1
        cls = turn["classes"][start] if "classes" in turn else None
        kind = self._kind(k, turn, start)
        if cls is not None:  # the class of the token the draft began at
            self._count(self.by_class, cls, len(draft), a)
        if kind is not None:
            self._count(self.by_kind, kind, len(draft), a)
        if self.by_turn is not None:
            self._count(self.by_turn[i], "all", len(draft), a)
            if kind is not None:
                self._count(self.by_turn[i]["kinds"], kind, len(draft), a)
        if self.records is not None:
            self.records.append((cls, kind, len(draft), a))
        if pos[i] >= len(turn["out"]):
            release = getattr(self.trim, "release", None)
            if release is not None:
                release(turn)
            self.done[i] = True
            self.live.remove(i)
            self.finishing.append(i)
            for d in self.drafters:
                if getattr(d, "keyed", False):
                    d.retire(i, turn["out"][self.told[i]:])

    def run(self) -> dict:
        while True:
            self._start_rows()
            active = list(self.live)
            options = self._drafts(active)
            if options is None:
                if not self.left and not self.live:
                    break
                continue
            for k, (i, drafts) in enumerate(zip(active, options, strict=True)):
                self._verify(k, i, drafts)
        row = {"passes": self.passes, "drafted": self.drafted, "accepted": self.accepted}
        if len(self.drafters) > 1:
            row["picks"] = self.picks
        if self.by_class:
            row["by_class"] = dict(sorted(self.by_class.items()))
        if self.by_kind:
            row["by_kind"] = dict(sorted(self.by_kind.items()))
        if self.by_turn is not None:
            row["by_turn"] = self.by_turn
        return row
