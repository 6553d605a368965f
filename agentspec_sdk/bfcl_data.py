"""Single-turn tool-call prompts from BFCL (Berkeley Function Calling Leaderboard, `bfcl-eval`, Apache-2.0).

Each prompt is a user message, the tools offered with it (OpenAI tool dicts, BFCL's type names mapped
to JSON Schema) and BFCL's ground truth (acceptable values per argument). `bfcl-eval` is installed
without its dependencies; only its data files are read, through importlib.resources.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from agentspec_sdk.errors import AgentSpecError
from agentspec_sdk.structure.tools import ToolRegistry

DEFAULT_CATEGORIES = ("simple_python", "multiple", "live_multiple")


class BfclDataError(AgentSpecError):
    """bfcl-eval is missing or a data file / category does not exist."""


@dataclass
class BfclPrompt:
    id: str
    messages: list[dict[str, str]]
    tools: list[dict[str, Any]]  # OpenAI tool dicts
    ground_truth: list[dict[str, Any]] = field(default_factory=list)

    def registry(self) -> ToolRegistry:
        return ToolRegistry(self.tools)


def _data_dir():
    try:
        return resources.files("bfcl_eval") / "data"
    except ModuleNotFoundError:
        raise BfclDataError("BFCL prompts need the bfcl-eval package (pip install --no-deps bfcl-eval)") from None


def _read(path) -> list[dict]:
    if not path.is_file():
        raise BfclDataError(f"BFCL data file {path.name!r} not found in the installed bfcl-eval package")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load_category(category: str) -> list[BfclPrompt]:
    """All single-turn prompts of one BFCL category, e.g. 'simple_python', 'multiple', 'live_multiple'."""
    data = _data_dir()
    name = f"BFCL_v4_{category}.json"
    entries = _read(data / name)
    answers_path = data / "possible_answer" / name
    answers = {a["id"]: a["ground_truth"] for a in _read(answers_path)} if answers_path.is_file() else {}
    prompts = []
    for entry in entries:
        turns = entry.get("question") or []
        if len(turns) != 1:
            continue  # multi-turn entries belong to the replay runner
        messages = [{"role": m["role"], "content": m["content"]} for m in turns[0]]
        tools = ToolRegistry(entry.get("function", [])).openai_tools()
        prompts.append(BfclPrompt(entry["id"], messages, tools, answers.get(entry["id"], [])))
    return prompts


def tool_call_prompts(n: int | None = None, categories=DEFAULT_CATEGORIES, *, max_tools: int = 4) -> list[BfclPrompt]:
    """Up to `n` prompts, interleaved round-robin over `categories` (stable order, no randomness).

    Prompts offering more than `max_tools` tools are skipped (they make very long system prompts).
    """
    pools = []
    for cat in categories:
        pools.append([p for p in load_category(cat) if 0 < len(p.tools) <= max_tools])
    out: list[BfclPrompt] = []
    i = 0
    while any(i < len(pool) for pool in pools):
        for pool in pools:
            if i < len(pool):
                out.append(pool[i])
                if n is not None and len(out) >= n:
                    return out
        i += 1
    return out
