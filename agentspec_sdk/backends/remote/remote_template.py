"""The server's chat template as `RemoteEngine` sees it, and the embedded engine's prompt decision made
from it (`chat_template.ChatTemplate.renders_tools`).

`agentspec serve` starts vLLM with `--enable-tokenizer-info-endpoint`; GET /tokenizer_info returns the
served chat template and the tokenizer's init arguments (named special tokens, added tokens). The
served template is the model's own where it renders tools for the server's `--tool-format` (then the
decision is made on its text, as the embedded engine makes it on the tokenizer's), or our wrapper
(`tool_prompt.chat_template`), whose leading comment says whether the model's own template renders
tools and which format it writes (`tool_prompt.wrapper_info`).

Where the template renders tools for the turn's format, the turn is sent as OpenAI messages with
`tools=` (and `tool_choice="none"`: the text comes back raw, our grammar decides the calls) for vLLM
to render through the model's template, as for any client; otherwise as today, our instructions in
the messages (`prompts.chat_messages`) and no `tools=`. See docs/deployment.md.
"""

from __future__ import annotations

import json
from typing import Any

from agentspec_sdk.backends.chat_template import AUTO, ChatTemplate
from agentspec_sdk.backends.inside_vllm.tool_prompt import wrapper_info
from agentspec_sdk.backends.prompts import chat_messages, template_messages
from agentspec_sdk.errors import BackendError, MalformedResponse
from agentspec_sdk.structure.formats import AgentFormat, get_format
from agentspec_sdk.structure.tools import ToolRegistry

_NAMED = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class ServedTemplate:
    """The decision for one server, from its /tokenizer_info answer (`info`; None: the server does not
    publish it, e.g. vLLM started without `--enable-tokenizer-info-endpoint`)."""

    def __init__(self, info: dict | None, root: str = "the server"):
        self.root = root
        self.published = isinstance(info, dict)
        info = info if isinstance(info, dict) else {}
        text = info.get("chat_template") if isinstance(info.get("chat_template"), str) else None
        self.wrapper = wrapper_info(text)
        special = {k: v for k, v in info.items() if k in _NAMED and isinstance(v, str)}
        added = info.get("added_tokens_decoder") or {}
        extra = info.get("additional_special_tokens") or []
        added = list(added.values()) if isinstance(added, dict) else []
        tokens = [t for t in [*added, *extra] if isinstance(t, str)]
        self.template = ChatTemplate(None if self.wrapper else text, special, tokens)

    @property
    def native(self) -> str:
        """The format the model's own template writes."""
        return self.wrapper["model_native"] if self.wrapper else self.template.native

    def _model_tools(self) -> bool:
        return bool(self.wrapper["model_tools"]) if self.wrapper else self.template.tools

    def resolve(self, fmt: AgentFormat | str) -> AgentFormat:
        """`fmt`, with "auto" replaced by the model's own format (as `ChatTemplate.resolve`)."""
        if fmt == AUTO and not self.published:
            raise BackendError(f"fmt='auto' (TurnRequest's default) needs the model's chat template, which "
                               f"{self.root} does not publish (GET /tokenizer_info): start it with "
                               "`agentspec serve`, or vLLM with --enable-tokenizer-info-endpoint, or name "
                               "the format (fmt='tool_calls': our own syntax)")
        return get_format(self.native if fmt == AUTO else fmt)

    def renders_tools(self, fmt: AgentFormat) -> bool:
        """The embedded engine's decision for `fmt` (resolved). A wrapped template cannot render the
        model's tools: where the model's own would, that is an error naming the fix, not another prompt."""
        if not self.published or not (self._model_tools() and fmt.name == self.native):
            return False
        if self.wrapper:
            raise BackendError(f"the model's chat template renders tools in format {fmt.name!r}, but "
                               f"{self.root} wraps it for --tool-format {self.wrapper['format']!r}: restart "
                               f"it with --tool-format {fmt.name} (or auto) so that prompts match the "
                               "embedded engine's")
        return True

    def chat_arguments(self, messages: list[dict], fmt: AgentFormat,
                       registry: ToolRegistry) -> dict[str, Any]:
        """`messages` (and `tools`, `tool_choice`) of the chat request for this turn."""
        if not self.renders_tools(fmt):
            return {"messages": chat_messages(messages, fmt, registry)}
        out: dict[str, Any] = {"messages": [_openai_message(m) for m in template_messages(messages, fmt)]}
        if registry.openai_tools():
            # "none": vLLM renders the tools but neither parses the text nor adds its own grammar
            out.update(tools=registry.openai_tools(), tool_choice="none")
        return out


def fetch_served(transport: Any, request_id: str) -> ServedTemplate:
    """GET /tokenizer_info of `transport.root` (`remote_transport.Transport`), retried as the turn
    `request_id` is and not counted among its attempts; a server that does not answer it (HTTP 404)
    publishes nothing."""
    resp = transport.lookup(transport.root + "/tokenizer_info", request_id)
    info = None
    if resp.status_code == 200:
        try:
            info = resp.json()
        except ValueError:
            raise MalformedResponse("malformed response: /tokenizer_info is not JSON") from None
    return ServedTemplate(info, transport.root)


def _openai_message(m: dict) -> dict:
    """A `template_messages` message as the OpenAI API carries it: call arguments as JSON text (vLLM
    turns them back into the same objects before its template sees them)."""
    if not m.get("tool_calls"):
        return m
    calls = [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
             for c in m["tool_calls"]]
    return {**m, "tool_calls": calls}
