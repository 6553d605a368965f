"""Backends: where a turn request meets vLLM. Four rooms, cut by where their code runs, over light
modules every room shares:

- `inside_vllm/`: code vLLM loads into its own processes (proposer, model-drafter plugin, mask patch,
  tool parser and its template, the proposer's Prometheus metrics, the server's capture);
- `embedded/`: the embedded engine (`Engine`, vLLM's `LLM` in this process, and its helpers);
- `remote/`: the client of a vLLM server (`RemoteEngine`); imports no vLLM;
- `serving/`: operations (`agentspec serve`, the server launcher, draft-model folders).

The shared modules here import no vLLM and no room: `types` (turn types), `contract` (the engine
contract), `stream_split`, `prompts`, `chat_template`, `vllm_metrics` (drafts settled against vLLM's
counts), `engine_config` (settings and the one `speculative_config`), `model_bundle`, `plan_file`,
`capture` (captured traffic, format v1), `offline_peers` (vLLM's ngram and suffix proposers as an
offline replay calls them; vLLM's ngram function is imported only where that peer is built).
"""

__all__ = [
    "capture", "chat_template", "contract", "engine_config", "model_bundle", "offline_peers", "plan_file",
    "prompts", "stream_split", "types", "vllm_metrics",
]
