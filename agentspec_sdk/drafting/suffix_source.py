"""Suffix-tree continuations for the structure drafter: SuffixDecoding's trees, confidences included.

vLLM's `suffix` drafter runs arctic-inference's `SuffixDecodingCache`: a tree over each request's
prompt plus one global tree over the responses of all requests, both matched against the last
`max_tree_depth` tokens, every drafted token with the tree's estimate of the probability of the path
up to it. The drafter keeps the same trees in `_trees.Forest` (C++, csrc/suffix_trees: arctic's tree
code, kept and evicted as the cache keeps them) with the same depth, spec factor and probability
floor, so on every row it knows what suffix decoding would have drafted; the drafter then cuts that
draft at the segment's end and lets the budget price each token by its own confidence. The structure
drafter is thereby a superset of suffix decoding inside a segment. A row's tokens reach both trees in
one call, and its draft and the draft's extension (`draft`) come from one pass over the matches.

Keys: vLLM's proposer sees no request ids, so a "request" here is one tracked row (the drafter's
`_Row`: a history it follows step by step); a row that is rebuilt (it left the batch and came back,
or was reordered past recognition) starts a new entry, and one that leaves the batch is stopped (its
response stays in the global tree, as in vLLM). The trees are not keyed by segment kind or tool: the
matched context (up to 24 tokens) already carries the kind and usually the tool name, and a draft is
cut where the segment ends anyway.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading

import numpy as np

from agentspec_sdk.errors import PlanError

log = logging.getLogger("agentspec.drafting")

# vLLM 0.32's defaults for method "suffix" (SpeculativeConfig.suffix_decoding_*)
MAX_TREE_DEPTH = 24
MAX_CACHED_REQUESTS = 10_000
MAX_SPEC_FACTOR = 1.0
MIN_TOKEN_PROB = 0.1
# A new row's prompt tree of this many tokens or more is built on a builder thread while the step's
# other rows are worked on (a 1.4k-token prompt's tree takes about 1 ms). Threads: `AGENTSPEC_TREE_BUILDERS`
# (0: none, every tree on the caller's thread), else one per 4 cores, at most 4 (none below 4 cores:
# a small machine's other cores belong to the engine).
MIN_BUILT = 256
BUILDERS_ENV = "AGENTSPEC_TREE_BUILDERS"


def _build_threads() -> int:
    value = os.environ.get(BUILDERS_ENV, "").strip()
    if not value:
        return min(4, (os.cpu_count() or 1) // 4)
    try:
        threads = int(value)
    except ValueError:
        threads = -1
    if not 0 <= threads <= 64:
        raise PlanError(f"{BUILDERS_ENV}={value!r}: give a number of threads from 0 to 64")
    return threads


def available() -> bool:
    """Whether the compiled trees are built (`pip install` builds them from csrc/suffix_trees)."""
    try:
        from agentspec_sdk.drafting import _trees  # noqa: F401
    except ImportError:
        return False
    return True


_NO_HISTORY = np.zeros(0, dtype=np.int32)  # a row's part of `step` with no tokens gained, or none drafted


class SuffixTrees:
    """The rows' suffix trees: one `_trees.Forest`, keyed by tracked row."""

    def __init__(self, max_tree_depth: int = MAX_TREE_DEPTH, max_cached_requests: int = MAX_CACHED_REQUESTS,
                 max_spec_factor: float = MAX_SPEC_FACTOR, min_token_prob: float = MIN_TOKEN_PROB,
                 extend_factor: float | None = None, build_threads: int | None = None):
        from agentspec_sdk.drafting._trees import Forest

        threads = _build_threads() if build_threads is None else build_threads
        self.forest = Forest(max_tree_depth, max_cached_requests, threads, MIN_BUILT)
        self.depth = max_tree_depth
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        # a second, longer draft at this spec factor (None: none); see `draft`
        self.extend_factor = extend_factor
        self._ids = itertools.count()

    @classmethod
    def for_plan(cls, plan, wanted: bool, current: SuffixTrees | None) -> SuffixTrees | None:
        """The trees a plan wants (`wanted`: the lab switch `suffix_trees`): `current` with the plan's
        knobs (they apply from the next step on; the trees and what they learned are kept), new trees
        where there were none, None where they are not wanted or not built (logged)."""
        if not wanted:
            return None
        if current is not None:
            current.max_spec_factor = plan.suffix_max_spec_factor
            current.min_token_prob = plan.suffix_min_token_prob
            current.extend_factor = plan.suffix_extend_factor
            return current
        if not available():
            log.warning("the compiled suffix trees (agentspec_sdk.drafting._trees) are not built: the "
                        "structure drafter runs without them (pip install -e . builds them)")
            return None
        return cls(max_spec_factor=plan.suffix_max_spec_factor, min_token_prob=plan.suffix_min_token_prob,
                   extend_factor=plan.suffix_extend_factor)

    def start(self, history: np.ndarray, response: int = 0, defer: bool = False) -> int:
        """A new tracked row: its history so far is its "prompt", but for its last `response` tokens,
        which enter as its response (in the global tree too), as vLLM's proposer adds a request's
        tokens sampled at its first step; returns its key. `defer`: the row's place in the global tree
        (its sequence, its response) waits for its turn in the next `step`, so the global tree
        changes in the batch's row order, as the cache's calls row by row would change it; its prompt
        tree is then built on a builder thread where it is long (`MIN_BUILT`), and the first call
        that needs it waits for it."""
        key = next(self._ids)
        self.forest.start(key, history, response, defer)
        return key

    def adopt(self, key: int, new_tokens, response: int = 0, defer: bool = False) -> int | None:
        """A new tracked row that continues row `key` (its history is `key`'s history followed by
        `new_tokens`: an agent's next turn resends the previous turn's prompt and output): `key`'s
        prompt tree, extended by `new_tokens`, becomes the new row's, as `stop(key)` then
        `start(history)` would leave the trees, without building a tree over the whole history.
        The last `response` of `new_tokens` enter as the new row's response (`start`, `defer` too).
        Returns the new key, or None where `key` is not active (nothing changed then)."""
        if not self.forest.active(key):
            return None
        new_key = next(self._ids)
        self.forest.adopt(key, new_key, new_tokens, response, defer)
        return new_key

    def extend(self, key: int, new_tokens) -> None:
        """Row `key` gained `new_tokens` (a `step` of that one row, drafting nothing)."""
        if len(new_tokens):
            self.step([self.request(key, new_tokens, _NO_HISTORY, 0)])

    def stop(self, key: int) -> None:
        """Row `key` is done: its prompt tree goes (its response stays in the global tree), freed by
        `_REAPER` off the caller's path (0.3–0.9 ms for a 1.4k-token prompt's tree)."""
        tree = self.forest.stop(key)
        if tree is not None:
            _REAPER.drop(tree)

    def step(self, rows: list[tuple]) -> list[tuple | None]:
        """A step's rows in one call, in batch order: each (key, new tokens, history, what, max tokens,
        spec factor, probability floor, extension factor), as `request` builds them. A row takes its
        deferred place in the global tree, its new tokens go into both trees, then it gets its draft:
        what 0 none (None), 1 `draft`'s four lists, 2 `speculate`'s two. Row after row, as vLLM's
        suffix proposer goes: each row's draft sees the rows before it, as the calls one by one would."""
        return self.forest.step(rows)

    def request(self, key: int, new_tokens, history: np.ndarray, what: int, max_tokens: int = 0,
                spec_factor: float | None = None, min_token_prob: float | None = None,
                extend_factor: float | None = None) -> tuple:
        """One row of `step` (`history`: the row's tokens, the trees match its last `depth`; `what`: 0
        no draft, 1 as `draft`, 2 as `speculate`), the knobs resolved: None takes the trees' own."""
        if what and max_tokens <= 0:
            what = 0
        factor = self.extend_factor if extend_factor is None else extend_factor
        return (key, new_tokens, history, what, max_tokens, spec_factor or self.max_spec_factor,
                self.min_token_prob if min_token_prob is None else min_token_prob, factor or 0.0)

    def speculate(self, key: int, history: np.ndarray, max_tokens: int, spec_factor: float | None = None,
                  min_token_prob: float | None = None) -> tuple[list[int], list[float]]:
        """(tokens, conditional confidence of each token given the ones before it): the cache's draft
        on the history's last `depth` tokens. The tree gives the probability of the whole path up to
        each token; the ratio of consecutive ones is the token's own. `spec_factor` /
        `min_token_prob`: a segment kind's knobs (None: the trees' own)."""
        [drafted] = self.step([self.request(key, _NO_HISTORY, history, 2, max_tokens, spec_factor,
                                            min_token_prob)])
        return drafted or ([], [])

    def draft(self, key: int, history: np.ndarray, max_tokens: int, extend_factor: float | None = None,
              spec_factor: float | None = None, min_token_prob: float | None = None
              ) -> tuple[list[int], list[float], list[int], list[float]]:
        """`speculate`'s (tokens, confidences) and its extension (more tokens, their confidences):
        the tokens a draft at `extend_factor` (None: the trees' own; 0: none) holds past it, nothing
        when the longer draft does not begin with it (the cache then preferred another match:
        suffix's own draft stands), when it fills `max_tokens`, or when it is empty at a spec factor
        of 1 or more (neither tree matched a token, or neither's next token is likely enough).

        The spec factor caps a draft at factor × the matched context's length. At factor 2 suffix
        gains on some traffic (ReAct at γ 16) and loses on other (code at b 1): its tokens past what
        factor 1 allows are sent either way. Here they are a source of their own ("extend"), priced
        per row like every other source, so they go only where their learned acceptance pays."""
        [drafted] = self.step([self.request(key, _NO_HISTORY, history, 1, max_tokens, spec_factor,
                                            min_token_prob, extend_factor)])
        return drafted or ([], [], [], [])


def builders_cpu_seconds() -> float:
    """CPU seconds the builder threads have spent on prompt trees in this process (0 without them)."""
    if not available():
        return 0.0
    from agentspec_sdk.drafting._trees import Forest

    return Forest.build_cpu_seconds()


class _Reaper:
    """Drops objects in a daemon thread: a stopped prompt tree's C++ teardown then runs outside the
    proposer's call that the step waits for, without the GIL (`StoppedTree.release`), while the
    engine's pass runs. `pending` counts the objects not yet dropped."""

    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.dropped = 0

    def drop(self, obj) -> None:
        if self._thread is None or not self._thread.is_alive():  # also after a fork (vLLM's workers)
            with self._lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._run, name="agentspec-reaper", daemon=True)
                    self._thread.start()
        self._queue.put(obj)

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def _run(self) -> None:
        while True:
            obj = self._queue.get()
            release = getattr(obj, "release", None)  # a stopped tree frees itself without the GIL
            if release is not None:
                release()
            del obj
            self.dropped += 1


_REAPER = _Reaper()
