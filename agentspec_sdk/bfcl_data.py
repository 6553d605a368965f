"""Old import path of the single-turn BFCL prompts; they live in `agentspec_sdk.bfcl`."""

from agentspec_sdk.bfcl import DEFAULT_CATEGORIES, BfclPrompt, load_category, tool_call_prompts
from agentspec_sdk.errors import BfclDataError

__all__ = ["DEFAULT_CATEGORIES", "BfclDataError", "BfclPrompt", "load_category", "tool_call_prompts"]
