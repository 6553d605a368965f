"""AgentSpec SDK: structure-aware speculative decoding for LLM agents on vLLM.

The façade is light: importing it pulls neither vllm nor torch. Heavy names (Engine, RemoteEngine)
are imported on first use.
"""

from importlib import import_module

from agentspec_sdk.errors import (
    AgentSpecError,
    BackendError,
    FormatError,
    InvalidSchema,
    LawInputError,
    SandboxError,
    SchemaNotSupported,
    ToolRegistryError,
    TraceError,
    TurnParseError,
)

__version__ = "0.1.0"

_LAZY = {
    "compile_schema": "agentspec_sdk.structure.schema.compiler",
    "compile_schema_gbnf": "agentspec_sdk.structure.schema.compiler",
    "load_grammar": "agentspec_sdk.structure.grammars",
    "schema_rules": "agentspec_sdk.structure.schema.compiler",
    "AgentFormat": "agentspec_sdk.structure.formats",
    "SegmentKind": "agentspec_sdk.structure.formats",
    "LawClass": "agentspec_sdk.structure.formats",
    "REACT": "agentspec_sdk.structure.formats",
    "TOOL_CALLS": "agentspec_sdk.structure.formats",
    "CODE_AGENT": "agentspec_sdk.structure.formats",
    "get_format": "agentspec_sdk.structure.formats",
    "register_format": "agentspec_sdk.structure.formats",
    "format_names": "agentspec_sdk.structure.formats",
    "Segmenter": "agentspec_sdk.structure.segmenter",
    "label_tokens": "agentspec_sdk.structure.segmenter",
    "Span": "agentspec_sdk.structure.segmenter",
    "Tool": "agentspec_sdk.structure.tools",
    "ToolRegistry": "agentspec_sdk.structure.tools",
    "turn_grammar": "agentspec_sdk.structure.turn_grammar",
    "tool_call_grammar": "agentspec_sdk.structure.turn_grammar",
    "turn_grammar_gbnf": "agentspec_sdk.structure.turn_grammar",
    "parse_turn": "agentspec_sdk.structure.turns",
    "ParsedTurn": "agentspec_sdk.structure.turns",
    "ToolCall": "agentspec_sdk.structure.turns",
    "parse_calls": "agentspec_sdk.structure.turns",
    "write_calls": "agentspec_sdk.structure.call_syntax",
    "AgentEngine": "agentspec_sdk.backends.contract",
    "Engine": "agentspec_sdk.backends.embedded.vllm_engine",
    "EngineConfig": "agentspec_sdk.backends.engine_config",
    "TurnRequest": "agentspec_sdk.backends.types",
    "TurnResult": "agentspec_sdk.backends.types",
    "StreamEvent": "agentspec_sdk.backends.types",
    "RemoteEngine": "agentspec_sdk.backends.remote.openai_backend",
    "Sandbox": "agentspec_sdk.sandbox",
    "SandboxLimits": "agentspec_sdk.sandbox",
    "SandboxResult": "agentspec_sdk.sandbox",
    "CODE_TOOL": "agentspec_sdk.structure.formats",
}

__all__ = [
    "AgentSpecError",
    "BackendError",
    "FormatError",
    "InvalidSchema",
    "LawInputError",
    "SchemaNotSupported",
    "SandboxError",
    "ToolRegistryError",
    "TraceError",
    "TurnParseError",
    *_LAZY,
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agentspec_sdk' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
