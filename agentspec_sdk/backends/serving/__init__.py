"""Serving and operations: `serve_cli` (`agentspec serve`: the plan, the exact `vllm serve` command),
`server` (`ServerSpec`, `ServerProcess`: launching `vllm serve` with what `inside_vllm` holds),
`replicas` (`ReplicaSet`: N servers behind vLLM's router, `agentspec serve --replicas N`),
`draft_cli` (`agentspec draft make`) and `draft_models` (layer-truncated draft folders).

May import every other backends room and the shared modules; no backends room imports it (replay and
the CLI do).
"""

__all__ = ["draft_cli", "draft_models", "replicas", "serve_cli", "server"]
