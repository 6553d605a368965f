"""`EngineConfig`: every setting of the embedded engine in one checked dataclass.

`Engine(model=..., speculation=..., gamma_max=..., ...)` builds one from its keywords;
`Engine(config=EngineConfig(...))` takes one as is (keywords given next to it override its fields).
Bad settings fail here, before a model is resolved or vLLM starts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from agentspec_sdk.backends.server import check_block_size, require_suffix_decoding
from agentspec_sdk.errors import BackendError
from agentspec_sdk.structure.formats import AgentFormat
from agentspec_sdk.structure.tools import ToolRegistry

SPECULATION = ("off", "ngram", "suffix", "structure", "draft_model")
ABLATIONS = (None, "no_budget", "no_isolation")


@dataclass(frozen=True)
class EngineConfig:
    """Settings of `Engine`. See docs/engine.md for what each changes."""

    model: str | os.PathLike | None = None  # HF folder or id; None: the default bundle (model_bundle)
    speculation: str = "off"  # one of SPECULATION
    gamma_max: int = 8  # draft tokens per step at most (vLLM's num_speculative_tokens)
    step_budget: int | None = None  # draft tokens per step over all rows (None: no budget)
    draft_model: str | None = None  # speculation="draft_model": the draft model
    formats: Sequence[str | AgentFormat] | None = None  # None: every known format
    tools: ToolRegistry | list | None = None  # tools known from the start (more register per request)
    enable_prefix_caching: bool = True
    max_model_len: int | None = None  # None: the model's own context length
    seed: int = 0
    ablation: str | None = None  # one of ABLATIONS
    ngram_min: int = 2  # ngram: shortest match
    ngram_max: int = 5  # ngram: longest match
    law: dict[str, float] | None = None  # Draft Law parameters handed to the plan
    dtype: str | None = None  # None: float32 on CPU, else vLLM's auto
    kv_cache_gb: float = 2.0  # VLLM_CPU_KVCACHE_SPACE (CPU)
    reserved_cpus: int | None = None  # VLLM_CPU_NUM_OF_RESERVED_CPU
    in_process: bool = True  # vLLM's engine core in this process (the structure proposer is then readable)
    max_num_seqs: int = 32
    enforce_eager: bool = False
    block_size: int | None = None  # None: 32 on CPU, vLLM's default elsewhere
    work_dir: str | os.PathLike | None = None  # plan and records files (None: a fresh temp folder)

    def __post_init__(self) -> None:
        if self.speculation not in SPECULATION:
            raise BackendError(f"speculation must be one of {SPECULATION}, got {self.speculation!r}")
        if self.ablation not in ABLATIONS:
            raise BackendError(f"ablation must be one of {ABLATIONS}, got {self.ablation!r}")
        if self.speculation == "suffix":
            require_suffix_decoding()
        if self.speculation == "draft_model" and not self.draft_model:
            raise BackendError("speculation='draft_model' needs draft_model=<HF folder or id>")
        if not isinstance(self.gamma_max, int) or not 1 <= self.gamma_max <= 64:
            raise BackendError(f"gamma_max must be an integer in [1, 64], got {self.gamma_max!r}")
        check_block_size(self.block_size)

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
