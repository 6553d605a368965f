"""Tool registry: tools from callables, pydantic models, OpenAI tool dicts and LangChain tools.

Parameter schemas are JSON Schema. Sources with their own type names (BFCL's "dict", "float", ...) are
read by their own module, which hands standard tool dicts to the registry (`agentspec_sdk.bfcl`).
"""

from __future__ import annotations

import inspect
import json
import re
import typing
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic

from agentspec_sdk.errors import InvalidSchema, ToolRegistryError

TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONES = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else")
JSON_TYPES = frozenset({"array", "boolean", "integer", "null", "number", "object", "string"})
_SUB_SCHEMAS = ("items", "additionalProperties", "additionalItems", "not")


@dataclass(frozen=True)
class Tool:
    """A tool the model may call. `parameters` is the JSON Schema of its arguments (an object)."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any] | None = field(default=None, compare=False, repr=False)

    def openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def check_tool_name(name: Any) -> str:
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise ToolRegistryError(f"invalid tool name {name!r}: must match {TOOL_NAME.pattern}")
    return name


class ToolRegistry:
    """An ordered set of tools with unique names."""

    def __init__(self, tools: Iterable[Any] = ()):
        self._tools: dict[str, Tool] = {}
        for obj in tools:
            self.add(obj)

    # -- adding -------------------------------------------------------------------------------

    def add(self, obj: Any, *, name: str | None = None, description: str | None = None) -> Tool:
        """Register a callable, pydantic model, OpenAI tool dict (or a plain {"name", "description",
        "parameters"} dict), LangChain tool or Tool."""
        tool = to_tool(obj, name=name, description=description)
        if tool.name in self._tools:
            raise ToolRegistryError(f"duplicate tool name {tool.name!r}")
        self._tools[tool.name] = tool
        return tool

    def extend(self, objs: Iterable[Any]) -> ToolRegistry:
        for obj in objs:
            self.add(obj)
        return self

    def tool(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator form of `add` for plain functions."""
        self.add(fn)
        return fn

    # -- reading ------------------------------------------------------------------------------

    @property
    def tools(self) -> list[Tool]:
        return list(self._tools.values())

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def get(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            raise ToolRegistryError(f"unknown tool {name!r}; registered: {self.names[:20]}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ToolRegistry) and self.tools == other.tools

    def openai_tools(self) -> list[dict[str, Any]]:
        return [t.openai() for t in self._tools.values()]

    def missing(self, other: ToolRegistry) -> list[Tool]:
        """The tools of `other` whose names this registry lacks, in `other`'s order."""
        return [t for name, t in other._tools.items() if name not in self._tools]

    def key(self) -> str:
        """The tools, in order, as one JSON text: equal keys, equal tools (a cache key)."""
        return json.dumps(self.openai_tools(), sort_keys=True, ensure_ascii=False, separators=(",", ":"))

    # -- tools.json ---------------------------------------------------------------------------

    def to_json(self, *, indent: int | None = 2) -> str:
        """A JSON list of OpenAI tool dicts (what `from_json` and any OpenAI client read)."""
        return json.dumps(self.openai_tools(), indent=indent, ensure_ascii=False)

    @classmethod
    def from_json(cls, data: str | bytes | list | Mapping) -> ToolRegistry:
        """Read `to_json` output; also a `{"tools": [...]}` object, OpenAI or plain tool dicts."""
        if isinstance(data, str | bytes):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as exc:
                raise ToolRegistryError(f"tools JSON is not valid JSON: {exc}") from None
        if isinstance(data, Mapping) and "tools" in data:
            data = data["tools"]
        if isinstance(data, Mapping):
            data = [data]
        if not isinstance(data, list):
            raise ToolRegistryError(f"tools JSON must be a list of tool objects, got {type(data).__name__}")
        return cls(data)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_json() + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> ToolRegistry:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ToolRegistryError(f"cannot read tools file {path}: {exc}") from None
        return cls.from_json(text)


# -- conversion -------------------------------------------------------------------------------


def to_tool(obj: Any, *, name: str | None = None, description: str | None = None) -> Tool:
    if isinstance(obj, Tool):
        tool = obj
    elif isinstance(obj, Mapping):
        tool = _from_dict(obj)
    elif isinstance(obj, type) and issubclass(obj, pydantic.BaseModel):
        tool = _from_model(obj)
    elif _is_langchain_tool(obj):
        tool = _from_langchain(obj)
    elif callable(obj):
        tool = _from_callable(obj)
    else:
        raise ToolRegistryError(
            f"cannot make a tool from {type(obj).__name__}: expected a callable, pydantic model, "
            "OpenAI tool dict or LangChain tool"
        )
    if name is not None or description is not None:
        tool = Tool(name or tool.name, tool.description if description is None else description,
                    tool.parameters, tool.fn)
    check_tool_name(tool.name)
    _check_parameters(tool.name, tool.parameters)
    return tool


def _check_parameters(name: str, params: Any) -> None:
    if not isinstance(params, Mapping):
        raise ToolRegistryError(f"tool {name!r}: parameters must be a JSON Schema object, got {params!r}")
    if params.get("type", "object") != "object":
        raise ToolRegistryError(f"tool {name!r}: parameters must have type 'object', got "
                                f"{params.get('type')!r}")


def _from_dict(d: Mapping[str, Any]) -> Tool:
    if d.get("type") == "function" and isinstance(d.get("function"), Mapping):
        d = d["function"]
    name = d.get("name")
    if not isinstance(name, str):
        raise ToolRegistryError(f"tool dict without a string 'name': keys {sorted(d)}")
    params = d.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, Mapping):
        raise ToolRegistryError(f"tool {name!r}: parameters must be an object, got {type(params).__name__}")
    try:
        params = tidy_schema(params)
    except InvalidSchema as exc:
        raise ToolRegistryError(f"tool {name!r}: {exc}") from None
    return Tool(name, str(d.get("description", "")), params)


def tidy_schema(schema: Any, pointer: str = "") -> Any:
    """A copy of a tool dict's parameter schema as the registry keeps it: every keyword kept; each
    `type` one of JSON Schema's seven names or a list of them (a list of one is written as the name;
    `InvalidSchema` naming the path otherwise); an object schema that lists neither `properties`
    nor `additionalProperties` gets `properties: {}` (the turn grammar then closes it: an argument
    of a declared object holds the keys it declares). Walks properties, $defs, definitions,
    patternProperties, items, prefixItems, additionalProperties, additionalItems, not, anyOf, oneOf
    and allOf."""
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict):
        raise InvalidSchema(f"a schema must be an object or a boolean, got {type(schema).__name__}", pointer)
    return map_schema(schema, pointer, tidy_schema, _json_type)


def map_schema(schema: dict, pointer: str, visit: Callable[[Any, str], Any],
               type_of: Callable[[Any, str], Any], skip: Collection[str] = ()) -> dict:
    """One level of a schema walk, shared by every schema rewrite (ours, BFCL's): a copy of `schema`
    with `type` through `type_of` (None drops it), each sub-schema (under properties, $defs,
    definitions, patternProperties, items, prefixItems, additionalProperties, additionalItems, not,
    anyOf, oneOf, allOf) through `visit(sub, its pointer)`, keys in `skip` left out, other keys kept;
    an object type without properties or additionalProperties gets `properties: {}`."""
    out = {}
    for key, value in schema.items():
        if key in skip:
            continue
        if key == "type":
            mapped = type_of(value, pointer)
            if mapped is not None:
                out["type"] = mapped
        elif key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(value, dict):
            out[key] = {name: visit(sub, f"{pointer}/{key}/{name}") for name, sub in value.items()}
        elif key in _SUB_SCHEMAS and isinstance(value, dict | bool):
            out[key] = visit(value, f"{pointer}/{key}")
        elif key in ("items", "prefixItems", "anyOf", "oneOf", "allOf") and isinstance(value, list):
            out[key] = [visit(sub, f"{pointer}/{key}/{i}") for i, sub in enumerate(value)]
        else:
            out[key] = value
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["properties"] = {}
    return out


def _json_type(value: Any, pointer: str) -> str | list[str]:
    names = value if isinstance(value, list) else [value]
    for name in names:
        if not isinstance(name, str):
            raise InvalidSchema(f"type must be a string, got {name!r}", f"{pointer}/type")
        if name not in JSON_TYPES:
            raise InvalidSchema(f"unknown JSON Schema type {name!r} (one of {sorted(JSON_TYPES)})",
                                f"{pointer}/type")
    return names[0] if len(names) == 1 else list(names)


def _from_model(model: type[pydantic.BaseModel]) -> Tool:
    schema = strip_titles(model.model_json_schema())
    description = schema.pop("description", "") or ""
    return Tool(model.__name__, description, schema)


def _is_langchain_tool(obj: Any) -> bool:
    # Duck-typed so that structure/ does not import langchain: BaseTool has all three.
    return all(hasattr(obj, a) for a in ("name", "description", "args")) and (
        hasattr(obj, "tool_call_schema") or hasattr(obj, "args_schema")
    ) and not isinstance(obj, type)


def _from_langchain(obj: Any) -> Tool:
    schema_src = getattr(obj, "tool_call_schema", None) or getattr(obj, "args_schema", None)
    if isinstance(schema_src, Mapping):
        schema = dict(schema_src)
    elif isinstance(schema_src, type) and issubclass(schema_src, pydantic.BaseModel):
        schema = schema_src.model_json_schema()
    elif schema_src is None:
        schema = {"type": "object", "properties": {}}
    else:
        raise ToolRegistryError(f"LangChain tool {obj.name!r}: unsupported args schema "
                                f"{type(schema_src).__name__}")
    schema = strip_titles(schema)
    schema.pop("description", None)
    description = obj.description or ""
    return Tool(obj.name, inspect.cleandoc(description), schema, getattr(obj, "invoke", None))


def _from_callable(fn: Callable[..., Any]) -> Tool:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    try:
        sig = inspect.signature(fn)
        hints = typing.get_type_hints(fn, include_extras=True)
    except (TypeError, ValueError, NameError) as exc:
        raise ToolRegistryError(f"tool {name!r}: cannot read its signature: {exc}") from None
    summary, arg_docs = parse_docstring(inspect.getdoc(fn) or "")
    fields: dict[str, Any] = {}
    for pname, param in sig.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if pname in ("self", "cls") and param.annotation is param.empty:
            continue
        annotation = hints.get(pname, Any)
        default = ... if param.default is param.empty else param.default
        fields[pname] = (annotation, pydantic.Field(default, description=arg_docs.get(pname)))
    try:
        model = pydantic.create_model(f"{name}_arguments", **fields)
        schema = strip_titles(model.model_json_schema())
    except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError, TypeError) as exc:
        raise ToolRegistryError(f"tool {name!r}: cannot build a JSON Schema from its type hints: "
                                f"{exc}") from None
    schema.pop("description", None)
    schema.setdefault("properties", {})
    return Tool(name, summary, schema, fn)


def strip_titles(schema: Any) -> Any:
    """Drop pydantic's auto `title`s (schema positions only, so a property named "title" stays)."""
    if not isinstance(schema, Mapping):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {k: strip_titles(v) for k, v in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [strip_titles(v) for v in value]
        elif key in _SCHEMA_ONES:
            out[key] = strip_titles(value)
        else:
            out[key] = value
    return out


_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Params|Returns?|Yields?|Raises|Examples?|Notes?|See Also)\s*:?\s*$"
)
_GOOGLE_ARG = re.compile(r"^\s*\**(\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")
_NUMPY_ARG = re.compile(r"^\s*(\w+)\s*(?::\s*(.*))?$")


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(summary, {param: description}) from a Google- or NumPy-style docstring."""
    lines = doc.splitlines()
    summary: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    numpy_style = False
    current: str | None = None
    arg_indent: int | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        heading = _SECTION.match(line)
        underline = i + 1 < len(lines) and re.match(r"^\s*-{3,}\s*$", lines[i + 1]) is not None
        if heading and (line.rstrip().endswith(":") or underline):
            section, numpy_style, current, arg_indent = heading.group(1).lower(), underline, None, None
            i += 2 if underline else 1
            continue
        i += 1
        if section is None:
            summary.append(line)
            continue
        if section not in ("args", "arguments", "parameters", "params") or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if arg_indent is None or indent <= arg_indent:
            m = (_NUMPY_ARG if numpy_style else _GOOGLE_ARG).match(line)
            if m:
                current, arg_indent = m.group(1), indent
                args[current] = "" if numpy_style else m.group(3).strip()
                continue
        if current is not None:
            args[current] = (args[current] + " " + line.strip()).strip()
    return "\n".join(summary).strip(), {k: v for k, v in args.items() if v}
