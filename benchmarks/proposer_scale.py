"""What each proposer costs per step at the batch sizes agents are served at: vLLM's ngram, vLLM's
suffix and the structure drafter, side by side on the same captured turns, no engine.

Rows are the captured turns of a capture (`tests/data/*.capture.jsonl`, or any capture file or
directory: `benchmarks/offline_drafting.py --capture`, `agentspec serve --capture`; docs/capture.md),
copied as distinct episodes until `--batch` rows can run at once (each copy keeps its episode order: a
turn starts once its episode's previous turn has finished, as the engine runs agents). The rows live in
one `[rows, max_len]` token array as vLLM's input batch holds them: a new row takes the first free slot,
a finished row's slot is filled by the last row (vLLM's `condense`), so the drafters see rows move.
Every step each mode's proposer is called with every live row (and, once more, the rows that finished in
the step before: vLLM calls the proposer with a finishing row's last tokens); the draft is trimmed by
the turn's grammar as vLLM trims it, and greedy verification against the recorded output decides what is
accepted (at temperature 0 the target writes the same tokens whatever was drafted). The modes step in
turn (one step of each, then the next), so a burst of load falls on all of them.

Per mode, set and batch size: ms per step (median, p90) of the proposer call, wall and the calling
thread's CPU time (robust to other load on the machine; a reaper thread's work is not in it, the
builder threads' work is a column of its own and counted in the ratio to suffix), all of it and
"steady" (less the time spent building new rows and tearing down finished ones: structure's
`RowState` set-up, continued or built, and `forget` of a row its parking lets go, the suffix cache's
`start_request`, `stop_request` and evictions; structure's trees are torn down by a reaper thread
while the target's pass runs, here between steps, outside the timed call),
µs per row (steady, median over steps), ms per new row and per finished row, drafted and accepted
tokens per step, and the steps with all `--batch` rows live. The proposer's share of an assumed
GPU pass: `--gpu-pass-ms` (default: a 32B BF16 target on one H200, 64 GB of weights read at
4.8 TB/s = 13 ms, plus attention and the KV cache growing with the batch: 15 ms at 8 rows, 20 ms at
64; an estimate, not a measurement; give your own per batch size, e.g. `8:12,64:18`).

`--phases`: structure's step by part (rows matched, new rows built or continued, drafts resolved, rows
advanced, the own and tree candidates, sizing, the step's accounting), CPU of the calling thread per
step and per row, from wrappers around the drafter's methods. `--profile N`: cProfile of structure's
calls from step N on, and its own time grouped by where it runs (the suffix trees, llguidance, numpy,
our modules, Python's builtins); the profiler slows Python calls more than native ones, so the
native shares it prints are lower bounds.

Copies of one episode are identical, so the suffix trees (suffix's and structure's) see a copy's
answers before the later copies write them: acceptance is higher than on distinct traffic. The
figures are per-step costs, not acceptance figures (benchmarks/offline_drafting.py is that).

  python benchmarks/proposer_scale.py                                 # the three bundled sets, B 8..128
  python benchmarks/proposer_scale.py --sets tool_calls --batch 64 --phases   # structure's step by part
  python benchmarks/proposer_scale.py --sets tool_calls --batch 64 --profile 20   # cProfile structure
  python benchmarks/proposer_scale.py --sets code --plan tuned.json   # a tuned plan's policies
  python benchmarks/proposer_scale.py --sets tool_calls --batch 64 --tree-calls   # the trees' own share
  python benchmarks/proposer_scale.py --turns long.json --batch 8,64 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
SETS = {name: DATA / f"{name}.capture.jsonl" for name in ("tool_calls", "react", "code")}
MODES = ("ngram", "suffix", "structure")
# assumed ms of one target pass on the GPU by batch size (see the module docstring)
GPU_PASS_MS = {8: 15.0, 32: 17.0, 64: 20.0, 128: 25.0}
MAX_LEN = 16384
PROFILE_SORT = "tottime"
PROFILE_LINES = 60


class Clock:
    """Seconds (wall and this thread's CPU) spent in wrapped calls since the last `take()`."""

    def __init__(self):
        self.spent, self.cpu, self.calls = 0.0, 0.0, 0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            t, c = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent += time.perf_counter() - t
                self.cpu += time.thread_time() - c
                self.calls += 1
        return timed

    def take(self) -> tuple[float, float, int]:
        out = (self.spent, self.cpu, self.calls)
        self.spent, self.cpu, self.calls = 0.0, 0.0, 0
        return out


class TreeCalls:
    """`--tree-calls`: the calling thread's CPU inside the suffix trees' native methods, by mode
    (suffix calls arctic-inference's `SuffixTree`, structure the compiled `_trees.Forest` around the
    same tree code), counting the calls of a step (an `extend` of at most γ + 1 tokens: a new row's
    prompt, extended at its set-up, is longer), every `speculate`, and structure's `step` (every row's
    tokens added and its draft with the extension, one call a step). What the trees' own work costs a
    row and step."""

    METHODS = {"extend": "extend", "extend_ndarray": "extend", "speculate": "speculate",
               "speculate_ndarray": "speculate", "step": "step"}

    def __init__(self, gamma: int):
        from arctic_inference.suffix_decoding import _C

        from agentspec_sdk.drafting import _trees

        self.gamma, self.mode = gamma, None
        self.cpu: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._saved = [(cls, name, getattr(cls, name)) for cls in (_C.SuffixTree, _trees.Forest)
                       for name in self.METHODS if hasattr(cls, name)]
        for cls, name, fn in self._saved:
            setattr(cls, name, self._timed(self.METHODS[name], fn))

    def _timed(self, method: str, fn):
        def tree_call(tree, *args):  # named so a profile tells the trees' native time apart
            c = time.thread_time()
            try:
                return fn(tree, *args)
            finally:
                if self.mode is not None and not (method == "extend" and len(args[-1]) > self.gamma + 1):
                    key = f"{self.mode}.{method}"
                    self.cpu[key] = self.cpu.get(key, 0.0) + time.thread_time() - c
                    self.calls[key] = self.calls.get(key, 0) + 1
        return tree_call

    def take(self, mode: str, row_steps: int) -> dict:
        """The mode's calls since the last `take`: µs a call and a row's µs a step, by method."""
        out = {}
        for method in ("extend", "speculate", "step"):
            key = f"{mode}.{method}"
            cpu, calls = self.cpu.pop(key, 0.0), self.calls.pop(key, 0)
            if calls:
                out[method] = {"calls": calls, "us_per_call": 1e6 * cpu / calls,
                               "us_per_row_step": 1e6 * cpu / max(1, row_steps)}
        return out

    def close(self) -> None:
        for cls, name, fn in self._saved:
            setattr(cls, name, fn)


class Phases:
    """`--phases`: the calling thread's CPU in each part of structure's step (rows matched, new rows
    built or continued, drafts resolved, rows advanced, each row's own and tree candidates and the
    choice between them, sizing, the step's accounting), by wrappers around the drafter's methods (no
    profiler: each call costs a wrapper's µs or so more). What each part would have to shed."""

    PARTS = (  # (label, module, class, method); indented labels are parts of the one above
        ("rows matched to the batch", "rows", "RowTracker", "match"),
        ("new rows (built or continued)", "rows", "RowTracker", "new_row"),
        ("drafts resolved (accounting, choice judged)", "records", "Accounting", "resolve_row"),
        ("rows advanced (text, segmenter)", "rows", "RowState", "advance"),
        ("the trees' call (rows' tokens added, drafts)", "suffix_source", "SuffixTrees", "step"),
        ("row candidates", "choice", "RowChoice", "candidate"),
        ("  own (forced text, lookups, tokenized)", "candidates", "OwnSource", "candidate"),
        ("  trees (their draft cut at the segment)", "candidates", "TreeSource", "candidate"),
        ("drafts sized", "pricing", "Sizer", "size"),
        ("prices", "pricing", "Sizer", "begin_step"),
        ("step settled (pending drafts, step record)", "drafter", "StructureDrafter", "_settle"),
    )

    def __init__(self):
        import importlib

        self.cpu: dict[str, float] = {}  # the step running
        self.steps: list[dict[str, float]] = []  # each step's
        self._saved = []
        for label, module, owner, method in self.PARTS:
            cls = getattr(importlib.import_module(f"agentspec_sdk.drafting.{module}"), owner)
            fn = getattr(cls, method)
            self._saved.append((cls, method, fn))
            setattr(cls, method, self._timed(label, fn))

    def _timed(self, label: str, fn):
        def timed(*args, **kwargs):
            c = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu[label] = self.cpu.get(label, 0.0) + time.thread_time() - c
        return timed

    def end_step(self) -> None:
        """The parts of the step just run, kept apart (`take` leaves out the slowest steps)."""
        self.steps.append(self.cpu)
        self.cpu = {}

    def take(self, steps: list[dict]) -> list[dict]:
        """Per part: ms a step, µs a row and step, share of the step's CPU; the rest of the step last.
        Over the steps at or below the 98th percentile of the step's CPU: a one-off (a grammar's first
        compile, a collection) would otherwise decide the shares of a short run."""
        cpu = np.array([s["cpu_s"] for s in steps])
        top_cpu = np.percentile(cpu, 98) if len(steps) else 0.0
        keep = [i for i in range(len(steps)) if cpu[i] <= top_cpu]
        n, rows = max(1, len(keep)), max(1, sum(steps[i]["called"] for i in keep))
        total = float(sum(cpu[i] for i in keep)) or 1.0
        spent = {label: sum(self.steps[i].get(label, 0.0) for i in keep) for label, *_ in self.PARTS}
        top = sum(v for label, v in spent.items() if not label.startswith(" "))
        out = list(spent.items()) + [("the rest of the step", max(0.0, total - top))]
        self.steps = []
        return [{"part": label, "ms_per_step": 1e3 * v / n, "us_per_row_step": 1e6 * v / rows,
                 "share": v / total} for label, v in out]

    def close(self) -> None:
        for cls, method, fn in self._saved:
            setattr(cls, method, fn)


# -- the three proposers, each as vLLM calls it ------------------------------------------------------

class Ngram:
    """vLLM's `NgramProposer` (n 2..5, numba, one thread as vLLM sets it), built without a vLLM config."""

    def __init__(self, gamma: int, rows: int):
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer

        cfg = SimpleNamespace(
            speculative_config=SimpleNamespace(prompt_lookup_min=2, prompt_lookup_max=5,
                                               num_speculative_tokens=gamma),
            model_config=SimpleNamespace(max_model_len=MAX_LEN),
            scheduler_config=SimpleNamespace(max_num_seqs=max(rows, 1024)),
            parallel_config=SimpleNamespace(tensor_parallel_size=1))
        self.proposer = NgramProposer(cfg)
        self.gamma = gamma
        self.setup, self.teardown = Clock(), Clock()

    def __call__(self, sampled, num_tokens, token_ids, keys, prompt_lens) -> list[list[int]]:
        return self.proposer.propose(self.gamma, sampled, num_tokens, token_ids)

    def finished(self, key) -> None:
        pass


class Suffix:
    """vLLM 0.32's `SuffixDecodingProposer` on arctic-inference's `SuffixDecodingCache` (vLLM's
    defaults): a request's prompt tree starts at its first step, every step adds the tokens sampled
    since, the pattern is the last 24 tokens; a finished request is stopped."""

    def __init__(self, gamma: int, rows: int):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=10000)
        self.gamma, self.depth = gamma, 24
        self.setup, self.teardown = Clock(), Clock()
        self.cache.start_request = self.setup.wrap(self.cache.start_request)
        self.cache.evict_cached_response = self.setup.wrap(self.cache.evict_cached_response)
        self.cache.stop_request = self.teardown.wrap(self.cache.stop_request)

    def __call__(self, sampled, num_tokens, token_ids, keys, prompt_lens) -> list[list[int]]:
        cache, drafts = self.cache, []
        for i, new in enumerate(sampled):
            key, n = keys[i], int(num_tokens[i])
            if not new:
                drafts.append([])
                continue
            if key not in cache.active_requests:
                if key in cache.cached_requests:
                    cache.evict_cached_response(key)
                cache.start_request(key, token_ids[i, :prompt_lens[i]])
            cache.add_active_response(key, new)
            pattern = token_ids[i, max(0, n - self.depth):n]
            draft = cache.speculate(key, pattern, max_spec_tokens=min(self.gamma, MAX_LEN - n - 1),
                                    max_spec_factor=1.0, min_token_prob=0.1)
            drafts.append(draft.token_ids)
        return drafts

    def finished(self, key) -> None:
        if key in self.cache.active_requests:
            self.cache.stop_request(key)


class Structure:
    """The product's `StructureDrafter` through the adapter vLLM instantiates (`RowInput` per row:
    the row of the token array, `num_tokens_no_spec`, sampled count), priced at `delta` per drafted
    token as benchmarks/offline_drafting.py prices it."""

    def __init__(self, gamma: int, rows: int, tools: list[dict], delta: float,
                 plan_path: str | None = None):
        from transformers import AutoTokenizer

        from agentspec_sdk.backends.model_bundle import resolve_model
        from agentspec_sdk.drafting import rows as rows_module
        from agentspec_sdk.drafting.budget import sequence_price
        from agentspec_sdk.drafting.drafter import StructureDrafter
        from agentspec_sdk.drafting.plan import DraftPlan
        from agentspec_sdk.structure.formats import CODE_AGENT, REACT, TOOL_CALLS

        self.RowInput = rows_module.RowInput
        model = resolve_model(None)
        plan = DraftPlan(formats=[REACT, TOOL_CALLS, CODE_AGENT], tools=tools, tokenizer=model,
                         gamma_max=gamma, learn_delta=False, delta=sequence_price(delta, rows), delta_ctx=0.0)
        if plan_path:  # a tuned plan's kind policies and tree knobs (`agentspec tune`), on the same rows
            tuned = DraftPlan.load(plan_path)
            plan = plan.model_copy(update={k: getattr(tuned, k) for k in (
                "kinds", "suffix_max_spec_factor", "suffix_min_token_prob", "suffix_extend_factor")})
        self.drafter = StructureDrafter(plan, AutoTokenizer.from_pretrained(model))
        self.setup, self.teardown = Clock(), Clock()
        # the benchmark's own timers around a row's set-up and teardown (restored by `close`)
        self._rows_module = rows_module
        self._saved = rows_module.RowState.__init__, rows_module.RowState.forget
        rows_module.RowState.__init__ = self.setup.wrap(self._saved[0])
        rows_module.RowState.forget = self.teardown.wrap(self._saved[1])

    def __call__(self, sampled, num_tokens, token_ids, keys, prompt_lens) -> list[list[int]]:
        rows = [self.RowInput(token_ids[i], int(num_tokens[i]), bool(new), len(new))
                for i, new in enumerate(sampled)]
        return self.drafter.propose(rows)

    def finished(self, key) -> None:
        pass

    def close(self) -> None:
        self._rows_module.RowState.__init__, self._rows_module.RowState.forget = self._saved


# -- the replay ---------------------------------------------------------------------------------------

def copies(turns: list[dict], count: int) -> tuple[list[dict], list[int | None]]:
    """`count` copies of the turns, each copy its own episodes (predecessors inside the copy)."""
    pred = _offline().predecessors(turns)
    out, preds = [], []
    for c in range(count):
        base = c * len(turns)
        out.extend(dict(t) for t in turns)  # distinct dicts: the grammar trim keys its matchers by turn
        preds.extend(None if p is None else base + p for p in pred)
    return out, preds


class Replay:
    """One mode's replay of the rows, one step at a time (`step`)."""

    def __init__(self, name: str, proposer, turns: list[dict], preds: list, batch: int, trim):
        self.name, self.proposer, self.turns, self.preds, self.batch, self.trim = \
            name, proposer, turns, preds, batch, trim
        self.token_ids = np.zeros((batch, MAX_LEN), dtype=np.int32)
        self.slots: list[int] = []  # slot -> turn index
        self.pos = [1] * len(turns)  # the first output token comes from the prefill pass
        self.told = [0] * len(turns)
        self.done = [len(t["out"]) <= 1 for t in turns]
        self.waiting = [j for j in range(len(turns)) if not self.done[j]]
        self.finishing: list[int] = []  # turns that finished in the step before (called once more)
        self.steps: list[dict] = []
        self.profiler = None  # a cProfile.Profile around the proposer's calls (`--profile`)
        self.profiled_rows = 0  # the rows of the profiled calls

    def _admit(self) -> int:
        new = 0
        # a turn starts once its episode's previous turn is done and has been called once more (the
        # agent sends it after the answer came back)
        ready = [j for j in self.waiting if self.preds[j] is None
                 or (self.done[self.preds[j]] and self.preds[j] not in self.finishing)]
        for j in ready[: self.batch - len(self.slots)]:
            self.waiting.remove(j)
            turn = self.turns[j]
            self.token_ids[len(self.slots), : len(turn["prompt"])] = turn["prompt"]
            self.slots.append(j)
            new += 1
        return new

    def step(self) -> bool:
        """One engine step; False when every turn is done."""
        if not self.slots and not self.waiting and not self.finishing:
            return False
        new_rows = self._admit()
        called = self.slots + self.finishing
        sampled, num_tokens, keys, prompt_lens = [], np.zeros(len(called), np.int32), [], []
        ids = self.token_ids
        if self.finishing:  # a finishing row's slot is gone: its last history rides in extra rows
            ids = np.vstack([self.token_ids[: len(self.slots)],
                             np.zeros((len(self.finishing), MAX_LEN), np.int32)])
        for r, j in enumerate(called):
            turn = self.turns[j]
            n = len(turn["prompt"]) + self.pos[j]
            ids[r, len(turn["prompt"]): n] = turn["out"][: self.pos[j]]
            if r >= len(self.slots):
                ids[r, : len(turn["prompt"])] = turn["prompt"]
            num_tokens[r] = n
            sampled.append([int(t) for t in turn["out"][self.told[j]: self.pos[j]]])
            keys.append(j)
            prompt_lens.append(len(turn["prompt"]))
        for r in range(len(self.slots), len(called)):  # nothing to draft after the last token
            sampled[r] = sampled[r] or []
        _drain_reaper()
        self.proposer.setup.take()
        self.proposer.teardown.take()
        if self.profiler is not None:
            self.profiler.enable()
            self.profiled_rows += len(called)
        t, c, b = time.perf_counter(), time.thread_time(), _builders_cpu()
        drafts = self.proposer(sampled, num_tokens, ids, keys, prompt_lens)
        for j in self.finishing:
            self.proposer.finished(j)
        spent, cpu, builders = time.perf_counter() - t, time.thread_time() - c, _builders_cpu() - b
        if self.profiler is not None:
            self.profiler.disable()
        setup, setup_cpu, built = self.proposer.setup.take()
        teardown, teardown_cpu, torn = self.proposer.teardown.take()
        finished_before = len(self.finishing)
        self.finishing = []
        drafted = accepted = 0
        live = list(self.slots)
        for r, j in enumerate(live):
            turn = self.turns[j]
            self.told[j] = self.pos[j]
            draft = [int(x) for x in drafts[r]]
            if self.trim is not None:
                draft = self.trim(turn, self.pos[j], draft)
            truth = turn["out"][self.pos[j]:]
            a = 0
            while a < len(draft) and a < len(truth) and draft[a] == truth[a]:
                a += 1
            drafted += len(draft)
            accepted += a
            self.pos[j] = min(len(turn["out"]), self.pos[j] + a + 1)
            if self.pos[j] >= len(turn["out"]):
                self.done[j] = True
                self.finishing.append(j)
        for j in self.finishing:  # vLLM's condense: the last row fills the hole
            slot = self.slots.index(j)
            last = len(self.slots) - 1
            if slot != last:
                self.token_ids[slot] = self.token_ids[last]
                self.slots[slot] = self.slots[last]
            self.slots.pop()
        self.steps.append({"rows": len(live), "called": len(called), "s": spent, "cpu_s": cpu,
                           "builders_cpu_s": builders,
                           "steady_s": max(0.0, spent - setup - teardown),
                           "steady_cpu_s": max(0.0, cpu - setup_cpu - teardown_cpu), "new": new_rows,
                           "finished": finished_before, "setup_s": setup, "built": built,
                           "teardown_s": teardown, "torn": torn, "drafted": drafted, "accepted": accepted})
        return True


def _drain_reaper() -> None:
    """Wait until the structure drafter's reaper has torn down the trees handed to it: in the engine
    it does so during the target's pass, which releases the GIL (≥ 15 ms on the GPU against ≤ 1 ms
    of teardown); here, between steps, outside the timed call."""
    from agentspec_sdk.drafting import suffix_source

    reaper = getattr(suffix_source, "_REAPER", None)  # None: a drafter from before the reaper
    while reaper is not None and reaper.pending:
        time.sleep(0.0002)


def _builders_cpu() -> float:
    """CPU seconds structure's builder threads have spent building prompt trees in this process (they
    build a new row's tree while the proposer's call goes on with the other rows; the call waits for
    them before it drafts that row)."""
    from agentspec_sdk.drafting import suffix_source

    return suffix_source.builders_cpu_seconds()


def _offline():
    """benchmarks/offline_drafting.py (its episode order and grammar trim)."""
    import sys

    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import offline_drafting

    return offline_drafting


def grammar_trim(grammars: list[str]):
    return _offline().GrammarTrim(grammars) if grammars else None


def summary(steps: list[dict], batch: int) -> dict:
    ms = np.array([s["s"] for s in steps]) * 1e3
    steady = np.array([s["steady_s"] for s in steps]) * 1e3
    rows = np.array([max(1, s["called"]) for s in steps])
    full = [s for s in steps if s["rows"] == batch]
    built = sum(s["built"] for s in steps)
    torn = sum(s["torn"] for s in steps)
    return {
        "steps": len(steps), "full_steps": len(full),
        "ms": float(np.median(ms)), "ms_p90": float(np.percentile(ms, 90)),
        "steady_ms": float(np.median(steady)), "steady_ms_p90": float(np.percentile(steady, 90)),
        "full_ms": float(np.median([s["s"] for s in full]) * 1e3) if full else None,
        "full_steady_ms": float(np.median([s["steady_s"] for s in full]) * 1e3) if full else None,
        "us_per_row": float(np.median(steady * 1e3 / rows)),
        "cpu_ms": float(np.median([s["cpu_s"] for s in steps]) * 1e3),
        "builders_cpu_ms": float(np.mean([s["builders_cpu_s"] for s in steps]) * 1e3),
        "cpu_and_builders_ms": float(np.median([s["cpu_s"] + s["builders_cpu_s"] for s in steps]) * 1e3),
        "steady_cpu_ms": float(np.median([s["steady_cpu_s"] for s in steps]) * 1e3),
        "cpu_us_per_row": float(np.median(np.array([s["steady_cpu_s"] for s in steps]) * 1e6 / rows)),
        "new_row_ms": 1e3 * sum(s["setup_s"] for s in steps) / built if built else None,
        "finished_row_ms": 1e3 * sum(s["teardown_s"] for s in steps) / torn if torn else None,
        "drafted_per_step": float(np.mean([s["drafted"] for s in steps])),
        "accepted_per_step": float(np.mean([s["accepted"] for s in steps])),
        "passes": int(sum(s["rows"] for s in steps)),
        "drafted": int(sum(s["drafted"] for s in steps)),
        "accepted": int(sum(s["accepted"] for s in steps)),
    }


def run(set_name: str, path: Path, batch: int, gamma: int, modes: tuple[str, ...], delta: float,
        max_steps: int, profile: int = 0, plan_path: str | None = None, tree_calls: bool = False,
        phases: bool = False) -> dict:
    data = _offline().load_turns(path)
    turns = data["turns"]
    mean_steps = max(1.0, np.mean([len(t["out"]) for t in turns]) / 4)  # a row's life in steps, roughly
    count = max(2, math.ceil(batch * min(max_steps, 60) / mean_steps / len(turns)))
    rows, preds = copies(turns, count)
    built = {"ngram": lambda: Ngram(gamma, batch), "suffix": lambda: Suffix(gamma, batch),
             "structure": lambda: Structure(gamma, batch, data.get("tools", []), delta, plan_path)}
    # before the proposers (structure binds a method); a profile needs them to tell arctic's time apart
    trees = TreeCalls(gamma) if tree_calls or profile else None
    replays = [Replay(m, built[m](), rows, preds, batch, grammar_trim(data.get("grammars", [])))
               for m in modes]
    parts = Phases() if phases and "structure" in modes else None
    load = os.getloadavg()[0]
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
    live = list(replays)
    while live:
        for rep in list(live):
            if len(rep.steps) >= max_steps:
                live.remove(rep)
                continue
            if profiler is not None and rep.name == "structure" and len(rep.steps) >= profile:
                rep.profiler = profiler
            if trees is not None:
                trees.mode = rep.name
            going = rep.step()
            if parts is not None and rep.name == "structure" and going:
                parts.end_step()
            if trees is not None:
                trees.mode = None
            if not going:
                live.remove(rep)
    for rep in replays:
        if hasattr(rep.proposer, "close"):
            rep.proposer.close()
    if parts is not None:
        parts.close()
    out = {"set": set_name, "batch": batch, "gamma": gamma, "copies": count, "turns": len(rows),
           "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2),
           "modes": {rep.name: summary(rep.steps, batch) for rep in replays}}
    if parts is not None:
        structure = next(r for r in replays if r.name == "structure")
        out["modes"]["structure"]["phases"] = parts.take(structure.steps)
    if trees is not None:
        trees.close()
        for rep in replays:
            calls = trees.take(rep.name, sum(s["called"] for s in rep.steps))
            if calls:
                out["modes"][rep.name]["tree_calls"] = calls
    if profiler is not None:
        import io
        import pstats

        buf = io.StringIO()
        stats = pstats.Stats(profiler, stream=buf)
        stats.sort_stats(PROFILE_SORT).print_stats(PROFILE_LINES)
        out["profile"] = buf.getvalue()
        rep = next(r for r in replays if r.name == "structure")
        steps = len(rep.steps) - profile
        out["time_went"] = [{"group": g, "ms_per_step": 1e3 * s / max(1, steps),
                             "us_per_row_step": 1e6 * s / max(1, rep.profiled_rows), "share": share}
                            for g, s, share in time_went(stats.stats)]
    return out


NATIVE_GROUPS = ("suffix trees (native)", "llguidance (native)", "numpy")


def time_went(stats: dict) -> list[tuple[str, float, float]]:
    """(group, seconds, share) of a profile's own time by where it runs: the suffix trees (the
    `TreeCalls` wrappers: native methods are invisible to cProfile, their time would land in the
    caller), llguidance's matcher and tokenizer, numpy, our code by module, Python's builtins (str,
    list, dict, re, len...) and the rest; largest first."""
    groups: dict[str, float] = {}
    for (path, _line, name), (_cc, _nc, own, _cum, _callers) in stats.items():
        if name == "tree_call" or "arctic_inference" in path:
            group = NATIVE_GROUPS[0]
        elif path == "~" and ("LLMatcher" in name or "LLTokenizer" in name or "llguidance" in name):
            group = NATIVE_GROUPS[1]
        elif "/numpy/" in path or (path == "~" and "numpy" in name):
            group = NATIVE_GROUPS[2]
        elif path == "~":
            group = "Python builtins (str, list, dict, re, len...)"
        elif "agentspec_sdk/" in path:
            group = "ours: " + path.split("agentspec_sdk/", 1)[1]
        else:
            group = "other: " + Path(path).name
        groups[group] = groups.get(group, 0.0) + own
    total = sum(groups.values()) or 1.0
    return sorted(((g, s, s / total) for g, s in groups.items()), key=lambda x: -x[1])


def gpu_pass_ms(spec: str | None) -> dict[int, float]:
    if not spec:
        return dict(GPU_PASS_MS)
    out = {}
    for part in spec.split(","):
        b, _, ms = part.partition(":")
        out[int(b)] = float(ms)
    return out


def _fmt(x, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def table(results: list[dict], passes: dict[int, float]) -> str:
    lines = ["| set | B | mode | ms/step all (p90) | steady (p90) | µs/row steady | CPU ms all / steady | "
             "builders' CPU ms | CPU µs/row steady | new row ms | finished row ms | drafted/step | "
             "accepted/step | ÷ suffix all (+ builders) / steady (CPU) | GPU pass share |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        suffix = res["modes"].get("suffix")
        for mode, m in res["modes"].items():
            vs = (f"{m['cpu_and_builders_ms'] / suffix['cpu_ms']:.2f} / "
                  f"{m['steady_cpu_ms'] / suffix['steady_cpu_ms']:.2f}"
                  if suffix and suffix["cpu_ms"] > 0 and suffix["steady_cpu_ms"] > 0 else "–")
            gpu = passes.get(res["batch"])
            share = f"{100 * m['ms'] / gpu:.0f}% of {gpu:g} ms" if gpu else "–"
            lines.append(
                f"| {res['set']} | {res['batch']} | {mode} | {_fmt(m['ms'])} ({_fmt(m['ms_p90'])}) | "
                f"{_fmt(m['steady_ms'])} ({_fmt(m['steady_ms_p90'])}) | {_fmt(m['us_per_row'], 0)} | "
                f"{_fmt(m['cpu_ms'])} / {_fmt(m['steady_cpu_ms'])} | {_fmt(m['builders_cpu_ms'])} | "
                f"{_fmt(m['cpu_us_per_row'], 0)} | "
                f"{_fmt(m['new_row_ms'])} | {_fmt(m['finished_row_ms'])} | "
                f"{_fmt(m['drafted_per_step'], 1)} | {_fmt(m['accepted_per_step'], 1)} | {vs} | {share} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default=",".join(SETS), help="bundled turn sets: " + ", ".join(SETS))
    ap.add_argument("--turns", action="append", default=[],
                    help="another capture file or directory (repeatable)")
    ap.add_argument("--batch", default="8,32,64,128")
    ap.add_argument("--gamma", type=int, default=8)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--delta", type=float, default=0.2, help="price of a drafted token per row (passes)")
    ap.add_argument("--max-steps", type=int, default=80, help="steps per mode, set and batch size")
    ap.add_argument("--gpu-pass-ms", default=None, help="assumed GPU pass ms by batch size, e.g. 8:15,64:20")
    ap.add_argument("--profile", type=int, default=0, help="cProfile structure's steps from this step on")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--tree-calls", action="store_true",
                    help="time the suffix trees' native calls by mode (suffix: extend, speculate; "
                         "structure: its one call a step): the trees' own cost")
    ap.add_argument("--phases", action="store_true",
                    help="structure's step by part (new rows, candidates, ...): CPU a step and a row")
    ap.add_argument("--plan", default=None,
                    help="a tuned plan file (`agentspec tune`): its kind policies and tree knobs")
    args = ap.parse_args()
    sets = {name: SETS[name] for name in args.sets.split(",") if name}
    for extra in args.turns:
        sets[_offline().set_label(extra)] = Path(extra)
    modes = tuple(m for m in args.modes.split(",") if m)
    results = []
    for name, path in sets.items():
        for batch in (int(b) for b in args.batch.split(",")):
            res = run(name, path, batch, args.gamma, modes, args.delta, args.max_steps, args.profile,
                      args.plan, args.tree_calls, args.phases)
            results.append(res)
            print(f"{name} B {batch}: load {res['load_before']} -> {res['load_after']}, "
                  f"{res['copies']} copies", flush=True)
            if "profile" in res:
                print(res["profile"])
                went = res["time_went"]
                print(f"Where structure's step went (own time, steps {args.profile} on):\n"
                      "| where | ms a step | µs a row and step | share |\n|---|---|---|---|")
                for g in went:
                    print(f"| {g['group']} | {g['ms_per_step']:.2f} | {g['us_per_row_step']:.1f} | "
                          f"{100 * g['share']:.1f}% |")
                native = [g for g in went if g["group"] in NATIVE_GROUPS]
                print(f"| native calls ({', '.join(NATIVE_GROUPS)}) | "
                      f"{sum(g['ms_per_step'] for g in native):.2f} | "
                      f"{sum(g['us_per_row_step'] for g in native):.1f} | "
                      f"{100 * sum(g['share'] for g in native):.1f}% |\n")
            if "phases" in res["modes"].get("structure", {}):
                print(f"Structure's step by part ({name}, B {batch}, CPU of the calling thread, mean of the "
                      "steps up to the 98th percentile):\n"
                      "| part | ms a step | µs a row and step | share |\n|---|---|---|---|")
                for p in res["modes"]["structure"]["phases"]:
                    print(f"| {p['part']} | {p['ms_per_step']:.2f} | {p['us_per_row_step']:.1f} | "
                          f"{100 * p['share']:.1f}% |")
            for mode, m in res["modes"].items():
                for method, t in m.get("tree_calls", {}).items():
                    print(f"  {mode}: the trees' {method}, {t['calls']} calls, {t['us_per_call']:.1f} µs a "
                          f"call, {t['us_per_row_step']:.1f} µs a row and step")
    passes = gpu_pass_ms(args.gpu_pass_ms)
    print(table(results, passes))
    print(f"\nγ {args.gamma}; GPU pass assumed (ms by B): {passes}; 1-minute load "
          f"{min(r['load_before'] for r in results)}–{max(r['load_after'] for r in results)}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
