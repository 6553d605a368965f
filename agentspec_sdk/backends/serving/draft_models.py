"""Draft models for vLLM's `draft_model` method, made from what is installed (no hub).

`make_truncated_draft(k)`: the first K decoder layers of a Llama-family HF folder (the default bundle,
SmolLM2-135M-Instruct: 30 layers) with the same embeddings, final norm and tied LM head, written as an
HF folder under `$AGENTSPEC_CACHE/drafts/<model>-L<K>` (made once; reused afterwards). It shares the
target's tokenizer and vocabulary, which vLLM's draft_model method requires. The weights are copied
tensor by tensor from the target's safetensors, so the draft computes exactly the target's first K
layers followed by the target's own norm and head (an early exit, untrained).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from agentspec_sdk.backends.model_bundle import cache_dir, resolve_model
from agentspec_sdk.errors import BackendError

# everything in the target's folder a draft folder keeps as is (tokenizer, template, generation config)
COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
          "generation_config.json", "vocab.json", "merges.txt", "NOTICE")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")

# the draft the bench's model drafter modes use (replay.arms): measured in
# docs/experiments/2026-12-02-model-drafters.md; AGENTSPEC_DRAFT_LAYERS overrides it
DEFAULT_DRAFT_LAYERS = 8

__all__ = ["make_truncated_draft", "drafts_dir", "truncated_draft_dir", "default_draft",
           "DEFAULT_DRAFT_LAYERS"]


def default_draft(model: str | os.PathLike | None = None) -> Path:
    """The K-layer draft of `model` the bench uses (K = AGENTSPEC_DRAFT_LAYERS or DEFAULT_DRAFT_LAYERS)."""
    raw = os.environ.get("AGENTSPEC_DRAFT_LAYERS") or str(DEFAULT_DRAFT_LAYERS)
    try:
        layers = int(raw)
    except ValueError:
        raise BackendError(f"AGENTSPEC_DRAFT_LAYERS must be an integer, got {raw!r}") from None
    return make_truncated_draft(layers, model)


def drafts_dir() -> Path:
    return cache_dir() / "drafts"


def truncated_draft_dir(layers: int, model: str | os.PathLike | None = None) -> Path:
    return drafts_dir() / f"{Path(resolve_model(model)).name}-L{layers}"


def make_truncated_draft(layers: int, model: str | os.PathLike | None = None,
                         out: str | os.PathLike | None = None) -> Path:
    """The folder of a K-layer draft of `model` (default: the bundled default model); made once."""
    src = Path(resolve_model(model))
    if not (src / "config.json").is_file():
        raise BackendError(f"draft make needs a local Hugging Face folder, got {model!r}")
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    total = config.get("num_hidden_layers")
    if not isinstance(total, int):
        raise BackendError(f"{src}/config.json has no num_hidden_layers: not a decoder-only model")
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers < total:
        raise BackendError(f"--layers must be an integer in [1, {total - 1}] for {src.name} "
                           f"({total} layers), got {layers!r}")
    dest = Path(out).expanduser() if out is not None else truncated_draft_dir(layers, src)
    if (dest / "config.json").is_file() and (dest / "model.safetensors").is_file():
        made = json.loads((dest / "config.json").read_text(encoding="utf-8"))
        if made.get("num_hidden_layers") != layers:
            raise BackendError(f"{dest} holds a {made.get('num_hidden_layers')}-layer draft, not {layers}")
        return dest
    weights = sorted(src.glob("*.safetensors"))
    if not weights:
        raise BackendError(f"{src} has no *.safetensors weights to truncate")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _write_weights(weights, layers, tmp / "model.safetensors")
    config["num_hidden_layers"] = layers
    config["agentspec_draft"] = {"of": src.name, "layers": layers, "of_layers": total}
    if isinstance(config.get("layer_types"), list):
        config["layer_types"] = config["layer_types"][:layers]
    (tmp / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    for name in COPIED:
        if (src / name).is_file():
            shutil.copy2(src / name, tmp / name)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.replace(dest)
    return dest


def _write_weights(files: list[Path], layers: int, out: Path) -> None:
    """Every tensor except those of decoder layers >= `layers` (tied head: no lm_head tensor to copy;
    an untied one is kept as is)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    kept = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has keys(), no iteration)
                m = _LAYER.match(name)
                if m is None or int(m.group(1)) < layers:
                    kept[name] = f.get_tensor(name)
    if not any(_LAYER.match(n) for n in kept):
        raise BackendError("no decoder layer tensors (model.layers.N.*) found: not a Llama-style layout")
    save_file(kept, str(out), metadata={"format": "pt"})
