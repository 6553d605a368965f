"""The client of a vLLM server: `openai_backend.RemoteEngine` over `remote_transport` (HTTP, retries),
`remote_inspect` (/metrics, health check) and `remote_template` (the served chat template).

May import: the shared backends modules, `inside_vllm.prom_metrics` and `inside_vllm.tool_prompt`
(light), drafting, structure, errors, openai, httpx, tenacity. Never vllm or torch (not even
indirectly), `embedded` or `serving`.
"""

__all__ = ["openai_backend", "remote_inspect", "remote_template", "remote_transport"]
