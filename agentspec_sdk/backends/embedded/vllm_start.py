"""Starting `vllm.LLM` for the embedded engine: the speculative config of each mode, the CPU settings
(KV space, block size, dtype) and the plan file the structure proposer reads while vLLM builds it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agentspec_sdk.backends.engine_config import (
    CPU_BLOCK_SIZE,
    MODEL_DRAFTERS,
    EngineConfig,
    speculative_config,
)
from agentspec_sdk.backends.inside_vllm.vllm_grammar import EXACT_MASKS_ENV, patch_guidance, patch_slices
from agentspec_sdk.backends.inside_vllm.vllm_hybrid import LAYER_ATTR, MODE_ENV, check_layout, register
from agentspec_sdk.backends.model_bundle import resolve_model
from agentspec_sdk.drafting.lab import LAB_ENV
from agentspec_sdk.drafting.plan import PLAN_ENV

__all__ = ["engine_speculative_config", "start_llm", "default_dtype", "default_block_size",
           "in_process_drafter"]


def engine_speculative_config(cfg: EngineConfig, gamma_max: int) -> dict[str, Any] | None:
    """vLLM's `speculative_config` for the engine's mode (None: off): `engine_config.speculative_config`,
    the server's builder too, over the engine's settings."""
    draft = resolve_model(cfg.draft_model) if cfg.speculation in MODEL_DRAFTERS else None
    return speculative_config(cfg.speculation, gamma_max, ngram_min=cfg.ngram_min, ngram_max=cfg.ngram_max,
                              suffix_max_spec_factor=cfg.suffix_max_spec_factor,
                              suffix_min_token_prob=cfg.suffix_min_token_prob, draft_model=draft)


def start_llm(cfg: EngineConfig, model: str, max_model_len: int, gamma_max: int, plan_path: Path,
              lab_path: Path | None = None):
    """`vllm.LLM` with the engine's settings; the plan path is in AGENTSPEC_PLAN and the lab switches'
    path (`lab_path`, the bench's; None: unset) in AGENTSPEC_LAB while vLLM starts (its proposer reads
    them then), and the variables are restored afterwards."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{cfg.kv_cache_gb:g}")
    # vLLM 0.32's AOT compile cache fails to reload on CPU; the inductor cache reloads (≈35 s start).
    os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if cfg.in_process else "1"
    # exact llguidance masks under speculation (backends.inside_vllm.vllm_grammar): here for an in-process
    # engine core, through the entry point in vLLM's own processes
    os.environ[EXACT_MASKS_ENV] = "1"
    patch_guidance()
    patch_slices()
    if cfg.reserved_cpus is not None:
        os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(cfg.reserved_cpus)
    spec = engine_speculative_config(cfg, gamma_max)
    block = cfg.block_size or default_block_size()
    extra = {"block_size": block} if block else {}
    # restored after the start: they matter only while vLLM builds its engine (in this process)
    previous = {k: os.environ.get(k) for k in (PLAN_ENV, LAB_ENV, MODE_ENV, "VLLM_USE_V2_MODEL_RUNNER")}
    extra.update(_model_drafter_setup(cfg))
    os.environ[PLAN_ENV] = str(plan_path)
    if lab_path is not None:
        os.environ[LAB_ENV] = str(lab_path)
    else:
        os.environ.pop(LAB_ENV, None)
    if cfg.speculation in MODEL_DRAFTERS:
        os.environ[MODE_ENV] = MODEL_DRAFTERS[cfg.speculation]
    else:
        os.environ.pop(MODE_ENV, None)
    try:
        from vllm import LLM

        if cfg.speculation in MODEL_DRAFTERS:
            register()  # what the entry point does in a separate vLLM process
        return LLM(model=model, dtype=cfg.dtype or default_dtype(), max_model_len=max_model_len,
                   enable_prefix_caching=cfg.enable_prefix_caching, seed=cfg.seed,
                   max_num_seqs=cfg.max_num_seqs, **extra,
                   structured_outputs_config={"backend": "guidance"}, speculative_config=spec,
                   per_request_spec_decode_metrics="detailed" if spec else "none",
                   disable_log_stats=False, enforce_eager=cfg.enforce_eager)
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _model_drafter_setup(cfg: EngineConfig) -> dict[str, Any]:
    """Model drafter modes: the vLLM layout our layer patches is checked before anything starts
    (BackendError naming the version), and the scheduler is synchronous: our drafter reads the CPU
    token histories, which async scheduling fills with placeholders, and hands over ragged lists."""
    if cfg.speculation not in MODEL_DRAFTERS:
        return {}
    check_layout()
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"  # the V1 runner is the one patched
    return {"async_scheduling": False}


def default_dtype() -> str:
    try:
        from vllm.platforms import current_platform

        return "float32" if current_platform.is_cpu() else "auto"
    except Exception:
        return "auto"


def default_block_size() -> int | None:
    try:
        from vllm.platforms import current_platform

        return CPU_BLOCK_SIZE if current_platform.is_cpu() else None
    except Exception:
        return None


def in_process_drafter(llm_engine, speculation: str):
    """The drafter on the model runner of an in-process engine core (model drafters: our layer,
    backends.inside_vllm.vllm_hybrid; else vLLM's own `drafter`); None out of process."""
    try:
        core = llm_engine.engine_core.engine_core
        runner = core.model_executor.driver_worker.worker.model_runner
    except AttributeError:
        return None
    return getattr(runner, LAYER_ATTR if speculation in MODEL_DRAFTERS else "drafter", None)
