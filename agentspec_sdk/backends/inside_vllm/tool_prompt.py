"""The chat template for plain OpenAI clients of `agentspec serve` (no vLLM import here).

`chat_template(fmt, base)` is a Jinja prelude over the model's own template `base`: for a request with
`tools` it rewrites the messages as `backends.prompts.chat_messages` writes them for our own client
(the format's instructions and the tools in the system prompt, an assistant's earlier `tool_calls`
written in the format as the turn grammar writes them, tool results wrapped by `fmt.env_wrap`), then
clears `tools` so that the model's template does not render them again. Without tools the prompt is
the model's template alone. Where the model's template renders tools itself for `fmt`
(`chat_template.ChatTemplate.renders_tools`, the decision the engine's prompts use too) the template is
the model's own, unchanged: vLLM then renders tools and results with it as for any client.
`agentspec serve` writes it with `write_chat_template` and passes it as `--chat-template`.

A wrapper starts with a Jinja comment (`WRAPPER_MARK` and JSON: the format it writes, and whether the
model's own template renders tools and which format it writes): it renders nothing, and it lets a
client that reads the served template (`RemoteEngine`, from /tokenizer_info) make the embedded
engine's decision although the served template is not the model's own.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from agentspec_sdk.backends.chat_template import ChatTemplate
from agentspec_sdk.errors import AgentSpecError
from agentspec_sdk.structure.formats import AgentFormat, get_format

log = logging.getLogger("agentspec.backends")
# the layouts whose turns carry tool calls an OpenAI client reads
LAYOUTS = ("tool_calls", "react", "call_list")
WRAPPER_MARK = "{# agentspec-wrapper "


def chat_template(fmt: AgentFormat | str, base: str, model: ChatTemplate | None = None) -> str:
    """Jinja: for a request with tools, messages rewritten as `prompts.chat_messages` writes them, then
    the model's own template `base` (with `tools` cleared); without tools, `base` alone. `base` itself
    where it renders tools for `fmt` (`model`: the tokenizer's template with its special tokens, which
    the decision reads beside `base`)."""
    tokens = (model.special_tokens, model.tokens) if model is not None else ({}, ())
    own = ChatTemplate(base, *tokens)
    if own.renders_tools(fmt):
        return base
    fmt = get_format(fmt)
    if fmt.layout not in LAYOUTS:
        raise AgentSpecError(f"format {fmt.name!r} has no tool-call layout ({' or '.join(LAYOUTS)})")
    how = fmt.instructions or fmt.description or f"Write your turn in the {fmt.name} format."
    before, _, after = fmt.env_wrap.partition("{}")
    sep, opening, closing = "\n", "", ""
    syntax = fmt.syntax
    if fmt.layout == "react":
        act, inp = fmt.kind("action").open[0], fmt.kind("action_input").open[0]
        call = f"{_lit(act + ' ')} ~ tc.function.name ~ {_lit(chr(10) + inp + ' ')} ~ ns.args"
    else:  # the call as the turn grammar writes it
        call = _call_expr(syntax)
        if fmt.layout == "tool_calls":
            kind = fmt.kind("tool_call")
            nl = "\n" if syntax.newlines == "required" else ""
            call = f"{_lit(kind.open[0] + nl)} ~ {call} ~ {_lit(nl + kind.close[0])}"
        else:
            sep, opening, closing = syntax.list_sep, syntax.lead + syntax.list_open, syntax.list_close
    prelude = (_PRELUDE.replace("@SYSTEM@", _lit(how + "\n\nTools (JSON):")).replace("@BEFORE@", _lit(before))
               .replace("@AFTER@", _lit(after)).replace("@CALL@", call).replace("@SEP@", _lit(sep))
               .replace("@OPEN@", _lit(opening)).replace("@CLOSE@", _lit(closing))
               .replace("@JSON@", _lit(", ") if syntax.whitespace == "spaced" else _lit(","))
               .replace("@COLON@", _lit(": ") if syntax.whitespace == "spaced" else _lit(":")))
    mark = json.dumps({"format": fmt.name, "model_tools": own.tools, "model_native": own.native},
                      separators=(",", ":"))
    return WRAPPER_MARK + mark + " #}" + prelude + base


def wrapper_info(template: str | None) -> dict | None:
    """The JSON a wrapper starts with (`WRAPPER_MARK`); None for any other template."""
    if not template or not template.startswith(WRAPPER_MARK):
        return None
    head = template[len(WRAPPER_MARK):template.index(" #}")]
    return json.loads(head)


def _call_expr(syntax) -> str:
    """Jinja for one call `tc` in the call syntax (`ns.args`: its arguments, JSON text; `ns.kwargs`:
    them as keyword arguments, values as Python literals at every depth, as `write_calls` writes them)."""
    if syntax.payload == "python_call":
        return "tc.function.name ~ '(' ~ ns.kwargs ~ ')'"
    comma, colon = (", ", ": ") if syntax.whitespace == "spaced" else (",", ":")
    head = _lit("{" + json.dumps(syntax.name_key) + colon)
    mid = _lit(comma + json.dumps(syntax.args_key) + colon)
    return f"{head} ~ (tc.function.name | tojson) ~ {mid} ~ ns.args ~ '}}'"


# A value as a Python literal, nested ones too (`{"on": True}`, not JSON's `{"on": true}`): what
# `call_syntax.write_calls` writes and the turn grammar allows.
_PY_LITERAL = """{%- macro agentspec_py(v) -%}
{%- if v is none -%}None
{%- elif v is sameas true -%}True
{%- elif v is sameas false -%}False
{%- elif v is mapping -%}{{ '{' }}{%- for k, x in v.items() -%}{{ @JSON@ if not loop.first else '' }}
{{- k | tojson }}{{ @COLON@ }}{{ agentspec_py(x) }}{%- endfor -%}{{ '}' }}
{%- elif v is string -%}{{ v | tojson }}
{%- elif v is iterable -%}{{ '[' }}{%- for x in v -%}{{ @JSON@ if not loop.first else '' }}
{{- agentspec_py(x) }}{%- endfor -%}{{ ']' }}
{%- else -%}{{ v | tojson }}
{%- endif -%}
{%- endmacro -%}
"""

_PRELUDE = _PY_LITERAL + """{%- if tools %}
{%- set ns = namespace(msgs=[], system=@SYSTEM@, text='', args=none, kwargs='', calls=[]) %}
{%- for t in tools %}{%- set f = t.function if t.function is defined else t %}
{%- set ns.system = ns.system ~ '\\n' ~ ({'name': f.name, 'description': f.description or '',
                                   'parameters': f.parameters or {}} | tojson(separators=(',', ':'))) %}
{%- endfor %}
{%- for m in messages %}
{%- if m.role == 'system' %}{%- set ns.system = (m.content or '') ~ '\\n\\n' ~ ns.system %}
{%- elif m.role == 'tool' %}
{%- set ns.msgs = ns.msgs + [{'role': 'user', 'content': @BEFORE@ ~ (m.content or '') ~ @AFTER@}] %}
{%- elif m.role == 'assistant' and m.tool_calls %}
{%- set ns.text = m.content or '' %}
{%- set ns.calls = [] %}
{%- for tc in m.tool_calls %}
{%- set ns.args = tc.function.arguments %}
{%- set ns.kwargs = ns.args if ns.args is string else '' %}
{%- if ns.args is mapping %}{%- for k, v in ns.args.items() %}
{%- set ns.kwargs = ns.kwargs ~ (@JSON@ if loop.index > 1 else '') ~ k ~ '=' ~ agentspec_py(v) %}
{%- endfor %}{%- endif %}
{%- if ns.args is not string %}{%- set ns.args = ns.args | tojson(separators=(@JSON@, @COLON@)) %}{%- endif %}
{%- set ns.calls = ns.calls + [@CALL@] %}
{%- endfor %}
{%- set ns.text = ns.text ~ ('\\n' if ns.text else '') ~ @OPEN@ ~ (ns.calls | join(@SEP@)) ~ @CLOSE@ %}
{%- set ns.msgs = ns.msgs + [{'role': 'assistant', 'content': ns.text}] %}
{%- else %}{%- set ns.msgs = ns.msgs + [{'role': m.role, 'content': m.content or ''}] %}
{%- endif %}
{%- endfor %}
{%- set messages = [{'role': 'system', 'content': ns.system}] + ns.msgs %}
{%- set tools = none %}
{%- endif -%}
"""


def _lit(text: str) -> str:
    """A Jinja string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def model_chat_template(model: str | os.PathLike) -> str | None:
    """The model's own chat template: `chat_template.jinja` or `tokenizer_config.json` of a local
    folder, else the tokenizer's (transformers); None when it has none."""
    folder = Path(model)
    if folder.is_dir():
        if (folder / "chat_template.jinja").is_file():
            return (folder / "chat_template.jinja").read_text(encoding="utf-8")
        try:
            template = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get(
                "chat_template")
        except (OSError, ValueError):
            template = None
    else:
        from transformers import AutoTokenizer

        template = AutoTokenizer.from_pretrained(str(model)).chat_template
    if isinstance(template, list):  # named templates
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template or None


def write_chat_template(model: str | os.PathLike, fmt: AgentFormat | str,
                        path: str | os.PathLike, template: ChatTemplate | None = None) -> Path | None:
    """Write the template for `model`; None (logged) when the model has no template to wrap."""
    base = model_chat_template(model)
    if base is None:
        log.warning("model %s has no chat template: plain clients' tools are not put in the prompt", model)
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(chat_template(fmt, base, template), encoding="utf-8")
    return path
