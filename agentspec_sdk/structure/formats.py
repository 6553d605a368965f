"""Agent formats: the segment kinds of an agent turn, their markers, writers and law classes.

A format is plain data (`to_dict`/`from_dict` round-trip through JSON), so users define their own
without editing the library and register them with `register_format`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Literal

from agentspec_sdk.errors import FormatError

Writer = Literal["model", "env"]
Content = Literal["text", "json", "code"]
"""How marker text inside a segment is read.

- ``text``: every marker is live.
- ``json``: markers inside JSON strings are not boundaries (string and escape state is tracked).
- ``code``: markers inside ``` fences are not boundaries. A segment that has its own close marker is
  opaque up to that close marker whatever its content.
"""

# Layout → the segment kinds it needs (by name); see turn_grammar.py and turns.py.
LAYOUTS: dict[str, tuple[str, ...]] = {
    "react": ("action", "action_input"),
    "tool_calls": ("tool_call",),
    "code_agent": ("code",),
}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
FENCE = "```"
CODE_TOOL = "python"  # the code-agent layout's code block is a call of this tool, arguments {"code": …}


class LawClass(StrEnum):
    """Draft Law class of a segment: schema-bound, reasoning, free prose."""

    S = "S"
    R = "R"
    F = "F"


@dataclass(frozen=True)
class SegmentKind:
    """One kind of segment.

    `open` lists the markers that start it (the marker text belongs to the new segment). `close` is
    empty ("until the next marker") or pairs one close marker with each open marker; the close
    marker belongs to the segment it closes and the text after it goes to the format's initial kind.
    """

    name: str
    law_class: LawClass
    writer: Writer = "model"
    open: tuple[str, ...] = ()
    close: tuple[str, ...] = ()
    content: Content = "text"

    @property
    def delimited(self) -> bool:
        return bool(self.close)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "law_class": self.law_class.value,
            "writer": self.writer,
            "open": list(self.open),
            "close": list(self.close),
            "content": self.content,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SegmentKind:
        if not isinstance(data, Mapping):
            raise FormatError(f"a segment kind must be an object, got {type(data).__name__}")
        where = f"segment kind {data.get('name', '?')!r}"
        unknown = set(data) - {"name", "law_class", "writer", "open", "close", "content"}
        if unknown:
            raise FormatError(f"{where}: unknown keys {sorted(unknown)}")
        return cls(
            name=_str(data.get("name"), f"{where}: name"),
            law_class=_law_class(data.get("law_class"), where),
            writer=data.get("writer", "model"),
            open=_markers(data.get("open", ()), f"{where}: open"),
            close=_markers(data.get("close", ()), f"{where}: close"),
            content=data.get("content", "text"),
        )


@dataclass(frozen=True)
class AgentFormat:
    """An agent output format.

    `initial` is the kind a model turn starts in (text before any marker, and text after a close
    marker). `stop` are the strings where the environment's segment would begin: the model's turn
    ends there. `turn_end` are chat-template end tokens such as ``<|im_end|>``. `layout` names the
    shape of a model turn the turn grammar and `parse_turn` use (one of `LAYOUTS`); the layout
    finds its segment kinds by name, so a user format reuses a layout with its own markers.
    `instructions` is the system-prompt text telling the model how to write a turn (empty: the
    `description`); `env_wrap` is how a tool result is shown to the model, `{}` standing for the
    result (see backends/prompts.py).
    """

    name: str
    kinds: tuple[SegmentKind, ...]
    initial: str
    stop: tuple[str, ...] = ()
    turn_end: tuple[str, ...] = ()
    description: str = ""
    layout: str | None = None
    instructions: str = ""
    env_wrap: str = "{}"
    _by_name: dict[str, SegmentKind] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kinds", tuple(self.kinds))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "turn_end", tuple(self.turn_end))
        object.__setattr__(self, "_by_name", {k.name: k for k in self.kinds})
        _validate(self)

    def kind(self, name: str) -> SegmentKind:
        try:
            return self._by_name[name]
        except KeyError:
            raise FormatError(f"format {self.name!r} has no segment kind {name!r}") from None

    @property
    def kind_names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.kinds)

    def open_markers(self) -> dict[str, tuple[str, int]]:
        """Every open marker → (kind name, index of the marker in that kind's `open`)."""
        return {m: (k.name, i) for k in self.kinds for i, m in enumerate(k.open)}

    def with_classes(self, mapping: Mapping[str, LawClass | str]) -> AgentFormat:
        """A copy with some segment kinds mapped to other law classes, e.g. ``{"code": "S"}``."""
        for name in mapping:
            self.kind(name)
        kinds = tuple(
            replace(k, law_class=_law_class(mapping[k.name], f"segment kind {k.name!r}"))
            if k.name in mapping
            else k
            for k in self.kinds
        )
        return replace(self, kinds=kinds)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "initial": self.initial,
            "stop": list(self.stop),
            "turn_end": list(self.turn_end),
            "layout": self.layout,
            "kinds": [k.to_dict() for k in self.kinds],
            "instructions": self.instructions,
            "env_wrap": self.env_wrap,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AgentFormat:
        if not isinstance(data, Mapping):
            raise FormatError(f"a format must be an object, got {type(data).__name__}")
        unknown = set(data) - {"name", "description", "initial", "stop", "turn_end", "kinds", "layout",
                               "instructions", "env_wrap"}
        if unknown:
            raise FormatError(f"format {data.get('name', '?')!r}: unknown keys {sorted(unknown)}")
        name = _str(data.get("name"), "format name")
        kinds = data.get("kinds")
        if not isinstance(kinds, list | tuple) or not kinds:
            raise FormatError(f"format {name!r}: 'kinds' must be a non-empty list")
        return cls(
            name=name,
            kinds=tuple(SegmentKind.from_dict(k) for k in kinds),
            initial=_str(data.get("initial"), f"format {name!r}: initial"),
            stop=_markers(data.get("stop", ()), f"format {name!r}: stop"),
            turn_end=_markers(data.get("turn_end", ()), f"format {name!r}: turn_end"),
            description=str(data.get("description", "")),
            layout=data.get("layout"),
            instructions=str(data.get("instructions", "")),
            env_wrap=str(data.get("env_wrap", "{}")),
        )


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise FormatError(f"{where} must be a non-empty string, got {value!r}")
    return value


def _markers(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Iterable):
        raise FormatError(f"{where} must be a list of strings, got {value!r}")
    out = tuple(value)
    for m in out:
        if not isinstance(m, str) or not m:
            raise FormatError(f"{where}: markers must be non-empty strings, got {m!r}")
    return out


def _law_class(value: Any, where: str) -> LawClass:
    try:
        return LawClass(value.value if isinstance(value, LawClass) else value)
    except (ValueError, AttributeError):
        raise FormatError(f"{where}: law_class must be one of S, R, F, got {value!r}") from None


def _validate(fmt: AgentFormat) -> None:
    where = f"format {fmt.name!r}"
    if not fmt.kinds:
        raise FormatError(f"{where}: no segment kinds")
    if fmt.initial not in {k.name for k in fmt.kinds}:
        raise FormatError(f"{where}: initial kind {fmt.initial!r} is not one of "
                          f"{[k.name for k in fmt.kinds]}")
    seen: dict[str, str] = {}
    for k in fmt.kinds:
        kw = f"{where}, segment kind {k.name!r}"
        if not _NAME.match(k.name):
            raise FormatError(f"{kw}: name must match {_NAME.pattern}")
        if k.name in seen:
            raise FormatError(f"{where}: duplicate segment kind {k.name!r}")
        seen[k.name] = k.name
        if not isinstance(k.law_class, LawClass):
            raise FormatError(f"{kw}: law_class must be a LawClass")
        if k.writer not in ("model", "env"):
            raise FormatError(f"{kw}: writer must be 'model' or 'env', got {k.writer!r}")
        if k.content not in ("text", "json", "code"):
            raise FormatError(f"{kw}: content must be 'text', 'json' or 'code', got {k.content!r}")
        if k.close and len(k.close) != len(k.open):
            raise FormatError(
                f"{kw}: 'close' must be empty or pair one close marker with each open marker "
                f"({len(k.open)} open, {len(k.close)} close)"
            )
        if not k.open and k.name != fmt.initial:
            raise FormatError(f"{kw}: only the initial kind may have no open marker")
    if fmt.kind(fmt.initial).writer != "model":
        raise FormatError(f"{where}: the initial kind {fmt.initial!r} must be written by the model")
    if fmt.layout is not None:
        if fmt.layout not in LAYOUTS:
            raise FormatError(f"{where}: unknown layout {fmt.layout!r}; known: {sorted(LAYOUTS)}")
        for needed in LAYOUTS[fmt.layout]:
            if needed not in seen:
                raise FormatError(f"{where}: layout {fmt.layout!r} needs a segment kind named {needed!r}")
            if not fmt.kind(needed).open or fmt.kind(needed).writer != "model":
                raise FormatError(f"{where}: kind {needed!r} of layout {fmt.layout!r} must be model-written "
                                  "with an open marker")
        if fmt.layout in ("tool_calls", "code_agent") and not fmt.kind(LAYOUTS[fmt.layout][0]).delimited:
            raise FormatError(f"{where}: kind {LAYOUTS[fmt.layout][0]!r} of layout {fmt.layout!r} needs "
                              "close markers")
    owners: dict[str, str] = {}
    for k in fmt.kinds:
        for m in k.open:
            if m in owners:
                raise FormatError(f"{where}: open marker {m!r} used by both {owners[m]!r} and {k.name!r}")
            owners[m] = k.name
    if fmt.env_wrap.count("{}") != 1:
        raise FormatError(f"{where}: env_wrap must hold '{{}}' (where the tool result goes) once, "
                          f"got {fmt.env_wrap!r}")
    for s in fmt.stop:
        if s not in owners or fmt.kind(owners[s]).writer != "env":
            raise FormatError(f"{where}: stop string {s!r} must be the open marker of an env-written kind")


REACT = AgentFormat(
    name="react",
    description="ReAct: Thought / Action / Action Input (JSON) / Observation / Final Answer.",
    initial="thought",
    kinds=(
        SegmentKind("thought", LawClass.R, "model", ("Thought:",)),
        SegmentKind("action", LawClass.S, "model", ("Action:",)),
        SegmentKind("action_input", LawClass.S, "model", ("Action Input:",), content="json"),
        SegmentKind("observation", LawClass.F, "env", ("Observation:",)),
        SegmentKind("final_answer", LawClass.F, "model", ("Final Answer:",)),
    ),
    stop=("Observation:",),
    layout="react",
    instructions=("Answer in this format:\nThought: <your reasoning>\nAction: <tool name>\n"
                  "Action Input: <arguments as JSON>\nObservation: <the tool result, written by the system>\n"
                  "... (repeat as needed)\nFinal Answer: <the answer>"),
    env_wrap="Observation: {}",
)

TOOL_CALLS = AgentFormat(
    name="tool_calls",
    description="Hermes/Qwen JSON tool calls: optional reasoning, then <tool_call>{...}</tool_call>.",
    initial="reasoning",
    kinds=(
        SegmentKind("reasoning", LawClass.R, "model"),
        SegmentKind("tool_call", LawClass.S, "model", ("<tool_call>",), ("</tool_call>",), "json"),
        SegmentKind("tool_response", LawClass.F, "env", ("<tool_response>",), ("</tool_response>",)),
    ),
    stop=("<tool_response>",),
    turn_end=("<|im_end|>",),
    layout="tool_calls",
    instructions=("To call a tool, reply with exactly one line:\n"
                  '<tool_call>{"name":"<tool name>","arguments":{<arguments as JSON>}}</tool_call>\n'
                  "Use only the tools listed below and copy argument values from the user's message. "
                  "Tool results come back in <tool_response></tool_response>."),
    env_wrap="<tool_response>\n{}\n</tool_response>",
)

CODE_AGENT = AgentFormat(
    name="code_agent",
    description="Code agent: reasoning, then a ``` fenced or <code> block; the result in <result>.",
    initial="reasoning",
    kinds=(
        SegmentKind("reasoning", LawClass.R, "model"),
        SegmentKind("code", LawClass.R, "model", (FENCE, "<code>"), (FENCE, "</code>"), "code"),
        SegmentKind("result", LawClass.F, "env", ("<result>",), ("</result>",)),
    ),
    stop=("<result>",),
    turn_end=("<|im_end|>",),
    layout="code_agent",
    instructions=("Think briefly, then write Python code in a ```python fenced block. The result of running "
                  "it comes back in <result></result>. The tools below are Python functions you can call."),
    env_wrap="<result>\n{}\n</result>",
)

_BUILTIN = {f.name: f for f in (REACT, TOOL_CALLS, CODE_AGENT)}
_USER: dict[str, AgentFormat] = {}


def register_format(fmt: AgentFormat | Mapping[str, Any], *, replace_existing: bool = False) -> AgentFormat:
    """Make a user format available to `get_format` (and to plans that name it)."""
    if not isinstance(fmt, AgentFormat):
        fmt = AgentFormat.from_dict(fmt)
    if fmt.name in _BUILTIN:
        raise FormatError(f"format name {fmt.name!r} is built in; choose another name")
    if fmt.name in _USER and not replace_existing and _USER[fmt.name] != fmt:
        raise FormatError(f"format {fmt.name!r} is already registered (pass replace_existing=True)")
    _USER[fmt.name] = fmt
    return fmt


def get_format(name: str | AgentFormat | Mapping[str, Any]) -> AgentFormat:
    """A format by name (built-in or registered), or from a format object / dict."""
    if isinstance(name, AgentFormat):
        return name
    if isinstance(name, Mapping):
        return AgentFormat.from_dict(name)
    found = _BUILTIN.get(name) or _USER.get(name)
    if found is None:
        raise FormatError(f"unknown format {name!r}; known: {sorted(_BUILTIN) + sorted(_USER)}")
    return found


def format_names() -> list[str]:
    return sorted(_BUILTIN) + sorted(_USER)
