"""The structure layer over vLLM's own model drafter, hooked the way arctic-inference hooks vLLM.

A `vllm.general_plugins` entry point (pyproject.toml) calls `register()` in every vLLM process. It
does nothing unless AGENTSPEC_MODEL_DRAFTS names one of `drafting.hybrid.MODEL_MODES` (our engine
start sets it for speculation draft_model / draft_model+cut / structure+draft_model; `vllm serve`
takes it from the environment). Then it checks the vLLM layout it patches (`check_layout`, before any
engine starts) and wraps two methods of the V1 `GPUModelRunner` (the CPU runner subclasses it):

  __init__                  a runner whose speculative method is draft_model gets our layer: an
                            `AgentSpecProposer` driving a `HybridDrafter` (the plan file, records and
                            metrics exactly as for speculation="structure")
  propose_draft_token_ids   vLLM's draft model proposes `[batch, k]` (its padded path, before the
                            step's bookkeeping: `step_tokens` adds the tokens just sampled to the
                            histories our drafter reads); our layer cuts / replaces per row;
                            `hand_over` gives vLLM ragged lists (sync scheduling) or a −1-padded
                            tensor, and replaces the draft probabilities of replaced rows

Draft probabilities: vLLM 0.32's runner hands the rejection sampler `_draft_probs` (`[batch, k,
vocab]`) when the drafter's `take_last_draft_probs()` gives them. The draft model's proposer
(`SpecDecodeBaseProposer`) does only with `draft_sample_method="probabilistic"` (and the standard
rejection sampler) at temperature > 0; with the default `"greedy"` its drafts are argmax tokens, no
probabilities are kept, and every draft is verified as a deterministic proposal (`draft_probs=None`).
Where probabilities come, a replaced row's are set to the one-hot of the tokens we sent — what
`draft_probs=None` means for a deterministic draft — and a model row keeps the model's, so
probabilistic verification stays exact.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import time

import numpy as np

from agentspec_sdk.errors import BackendError

log = logging.getLogger("agentspec.backends")

MODE_ENV = "AGENTSPEC_MODEL_DRAFTS"
SUPPORTED_VLLM = ("0.32.",)  # versions whose runner layout below was read and tested
# the parameters of the V1 runner's propose_draft_token_ids we wrap (vLLM 0.32)
PROPOSE_PARAMS = ("self", "scheduler_output", "sampled_token_ids", "sampling_metadata", "hidden_states",
                  "sample_hidden_states", "aux_hidden_states", "spec_decode_metadata",
                  "common_attn_metadata", "slot_mappings")
RUNNER_ATTRS = ("propose_draft_token_ids", "_get_spec_decode_draft_probs", "take_draft_token_ids")
LAYER_ATTR = "_agentspec_layer"
_PATCHED = "_agentspec_patched"


def model_mode() -> str | None:
    from agentspec_sdk.drafting.hybrid import MODEL_MODES

    mode = os.environ.get(MODE_ENV) or None
    if mode is not None and mode not in MODEL_MODES:
        raise BackendError(f"{MODE_ENV}={mode!r}: must be one of {MODEL_MODES}")
    return mode


def register() -> None:
    """The entry point: inert unless AGENTSPEC_MODEL_DRAFTS is set; then check, pin V1, patch."""
    if model_mode() is None:
        return
    check_layout()
    # our patch is on the V1 runner (as arctic-inference's): keep vLLM off Model Runner V2
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    patch_runner(GPUModelRunner)


def check_layout(version: str | None = None, runner_cls=None) -> None:
    """BackendError naming the vLLM version when the runner we patch is not laid out as in 0.32."""
    if version is None or runner_cls is None:
        import vllm
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        version = version or vllm.__version__
        runner_cls = runner_cls or GPUModelRunner
    where = f"vLLM {version}"
    if not version.startswith(SUPPORTED_VLLM):
        raise BackendError(f"the model-drafter layer (speculation draft_model / draft_model+cut / "
                           f"structure+draft_model) patches vLLM's V1 GPUModelRunner as laid out in "
                           f"vLLM {'/'.join(v + 'x' for v in SUPPORTED_VLLM)}; {where} is installed")
    missing = [a for a in RUNNER_ATTRS if not hasattr(runner_cls, a)]
    if missing:
        raise BackendError(f"{where}: {runner_cls.__name__} lacks {missing}; the model-drafter layer "
                           "cannot hook it")
    params = tuple(inspect.signature(runner_cls.propose_draft_token_ids).parameters)
    if getattr(runner_cls.propose_draft_token_ids, _PATCHED, False):
        params = tuple(inspect.signature(runner_cls.propose_draft_token_ids.__wrapped__).parameters)
    if params != PROPOSE_PARAMS:
        raise BackendError(f"{where}: {runner_cls.__name__}.propose_draft_token_ids{params} is not the "
                           f"signature the model-drafter layer wraps {PROPOSE_PARAMS}")


def require_layer(engine) -> None:
    """An in-process engine of a model drafter mode whose vLLM came up without our layer on its runner
    (another runner than the V1 GPUModelRunner's family) is shut down with a BackendError."""
    from agentspec_sdk.backends.engine_config import MODEL_DRAFTERS

    if engine.speculation in MODEL_DRAFTERS and engine.config.in_process and engine.proposer() is None:
        engine._engine.engine_core.shutdown()
        raise BackendError(f"speculation={engine.speculation!r}: vLLM started without the model-drafter "
                           "layer on its runner (not the V1 GPUModelRunner?)")


def patch_runner(runner_cls) -> None:
    """Wrap `__init__` and `propose_draft_token_ids` of `runner_cls` once (idempotent)."""
    if getattr(runner_cls.propose_draft_token_ids, _PATCHED, False):
        return
    original_init, original_propose = runner_cls.__init__, runner_cls.propose_draft_token_ids

    @functools.wraps(original_init)
    def __init__(self, vllm_config, *args, **kwargs):
        original_init(self, vllm_config, *args, **kwargs)
        setattr(self, LAYER_ATTR, _make_layer(vllm_config))

    @functools.wraps(original_propose)
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, *args, **kwargs):
        layer = getattr(self, LAYER_ATTR, None)
        if layer is None:
            return original_propose(self, scheduler_output, sampled_token_ids, *args, **kwargs)
        started = time.perf_counter()
        model_out = original_propose(self, scheduler_output, sampled_token_ids, *args, **kwargs)
        layer.model_seconds += time.perf_counter() - started
        layer.model_steps += 1
        return _combine(self, layer, sampled_token_ids, model_out)

    setattr(propose_draft_token_ids, _PATCHED, True)
    runner_cls.__init__ = __init__
    runner_cls.propose_draft_token_ids = propose_draft_token_ids


def _make_layer(vllm_config):
    mode = os.environ.get(MODE_ENV) or None
    spec = vllm_config.speculative_config if mode is not None else None
    if spec is None or not spec.uses_draft_model():
        return None
    from agentspec_sdk.backends.inside_vllm.vllm_proposer import AgentSpecProposer

    return AgentSpecProposer(vllm_config, model_mode=mode)


def _combine(runner, layer, sampled_token_ids, model_out):
    import torch

    batch = runner.input_batch
    sampled = step_tokens(sampled_token_ids, runner.discard_request_mask.np[: batch.num_reqs],
                          batch.vocab_size)
    counts, histories = [], []
    for i, toks in enumerate(sampled):
        n = int(batch.num_tokens_no_spec[i])
        histories.append(np.concatenate([batch.token_ids_cpu[i, :n], np.asarray(toks, dtype=np.int64)]))
        counts.append(n + len(toks))
    model_lists = model_out.tolist() if torch.is_tensor(model_out) else [list(d) for d in model_out]
    drafts = layer.propose(sampled, counts, histories, model_drafts=model_lists)
    as_tensor = bool(runner.use_async_scheduling) and torch.is_tensor(model_out)
    out, probs = hand_over(drafts, layer.replaced, model_out, runner._draft_probs, as_tensor=as_tensor)
    runner._draft_probs = probs
    if probs is None:
        runner._draft_prob_req_ids = None
    return out


def step_tokens(sampled_token_ids, discard, vocab_size: int) -> list[list[int]]:
    """The tokens each row got in the step just run. vLLM's padded draft path calls the drafter before
    the step's bookkeeping with a `[batch, k+1]` tensor (rejected positions −1) or, unpadded, with the
    lists; a discarded row (a prefill chunk) got none. The input batch's token histories do not hold
    them yet: our drafter reads history + these."""
    rows = sampled_token_ids.tolist() if hasattr(sampled_token_ids, "tolist") else sampled_token_ids
    return [[] if discard[i] else [int(t) for t in row if 0 <= int(t) < vocab_size]
            for i, row in enumerate(rows)]


def hand_over(drafts: list[list[int]], replaced: list[bool], model_out, draft_probs, *, as_tensor: bool):
    """(drafts for vLLM, draft probabilities for its rejection sampler).

    `drafts`: per row the tokens to verify. `replaced[i]`: row i's draft is not a prefix of the model's,
    so the model's probabilities do not describe it. With `as_tensor` (async scheduling: vLLM wants a
    `[batch, k]` tensor) the rows are padded with −1, which the rejection sampler rejects; otherwise
    ragged lists (sync scheduling: the scheduler takes them as they are). `draft_probs` `[batch, k,
    vocab]` or None: kept for model rows, one-hot of the sent tokens for replaced rows."""
    import torch

    if len(drafts) != len(replaced):
        raise BackendError(f"hand_over: {len(drafts)} drafts for {len(replaced)} rows")
    if as_tensor:
        if not torch.is_tensor(model_out):
            raise BackendError("hand_over: a tensor handover needs the model's [batch, k] tensor")
        out = torch.full_like(model_out, -1)
        for i, d in enumerate(drafts):
            if d:
                out[i, : len(d)] = torch.tensor(d, dtype=out.dtype, device=out.device)
    else:
        out = [list(d) for d in drafts]
    if draft_probs is None:
        return out, None
    probs = draft_probs.clone()
    for i, d in enumerate(drafts):
        if replaced[i]:
            probs[i].zero_()
            for j, t in enumerate(d[: probs.shape[1]]):
                probs[i, j, int(t)] = 1.0
    return out, probs
