"""The embedded engine: `vllm_engine.Engine` (vLLM's `LLM` in this process) and its helpers: `vllm_start`
(starting vLLM), `turn_sampling`, `pass_log`, `engine_totals`, `scheduler_probe` and `stock_observer`
(they wrap vLLM's scheduler and stock drafter in this process's engine core), `target_entropy`,
`turn_capture` (`Engine(capture=DIR)`).

May import: the shared backends modules, `inside_vllm` (to set up what vLLM loads), drafting,
structure, law, errors, vllm, torch, transformers. Never `remote` or `serving`.
"""

__all__ = [
    "engine_totals", "pass_log", "scheduler_probe", "stock_observer", "target_entropy", "turn_capture",
    "turn_sampling", "vllm_engine", "vllm_start",
]
