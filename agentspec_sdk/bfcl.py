"""BFCL (Berkeley Function Calling Leaderboard, `bfcl-eval`, Apache-2.0): data, schemas, environments.

One module for everything the SDK knows about BFCL:

- data access: the single-turn tool-call prompts (`load_category`, `tool_call_prompts`) and the
  multi-turn entries and class docs (`multi_turn_entries`, `class_docs`), read through
  importlib.resources from the installed `bfcl-eval` (installed without its dependencies: only its
  data files and its pure-Python multi-turn tool classes are used);
- schema normalisation: BFCL's type names ("dict", "float", "tuple", "any", Java/JS names) to JSON
  Schema, in full (`normalise_bfcl_schema`; `function_tool` applies it to a function doc before the
  doc reaches a `ToolRegistry`, which knows only JSON Schema) or as the slim OpenAI tool dicts of the
  multi-turn replay (`to_json_schema`, `openai_tool`, `entry_tools`);
- the executable environments: BFCL's classes (GorillaFileSystem, MathAPI, TwitterAPI, TradingBot,
  VehicleControlAPI, ...) loaded with an entry's initial_config (`BfclEnvironment`).

A missing `bfcl-eval`, a missing data file and an unknown class all raise `BfclDataError`.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from agentspec_sdk.errors import BfclDataError, InvalidSchema, ToolRegistryError
from agentspec_sdk.structure.tools import ToolRegistry, map_schema

LICENSE = "Apache-2.0"
DATASET_URL = "https://github.com/ShishirPatil/gorilla/tree/main/berkeley-function-call-leaderboard"
DEFAULT_CATEGORIES = ("simple_python", "multiple", "live_multiple")

# ---------------------------------------------------------------- data access


def _data_dir():
    try:
        return resources.files("bfcl_eval") / "data"
    except ModuleNotFoundError:
        raise BfclDataError("BFCL data needs the bfcl-eval package "
                            "(pip install --no-deps bfcl-eval)") from None


def read_jsonl(name: str) -> list[dict]:
    """A BFCL data file (JSON lines) under bfcl_eval/data, e.g. 'BFCL_v4_multi_turn_base.json'."""
    path = _data_dir() / name
    if not path.is_file():
        raise BfclDataError(f"BFCL data file {name!r} not found in the installed bfcl-eval package")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@dataclass
class BfclPrompt:
    """A single-turn prompt: the user message, the tools offered with it (OpenAI tool dicts, BFCL's
    type names mapped to JSON Schema) and BFCL's ground truth (acceptable values per argument)."""

    id: str
    messages: list[dict[str, str]]
    tools: list[dict[str, Any]]  # OpenAI tool dicts
    ground_truth: list[dict[str, Any]] = field(default_factory=list)

    def registry(self) -> ToolRegistry:
        return ToolRegistry(self.tools)


def load_category(category: str) -> list[BfclPrompt]:
    """All single-turn prompts of one BFCL category, e.g. 'simple_python', 'multiple', 'live_multiple'."""
    name = f"BFCL_v4_{category}.json"
    entries = read_jsonl(name)
    answers_name = f"possible_answer/{name}"
    answers = ({a["id"]: a["ground_truth"] for a in read_jsonl(answers_name)}
               if (_data_dir() / answers_name).is_file() else {})
    prompts = []
    for entry in entries:
        turns = entry.get("question") or []
        if len(turns) != 1:
            continue  # multi-turn entries belong to the replay runner
        messages = [{"role": m["role"], "content": m["content"]} for m in turns[0]]
        tools = ToolRegistry([function_tool(doc) for doc in entry.get("function", [])]).openai_tools()
        prompts.append(BfclPrompt(entry["id"], messages, tools, answers.get(entry["id"], [])))
    return prompts


def tool_call_prompts(n: int | None = None, categories=DEFAULT_CATEGORIES, *,
                      max_tools: int = 4) -> list[BfclPrompt]:
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


def multi_turn_entries(category: str = "base") -> list[dict]:
    """Entries of BFCL_v4_multi_turn_<category>: id, question (list of user turns, each a list of
    messages), initial_config, involved_classes, excluded_function."""
    return read_jsonl(f"BFCL_v4_multi_turn_{category}.json")


def is_long_context(category: str) -> bool:
    """BFCL's own rule (bfcl_eval base_handler): long_context and composite categories load their
    classes with `long_context=True` (large file trees, long watch lists, many bookings), and here
    their tools keep BFCL's full documentation: prompts of 2-6k tokens."""
    return "long_context" in category or "composite" in category


_BACKEND = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
CLASS_MODULES = {
    "GorillaFileSystem": "gorilla_file_system", "MathAPI": "math_api", "MessageAPI": "message_api",
    "TwitterAPI": "posting_api", "TicketAPI": "ticket_api", "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking", "VehicleControlAPI": "vehicle_control",
}
CLASS_DOCS = {name: f"{module}.json" for name, module in CLASS_MODULES.items()}
STATELESS = {"MathAPI"}


def class_docs(class_name: str) -> list[dict]:
    """BFCL's function docs of one multi-turn class."""
    if class_name not in CLASS_DOCS:
        raise BfclDataError(f"unknown BFCL class {class_name!r}; known: {sorted(CLASS_DOCS)}")
    return read_jsonl(f"multi_turn_func_doc/{CLASS_DOCS[class_name]}")


# ---------------------------------------------------------------- schema normalisation

BFCL_TYPES = {
    "dict": "object", "hashmap": "object", "object": "object",
    "float": "number", "double": "number", "number": "number",
    "integer": "integer", "int": "integer", "long": "integer", "short": "integer", "byte": "integer",
    "tuple": "array", "array": "array", "arraylist": "array", "list": "array",
    "string": "string", "char": "string", "str": "string",
    "boolean": "boolean", "bool": "boolean",
    "null": "null",
}
UNTYPED = {"any", ""}
NON_STANDARD_KEYS = {"optional"}  # BFCL marks optional parameters; `required` already says it


def bfcl_type(value, pointer: str = ""):
    """A BFCL `type` (a name or a list of names) in JSON Schema; None for untyped ('any')."""
    names = value if isinstance(value, list) else [value]
    mapped = []
    for name in names:
        if not isinstance(name, str):
            raise InvalidSchema(f"type must be a string, got {name!r}", f"{pointer}/type")
        if name.strip().lower() in UNTYPED:
            return None
        standard = BFCL_TYPES.get(name.strip().lower())
        if standard is None:
            raise InvalidSchema(f"unknown BFCL type {name!r}", f"{pointer}/type")
        mapped.append(standard)
    return mapped[0] if len(mapped) == 1 else mapped


def normalise_bfcl_schema(schema, pointer: str = ""):
    """A copy of a BFCL parameter schema in standard JSON Schema (recursively), every keyword kept."""
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict):
        raise InvalidSchema(f"a BFCL schema must be an object, got {type(schema).__name__}", pointer)
    return map_schema(schema, pointer, normalise_bfcl_schema, bfcl_type, NON_STANDARD_KEYS)


def function_tool(doc: Any) -> Any:
    """A BFCL function doc ({"name", "description", "parameters"} with BFCL's type names) with its
    parameters normalised (`normalise_bfcl_schema`, every keyword kept): what a `ToolRegistry` takes.
    A doc that is not a dict with a parameters object is passed on as is, for the registry to name
    what is wrong; a bad type raises `ToolRegistryError` naming the tool and the schema path."""
    if not isinstance(doc, dict):
        return doc
    params = doc.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict):
        return doc
    try:
        return {**doc, "parameters": normalise_bfcl_schema(params)}
    except InvalidSchema as exc:
        raise ToolRegistryError(f"tool {doc.get('name')!r}: {exc}") from None


def to_json_schema(schema: Any, pointer: str = "") -> Any:
    """A multi-turn class doc's parameters in the replay's compact JSON Schema: types mapped as in
    `normalise_bfcl_schema`, only type, properties, items, description, enum, required and default
    kept, `required: []` on objects with properties."""
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "type":
            mapped = bfcl_type(value, pointer)
            if mapped is not None:
                out["type"] = mapped
        elif key == "properties":
            out["properties"] = {k: to_json_schema(v, f"{pointer}/properties/{k}") for k, v in value.items()}
        elif key == "items":
            out["items"] = to_json_schema(value, f"{pointer}/items")
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


def _short(description: str) -> str:
    text = description.split("Tool description:", 1)[-1].strip()
    return text.split(". ")[0].rstrip(".")[:120]


def openai_tool(doc: dict, *, slim: bool = True) -> dict:
    """An OpenAI tool dict. `slim` (the default) keeps the first sentence of the description and
    drops per-parameter descriptions: the engine lists every tool in the system prompt, and the
    full BFCL docs take 2-4k tokens per episode, too much for a 135M model's context on 2 cores."""
    try:
        params = to_json_schema(doc.get("parameters", {"type": "dict", "properties": {}}))
    except InvalidSchema as exc:
        raise BfclDataError(f"BFCL function {doc.get('name')!r}: {exc}") from None
    description = doc.get("description", "")
    if slim:
        params, description = _drop_descriptions(params), _short(description)
    return {"type": "function", "function": {"name": doc["name"], "description": description,
                                             "parameters": params}}


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


SYSTEM_PROMPT = ("You are an agent that completes the user's request by calling tools, one call at a time. "
                 "When the request is done, answer briefly without a tool call.")


def system_prompt() -> str:
    """The agent's role, the same for every entry: the engine appends the format's instructions and
    the tool list."""
    return SYSTEM_PROMPT


# ---------------------------------------------------------------- executable environments


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
                raise BfclDataError(f"unknown BFCL class {name!r}; known: {sorted(CLASS_MODULES)}")
            try:
                module = importlib.import_module(f"{_BACKEND}.{CLASS_MODULES[name]}")
            except ModuleNotFoundError as exc:
                if exc.name is None or not exc.name.startswith("bfcl_eval"):
                    raise
                raise BfclDataError("BFCL environments need the bfcl-eval package "
                                    "(pip install --no-deps bfcl-eval)") from None
            instance = getattr(module, name)()
            if name not in STATELESS:
                instance._load_scenario(copy.deepcopy(initial_config.get(name, {})),
                                        long_context=long_context)
            for method_name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not method_name.startswith("_"):
                    self.methods.setdefault(method_name, method)

    def has(self, name: str) -> bool:
        return name in self.methods

    def execute(self, name: str, arguments: dict) -> ToolRun:
        start = time.perf_counter()
        method = self.methods.get(name)
        if method is None:
            return ToolRun(f"Error during execution: no tool named {name!r}", time.perf_counter() - start,
                           False)
        try:
            result, ok = format_result(method(**arguments)), True
        except Exception as err:  # the tool's own failure is the observation the agent sees
            result, ok = f"Error during execution: {err}", False
        return ToolRun(result, time.perf_counter() - start, ok)
