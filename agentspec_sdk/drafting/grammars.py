"""The plan's tool grammars and the prototype matchers forking a row's tool-call matcher.

`CallGrammars` is built per plan from its tool registry: which grammar forces text in a segment (a
JSON tool call between markers, a call list, ReAct's ``Action:`` name or ``Action Input:``
arguments) and one prototype `CallMatcher` per grammar, forked for each segment that needs one.
The grammars come from `structure.turn_grammar`, imported when a plan first has tools (the
proposer's import stays light).
"""

from __future__ import annotations

from agentspec_sdk.drafting.forced import ArgsMatcher, CallMatcher, ListMatcher, name_grammar
from agentspec_sdk.drafting.rows import RowState


def call_grammar(registry, syntax=None, *, listed: bool = False) -> str:
    """`structure.turn_grammar.tool_call_grammar` of the registry's tools in a call syntax (None: the
    compact object of `tool_calls`); `listed`: the whole call list of a ``call_list`` layout."""
    from agentspec_sdk.structure.turn_grammar import tool_call_grammar

    return tool_call_grammar(registry, syntax=syntax, listed=listed)


def open_of(kind, seg_text: str) -> str | None:
    """The open marker of `kind` the segment's text begins with, or None."""
    for marker in kind.open:
        if seg_text.startswith(marker):
            return marker
    return None


def close_of(kind, seg_text: str) -> str:
    """The close marker matching the segment's open marker ("" for a kind without one)."""
    if not kind.close:
        return ""
    for marker, close in zip(kind.open, kind.close, strict=True):
        if seg_text.startswith(marker):
            return close
    return kind.close[0]


class CallGrammars:
    """A plan's tool grammars (`registry`: its non-empty `ToolRegistry`) and their prototype
    matchers. Raises `AgentSpecError` for a schema the grammars do not support."""

    def __init__(self, registry, ll, memo_tokenizer):
        self.registry = registry
        self.ll, self.memo_tokenizer = ll, memo_tokenizer
        self.call_grammar = call_grammar(registry)
        self.protos: dict[tuple, CallMatcher] = {}  # one prototype matcher per grammar

    def matcher_for(self, st: RowState, kind, seg_text: str) -> CallMatcher | None:
        """Which grammar forces text in this segment kind: a JSON tool call between markers (the
        union over tools), ReAct's ``Action:`` (a tool name), ReAct's ``Action Input:`` (the arguments
        of the tool named in the preceding action)."""
        proto = self._call_prototype(st.fmt, kind, seg_text)
        if proto is not None:
            return proto.fork()
        if kind.name == "action" and not kind.delimited:
            key = ("names",)
            if key not in self.protos:
                self.protos[key] = CallMatcher(self.ll, name_grammar(self.registry.names),
                                               text=self.memo_tokenizer)
        elif kind.name == "action_input":
            name = self._named_tool(st)
            if name is None:
                return None
            key = ("args", name)
            if key not in self.protos:
                grammar = call_grammar([self.registry.get(name)])
                self.protos[key] = ArgsMatcher(self.ll, grammar, name, text=self.memo_tokenizer)
        else:
            return None
        return self.protos[key].fork()

    def _named_tool(self, st: RowState) -> str | None:
        turn = st.text.slice(st.turn_char)
        for span in reversed(st.seg.spans):
            if span.kind == "action":
                text = turn[span.start:span.end]
                marker = open_of(st.fmt.kind("action"), text) or ""
                name = text[len(marker):].strip()
                return name if name in self.registry else None
        return None

    def _call_prototype(self, fmt, kind, seg_text: str) -> CallMatcher | None:
        """The prototype matcher of a tool-call segment, or None for another kind: the format's call
        syntax decides the grammar (one call in its markers, or the whole call list of a
        ``call_list`` layout), never the format's name."""
        protos, syntax = self.protos, fmt.call_syntax  # None: the compact object of `tool_calls`
        if syntax is not None and kind.name == "tool_call" and fmt.layout == "call_list":
            opener = open_of(kind, seg_text) or ""
            prefix = "" if opener == syntax.lead else opener  # `{` / `[`: the list's own first text
            key = ("list", prefix, syntax)
            if key not in protos:
                grammar = call_grammar(self.registry, syntax, listed=True)
                protos[key] = ListMatcher(self.ll, grammar, prefix, text=self.memo_tokenizer)
            return protos[key]
        if (kind.content == "json" and kind.delimited) or (syntax is not None and kind.name == "tool_call"):
            close = close_of(kind, seg_text)
            key = ("call", close, syntax)
            if key not in protos:
                grammar = self.call_grammar if syntax is None else call_grammar(self.registry, syntax)
                # Hermes' and Gemma's blocks end with a newline before the close marker
                newline = "\n" if syntax is not None and syntax.newlines == "required" else ""
                protos[key] = CallMatcher(self.ll, grammar, newline + close, text=self.memo_tokenizer)
            return protos[key]
        return None
