"""Old import path of the multi-turn BFCL data, tools and environments; they live in `agentspec_sdk.bfcl`."""

from agentspec_sdk.bfcl import (
    CLASS_DOCS,
    CLASS_MODULES,
    DATASET_URL,
    LICENSE,
    STATELESS,
    SYSTEM_PROMPT,
    BfclEnvironment,
    ToolRun,
    class_docs,
    entry_tools,
    format_result,
    is_long_context,
    multi_turn_entries,
    openai_tool,
    read_jsonl,
    system_prompt,
    to_json_schema,
)

__all__ = ["CLASS_DOCS", "CLASS_MODULES", "DATASET_URL", "LICENSE", "STATELESS", "SYSTEM_PROMPT",
           "BfclEnvironment",
           "ToolRun", "class_docs", "entry_tools", "format_result", "is_long_context", "multi_turn_entries",
           "openai_tool", "read_jsonl", "system_prompt", "to_json_schema"]
