"""Parse one model turn of a format into reasoning, tool calls, final answer and code."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentspec_sdk.errors import TurnParseError
from agentspec_sdk.structure.call_syntax import read_call, read_call_list, read_json
from agentspec_sdk.structure.formats import CODE_TOOL, FENCE, AgentFormat, not_a_format
from agentspec_sdk.structure.segmenter import Segmenter, Span


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class ParsedTurn:
    reasoning: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    final_answer: str | None = None
    code: str | None = None


def parse_turn(fmt: AgentFormat, text: str) -> ParsedTurn:
    """Split `text` (one model turn) by the format's segmenter and read each segment.

    Text from the first environment-written segment on is not part of the model's turn and is
    ignored. An unclosed last segment (generation stopped early) is read as far as it goes. A
    format without a layout (free prose) has no calls: its text is the final answer.
    """
    if not isinstance(fmt, AgentFormat):
        raise not_a_format(fmt, "parse_turn")
    if fmt.layout is None:
        return ParsedTurn("", [], text.strip())
    seg = Segmenter(fmt)
    seg.feed(text)
    parts: list[tuple[Span, str]] = []
    for span in seg.all_spans():
        if fmt.kind(span.kind).writer == "env":
            break
        parts.append((span, text[span.start : span.end]))
    layouts = {"tool_calls": _tool_calls, "react": _react, "code_agent": _code, "call_list": _call_list}
    return layouts[fmt.layout](fmt, parts)


def parse_calls(fmt: AgentFormat, text: str) -> list[ToolCall]:
    """The calls of one model turn, in order: its tool calls (tool-call and ReAct layouts), and a code
    agent's code block as one call of `CODE_TOOL` with arguments ``{"code": the block's text}``.

    One error behaviour: a malformed call (e.g. JSON cut off at max_tokens, an action without its
    input) raises `TurnParseError` naming the call and its offset, as `parse_turn` does. The caller
    decides what such a turn means: the replay loop executes no call of it (the turn is logged and the
    episode goes on to the next user message), the LangGraph chat model raises the error to its caller.
    """
    parsed = parse_turn(fmt, text)
    calls = list(parsed.tool_calls)
    if parsed.code:
        calls.append(ToolCall(CODE_TOOL, {"code": parsed.code}))
    return calls


def _strip_markers(fmt: AgentFormat, span: Span, body: str) -> str:
    kind = fmt.kind(span.kind)
    for i, op in enumerate(kind.open):
        if body.startswith(op):
            body = body[len(op) :]
            if kind.close and body.endswith(kind.close[i]):
                body = body[: -len(kind.close[i])]
            break
    return body


def _reasoning(fmt: AgentFormat, parts) -> str:
    texts = [_strip_markers(fmt, sp, body).strip() for sp, body in parts if sp.kind == fmt.initial]
    return "\n".join(t for t in texts if t)


def _tool_calls(fmt: AgentFormat, parts) -> ParsedTurn:
    calls = []
    for n, (sp, body) in enumerate(p for p in parts if p[0].kind == "tool_call"):
        where = f"tool call #{n + 1} at offset {sp.start}"
        calls.append(ToolCall(*read_call(fmt.syntax, _strip_markers(fmt, sp, body), where)))
    reasoning = _reasoning(fmt, parts)
    if calls:
        return ParsedTurn(reasoning, calls)
    return ParsedTurn("", [], reasoning)


def _call_list(fmt: AgentFormat, parts) -> ParsedTurn:
    """The call list runs from the first call segment to the turn's end (an anchored kind's text
    may hold its own marker characters, e.g. the brackets of a pythonic list)."""
    first = next((i for i, (sp, _) in enumerate(parts) if sp.kind == "tool_call"), None)
    if first is None:
        return ParsedTurn("", [], _reasoning(fmt, parts))
    start = parts[first][0].start
    raw = "".join(body for _, body in parts[first:])
    syntax = fmt.syntax
    if syntax.lead and raw.startswith(syntax.lead):
        raw = raw[len(syntax.lead):]
    where = f"tool call list at offset {start}"
    calls = [ToolCall(n, a) for n, a in read_call_list(syntax, raw, where)]
    return ParsedTurn(_reasoning(fmt, parts[:first]), calls)


def _react(fmt: AgentFormat, parts) -> ParsedTurn:
    reasoning = _reasoning(fmt, parts)
    names = [(sp, _strip_markers(fmt, sp, b).strip()) for sp, b in parts if sp.kind == "action"]
    inputs = [(sp, _strip_markers(fmt, sp, b).strip()) for sp, b in parts if sp.kind == "action_input"]
    finals = [_strip_markers(fmt, sp, b).strip() for sp, b in parts if sp.kind == "final_answer"]
    calls = []
    for i, (sp, name) in enumerate(names):
        if not name:
            raise TurnParseError(f"action at offset {sp.start} names no tool")
        if i >= len(inputs):
            raise TurnParseError(f"action {name!r} at offset {sp.start} has no action input")
        isp, raw = inputs[i]
        calls.append(ToolCall(name, _arguments(raw, f"action input of {name!r} at offset {isp.start}")))
    return ParsedTurn(reasoning, calls, finals[-1] if finals else None)


def _code(fmt: AgentFormat, parts) -> ParsedTurn:
    reasoning = _reasoning(fmt, parts)
    blocks = []
    for sp, body in parts:
        if sp.kind != "code":
            continue
        inner = _strip_markers(fmt, sp, body)
        if body.startswith(FENCE):
            info, nl, rest = inner.partition("\n")  # first line of a fence is its info string
            inner = rest if nl and " " not in info.strip() else inner
        blocks.append(inner.strip("\n"))
    if blocks:
        return ParsedTurn(reasoning, [], None, "\n\n".join(blocks))
    return ParsedTurn("", [], reasoning, None)


def _arguments(raw: str, where: str) -> dict[str, Any]:
    obj = read_json(raw, where)
    if not isinstance(obj, dict):
        raise TurnParseError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    return obj
