"""BFCL (Berkeley Function Calling Leaderboard, `bfcl-eval`, Apache-2.0) data and executable tools.

`bfcl-eval` is installed without its dependencies: only its data files (read through
importlib.resources) and the pure-Python multi-turn tool classes (GorillaFileSystem, MathAPI,
TwitterAPI, TradingBot, VehicleControlAPI, ...) are used.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import time
from dataclasses import dataclass
from importlib import resources
from typing import Any

from agentspec_sdk.errors import TraceError

LICENSE = "Apache-2.0"
DATASET_URL = "https://github.com/ShishirPatil/gorilla/tree/main/berkeley-function-call-leaderboard"
_BACKEND = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
CLASS_MODULES = {
    "GorillaFileSystem": "gorilla_file_system", "MathAPI": "math_api", "MessageAPI": "message_api",
    "TwitterAPI": "posting_api", "TicketAPI": "ticket_api", "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking", "VehicleControlAPI": "vehicle_control",
}
CLASS_DOCS = {
    "GorillaFileSystem": "gorilla_file_system.json", "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json", "TwitterAPI": "posting_api.json", "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json", "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}
STATELESS = {"MathAPI"}
_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}


def _data_dir():
    try:
        return resources.files("bfcl_eval") / "data"
    except ModuleNotFoundError:
        raise TraceError("BFCL data needs the bfcl-eval package (pip install --no-deps bfcl-eval)") from None


def read_jsonl(name: str) -> list[dict]:
    """A BFCL data file (JSON lines) under bfcl_eval/data, e.g. 'BFCL_v4_multi_turn_base.json'."""
    path = _data_dir() / name
    if not path.is_file():
        raise TraceError(f"BFCL data file {name!r} not found in the installed bfcl-eval package")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def multi_turn_entries(category: str = "base") -> list[dict]:
    """Entries of BFCL_v4_multi_turn_<category>: id, question (list of user turns, each a list of
    messages), initial_config, involved_classes, excluded_function."""
    return read_jsonl(f"BFCL_v4_multi_turn_{category}.json")


def to_json_schema(schema: Any) -> Any:
    """BFCL's parameter dialect (dict, float, tuple, any) → JSON Schema."""
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "type":
            mapped = _TYPES.get(value, value)
            if mapped is not None:
                out["type"] = mapped
        elif key == "properties":
            out["properties"] = {k: to_json_schema(v) for k, v in value.items()}
        elif key == "items":
            out["items"] = to_json_schema(value)
        elif key in ("description", "enum", "required", "default"):
            out[key] = value
    if out.get("type") == "object" and "properties" in out:
        out.setdefault("required", [])
    return out


def _drop_descriptions(schema: Any) -> Any:
    if isinstance(schema, dict):
        schema.pop("description", None)
        for value in schema.get("properties", {}).values():
            _drop_descriptions(value)
        _drop_descriptions(schema.get("items"))
    return schema


def openai_tool(doc: dict, *, slim: bool = True) -> dict:
    """An OpenAI tool dict. `slim` (the default) keeps the first sentence of the description and
    drops per-parameter descriptions: the engine lists every tool in the system prompt, and the
    full BFCL docs take 2-4k tokens per episode, too much for a 135M model's context on 2 cores."""
    params = to_json_schema(doc.get("parameters", {"type": "dict", "properties": {}}))
    description = doc.get("description", "")
    if slim:
        params, description = _drop_descriptions(params), _short(description)
    return {"type": "function", "function": {"name": doc["name"], "description": description,
                                             "parameters": params}}


def class_docs(class_name: str) -> list[dict]:
    if class_name not in CLASS_DOCS:
        raise TraceError(f"unknown BFCL class {class_name!r}; known: {sorted(CLASS_DOCS)}")
    return read_jsonl(f"multi_turn_func_doc/{CLASS_DOCS[class_name]}")


def is_long_context(category: str) -> bool:
    """BFCL's own rule (bfcl_eval base_handler): long_context and composite categories load their
    classes with `long_context=True` (large file trees, long watch lists, many bookings), and here
    their tools keep BFCL's full documentation: prompts of 2-6k tokens."""
    return "long_context" in category or "composite" in category


def entry_tools(entry: dict, *, slim: bool = True) -> list[dict]:
    """OpenAI tool dicts for the classes an entry involves, minus its excluded functions
    (`slim`: see openai_tool)."""
    excluded = {f.split(".")[-1] for f in entry.get("excluded_function", [])}
    tools, seen = [], set()
    for cls in entry["involved_classes"]:
        for doc in class_docs(cls):
            if doc["name"] not in excluded and doc["name"] not in seen:
                seen.add(doc["name"])
                tools.append(openai_tool(doc, slim=slim))
    return tools


def _short(description: str) -> str:
    text = description.split("Tool description:", 1)[-1].strip()
    return text.split(". ")[0].rstrip(".")[:120]


SYSTEM_PROMPT = ("You are an agent that completes the user's request by calling tools, one call at a time. "
                 "When the request is done, answer briefly without a tool call.")


def system_prompt(tools: list[dict]) -> str:
    """The agent's role. The engine appends the format's instructions and the tool list."""
    return SYSTEM_PROMPT


def format_result(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        try:
            return json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


@dataclass
class ToolRun:
    result: str
    latency_s: float
    ok: bool


class BfclEnvironment:
    """The executable BFCL classes of one entry, loaded with its initial_config (`long_context`: as
    BFCL loads them for its long_context categories)."""

    def __init__(self, initial_config: dict, involved_classes: list[str], long_context: bool = False):
        self.methods: dict[str, Any] = {}
        for name in involved_classes:
            if name not in CLASS_MODULES:
                raise TraceError(f"unknown BFCL class {name!r}; known: {sorted(CLASS_MODULES)}")
            module = importlib.import_module(f"{_BACKEND}.{CLASS_MODULES[name]}")
            instance = getattr(module, name)()
            if name not in STATELESS:
                instance._load_scenario(copy.deepcopy(initial_config.get(name, {})), long_context=long_context)
            for method_name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not method_name.startswith("_"):
                    self.methods.setdefault(method_name, method)

    def has(self, name: str) -> bool:
        return name in self.methods

    def execute(self, name: str, arguments: dict) -> ToolRun:
        start = time.perf_counter()
        method = self.methods.get(name)
        if method is None:
            return ToolRun(f"Error during execution: no tool named {name!r}", time.perf_counter() - start, False)
        try:
            result, ok = format_result(method(**arguments)), True
        except Exception as err:  # the tool's own failure is the observation the agent sees
            result, ok = f"Error during execution: {err}", False
        return ToolRun(result, time.perf_counter() - start, ok)
