"""The structure layer over vLLM's draft model (drafting.hybrid, backends.inside_vllm.vllm_hybrid) and the
layer-truncated draft folders (backends.serving.draft_models).

Unit tests drive the hybrid drafter with the real tokenizer and hand-written model drafts, the
handover with small tensors and the layout check with stand-in runner classes. The engine tests
(marked `engine`) run vLLM on CPU in their own processes:
  flock /tmp/agentspec-engine.lock python -m pytest tests/test_hybrid_drafting.py -q -m engine
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

from agentspec_sdk.backends.engine_config import EngineConfig
from agentspec_sdk.backends.inside_vllm import vllm_hybrid
from agentspec_sdk.backends.inside_vllm.vllm_hybrid import (
    PROPOSE_PARAMS,
    check_layout,
    hand_over,
    step_tokens,
)
from agentspec_sdk.backends.serving.draft_models import make_truncated_draft
from agentspec_sdk.drafting.hybrid import HybridDrafter
from agentspec_sdk.drafting.plan import DraftPlan
from agentspec_sdk.drafting.rows import RowInput
from agentspec_sdk.errors import BackendError, PlanError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model())


def _prompt(tok, user):
    msgs = [{"role": "system", "content": "Call tools as <tool_call>{...}</tool_call>."},
            {"role": "user", "content": user}]
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


CALL_OPEN = '<tool_call>{"name": "find", "arguments": {"q": "Trattoria Bell'


def _row(tok):
    return tok.encode(_prompt(tok, "Find the Trattoria Bellavista Downtown please.") + CALL_OPEN)


# -- the segment cut --------------------------------------------------------------------------

def test_a_model_draft_is_cut_at_the_end_of_the_segment(tok):
    ids = _row(tok)
    model = tok.encode('avista"}}</tool_call> and then some prose', add_special_tokens=False)
    cut = HybridDrafter(DraftPlan(tools=[], gamma_max=16), tok, mode="cut")
    drafts, replaced = cut.propose([RowInput(np.array(ids))], [model])
    text = tok.decode(drafts[0])
    assert text.startswith('avista"}}') and "prose" not in text and "and" not in text
    assert drafts[0] == model[: len(drafts[0])] and replaced == [False]
    assert cut.stats()["model_cut_tokens"] == len(model) - len(drafts[0]) > 0
    assert cut.pending_draft(0).source == "model" and cut.pending_draft(0).law_class == "S"
    # observe: the same draft untouched
    seen = HybridDrafter(DraftPlan(tools=[], gamma_max=16), tok, mode="observe")
    assert seen.propose([RowInput(np.array(ids))], [model])[0] == [model]


def test_a_model_draft_inside_the_segment_is_kept_whole_and_padding_ignored(tok):
    ids = _row(tok)
    model = tok.encode('avista Downtown', add_special_tokens=False)
    cut = HybridDrafter(DraftPlan(tools=[]), tok, mode="cut")
    drafts, _ = cut.propose([RowInput(np.array(ids))], [model + [-1, -1]])
    assert drafts == [model]


# -- the source choice ------------------------------------------------------------------------

def test_the_structure_draft_replaces_a_worse_model_draft_and_not_a_better_one(tok):
    ids = _row(tok)
    wrong = tok.encode("xyz qq", add_special_tokens=False)
    plan = DraftPlan(tools=[], gamma_max=8, prior_acceptance={"S": 0.8, "R": 0.45, "F": 0.3})
    hyb = HybridDrafter(plan, tok, mode="hybrid")
    own = hyb.choice.candidate(_state(hyb, ids), 0.0)
    assert own is not None and own.source != "model"
    # the model's acceptance learned as poor in S: the structure draft is worth more
    for _ in range(30):
        hyb.accounting.acceptance.update("S", "model", 8, 0)
    drafts, replaced = hyb.propose([RowInput(np.array(ids))], [wrong])
    assert replaced == [True] and drafts[0] and drafts[0] != wrong[: len(drafts[0])]
    assert hyb.stats()["structure_chosen"] == 1
    # the model learned as near perfect and the structure sources as poor: the model's draft stays
    good = tok.encode('avista Downtown"}}', add_special_tokens=False)
    hyb2 = HybridDrafter(plan, tok, mode="hybrid")
    for src in ("lookup", "forced", "repeat", "suffix", "marker"):
        hyb2.accounting.acceptance.update("S", src, 8, 0)
        hyb2.accounting.acceptance.update("S", src, 8, 0)
    for _ in range(30):
        hyb2.accounting.acceptance.update("S", "model", 8, 8)
    drafts2, replaced2 = hyb2.propose([RowInput(np.array(ids))], [good])
    assert replaced2 == [False] and drafts2[0] == good[: len(drafts2[0])] and drafts2[0]


def _state(drafter, ids):
    from agentspec_sdk.drafting.rows import RowState

    return RowState(drafter.rows.context, np.array(ids))


def test_the_hybrid_drafter_needs_one_model_draft_per_row(tok):
    hyb = HybridDrafter(DraftPlan(tools=[]), tok, mode="hybrid")
    with pytest.raises(PlanError, match="one model draft per row"):
        hyb.propose([RowInput(np.array(_row(tok)))], [])
    with pytest.raises(PlanError, match="mode must be one of"):
        HybridDrafter(DraftPlan(tools=[]), tok, mode="both")


# -- the handover ------------------------------------------------------------------------------

def test_handover_pads_with_minus_one_or_gives_ragged_lists():
    model = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    out, probs = hand_over([[5, 6], [1, 2, 3]], [False, True], model, None, as_tensor=True)
    assert out.tolist() == [[5, 6, -1, -1], [1, 2, 3, -1]] and probs is None
    lists, _ = hand_over([[5, 6], []], [False, False], model, None, as_tensor=False)
    assert lists == [[5, 6], []]
    with pytest.raises(BackendError, match="2 drafts for 1 rows"):
        hand_over([[1], [2]], [False], model, None, as_tensor=False)


def test_handover_drops_the_model_probabilities_of_replaced_rows_only():
    """A replaced row's tokens are deterministic: its draft distribution must be their one-hot (what
    vLLM's draft_probs=None means), never the model's, or the rejection sampler would accept our
    tokens with the model's odds. Kept rows keep the model's probabilities untouched."""
    vocab = 6
    model_probs = torch.softmax(torch.randn(2, 3, vocab, generator=torch.Generator().manual_seed(0)), -1)
    model = torch.tensor([[1, 2, 3], [4, 5, 0]])
    out, probs = hand_over([[1, 2], [3, 3, 1]], [False, True], model, model_probs, as_tensor=False)
    assert torch.equal(probs[0], model_probs[0])
    expected = torch.zeros(3, vocab)
    expected[0, 3] = expected[1, 3] = expected[2, 1] = 1.0
    assert torch.equal(probs[1], expected)
    assert torch.equal(model_probs[1], model_probs[1].clone())  # the input is not changed in place
    assert not torch.equal(probs[1], model_probs[1])


def test_step_tokens_drop_rejected_padding_and_discarded_rows():
    sampled = torch.tensor([[3, 4, -1], [7, -1, -1], [9, 1, 2]])
    assert step_tokens(sampled, np.array([False, True, False]), 50) == [[3, 4], [], [9, 1, 2]]
    assert step_tokens([[3], [4, 5]], [False, False], 5) == [[3], [4]]  # ids >= vocab are placeholders


# -- the pinned layout --------------------------------------------------------------------------

class _Runner:
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,
                                sample_hidden_states, aux_hidden_states, spec_decode_metadata,
                                common_attn_metadata, slot_mappings):
        return [[1]]

    def _get_spec_decode_draft_probs(self, meta):
        return None

    def take_draft_token_ids(self):
        return None


class _OtherRunner(_Runner):
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, hidden_states):
        return [[1]]


def test_the_layout_check_names_the_vllm_version():
    check_layout("0.32.0", _Runner)
    with pytest.raises(BackendError, match=r"vLLM 0\.33\.1 is installed"):
        check_layout("0.33.1", _Runner)
    with pytest.raises(BackendError, match=r"vLLM 0\.32\.0: _OtherRunner\.propose_draft_token_ids"):
        check_layout("0.32.0", _OtherRunner)

    class Bare:
        pass

    with pytest.raises(BackendError, match=r"vLLM 0\.32\.0: Bare lacks"):
        check_layout("0.32.0", Bare)


def test_the_installed_vllm_runner_has_the_layout_we_patch():
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    check_layout()  # the installed vLLM, as the engine start checks it
    assert issubclass(CPUModelRunner, GPUModelRunner)
    assert "propose_draft_token_ids" not in CPUModelRunner.__dict__  # the CPU runner inherits it


def test_patching_is_idempotent_and_inert_without_our_mode(monkeypatch):
    class Runner(_Runner):
        def __init__(self, vllm_config):
            self.vllm_config = vllm_config

    monkeypatch.delenv(vllm_hybrid.MODE_ENV, raising=False)
    vllm_hybrid.patch_runner(Runner)
    first = Runner.propose_draft_token_ids
    vllm_hybrid.patch_runner(Runner)
    assert Runner.propose_draft_token_ids is first
    check_layout("0.32.0", Runner)  # the wrapped method still shows vLLM's signature
    runner = Runner(vllm_config=None)
    assert getattr(runner, vllm_hybrid.LAYER_ATTR) is None
    assert runner.propose_draft_token_ids(*([None] * (len(PROPOSE_PARAMS) - 1))) == [[1]]
    vllm_hybrid.register()  # no mode chosen: nothing happens, nothing is imported


def test_a_bad_mode_in_the_environment_is_an_error(monkeypatch):
    monkeypatch.setenv(vllm_hybrid.MODE_ENV, "sideways")
    with pytest.raises(BackendError, match="AGENTSPEC_MODEL_DRAFTS='sideways'"):
        vllm_hybrid.register()


def test_the_plugin_entry_point_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    target = project["project"]["entry-points"]["vllm.general_plugins"]["agentspec_model_drafts"]
    module, func = target.split(":")
    assert (module, func) == ("agentspec_sdk.backends.inside_vllm.vllm_hybrid", "register")


def test_model_drafter_modes_need_a_draft_model():
    with pytest.raises(BackendError, match="needs draft_model"):
        EngineConfig(speculation="structure+draft_model")
    with pytest.raises(BackendError, match="draft_model applies to speculation"):
        EngineConfig(speculation="structure", draft_model="x")
    assert EngineConfig(speculation="draft_model+cut", draft_model="x").draft_model == "x"


# -- the draft folders ---------------------------------------------------------------------------

def test_a_truncated_draft_keeps_the_first_layers_embeddings_and_tokenizer(tmp_path):
    from safetensors import safe_open

    from agentspec_sdk.backends.model_bundle import resolve_model

    src = Path(resolve_model())
    out = make_truncated_draft(2, out=tmp_path / "d2")
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["tie_word_embeddings"] is True
    assert (out / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    with safe_open(str(out / "model.safetensors"), "pt") as f, \
            safe_open(str(src / "model.safetensors"), "pt") as g:
        names = set(f.keys())
        assert {"model.embed_tokens.weight", "model.norm.weight"} <= names
        assert not any(n.startswith("model.layers.2.") for n in names)
        w = "model.layers.1.mlp.down_proj.weight"
        assert torch.equal(f.get_tensor(w), g.get_tensor(w))
    assert make_truncated_draft(2, out=out) == out  # made once
    with pytest.raises(BackendError, match=r"\[1, 29\]"):
        make_truncated_draft(30, out=tmp_path / "d30")
    with pytest.raises(BackendError, match="holds a 2-layer draft"):
        make_truncated_draft(3, out=out)


def test_draft_make_cli_writes_the_folder(tmp_path):
    env_path = f"{ROOT}:{ROOT / 'integrations' / 'langgraph'}"
    done = subprocess.run([sys.executable, "-m", "agentspec_sdk.cli", "draft", "make", "--layers", "3",
                           "--out", str(tmp_path / "d3")], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin",
                               "HOME": str(Path.home())})
    assert done.returncode == 0, done.stderr[-2000:]
    assert Path(done.stdout.strip()) == tmp_path / "d3"
    assert json.loads((tmp_path / "d3" / "config.json").read_text())["num_hidden_layers"] == 3
    bad = subprocess.run([sys.executable, "-m", "agentspec_sdk.cli", "draft", "make", "--layers", "0",
                          "--out", str(tmp_path / "d0")], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    assert bad.returncode == 2 and "--layers must be an integer" in bad.stderr


# -- real engines ---------------------------------------------------------------------------------

MODEL_MODE_RUN = """
import json, sys
from agentspec_sdk.backends.embedded.vllm_engine import Engine, TurnRequest
from agentspec_sdk.bfcl import tool_call_prompts

if __name__ == "__main__":
    mode, draft, n, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    prompts = tool_call_prompts(n)
    # the session engines' settings (tests/conftest.py ENGINE_SETTINGS): comparable with engine_off
    with Engine(speculation=mode, draft_model=draft, gamma_max=8, max_model_len=2048, kv_cache_gb=1.0,
                seed=0) as engine:
        results = engine.generate([TurnRequest(messages=p.messages, tools=p.tools, tool_choice="call",
                                               max_tokens=max_tokens, request_id=p.id) for p in prompts])
        layer = engine.proposer()
        print(json.dumps({"results": [[r.request_id, r.error, r.token_ids] for r in results],
                          "vllm": engine.stats()["vllm"], "acceptance": engine.stats()["acceptance"],
                          "layer": layer.stats()}, default=str))
"""
N_ENGINE_PROMPTS = 4
ENGINE_MAX_TOKENS = 64


def _run_mode(tmp_path, mode: str, draft: Path) -> dict:
    # Its own process: vLLM tears down process-wide parallel state when an engine closes, which
    # would break the session's shared engines.
    script = tmp_path / "model_mode_run.py"
    script.write_text(MODEL_MODE_RUN)
    done = subprocess.run([sys.executable, str(script), mode, str(draft), str(N_ENGINE_PROMPTS),
                           str(ENGINE_MAX_TOKENS)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def off_tokens(engine_off):
    from agentspec_sdk.backends.types import TurnRequest
    from agentspec_sdk.bfcl import tool_call_prompts

    prompts = tool_call_prompts(N_ENGINE_PROMPTS)
    results = engine_off.generate([TurnRequest(messages=p.messages, tools=p.tools, tool_choice="call",
                                               max_tokens=ENGINE_MAX_TOKENS, request_id=p.id)
                                   for p in prompts])
    return [r.token_ids for r in results]


@pytest.mark.engine
def test_hybrid_outputs_are_token_identical_to_off(tmp_path, off_tokens):
    """structure+draft_model on the K=8 draft folder (which loads in vLLM as its draft model): the
    same tokens as off at temperature 0, with both sources chosen on some rows and drafts settled."""
    out = _run_mode(tmp_path, "structure+draft_model", make_truncated_draft(8))
    assert all(err is None for _, err, _ in out["results"]), out["results"]
    assert [ids for _, _, ids in out["results"]] == off_tokens
    layer = out["layer"]
    assert layer["model_mode"] == "hybrid" and layer["errors"] == 0 and layer["batch_errors"] == 0
    assert layer["model_draft_steps"] > 0 and layer["model_draft_s"] > 0
    assert layer["structure_chosen"] > 0 and layer["model_chosen"] > 0
    assert out["vllm"]["num_draft_tokens"] > 0 and out["vllm"]["num_accepted_tokens"] > 0
    assert "S" in out["acceptance"]
