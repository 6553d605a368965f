"""Which native tool-call format a model declares: read from its chat template and special tokens.

`detect_format(chat_template, special_tokens)` is pure (no tokenizer or file access: the caller
passes the template text and the tokenizer's special/added tokens) and returns a built-in format
name (`formats.NATIVE_FORMATS`), or ``tool_calls`` when the model declares none. The cues, in order
(the first that matches wins; an earlier cue is the more specific one):

1. ``[TOOL_CALLS]`` (token or template) → ``mistral``;
2. a template that asks for a Python list of calls (``[func_name1(params_name1=…), …]``, "python list")
   → ``pythonic`` (Llama 3.2/4 pythonic templates, and Gemma 3's pythonic one, which also writes
   ``<tool_response>``, so this comes before the Hermes cue);
3. ``tool_code`` in the template → ``gemma_tool_code``;
4. ``<tool_call>`` (token or template) → ``hermes``;
5. ``<|python_tag|>`` (token or template), or a template that asks for ``{"name": …, "parameters": …}``
   → ``llama3_json`` (Llama 3.1/3.2 JSON; their tokenizers also hold ``<|python_tag|>``, which is why
   the pythonic cue is read first).

`prompt_format(prompt_text, formats)` answers the drafter's question "which of the plan's formats does
this prompt ask for" from the prompt's text alone (vLLM hands the proposer token ids, never the
request's format).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from agentspec_sdk.errors import FormatError
from agentspec_sdk.structure.formats import AgentFormat

__all__ = ["detect_format", "prompt_format"]

_PYTHONIC = re.compile(r"\[\s*func_name\w*\s*\(|python list of (?:the )?(?:function )?calls", re.IGNORECASE)
_LLAMA_JSON = re.compile(r"""["']?parameters["']?\s*:\s*dictionary of argument""", re.IGNORECASE)


def detect_format(chat_template: str | None, special_tokens: Iterable[str]) -> str:
    """The built-in format name for a model's native tool calls (``tool_calls`` when it declares none)."""
    if chat_template is not None and not isinstance(chat_template, str):
        raise FormatError(f"chat_template must be a string or None, got {type(chat_template).__name__}")
    if isinstance(special_tokens, str):
        raise FormatError("special_tokens must be an iterable of token strings, not one string")
    template = chat_template or ""
    tokens = {t for t in special_tokens if isinstance(t, str)}

    def declared(marker: str) -> bool:
        return marker in tokens or marker in template

    if declared("[TOOL_CALLS]"):
        return "mistral"
    if _PYTHONIC.search(template):
        return "pythonic"
    if "tool_code" in template:
        return "gemma_tool_code"
    if declared("<tool_call>"):
        return "hermes"
    if declared("<|python_tag|>") or _LLAMA_JSON.search(template):
        return "llama3_json"
    return "tool_calls"


def prompt_format(prompt_text: str, formats: Sequence[AgentFormat]) -> AgentFormat:
    """The format among `formats` that `prompt_text` asks for; ties go to the earlier one.

    Evidence, strongest first:
    1. the format's own instructions (or, without any, its description), verbatim: our prompts carry
       them wherever the model's template does not render tools (`prompts.format_instructions`);
    2. the native format a template's rendered text declares (`detect_format` on the prompt), when it is
       one of `formats` (a template that renders tools writes its own system text and earlier calls);
    3. how often the prompt holds the format's open markers. Anchored markers (``{``, ``[``) open a call
       only at a turn's first character, so in a prompt they are JSON, not evidence.
    Counting markers alone cannot tell formats that share markers apart (``hermes`` and ``tool_calls``
    both use ``<tool_call>``; every JSON tool list holds ``{``).
    """
    if not formats:
        raise FormatError("prompt_format needs at least one format")
    if len(formats) == 1:
        return formats[0]

    def markers(fmt: AgentFormat) -> int:
        return sum(prompt_text.count(m) for k in fmt.kinds if not k.anchored for m in k.open)

    # the text `prompts.format_instructions` writes for the format (its instructions, else its description)
    instructed = [f for f in formats if (f.instructions or f.description)
                  and (f.instructions or f.description) in prompt_text]
    if instructed:
        return max(instructed, key=markers)
    declared = detect_format(prompt_text, ())
    for fmt in formats:
        if declared != "tool_calls" and fmt.name == declared:
            return fmt
    return max(formats, key=markers)
