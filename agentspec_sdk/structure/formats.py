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
    "call_list": ("tool_call",),  # one list of calls (after a lead marker, or the whole turn)
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
    anchored: bool = False  # its open markers open it only at the turn's first character

    @property
    def delimited(self) -> bool:
        return bool(self.close)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "law_class": self.law_class.value,
            "writer": self.writer,
            "open": list(self.open),
            "close": list(self.close),
            "content": self.content,
        }
        if self.anchored:  # written only when set: the dicts of older formats stay as they were
            out["anchored"] = True
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SegmentKind:
        if not isinstance(data, Mapping):
            raise FormatError(f"a segment kind must be an object, got {type(data).__name__}")
        where = f"segment kind {data.get('name', '?')!r}"
        unknown = set(data) - {"name", "law_class", "writer", "open", "close", "content", "anchored"}
        if unknown:
            raise FormatError(f"{where}: unknown keys {sorted(unknown)}")
        return cls(
            name=_str(data.get("name"), f"{where}: name"),
            law_class=_law_class(data.get("law_class"), where),
            writer=data.get("writer", "model"),
            open=_markers(data.get("open", ()), f"{where}: open"),
            close=_markers(data.get("close", ()), f"{where}: close"),
            content=data.get("content", "text"),
            anchored=_bool(data.get("anchored", False), f"{where}: anchored"),
        )


Payload = Literal["json_object", "python_call"]
_SYNTAX_KEYS = ("payload", "name_key", "args_key", "whitespace", "lead", "lead_optional", "list_open",
                "list_sep", "list_close", "newlines")


@dataclass(frozen=True)
class CallSyntax:
    """How one model family writes a tool call (plain data; `AgentFormat.call_syntax`).

    `payload`: ``json_object`` (``{"<name_key>": "f", "<args_key>": {...}}``) or ``python_call``
    (``f(a="x", b=1)``: keyword arguments, values as Python literals). `whitespace`: ``compact``
    (``{"a":1}``) or ``spaced`` (``json.dumps``'s default separators ``, `` and ``: ``, what chat
    templates' ``tojson`` writes; keyword arguments are then separated by ``, ``).
    Layout ``call_list``: the calls are one list, ``list_open call (list_sep call)* list_close``, after
    `lead` (one of the call kind's open markers; optional with `lead_optional`) or, with no lead, from
    the turn's first character. Layout ``tool_calls``: each call in its own call markers; `newlines`
    says whether a newline after the open marker and before the close marker is ``optional`` or
    ``required`` (Gemma's fenced block).
    """

    payload: Payload = "json_object"
    name_key: str = "name"
    args_key: str = "arguments"
    whitespace: Literal["compact", "spaced"] = "compact"
    lead: str = ""
    lead_optional: bool = False
    list_open: str = ""
    list_sep: str = ""
    list_close: str = ""
    newlines: Literal["optional", "required"] = "optional"

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _SYNTAX_KEYS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> CallSyntax:
        if not isinstance(data, Mapping):
            raise FormatError(f"{where}: call_syntax must be an object, got {type(data).__name__}")
        unknown = set(data) - set(_SYNTAX_KEYS)
        if unknown:
            raise FormatError(f"{where}: call_syntax has unknown keys {sorted(unknown)}")
        syntax = cls(**{k: data[k] for k in _SYNTAX_KEYS if k in data})
        choices = {"payload": ("json_object", "python_call"), "whitespace": ("compact", "spaced"),
                   "newlines": ("optional", "required")}
        for key, allowed in choices.items():
            if getattr(syntax, key) not in allowed:
                raise FormatError(f"{where}: call_syntax.{key} must be one of {list(allowed)}, got "
                                  f"{getattr(syntax, key)!r}")
        for key in ("name_key", "args_key", "lead", "list_open", "list_sep", "list_close"):
            if not isinstance(getattr(syntax, key), str):
                raise FormatError(f"{where}: call_syntax.{key} must be a string")
        _bool(syntax.lead_optional, f"{where}: call_syntax.lead_optional")
        return syntax


DEFAULT_SYNTAX = CallSyntax()  # the compact {"name":…,"arguments":…} object of `tool_calls`


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
    result (see backends/prompts.py). `call_syntax` says how a call is written (None: the compact
    ``{"name":…,"arguments":…}`` object of the built-in `tool_calls` format); `tool_parser` names the
    vLLM tool parser (``--tool-call-parser``) that reads this format's calls (None: only the SDK's own
    `agentspec` parser reads them).
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
    call_syntax: CallSyntax | None = None
    tool_parser: str | None = None
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

    @property
    def syntax(self) -> CallSyntax:
        """The call syntax, the default one when the format names none."""
        return self.call_syntax or DEFAULT_SYNTAX

    def to_dict(self) -> dict[str, Any]:
        out = {
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
        if self.call_syntax is not None:  # written only when set (older formats' dicts unchanged)
            out["call_syntax"] = self.call_syntax.to_dict()
        if self.tool_parser is not None:
            out["tool_parser"] = self.tool_parser
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AgentFormat:
        if not isinstance(data, Mapping):
            raise FormatError(f"a format must be an object, got {type(data).__name__}")
        unknown = set(data) - {"name", "description", "initial", "stop", "turn_end", "kinds", "layout",
                               "instructions", "env_wrap", "call_syntax", "tool_parser"}
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
            call_syntax=(None if data.get("call_syntax") is None
                         else CallSyntax.from_dict(data["call_syntax"], f"format {name!r}")),
            tool_parser=(None if data.get("tool_parser") is None
                         else _str(data["tool_parser"], f"format {name!r}: tool_parser")),
        )


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise FormatError(f"{where} must be a non-empty string, got {value!r}")
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise FormatError(f"{where} must be true or false, got {value!r}")
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
    _validate_syntax(fmt, where)
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


def _validate_syntax(fmt: AgentFormat, where: str) -> None:
    syntax = fmt.call_syntax
    if syntax is None:
        if fmt.layout == "call_list":
            raise FormatError(f"{where}: layout 'call_list' needs a call_syntax (the list's punctuation)")
        return
    if fmt.layout not in ("tool_calls", "call_list"):
        raise FormatError(f"{where}: call_syntax needs layout 'tool_calls' or 'call_list', not "
                          f"{fmt.layout!r}")
    kind = fmt.kind("tool_call")
    listed = syntax.lead or syntax.list_open or syntax.list_sep or syntax.list_close
    if fmt.layout == "tool_calls" and listed:
        raise FormatError(f"{where}: layout 'tool_calls' writes each call in its own markers: call_syntax "
                          "takes no lead or list punctuation there")
    if fmt.layout == "call_list":
        if not syntax.list_sep:
            raise FormatError(f"{where}: call_syntax.list_sep (between two calls) must not be empty")
        if syntax.lead and syntax.lead not in kind.open:
            raise FormatError(f"{where}: call_syntax.lead {syntax.lead!r} must be an open marker of kind "
                              f"'tool_call' {list(kind.open)}")
        if (not syntax.lead or syntax.lead_optional) and not kind.anchored:
            raise FormatError(f"{where}: a call list that may start without a lead marker needs an anchored "
                              "'tool_call' kind (its markers count at the turn's first character only)")
        if kind.delimited:
            raise FormatError(f"{where}: kind 'tool_call' of layout 'call_list' runs to the turn's end: "
                              "no close markers")
    if any(k.anchored for k in fmt.kinds if k.name != "tool_call" or fmt.layout != "call_list"):
        raise FormatError(f"{where}: only the 'tool_call' kind of a 'call_list' layout may be anchored")


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

# -- native tool-call formats: each model family's own syntax, paired with its vLLM tool parser ---------

HERMES = AgentFormat(
    name="hermes",
    description=("Hermes/Qwen2.5 native tool calls: "
                 '<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>.'),
    initial="reasoning",
    kinds=(
        SegmentKind("reasoning", LawClass.R, "model"),
        SegmentKind("tool_call", LawClass.S, "model", ("<tool_call>",), ("</tool_call>",), "json"),
        SegmentKind("tool_response", LawClass.F, "env", ("<tool_response>",), ("</tool_response>",)),
    ),
    stop=("<tool_response>",),
    turn_end=("<|im_end|>",),
    layout="tool_calls",
    instructions=("To call a tool, write one block per call:\n<tool_call>\n"
                  '{"name": "<tool name>", "arguments": {<arguments as JSON>}}\n</tool_call>\n'
                  "Tool results come back in <tool_response></tool_response>."),
    env_wrap="<tool_response>\n{}\n</tool_response>",
    call_syntax=CallSyntax(whitespace="spaced", newlines="required"),
    tool_parser="hermes",
)

LLAMA3_JSON = AgentFormat(
    name="llama3_json",
    description='Llama 3.1/3.2 JSON tool calls: [<|python_tag|>]{"name": …, "parameters": …}; {…}.',
    initial="reasoning",
    kinds=(
        SegmentKind("reasoning", LawClass.R, "model"),
        # the whole turn is the call list when it starts with the tag or a brace
        SegmentKind("tool_call", LawClass.S, "model", ("<|python_tag|>", "{"), (), "json", anchored=True),
        SegmentKind("ipython", LawClass.F, "env", ("<|start_header_id|>ipython<|end_header_id|>",),
                    ("<|eot_id|>",)),
    ),
    stop=("<|start_header_id|>ipython<|end_header_id|>",),
    turn_end=("<|eot_id|>", "<|eom_id|>"),
    layout="call_list",
    instructions=("To call tools, reply with only the calls, each a JSON object "
                  '{"name": "<tool name>", "parameters": {<arguments as JSON>}}, separated by "; ". '
                  "Tool results come back in the ipython role."),
    env_wrap="{}",
    call_syntax=CallSyntax(args_key="parameters", whitespace="spaced", lead="<|python_tag|>",
                           lead_optional=True, list_sep="; "),
    tool_parser="llama3_json",
)

MISTRAL = AgentFormat(
    name="mistral",
    description='Mistral tool calls: [TOOL_CALLS][{"name": …, "arguments": …}, …].',
    initial="reasoning",
    kinds=(
        SegmentKind("reasoning", LawClass.R, "model"),
        SegmentKind("tool_call", LawClass.S, "model", ("[TOOL_CALLS]",), (), "json"),
        SegmentKind("tool_results", LawClass.F, "env", ("[TOOL_RESULTS]",), ("[/TOOL_RESULTS]",)),
    ),
    stop=("[TOOL_RESULTS]",),
    turn_end=("</s>",),
    layout="call_list",
    instructions=("To call tools, write [TOOL_CALLS] and then a JSON list of calls, "
                  '[{"name": "<tool name>", "arguments": {<arguments as JSON>}}, …]. '
                  "Tool results come back in [TOOL_RESULTS][/TOOL_RESULTS]."),
    env_wrap="[TOOL_RESULTS]{}[/TOOL_RESULTS]",
    call_syntax=CallSyntax(whitespace="spaced", lead="[TOOL_CALLS]", list_open="[", list_sep=", ",
                           list_close="]"),
    tool_parser="mistral",
)

PYTHONIC = AgentFormat(
    name="pythonic",
    description='Llama 3.2/4 pythonic tool calls: the turn is a Python list of calls [f(a="x", b=1), g()].',
    initial="reasoning",
    kinds=(
        SegmentKind("reasoning", LawClass.R, "model"),
        SegmentKind("tool_call", LawClass.S, "model", ("[",), (), "json", anchored=True),
        SegmentKind("ipython", LawClass.F, "env", ("<|start_header_id|>ipython<|end_header_id|>",),
                    ("<|eot_id|>",)),
    ),
    stop=("<|start_header_id|>ipython<|end_header_id|>",),
    turn_end=("<|eot_id|>", "<|eom_id|>"),
    layout="call_list",
    instructions=("To call tools, reply with only a Python list of the calls, "
                  "[func_name1(param1=value1, param2=value2), func_name2()], values as Python literals. "
                  "Tool results come back in the ipython role."),
    env_wrap="{}",
    call_syntax=CallSyntax(payload="python_call", whitespace="spaced", list_open="[", list_sep=", ",
                           list_close="]"),
    tool_parser="pythonic",
)

GEMMA_TOOL_CODE = AgentFormat(
    name="gemma_tool_code",
    description=('Gemma tool calls: a ```tool_code block holding a Python call f(a="x"); results in '
                 "```tool_output."),
    initial="reasoning",
    kinds=(
        SegmentKind("reasoning", LawClass.R, "model"),
        SegmentKind("tool_call", LawClass.S, "model", (FENCE + "tool_code",), (FENCE,), "code"),
        SegmentKind("tool_output", LawClass.F, "env", (FENCE + "tool_output",), (FENCE,)),
    ),
    stop=(FENCE + "tool_output",),
    turn_end=("<end_of_turn>",),
    layout="tool_calls",
    instructions=("To call a tool, write a Python call of it in a tool_code block:\n```tool_code\n"
                  '<tool name>(<argument>=<value>, …)\n```\nValues are Python literals. The result comes '
                  "back in a ```tool_output block."),
    env_wrap=FENCE + "tool_output\n{}\n" + FENCE,
    call_syntax=CallSyntax(payload="python_call", whitespace="spaced", newlines="required"),
    tool_parser=None,  # vLLM 0.32 has no parser for ```tool_code blocks: the `agentspec` parser reads them
)

NATIVE_FORMATS = (HERMES, LLAMA3_JSON, MISTRAL, PYTHONIC, GEMMA_TOOL_CODE)
_BUILTIN = {f.name: f for f in (REACT, TOOL_CALLS, CODE_AGENT, *NATIVE_FORMATS)}
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


def not_a_format(fmt: object, where: str) -> FormatError:
    """The error for a name or dict where `where` takes an `AgentFormat`: a format is resolved once, at
    the edge (`get_format`, an engine's `resolve_format`), and passed on as the object."""
    return FormatError(f"{where} takes an AgentFormat, got {type(fmt).__name__} {fmt!r}: resolve it once "
                       "with get_format(name) where the request comes in")


def format_names() -> list[str]:
    return sorted(_BUILTIN) + sorted(_USER)
