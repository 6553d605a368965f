"""The model's chat template and what it renders: the one place that decides whether a turn's tools
and tool results go through the model's own template (as vLLM's chat endpoint renders them) or through
our format's instructions.

`supports_tools(template)` renders a probe conversation (transformers' renderer, the one
`apply_chat_template` uses): a template supports tools when the probe tool's description (only
reachable through `tools=`), an assistant's `tool_calls` argument and a `tool` message's content all
appear in the text. A template that ignores any of them, or raises on one (Gemma's raises on a `tool`
role), does not. `ChatTemplate.renders_tools(fmt)` adds the second half of the decision: the format
must be the one the template itself writes (`auto_format`: `structure.format_detect`), since
a template that teaches the model one call syntax while the turn grammar enforces another would set the
prompt against the grammar. No vLLM import here: `tool_prompt` (the template `agentspec serve` hands to
vLLM for plain OpenAI clients) reads the same decision.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cached_property
from typing import Any

from agentspec_sdk.structure.formats import AgentFormat, get_format

AUTO = "auto"  # fmt="auto": the format the model's template writes (`auto_format`)
_PROBE_TOOL = {"type": "function", "function": {
    "name": "agentspec_probe", "description": "agentspec-probe-description",
    "parameters": {"type": "object", "properties": {"probe": {"type": "string", "description": "probe"}},
                   "required": ["probe"]}}}
_PROBE_MESSAGES = [
    {"role": "user", "content": "probe"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "probe0001", "type": "function",
         "function": {"name": "agentspec_probe", "arguments": {"probe": "agentspec-probe-argument"}}}]},
    {"role": "tool", "tool_call_id": "probe0001", "name": "agentspec_probe",
     "content": "agentspec-probe-result"},
]
_PROBE_TEXTS = ("agentspec-probe-description", "agentspec-probe-argument", "agentspec-probe-result")


def render(template: str, messages: list[dict], tools: list[dict] | None, special_tokens: dict[str, str],
           *, add_generation_prompt: bool = True) -> str:
    """`template` rendered by transformers' chat-template renderer with the tokenizer's special tokens
    as variables, as `tokenizer.apply_chat_template(..., tokenize=False)` renders it."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                        add_generation_prompt=add_generation_prompt, **special_tokens)
    return rendered[0]


def supports_tools(template: str | None, special_tokens: dict[str, str] | None = None) -> bool:
    """Whether `template` renders `tools=`, an assistant's `tool_calls` and `tool` results (the probe)."""
    if not template:
        return False
    try:
        text = render(template, [dict(m) for m in _PROBE_MESSAGES], [_PROBE_TOOL], special_tokens or {})
    except Exception:  # a template that raises on tools, tool calls or the tool role has no support for them
        return False
    return all(t in text for t in _PROBE_TEXTS)


def auto_format(template: str | None, tokens: Iterable[str]) -> str:
    """The agent format the model's template writes (`tool_calls` when it declares no tool syntax):
    `structure.format_detect.detect_format` over the template and the tokenizer's special and added
    tokens."""
    from agentspec_sdk.structure.format_detect import detect_format

    return detect_format(template, list(tokens))


def special_tokens_of(tokenizer: Any) -> dict[str, str]:
    """The tokenizer's named special tokens (bos_token, eos_token, ...): the template's variables."""
    named = getattr(tokenizer, "special_tokens_map", None) or {}
    return {k: v for k, v in named.items() if isinstance(v, str)}


def tokens_of(tokenizer: Any) -> tuple[str, ...]:
    """The tokenizer's special and added tokens (where a model declares markers such as `<tool_call>`)."""
    special = list(getattr(tokenizer, "all_special_tokens", None) or [])
    added = list(tokenizer.get_added_vocab()) if hasattr(tokenizer, "get_added_vocab") else []
    return tuple(dict.fromkeys(t for t in special + added if isinstance(t, str)))


class ChatTemplate:
    """A model's chat template with its special tokens: whether it renders tools and which format it
    writes, each worked out once (the engine asks on every turn)."""

    def __init__(self, text: str | None, special_tokens: dict[str, str] | None = None,
                 tokens: Iterable[str] = ()):
        """`special_tokens`: the named ones (the template's variables); `tokens`: every special and
        added token (format detection reads them; the named ones count too)."""
        self.text = text or None
        self.special_tokens = dict(special_tokens or {})
        self.tokens = tuple(dict.fromkeys([*tokens, *self.special_tokens.values()]))

    @classmethod
    def of(cls, tokenizer: Any) -> ChatTemplate:
        template = getattr(tokenizer, "chat_template", None)
        if isinstance(template, dict):  # named templates
            template = template.get("default")
        return cls(template, special_tokens_of(tokenizer), tokens_of(tokenizer))

    @cached_property
    def tools(self) -> bool:
        return supports_tools(self.text, self.special_tokens)

    @cached_property
    def native(self) -> str:
        """The format this template writes (`auto_format`)."""
        return auto_format(self.text, self.tokens)

    def resolve(self, fmt: AgentFormat | str) -> AgentFormat:
        """`fmt`, with "auto" replaced by the template's own format (a format object as it is)."""
        if isinstance(fmt, AgentFormat):
            return fmt
        return get_format(self.native if fmt == AUTO else fmt)

    def renders_tools(self, fmt: AgentFormat | str) -> bool:
        """The decision: the model's template renders this turn's tools, tool calls and results when
        it supports them and `fmt` is the format it writes; otherwise our format's instructions do."""
        name = fmt if isinstance(fmt, str) else fmt.name
        return self.tools and (name == AUTO or name == self.native)
