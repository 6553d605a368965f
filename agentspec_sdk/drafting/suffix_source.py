"""Suffix-tree continuations for the structure drafter: SuffixDecoding's trees, confidences included.

`arctic_inference.suffix_decoding.SuffixDecodingCache` is what vLLM's `suffix` drafter runs: a tree
over each request's prompt plus one global tree over the responses of all requests, both matched
against the last `max_tree_depth` tokens, every drafted token with the tree's estimate of the
probability of the path up to it. The drafter drives one cache exactly as vLLM's proposer does (same
depth, spec factor and probability floor), so on every row it knows what suffix decoding would have
drafted; the drafter then cuts that draft at the segment's end and lets the budget price each token
by its own confidence. The structure drafter is thereby a superset of suffix decoding inside a
segment.

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
import queue
import threading

import numpy as np

log = logging.getLogger("agentspec.drafting")

# vLLM 0.32's defaults for method "suffix" (SpeculativeConfig.suffix_decoding_*)
MAX_TREE_DEPTH = 24
MAX_CACHED_REQUESTS = 10_000
MAX_SPEC_FACTOR = 1.0
MIN_TOKEN_PROB = 0.1


def available() -> bool:
    try:
        import arctic_inference.suffix_decoding  # noqa: F401
    except ImportError:
        return False
    return True


class SuffixTrees:
    """One SuffixDecodingCache over the rows the drafter tracks."""

    def __init__(self, max_tree_depth: int = MAX_TREE_DEPTH, max_cached_requests: int = MAX_CACHED_REQUESTS,
                 max_spec_factor: float = MAX_SPEC_FACTOR, min_token_prob: float = MIN_TOKEN_PROB,
                 extend_factor: float | None = None):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.cache = SuffixDecodingCache(max_tree_depth=max_tree_depth,
                                         max_cached_requests=max_cached_requests)
        self.depth = max_tree_depth
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        # a second, longer draft at this spec factor (None: none); see `extension`
        self.extend_factor = extend_factor
        self._ids = itertools.count()
        self._native = _NativeTrees.of(self.cache)

    def start(self, history: np.ndarray, response: int = 0) -> int:
        """A new tracked row: its history so far is its "prompt", but for its last `response` tokens,
        which enter as its response (in the global tree too), as vLLM's proposer adds a request's
        tokens sampled at its first step; returns its key."""
        key = next(self._ids)
        history = np.ascontiguousarray(history, dtype=np.int32)
        split = len(history) - min(response, len(history))
        self.cache.start_request(key, history[:split])
        if split < len(history):
            self.cache.add_active_response(key, history[split:])
        return key

    def adopt(self, key: int, new_tokens, response: int = 0) -> int | None:
        """A new tracked row that continues row `key` (its history is `key`'s history followed by
        `new_tokens`: an agent's next turn resends the previous turn's prompt and output): `key`'s
        prompt tree, extended by `new_tokens`, becomes the new row's, as `stop(key)` then
        `start(history)` would leave the cache, without building a tree over the whole history.
        The last `response` of `new_tokens` enter as the new row's response (`start`). Returns the
        new key, or None where the cache is not laid out as arctic-inference 0.3's (nothing changed
        then)."""
        cache = self.cache
        local = getattr(cache, "_local_trees", None)
        allocate = getattr(cache, "_generate_seq_id", None)
        if local is None or allocate is None or key not in local:
            return None
        new_key = next(self._ids)
        tree = local.pop(key)  # `key` stopped: its response stays in the global tree
        new_tokens = np.ascontiguousarray(new_tokens, dtype=np.int32)
        split = len(new_tokens) - min(response, len(new_tokens))
        if split:
            tree.extend_ndarray(0, new_tokens[:split])
        local[new_key] = tree
        if cache._max_cached_requests != 0:
            allocate(new_key)  # the new row's response gets its own sequence in the global tree
        if split < len(new_tokens):
            cache.add_active_response(new_key, new_tokens[split:])
        return new_key

    def extend(self, key: int, new_tokens) -> None:
        if not len(new_tokens):
            return
        tokens = np.ascontiguousarray(new_tokens, dtype=np.int32)
        if self._native is not None:
            self._native.extend(key, tokens)
        elif key in self.cache.active_requests:
            self.cache.add_active_response(key, tokens)

    def stop(self, key: int) -> None:
        """Row `key` is done: its prompt tree goes (its response stays in the global tree). The tree
        is torn down by `_REAPER` off the caller's path where the cache is laid out as
        arctic-inference 0.3's (0.3–0.9 ms for a 1.4k-token prompt's tree)."""
        local = getattr(self.cache, "_local_trees", None)
        if local is not None:
            tree = local.pop(key, None)
            if tree is not None:
                _REAPER.drop(tree)
        elif key in self.cache.active_requests:
            self.cache.stop_request(key)

    def speculate(self, key: int, history: np.ndarray, max_tokens: int, spec_factor: float | None = None,
                  min_token_prob: float | None = None) -> tuple[list[int], list[float]]:
        """(tokens, conditional confidence of each token given the ones before it). The tree gives the
        probability of the whole path up to each token; the ratio of consecutive ones is the token's own.
        `spec_factor` / `min_token_prob`: a segment kind's knobs (None: the trees' own)."""
        if max_tokens <= 0:
            return [], []
        return self._draft(key, history, max_tokens, spec_factor or self.max_spec_factor,
                           self.min_token_prob if min_token_prob is None else min_token_prob)

    def _draft(self, key: int, history: np.ndarray, max_tokens: int, factor: float,
               prob: float) -> tuple[list[int], list[float]]:
        """`cache.speculate` on the history's last `depth` tokens, as (tokens, confidences)."""
        context = np.ascontiguousarray(history[-self.depth:], dtype=np.int32)
        if self._native is not None:
            draft = self._native.speculate(key, context, max_tokens, factor, prob)
            return _tokens_and_confidences(draft) if draft is not None else ([], [])
        if key not in self.cache.active_requests:
            return [], []
        return _tokens_and_confidences(self.cache.speculate(key, context, max_spec_tokens=max_tokens,
                                                            max_spec_factor=factor, min_token_prob=prob))

    def extension(self, key: int, history: np.ndarray, max_tokens: int, base: list[int],
                  extend_factor: float | None = None, spec_factor: float | None = None,
                  min_token_prob: float | None = None) -> tuple[list[int], list[float]]:
        """The tokens a draft at `extend_factor` holds past `base` (this row's draft at `spec_factor`,
        None: `max_spec_factor`), with their conditional confidences; nothing when the longer draft does not
        begin with `base` (the cache then preferred another match: suffix's own draft stands) or when
        no extension is set.

        The spec factor caps a draft at factor × the matched context's length. At factor 2 suffix
        gains on some traffic (ReAct at γ 16) and loses on other (code at b 1): its tokens past what
        factor 1 allows are sent either way. Here they are a source of their own ("extend"), priced
        per row like every other source, so they go only where their learned acceptance pays."""
        factor = self.extend_factor if extend_factor is None else extend_factor  # 0: none
        spec_factor = spec_factor or self.max_spec_factor
        prob = self.min_token_prob if min_token_prob is None else min_token_prob
        if not factor or factor <= spec_factor or len(base) >= max_tokens:
            return [], []
        if not base and spec_factor >= 1:
            # no draft at a factor ≥ 1: neither tree matched a token, or neither's next token is
            # likely enough; a longer factor changes neither
            return [], []
        tokens, conf = self._draft(key, history, max_tokens, factor, prob)
        n = len(base)
        if len(tokens) <= n or tokens[:n] != list(base):
            return [], []
        return tokens[n:], conf[n:]


class _NativeTrees:
    """The cache's trees called directly, where the cache is laid out as arctic-inference 0.3's: what
    `SuffixDecodingCache.add_active_response` and `.speculate` do (the request's prompt tree and the
    global tree, the draft of the higher score, the prompt tree's on a tie), without their checks,
    dispatch and the copy of the draft into a dataclass (docs/drafting.md, the per-step cost). The
    cache's own dicts are shared, so rows started, adopted or stopped through the cache are seen here."""

    __slots__ = ("local", "global_tree", "seqs", "speculate_ndarray")

    def __init__(self, local: dict, global_tree, seqs: dict, speculate_ndarray):
        self.local, self.global_tree, self.seqs = local, global_tree, seqs
        self.speculate_ndarray = speculate_ndarray

    @classmethod
    def of(cls, cache) -> _NativeTrees | None:
        local, seqs = getattr(cache, "_local_trees", None), getattr(cache, "_req_to_seq_id", None)
        global_tree = getattr(cache, "_global_tree", None)
        speculate = getattr(type(global_tree), "speculate_ndarray", None)
        if not isinstance(local, dict) or not isinstance(seqs, dict) or speculate is None \
                or not hasattr(global_tree, "extend_ndarray"):
            return None
        return cls(local, global_tree, seqs, speculate)

    def extend(self, key: int, tokens: np.ndarray) -> None:
        tree = self.local.get(key)
        if tree is None:
            return
        tree.extend_ndarray(0, tokens)
        seq = self.seqs.get(key)
        if seq is not None:
            self.global_tree.extend_ndarray(seq, tokens)

    def speculate(self, key: int, context: np.ndarray, max_tokens: int, factor: float, prob: float):
        """The native draft (`token_ids`, `probs`), or None for a row the cache does not hold."""
        tree = self.local.get(key)
        if tree is None:
            return None
        mine = self.speculate_ndarray(tree, context, max_tokens, factor, 0.0, prob, False)
        shared = self.speculate_ndarray(self.global_tree, context, max_tokens, factor, 0.0, prob, False)
        return mine if mine.score >= shared.score else shared


class _Reaper:
    """Drops objects in a daemon thread: a prompt tree's C++ teardown then runs while the engine's
    pass runs (vLLM's forward and its device waits release the GIL), not inside the proposer's call
    that the step waits for. `pending` counts the objects not yet dropped."""

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
            del obj
            self.dropped += 1


_REAPER = _Reaper()


def _tokens_and_confidences(draft) -> tuple[list[int], list[float]]:
    tokens = list(map(int, draft.token_ids))
    conf, before = [], 1.0
    for p in draft.probs:
        p = float(p)
        if before > 0:
            c = p / before
            conf.append(1.0 if c > 1.0 else c)
        else:
            conf.append(0.0)
        before = p
    return tokens, conf
