"""Code vLLM loads into its own processes (engine core, model runner, API server), by class path, entry
point or file path: `vllm_proposer` (`PROPOSER_CLASS`, the structure proposer), `vllm_hybrid` (the
model-drafter plugin), `vllm_grammar` (exact llguidance masks), `tool_parser` (vLLM loads the file,
`serving.server.TOOL_PARSER_FILE`) and its chat template `tool_prompt`, `prom_metrics` (the proposer's
metrics, which the remote client also parses), `capture_hook` (`agentspec serve --capture`: every
finished turn of the API server into a capture directory).

May import: drafting, structure, law, errors, the shared backends modules, vllm. Never a client
(`embedded`, `remote`) or `serving`: vLLM's processes must not load them. Nothing is imported here,
so the remote client can use `prom_metrics` and `tool_prompt` without importing vLLM.
"""

__all__ = ["capture_hook", "prom_metrics", "tool_parser", "tool_prompt", "vllm_grammar", "vllm_hybrid",
           "vllm_proposer"]
