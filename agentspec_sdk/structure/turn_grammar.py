"""Per-turn grammars composed from an agent format and the registered tools.

Three renderings of the same language:
- ``llguidance`` Lark (what vLLM's ``guidance`` backend compiles; the default),
- ``lark``: plain python-lark text (Earley), used to parse and check sample turns,
- xgrammar EBNF (`turn_grammar_gbnf`).

Markers are literal; a tool call is the union over tools of
``{"name":"<tool>","arguments":<that tool's schema>}`` in compact canonical JSON; free text (reasoning,
final answers, code bodies) may be any text that does not contain a marker the segmenter would
split on; the model's turn ends where the environment's segment would begin.

Every variant of a turn is built here from arguments: `tool_choice` ("auto", "required", "none",
"call"), `single_call` (the tool-call layout's call-only turn is exactly one call in its markers) and
`thought_chars` (a ReAct turn that must act: one line of thought of at most that many characters, then
the action). Callers never edit the grammar text.

llguidance's lexer is greedy and does not give bytes back, so free text and the marker that ends it
are one lexeme (``text + marker``, with the text's marker-freedom written as ``& ~/…/``). Python lark
gets the same lexeme as a regex with a negative lookahead; xgrammar gets right-linear rules from the
marker automaton (it parses non-deterministically, so text and marker can stay apart).
"""

from __future__ import annotations

import json
import keyword
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from agentspec_sdk.errors import FormatError, SchemaNotSupported, ToolRegistryError
from agentspec_sdk.structure.formats import DEFAULT_SYNTAX, AgentFormat, CallSyntax, not_a_format
from agentspec_sdk.structure.marker_free import marker_free_regex, then_pieces
from agentspec_sdk.structure.schema.compiler import SchemaRules, schema_rules
from agentspec_sdk.structure.schema.grammar_ir import Lit, to_regex
from agentspec_sdk.structure.tools import Tool, ToolRegistry

Dialect = Literal["llguidance", "lark", "gbnf"]
ToolChoice = Literal["auto", "required", "none", "call"]  # "call": tool calls only, no text first


# -- public API -----------------------------------------------------------------------------------


def turn_grammar(
    fmt: AgentFormat,
    registry: ToolRegistry | Iterable[Tool] = (),
    *,
    whitespace: str | None = None,
    tool_choice: ToolChoice = "auto",
    dialect: Literal["llguidance", "lark"] = "llguidance",
    special_tokens: Sequence[str] = (),
    relax: Sequence[str] = (),
    closed: bool = True,
    single_call: bool = False,
    thought_chars: int | None = None,
) -> str:
    """Lark text for one model turn of `fmt` with the tools of `registry`.

    `whitespace`: of the call payload, ``compact``, ``spaced`` or ``flexible``; None: the format's call
    syntax's (``compact`` for formats without one).
    `special_tokens`: markers that are single special tokens in the target tokenizer (e.g. Qwen's
    ``<tool_call>``); llguidance must then see them as ``<tool_call>`` (token syntax), not as text.
    `single_call` (layout ``tool_calls``, ``tool_choice="call"``): the turn is one call in the call
    markers and nothing else. `thought_chars` (layout ``react``, a turn that must act, llguidance
    only): the turn starts with the thought marker, one line of at most that many characters, then
    the action and its input; it ends there.
    """
    if dialect not in ("llguidance", "lark"):
        raise ValueError(f"dialect must be 'llguidance' or 'lark', not {dialect!r}")
    if special_tokens and dialect == "lark":
        raise FormatError("python lark has no special-token syntax; use dialect='llguidance'")
    if thought_chars is not None and dialect != "llguidance":
        raise FormatError("thought_chars needs dialect='llguidance' (its line is an llguidance lexeme)")
    if not isinstance(fmt, AgentFormat):
        raise not_a_format(fmt, "turn_grammar")
    shape = _Shape(tool_choice, whitespace or fmt.syntax.whitespace, tuple(relax), single_call, thought_chars)
    return _build(fmt, _tools(registry), shape, dialect, tuple(special_tokens), closed)


def turn_grammar_gbnf(
    fmt: AgentFormat,
    registry: ToolRegistry | Iterable[Tool] = (),
    *,
    whitespace: str | None = None,
    tool_choice: ToolChoice = "auto",
    relax: Sequence[str] = (),
    closed: bool = True,
    single_call: bool = False,
) -> str:
    """The same turn grammar in xgrammar's EBNF (root rule ``root``; special tokens are text there)."""
    if not isinstance(fmt, AgentFormat):
        raise not_a_format(fmt, "turn_grammar_gbnf")
    shape = _Shape(tool_choice, whitespace or fmt.syntax.whitespace, tuple(relax), single_call, None)
    return _build(fmt, _tools(registry), shape, "gbnf", (), closed)


def tool_call_grammar(
    registry: ToolRegistry | Iterable[Tool],
    *,
    whitespace: str | None = None,
    dialect: Dialect = "llguidance",
    relax: Sequence[str] = (),
    closed: bool = True,
    syntax: CallSyntax | None = None,
    listed: bool = False,
) -> str:
    """Grammar of one call (what the drafter forces): the object ``{"name":…,"arguments":…}``, or the
    call in `syntax` (a format's `call_syntax`; `whitespace` None: the syntax's). `listed`: the
    syntax's whole call list instead, ``list_open call (list_sep call)* list_close`` (layout
    ``call_list``, the text after its lead marker)."""
    tools = _tools(registry)
    if not tools:
        raise ToolRegistryError("no tools registered: a tool call grammar needs at least one tool")
    syntax = syntax or DEFAULT_SYNTAX
    b = _Builder(dialect, closed=closed)
    union = _call_union(b, tools, whitespace or syntax.whitespace, tuple(relax), syntax)
    b.rule(b.start, _list_body(b, syntax, union, single=False) if listed else union)
    return b.render()


# -- building -------------------------------------------------------------------------------------


def _tools(registry: ToolRegistry | Iterable[Tool]) -> tuple[Tool, ...]:
    return tuple(registry.tools) if isinstance(registry, ToolRegistry) else tuple(registry)


@dataclass(frozen=True)
class _Shape:
    """What a turn may hold, besides its format and tools (the arguments of `turn_grammar`)."""

    choice: str
    whitespace: str
    relax: tuple[str, ...]
    single_call: bool = False
    thought_chars: int | None = None


def _build(fmt: AgentFormat, tools, shape: _Shape, dialect, special, closed) -> str:
    shape = _checked(fmt, tools, shape)
    b = _Builder(dialect, special, closed=closed)
    avoid = tuple(m for k in fmt.kinds if not k.anchored for m in k.open)
    layouts = {"react": _react, "tool_calls": _tool_calls, "code_agent": _code, "call_list": _call_list}
    layouts[fmt.layout](b, fmt, tools, avoid, shape)
    return b.render()


def _checked(fmt: AgentFormat, tools, shape: _Shape) -> _Shape:
    """`shape` checked against the format and the tools, with the choice each layout really has."""
    choice = shape.choice
    if choice not in ("auto", "required", "none", "call"):
        raise ValueError(f"tool_choice must be 'auto', 'required', 'none' or 'call', not {choice!r}")
    if fmt.layout is None:
        raise FormatError(f"format {fmt.name!r} has no layout, so it has no turn grammar")
    if shape.single_call and (fmt.layout not in ("tool_calls", "call_list") or choice != "call"):
        raise FormatError(f"single_call needs the 'tool_calls' layout and tool_choice='call' (format "
                          f"{fmt.name!r} has layout {fmt.layout!r}, tool_choice={choice!r})")
    if shape.thought_chars is not None:
        if fmt.layout != "react" or choice not in ("required", "call"):
            raise FormatError(f"thought_chars needs the 'react' layout and a turn that must act "
                              f"(format {fmt.name!r} has layout {fmt.layout!r}, tool_choice={choice!r})")
        if isinstance(shape.thought_chars, bool) or not isinstance(shape.thought_chars, int) \
                or shape.thought_chars < 1:
            raise ValueError(f"thought_chars must be a positive int, not {shape.thought_chars!r}")
    if not tools:
        if shape.single_call:
            raise ToolRegistryError("no tools registered: a tool call grammar needs at least one tool")
        if choice in ("required", "call") and fmt.layout != "code_agent":
            raise ToolRegistryError("tool_choice='required' but no tools are registered (format "
                                    f"{fmt.name!r})")
        if fmt.layout != "code_agent":
            choice = "none"
    if choice == "call" and fmt.layout not in ("tool_calls", "call_list"):
        choice = "required"  # react / code turns have no call-only shape: require a call
    return _Shape(choice, shape.whitespace, shape.relax, shape.single_call, shape.thought_chars)


def _tool_calls(b, fmt, tools, avoid, shape: _Shape) -> None:
    kind = fmt.kind("tool_call")
    choice, whitespace, relax = shape.choice, shape.whitespace, shape.relax
    syntax = fmt.syntax
    nl = '"\\n"' if syntax.newlines == "required" else '"\\n"?'
    if shape.single_call:  # one call in the call markers and nothing else
        union = _call_union(b, tools, whitespace, relax, syntax)
        if fmt.call_syntax is None:  # the built-in format's single call, as it always was
            b.rule(b.start, f"{b.lit(kind.open[0])} ({union}) {b.lit(kind.close[0])}")
        else:
            b.rule(b.start, f"{b.lit(kind.open[0])} {nl} {union} {nl} {b.lit(kind.close[0])}")
        return
    text = b.text(avoid)
    if choice == "none":
        b.rule(b.start, f"{text}?")
        return
    union = _call_union(b, tools, whitespace, relax, syntax)
    block = b.name("call_block")
    b.rule(block, f'{nl} {union} {nl} {b.lit(kind.close[0])}')
    rest = f"{block} ({b.ws_then(kind.open[0])} {block})* {b.ws()}?"
    if choice == "call":  # the turn is tool calls from its first character
        b.rule(b.start, f"{b.lit(kind.open[0])} {rest}")
        return
    calls = f"{b.text_then(avoid, kind.open[0])} {rest}"
    b.rule(b.start, calls if choice == "required" else f"{text}? | {calls}")


def _call_list(b, fmt, tools, avoid, shape: _Shape) -> None:
    """One list of calls (Mistral's ``[TOOL_CALLS][…]``, Llama's ``{…}; {…}``, pythonic ``[f(), g()]``)
    after the syntax's lead marker, or from the turn's first character; the turn ends with the list."""
    kind, syntax, choice = fmt.kind("tool_call"), fmt.syntax, shape.choice
    anchored = tuple(m for k in fmt.kinds if k.anchored for m in k.open)
    text = b.text(avoid, not_first=anchored)
    if choice == "none":
        b.rule(b.start, f"{text}?")
        return
    union = _call_union(b, tools, shape.whitespace, shape.relax, syntax)
    calls_rule = b.name("call_list")
    b.rule(calls_rule, _list_body(b, syntax, union, single=shape.single_call))
    lead = ""
    if syntax.lead:
        lead = f"{b.lit(syntax.lead)}? " if syntax.lead_optional else f"{b.lit(syntax.lead)} "
    if choice == "call" or kind.anchored or not syntax.lead:  # the turn is the call list
        calls = f"{lead}{calls_rule}"
        b.rule(b.start, calls if choice in ("call", "required") else f"{text}? | {calls}")
        return
    calls = f"{b.text_then(avoid, syntax.lead)} {calls_rule}"  # text, then the lead marker
    b.rule(b.start, calls if choice == "required" else f"{text}? | {calls}")


def _list_body(b, syntax: CallSyntax, union: str, *, single: bool) -> str:
    """``list_open call (list_sep call)* list_close`` (one call only with `single`)."""
    more = "" if single else f" ({b.lit(syntax.list_sep)} {union})*"
    return " ".join(p for p in (b.lit(syntax.list_open) if syntax.list_open else "", f"{union}{more}",
                                b.lit(syntax.list_close) if syntax.list_close else "") if p)


def _react(b, fmt, tools, avoid, shape: _Shape) -> None:
    choice = shape.choice
    text = b.text(avoid)
    steps = []
    union = None
    if choice != "none":
        inp = fmt.kind("action_input").open[0]
        calls = []
        for i, tool in enumerate(tools):
            args = _args_rule(b, i, tool, shape.whitespace, shape.relax)
            call = b.name(f"react_call_{i}")
            b.rule(call, f'{b.lit(tool.name)} "\\n" {b.lit(inp)} " "? {args}')
            calls.append(call)
        union = b.name("react_call")
        b.rule(union, " | ".join(calls))
        steps.append(f'{b.text_then(avoid, fmt.kind("action").open[0])} " "? {union} "\\n"?')
    if choice != "required" and "final_answer" in fmt.kind_names and fmt.kind("final_answer").open:
        steps.append(f"{b.text_then(avoid, fmt.kind('final_answer').open[0])} {text}?")
    if not steps:
        raise FormatError(f"format {fmt.name!r}: tool_choice={choice!r} leaves no way to end the turn")
    thought = fmt.kind(fmt.initial)
    head = f"{b.lit(thought.open[0])}? " if thought.open else ""
    step = b.name("step")
    b.rule(step, " | ".join(steps))
    if shape.thought_chars is None:
        b.rule(b.start, f"{head}{step}")
        return
    # One line of thought, then the action: a free thought lets a small model talk to max_tokens
    # without ever acting. (The step rule above stays, unused, so that the rest of the text is the
    # same as the free turn's.)
    # The line is not also kept free of markers (`& ~/…/` as the free texts are): the product of a
    # {1,N} counter and the markers' automaton makes llguidance's lexer build a new expression per
    # (length, marker prefix), and validating a drafter's drafts at every step exceeds its default
    # limit within a few tokens ("lexer error: too many expressions constructed"; the matcher stays
    # in error and rejects every later draft of the turn). A marker inside the line is then thought text
    # to the grammar; the segmenter splits there as in any other text.
    action = b.lit(fmt.kind("action").open[0])
    b.rule(b.start, f'{b.lit(thought.open[0] + " ")} REACT_THOUGHT "\\n" {action} " "? {union} "\\n"?')
    b.tail.append(f"REACT_THOUGHT: /[^\\n]{{1,{shape.thought_chars}}}/\n")


def _code(b, fmt, tools, avoid, shape: _Shape) -> None:
    choice = shape.choice
    kind = fmt.kind("code")
    text = b.text(avoid)
    # the turn ends with the block (one optional newline): a model that would go on writing is not
    # left to fill max_tokens with whitespace
    blocks = [
        f'{b.text_then(avoid, op)} {b.text_then((cl,), cl)} "\\n"?'
        for op, cl in zip(kind.open, kind.close, strict=True)
    ]
    code = b.name("code_block")
    b.rule(code, " | ".join(blocks))
    b.rule(b.start, code if choice == "required" else f"{text}? | {code}")


def _call_union(b, tools, whitespace, relax, syntax: CallSyntax = DEFAULT_SYNTAX) -> str:
    calls = []
    comma, colon = (", ", ": ") if whitespace == "spaced" else (",", ":")
    for i, tool in enumerate(tools):
        call = b.name(f"call_{i}")
        if syntax.payload == "python_call":  # name(a=1, b="x"): the arguments rule holds the parentheses
            args = _args_rule(b, i, tool, whitespace, relax, python=True)
            b.rule(call, f"{b.lit(python_name(tool.name))} {args}")
        else:
            args = _args_rule(b, i, tool, whitespace, relax)
            head = ("{" + json.dumps(syntax.name_key) + colon + json.dumps(tool.name) + comma
                    + json.dumps(syntax.args_key) + colon)
            b.rule(call, f'{b.lit(head)} {args} "}}"')
        calls.append(call)
    union = b.name("tool_call")
    b.rule(union, " | ".join(calls))
    return union


def python_name(name: str) -> str:
    """A tool name as a Python call's function: an identifier (ASCII letter first, not a keyword), as
    vLLM's pythonic parser reads it (its pattern has no dotted or hyphenated names)."""
    if not _PY_NAME.fullmatch(name) or keyword.iskeyword(name):
        raise ToolRegistryError(f"tool {name!r}: a Python call needs a name matching {_PY_NAME.pattern} "
                                "that is not a Python keyword")
    return name


_PY_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def _args_rule(b, i: int, tool: Tool, whitespace: str, relax, *, python: bool = False) -> str:
    key = f"t{i}"
    if key in b.schemas:
        return b.schemas[key].root
    schema = close_objects(tool.parameters) if b.closed else tool.parameters
    params = json.dumps(schema)  # key order kept: it is the property order of the grammar
    try:
        rules = _schema_rules_cached(params, key, whitespace, tuple(sorted(relax)), python)
    except SchemaNotSupported as exc:
        base = str(exc).rsplit(" (at ", 1)[0]
        raise type(exc)(f"tool {tool.name!r} parameters: {base}", exc.pointer) from exc
    b.schemas[key] = rules
    return rules.root


def close_objects(schema):
    """Objects that list `properties` and say nothing of `additionalProperties` get it false.

    Tool arguments are closed records in practice (OpenAI strict mode, BFCL); closing them lets the
    grammar force every key and the closing brace, which is what drafting lives on.
    """
    if isinstance(schema, list):
        return [close_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(value, dict):
            out[key] = {k: close_objects(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "anyOf", "oneOf", "allOf", "prefixItems", "not"):
            out[key] = close_objects(value)
        else:
            out[key] = value
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


@lru_cache(maxsize=1024)
def _schema_rules_cached(params: str, prefix: str, whitespace: str, relax: tuple,
                         python: bool) -> SchemaRules:
    if python:  # a Python call's keyword arguments, values as Python literals
        return schema_rules(json.loads(params), prefix, whitespace=whitespace, relax=relax, literals="python",
                            root="kwargs")
    return schema_rules(json.loads(params), prefix, whitespace=whitespace, relax=relax)


# -- rendering ------------------------------------------------------------------------------------


class _Builder:
    """Collects rules for one dialect; free-text lexemes are rendered per dialect."""

    def __init__(self, dialect: Dialect, special: Sequence[str] = (), *, closed: bool = True):
        self.dialect = dialect
        self.closed = closed
        self.special = set(special)
        self.start = "root" if dialect == "gbnf" else "start"
        self.rules: list[tuple[str, str]] = []
        self.extra: list[str] = []
        self.tail: list[str] = []  # lines (each with its newline) after the schemas' rules
        self.schemas: dict[str, SchemaRules] = {}
        self._lexemes: dict[tuple, str] = {}
        self._automata: dict[tuple[str, ...], str] = {}
        self._heads: dict[tuple, str] = {}

    def name(self, base: str) -> str:
        return f"turn_{base}"

    def rule(self, name: str, body: str) -> None:
        self.rules.append((name, body))

    def lit(self, text: str) -> str:
        if text in self.special and self.dialect == "llguidance":
            return text  # llguidance special-token syntax
        return json.dumps(text, ensure_ascii=False)

    def _lexeme(self, key: tuple, lark_regex: str, ll_expr: str, gbnf_body: str) -> str:
        name = self._lexemes.get(key)
        if name is None:
            n = len(self._lexemes)
            if self.dialect == "gbnf":
                name = f"turn_text_{n}"
                self.extra.append(f"{name} ::= {gbnf_body}")
            else:
                name = f"TURN_TEXT_{n}"
                body = ll_expr if self.dialect == "llguidance" else f"/{lark_regex}/"
                self.extra.append(f"{name}: {body}")
            self._lexemes[key] = name
        return name

    def text(self, avoid: Sequence[str], not_first: Sequence[str] = ()) -> str:
        """Non-empty text without any of `avoid` (use it with `?`); with `not_first`, text that does not
        start with one of those (an anchored kind's markers, live at the turn's first character only)."""
        avoid = self._plain(avoid)
        alts = _alts(avoid)
        first = tuple(sorted(set(not_first)))
        ll = self._marker_free(avoid, not_first=first) if avoid or first else "/(?s:.+)/"
        if not first:
            return self._lexeme(
                ("text", avoid),
                f"(?:(?!{alts})[\\s\\S])+" if avoid else "[\\s\\S]+",
                ll,
                self._automaton(avoid, nonempty=True),
            )
        heads = _alts(first)
        gbnf = ""
        if self.dialect == "gbnf":
            self._automaton(avoid, nonempty=True)  # the state rules the anchored start falls into
            gbnf = self._anchored_start(avoid, first)
        return self._lexeme(
            ("text", avoid, first),
            f"(?!{heads})(?:(?!{alts})[\\s\\S])+" if avoid else f"(?!{heads})[\\s\\S]+",
            ll,
            gbnf,
        )

    def text_then(self, avoid: Sequence[str], marker: str) -> str:
        """Text without any of `avoid` (maybe empty), then `marker`: one lexeme."""
        if marker in self.special and self.dialect == "llguidance":
            return f"{self.text(avoid)}? {marker}"
        avoid = self._plain(avoid)
        alts = _alts(avoid)
        m = to_regex(Lit(marker))
        pieces = then_pieces(avoid, marker) if self.dialect == "llguidance" and avoid else None
        if pieces is not None:  # ReAct's markers: the text as pieces that each end at a `:`
            return self._pieces(("then", avoid, marker), *pieces)
        return self._lexeme(
            ("then", avoid, marker),
            f"(?:(?!{alts})[\\s\\S])*{m}" if avoid else f"[\\s\\S]*?{m}",
            self._marker_free(avoid, then=marker) if avoid else f"/(?s:.*){m}/",
            f"{self._automaton(avoid, nonempty=False)} {self.lit(marker)}",
        )

    def _pieces(self, key: tuple, piece: str | None, final: str) -> str:
        """llguidance: a rule ``PIECE* FINAL`` over two lexemes (`marker_free.then_pieces`)."""
        name = self._lexemes.get(key)
        if name is None:
            body = self._lexeme(key + ("final",), "", f"/{final}/", "")
            if piece is not None:  # one piece lexeme per marker set, whichever marker ends the text
                body = f"{self._lexeme(('piece', key[1]), '', f'/{piece}/', '')}* {body}"
            name = self.name(f"pieces_{len(self._lexemes)}")
            self.rule(name, body)
            self._lexemes[key] = name
        return name

    def _marker_free(self, avoid: tuple[str, ...], *, then: str | None = None,
                     not_first: tuple[str, ...] = ()) -> str:
        """llguidance's lexeme of marker-free text: one plain regex from the markers' automaton
        (`structure.marker_free`), not `&`/`~` (the same language; masks in it cost 5 µs, not 0.29
        ms, with the token slices vLLM's engine gets from `backends.inside_vllm.vllm_grammar`)."""
        if self.dialect != "llguidance":
            return ""
        return "/" + marker_free_regex(avoid, then=then, not_first=not_first) + "/"

    def ws_then(self, marker: str) -> str:
        if marker in self.special and self.dialect == "llguidance":
            return f"{self.ws()}? {marker}"
        m = to_regex(Lit(marker))
        return self._lexeme(("ws_then", marker), f"[ \\t\\n]*{m}", f"/[ \\t\\n]*{m}/",
                            f"[ \\t\\n]* {self.lit(marker)}")

    def ws(self) -> str:
        return self._lexeme(("ws",), "[ \\t\\n]+", "/[ \\t\\n]+/", "[ \\t\\n]+")

    def _plain(self, avoid: Sequence[str]) -> tuple[str, ...]:
        return tuple(sorted({m for m in avoid if not (m in self.special and self.dialect == "llguidance")}))

    def _automaton(self, avoid: tuple[str, ...], *, nonempty: bool) -> str:
        """GBNF only: rules for text avoiding `avoid`; returns the start rule's name."""
        if self.dialect != "gbnf":
            return ""
        base = self._automata.get(avoid)
        if base is None:  # one set of state rules per marker set, with a nullable and a non-empty start
            base = self._automata[avoid] = f"turn_safe_{len(self._automata)}"
            self.extra.extend(_safe_text_gbnf(avoid, base))
        return f"{base}_plus" if nonempty else f"{base}_star"

    def _anchored_start(self, avoid: tuple[str, ...], first: tuple[str, ...]) -> str:
        """GBNF only: the start rule of non-empty text avoiding `avoid` that does not begin with one of
        `first`; it reads a prefix of those markers, then falls into the `avoid` automaton's state."""
        base = self._automata[avoid]
        name = f"{base}_head{len(self._heads)}"
        self._heads[(avoid, first)] = name
        self.extra.extend(_anchored_gbnf(avoid, first, base, name))
        return name

    def render(self) -> str:
        sep = " ::= " if self.dialect == "gbnf" else ": "
        lines = [f"{name}{sep}{body}" for name, body in self.rules]
        # the start rule first (xgrammar wants `root` first by convention, lark does not care)
        start = [ln for ln in lines if ln.startswith(self.start + sep)]
        lines = start + [ln for ln in lines if not ln.startswith(self.start + sep)] + self.extra
        out = "\n".join(lines) + "\n"
        for rules in self.schemas.values():
            out += rules.gbnf if self.dialect == "gbnf" else rules.lark
        return out + "".join(self.tail)


def _alts(avoid: Sequence[str]) -> str:
    return "|".join(to_regex(Lit(m)) for m in sorted(avoid, key=lambda s: (-len(s), s)))


def _safe_text_gbnf(avoid: tuple[str, ...], base: str) -> list[str]:
    """Right-linear rules of the automaton that reads text and dies on any marker of `avoid`.

    `{base}_star` derives every text without a marker (the empty text too), `{base}_plus` the
    non-empty ones. States are the proper prefixes of the markers (Aho-Corasick without output).
    """
    if not avoid:
        raise ValueError("free text without markers to avoid has no automaton")
    prefixes = sorted({m[:i] for m in avoid for i in range(len(m))}, key=lambda s: (len(s), s))
    pset = set(prefixes)
    alphabet = sorted({c for m in avoid for c in m})
    state = {p: f"{base}_{i}" for i, p in enumerate(prefixes)}
    state[""] = f"{base}_star"

    def step(q: str, c: str) -> str | None:
        s = q + c
        if any(s.endswith(m) for m in avoid):
            return None
        return next(s[k:] for k in range(len(s) + 1) if s[k:] in pset)

    def edges(q: str) -> list[str]:
        by_target: dict[str, list[str]] = {}
        not_root = []
        for c in alphabet:
            t = step(q, c)
            if t != "":
                not_root.append(c)
            if t not in (None, ""):
                by_target.setdefault(t, []).append(c)
        out = [f"[^{_gbnf_class(not_root)}] {state['']}"]
        out += [f"[{_gbnf_class(cs)}] {state[t]}" for t, cs in sorted(by_target.items())]
        return out

    empty = '""'
    lines = [f"{state[q]} ::= {' | '.join([empty, *edges(q)])}" for q in prefixes]
    lines.append(f"{base}_plus ::= {' | '.join(edges(''))}")
    return lines


_OUTSIDE = "\x00"  # stands for a character in no marker (NUL is in none of ours)


def _anchored_gbnf(avoid: tuple[str, ...], first: tuple[str, ...], base: str, name: str) -> list[str]:
    """Rules for non-empty text that contains none of `avoid` and does not start with one of `first`.

    States are the prefixes of `first` read so far (`name` is the empty one, which may not end); a
    character that leaves them lands in the state of `_safe_text_gbnf`'s automaton (rules `base_*`)
    that the text read so far leads to."""
    heads = sorted({m[:i] for m in first for i in range(len(m))}, key=lambda s: (len(s), s))
    hset = set(heads)
    pset = {m[:i] for m in avoid for i in range(len(m))}
    state = {h: (name if h == "" else f"{name}_{i}") for i, h in enumerate(heads)}
    alphabet = sorted({c for m in (*avoid, *first) for c in m})

    def safe_state(text: str) -> str | None:  # the avoid automaton after reading `text` from its start
        q = ""
        for c in text:
            s = q + c
            if any(s.endswith(m) for m in avoid):
                return None
            q = next(s[k:] for k in range(len(s) + 1) if s[k:] in pset)
        return f"{base}_star" if q == "" else f"{base}_{sorted(pset, key=lambda s: (len(s), s)).index(q)}"

    lines = []
    for h in heads:
        by_target: dict[str, list[str]] = {}
        for c in alphabet:
            s = h + c
            if s in first:
                continue  # the text would start with an anchored marker
            target = safe_state(s)  # None: `s` already holds a marker to avoid
            if target is not None and s in hset:
                target = state[s]
            if target is not None:
                by_target.setdefault(target, []).append(c)
        rest = safe_state(h + _OUTSIDE)  # any character outside the alphabet
        edges = [f"[^{_gbnf_class(alphabet)}] {rest}"] if rest is not None else []
        edges += [f"[{_gbnf_class(cs)}] {t}" for t, cs in sorted(by_target.items())]
        if h:
            edges.insert(0, '""')  # a text may end inside a marker's prefix (it is no marker)
        lines.append(f"{state[h]} ::= {' | '.join(edges)}")
    return lines


def _gbnf_class(chars: Iterable[str]) -> str:
    out = []
    for c in chars:
        if c in "\\]^-[":
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(c)
    return "".join(out)
