"""vLLM's stock drafters as an offline replay calls them: the ngram proposer (vLLM's own numba function)
and the suffix proposer (arctic-inference's SuffixDecodingCache driven exactly as vLLM 0.32's
SuffixDecodingProposer drives it).

Each peer is `propose(rows) -> drafts`; the suffix peer is keyed (`keyed = True`): it is called with rows
(key, prompt length, history, tokens sampled since its last call) and told `retire(key, last tokens)`
when a row finishes, as vLLM's proposer sees requests. A shared light module of backends: vLLM is
imported only when the ngram peer is built, so the tuning room uses both without importing vLLM itself.
"""

from __future__ import annotations

import numpy as np

__all__ = ["NGRAM_MAX", "NGRAM_MIN", "SUFFIX_DEFAULTS", "SuffixDrafter", "cut_at_confidence", "ngram_drafter"]

# vLLM's ngram proposer as the engine configures it (engine_config: prompt_lookup_min / _max)
NGRAM_MIN, NGRAM_MAX = 2, 5
# vLLM 0.32's suffix decoding defaults (suffix_decoding_max_tree_depth, _max_cached_requests,
# _max_spec_factor, _min_token_prob)
SUFFIX_DEFAULTS = {"max_tree_depth": 24, "max_cached_requests": 10000, "max_spec_factor": 1.0,
                   "min_token_prob": 0.1}


def ngram_drafter(gamma: int, n_min: int = NGRAM_MIN, n_max: int = NGRAM_MAX):
    """vLLM's ngram proposer: the longest n-gram (n_min..n_max) of the history's end matched earlier in
    the history, and the `gamma` tokens after the match."""
    from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as find

    def propose(histories: list[np.ndarray]) -> list[list[int]]:
        return [list(find(h.astype(np.int32), n_min, n_max, 1 << 20, gamma)) for h in histories]
    return propose


class SuffixDrafter:
    """vLLM 0.32's SuffixDecodingProposer (vllm/v1/spec_decode/suffix_decoding.py) step for step, on
    arctic-inference's SuffixDecodingCache with vLLM's defaults (tree depth 24, 10000 cached
    requests, spec factor 1.0, min token probability 0.1): a request's prompt tree starts at its
    first step, every step adds the tokens sampled since the last one (the prefill's token first,
    then accepted + bonus), the pattern is the last `max_tree_depth` tokens, at most
    min(gamma, max_model_len - tokens - 1) are speculated, and a finished request is stopped (its
    response stays in the global tree, which holds the in-flight responses of the other rows too).

    `cut` > 0 (an idea, not vLLM): drop the draft's tail from the first token whose estimated
    probability (the tree's path frequency, non-increasing along the draft) is below `cut`."""

    keyed = True

    def __init__(self, gamma: int, *, max_tree_depth: int = 24, max_cached_requests: int = 10000,
                 max_spec_factor: float = 1.0, min_token_prob: float = 0.1, max_model_len: int = 8192,
                 cut: float = 0.0):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.cache = SuffixDecodingCache(max_tree_depth=max_tree_depth,
                                         max_cached_requests=max_cached_requests)
        self.gamma, self.depth, self.max_model_len = gamma, max_tree_depth, max_model_len
        self.factor, self.min_prob, self.cut = max_spec_factor, min_token_prob, cut
        self.probs: dict = {}  # row key -> the tree's probability estimate of each token of its last draft

    def __call__(self, rows) -> list[list[int]]:
        drafts = []
        for key, prompt_len, history, new in rows:
            num_tokens = len(history)
            self.probs[key] = []
            if num_tokens >= self.max_model_len:
                drafts.append([])
                continue
            if key not in self.cache.active_requests:
                if key in self.cache.cached_requests:
                    self.cache.evict_cached_response(key)
                self.cache.start_request(key, np.ascontiguousarray(history[:prompt_len], dtype=np.int32))
            self.cache.add_active_response(key, [int(t) for t in new])
            pattern = np.ascontiguousarray(history[max(0, num_tokens - self.depth):num_tokens],
                                           dtype=np.int32)
            draft = self.cache.speculate(key, pattern,
                                         max_spec_tokens=min(self.gamma, self.max_model_len - num_tokens - 1),
                                         max_spec_factor=self.factor, min_token_prob=self.min_prob)
            drafts.append(cut_at_confidence(draft.token_ids, draft.probs, self.cut))
            self.probs[key] = list(draft.probs[:len(drafts[-1])])
        return drafts

    def retire(self, key, new: list[int]) -> None:
        """The row's last sampled tokens (vLLM adds them in the step that samples them), then stop."""
        if new:
            self.cache.add_active_response(key, [int(t) for t in new])
        self.cache.stop_request(key)
        self.probs.pop(key, None)


def cut_at_confidence(tokens, probs, cut: float) -> list[int]:
    """The draft up to the first token whose estimated probability is below `cut` (all of it at 0)."""
    if cut <= 0:
        return list(tokens)
    n = 0
    while n < len(tokens) and probs[n] >= cut:
        n += 1
    return list(tokens[:n])
