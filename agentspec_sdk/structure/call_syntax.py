"""Reading and writing tool calls in a format's call syntax (`formats.CallSyntax`).

Reading (`read_call`, `read_call_list`) is what `turns.parse_turn` does with a call segment: a JSON
object with the syntax's name and arguments keys, or a Python call ``f(a=1, b="x")`` whose keyword
values are Python literals (JSON's ``null``/``true``/``false`` are read too: some chat templates write
arguments with ``tojson``). Writing (`write_calls`) is the canonical text the turn grammar accepts:
arguments in the grammar's key order, spaced or compact as the syntax says.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable, Mapping
from typing import Any

from agentspec_sdk.errors import FormatError, TurnParseError
from agentspec_sdk.structure.formats import AgentFormat, CallSyntax, not_a_format
from agentspec_sdk.structure.schema.compiler import canonical_texts
from agentspec_sdk.structure.tools import Tool, ToolRegistry

__all__ = ["read_call", "read_call_list", "read_json", "write_calls"]

_JSON_NAMES = {"null": None, "true": True, "false": False}


# -- reading --------------------------------------------------------------------------------------


def read_call(syntax: CallSyntax, raw: str, where: str) -> tuple[str, dict[str, Any]]:
    """(name, arguments) of one call's text; `TurnParseError` naming `where` if it is malformed."""
    raw = raw.strip()
    if syntax.payload == "python_call":
        return _python_call(_python_expr(raw, where), where)
    return _json_call(read_json(raw, where), syntax, where)


def read_call_list(syntax: CallSyntax, raw: str, where: str) -> list[tuple[str, dict[str, Any]]]:
    """The calls of a call list (layout ``call_list``), its lead marker already removed."""
    raw = raw.strip()
    if syntax.payload == "python_call":
        expr = _python_expr(raw, where)
        items = expr.elts if isinstance(expr, ast.List) and syntax.list_open == "[" else [expr]
        return [_python_call(e, f"{where}, call #{i + 1}") for i, e in enumerate(items)]
    if syntax.list_open == "[":  # one JSON array of call objects
        value = read_json(raw, where)
        items = value if isinstance(value, list) else [value]
    else:  # objects separated by `list_sep`: read one JSON value after another
        items, decoder, at = [], json.JSONDecoder(), 0
        sep = syntax.list_sep.strip()
        while at < len(raw):
            try:
                value, end = decoder.raw_decode(raw, at)
            except json.JSONDecodeError as exc:
                raise TurnParseError(f"{where}: malformed JSON ({exc.msg} at char {exc.pos})") from None
            items.append(value)
            at = end
            rest = raw[at:].lstrip()
            if rest and sep and rest.startswith(sep):
                rest = rest[len(sep):].lstrip()
            elif rest:
                raise TurnParseError(f"{where}: expected {syntax.list_sep!r} between calls at char "
                                     f"{len(raw) - len(rest)}")
            at = len(raw) - len(rest)
    return [_json_call(v, syntax, f"{where}, call #{i + 1}") for i, v in enumerate(items)]


def read_json(raw: str, where: str) -> Any:
    """`raw` as JSON; malformed JSON is a TurnParseError naming `where` and the spot."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        snippet = raw[max(0, exc.pos - 20) : exc.pos + 20]
        raise TurnParseError(f"{where}: malformed JSON ({exc.msg} at char {exc.pos}: {snippet!r})") from None


def _json_call(obj: Any, syntax: CallSyntax, where: str) -> tuple[str, dict[str, Any]]:
    if not isinstance(obj, dict):
        raise TurnParseError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    name = obj.get(syntax.name_key, obj.get("name"))
    if not isinstance(name, str) or not name:
        raise TurnParseError(f"{where}: missing or non-string {syntax.name_key!r}")
    args = next((obj[k] for k in (syntax.args_key, "arguments", "parameters") if k in obj), {})
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        args = read_json(args, f"{where}, arguments of {name!r}")
    if not isinstance(args, dict):
        raise TurnParseError(f"{where}: arguments of {name!r} must be a JSON object, got "
                             f"{type(args).__name__}")
    return name, args


def _python_expr(raw: str, where: str) -> ast.expr:
    try:
        return ast.parse(raw, mode="eval").body
    except SyntaxError as exc:
        raise TurnParseError(f"{where}: malformed Python ({exc.msg} at char {exc.offset})") from None


def _python_call(node: ast.expr, where: str) -> tuple[str, dict[str, Any]]:
    if not isinstance(node, ast.Call):
        raise TurnParseError(f"{where}: expected a Python call, got {type(node).__name__}")
    name = _dotted(node.func)
    if name is None:
        raise TurnParseError(f"{where}: the called function is not a name")
    if node.args:
        raise TurnParseError(f"{where}: {name}() takes keyword arguments only, got {len(node.args)} "
                             "positional")
    args: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise TurnParseError(f"{where}: {name}() got **-unpacking, not keyword arguments")
        args[kw.arg] = _literal(kw.value, f"{where}, argument {kw.arg!r} of {name}()")
    return name, args


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _literal(node: ast.expr, where: str) -> Any:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise TurnParseError(f"{where}: a dict with ** unpacking is not a literal")
        keys = [_literal(k, where) for k in node.keys]
        if not all(isinstance(k, str) for k in keys):
            raise TurnParseError(f"{where}: dict keys must be strings (JSON objects)")
        return {k: _literal(v, where) for k, v in zip(keys, node.values, strict=True)}
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(e, where) for e in node.elts]
    try:
        value = ast.literal_eval(node)
    except ValueError:
        raise TurnParseError(f"{where}: not a literal ({ast.unparse(node)[:40]!r})") from None
    if value is not None and not isinstance(value, bool | int | float | str):
        raise TurnParseError(f"{where}: {type(value).__name__} has no JSON value")
    return value


# -- writing --------------------------------------------------------------------------------------


def write_calls(fmt: AgentFormat, calls: Iterable[tuple[str, Mapping[str, Any]]],
                registry: ToolRegistry | Iterable[Tool]) -> str:
    """The canonical text of `calls` ((name, arguments) pairs, in order) in `fmt`'s call syntax, as
    the format's turn grammar accepts it (arguments in the grammar's key order; each tool's schema
    from `registry`). Layout ``tool_calls``: one block per call, blocks joined by a newline; layout
    ``call_list``: the lead marker and the list."""
    if not isinstance(fmt, AgentFormat):
        raise not_a_format(fmt, "write_calls")
    if fmt.layout not in ("tool_calls", "call_list"):
        raise FormatError(f"format {fmt.name!r} (layout {fmt.layout!r}) has no tool-call syntax to write")
    tools = {t.name: t for t in (registry.tools if isinstance(registry, ToolRegistry) else registry)}
    syntax = fmt.syntax
    texts = []
    for name, args in calls:
        if name not in tools:
            raise FormatError(f"call of {name!r}: no such tool in the registry ({sorted(tools)})")
        texts.append(_write_call(syntax, tools[name], dict(args)))
    if fmt.layout == "tool_calls":
        kind = fmt.kind("tool_call")
        nl = "\n" if syntax.newlines == "required" else ""
        return "\n".join(f"{kind.open[0]}{nl}{t}{nl}{kind.close[0]}" for t in texts)
    return syntax.lead + syntax.list_open + syntax.list_sep.join(texts) + syntax.list_close


def _write_call(syntax: CallSyntax, tool: Tool, args: dict[str, Any]) -> str:
    if syntax.payload == "python_call":
        body = canonical_texts(tool.parameters, args, closed=True, whitespace=syntax.whitespace,
                               literals="python", root="kwargs", limit=1)[0]
        return tool.name + body
    body = canonical_texts(tool.parameters, args, closed=True, whitespace=syntax.whitespace, limit=1)[0]
    comma, colon = (", ", ": ") if syntax.whitespace == "spaced" else (",", ":")
    return ("{" + json.dumps(syntax.name_key) + colon + json.dumps(tool.name, ensure_ascii=False) + comma
            + json.dumps(syntax.args_key) + colon + body + "}")
