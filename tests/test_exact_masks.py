"""Exact grammar masks under speculation (backends.vllm_grammar): llguidance keeps something of a mask
computed while vLLM walks a draft past the walk's rollback, so a later mask allowed a token the grammar
forbids and vLLM ended the request with an error (the long_context traces, structure γ 8 and 16:
4 of 652 outputs differed from `off`). Masks are now filled from a copy of the matcher."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = json.loads((ROOT / "tests" / "data" / "exact_masks.json").read_text())


@pytest.fixture(scope="module")
def ll_tokenizer():
    import llguidance.hf

    from agentspec_sdk.backends.model_bundle import load_tokenizer

    return llguidance.hf.from_tokenizer(load_tokenizer(None))


def _matcher(ll_tokenizer):
    import llguidance

    return llguidance.LLMatcher(ll_tokenizer, llguidance.LLMatcher.grammar_from_lark(DATA["grammar"]),
                                log_level=0)


def _allows(bitmask, row: int, token: int) -> bool:
    return bool((int(bitmask[row, token // 32]) >> (token % 32)) & 1)


def _walk_then_mask(accept, fill, rollback, bitmask) -> None:
    """vLLM's `grammar_bitmask` over the draft (fill, accept, ..., fill, rollback), then the tokens the
    model wrote, then the next mask into row 0."""
    accept(DATA["prefix"])
    for row, token in enumerate(DATA["draft"]):
        fill(bitmask, row)
        assert accept([token])
    fill(bitmask, len(DATA["draft"]))
    rollback(len(DATA["draft"]))
    assert accept(DATA["then"])
    fill(bitmask, 0)


def test_llguidance_masks_after_a_rolled_back_walk_allow_a_forbidden_token(ll_tokenizer):
    """The upstream behaviour the workaround exists for (llguidance 1.7.6; 1.8.0 and 1.9.1 too). If
    this fails, llguidance is exact after rollbacks and `vllm_grammar` can go."""
    import llguidance.torch as lt

    bitmask = lt.allocate_token_bitmask(len(DATA["draft"]) + 1, ll_tokenizer.vocab_size)
    m = _matcher(ll_tokenizer)
    _walk_then_mask(m.consume_tokens, lambda b, i: lt.fill_next_token_bitmask(m, b, i), m.rollback,
                    bitmask)
    assert _allows(bitmask, 0, DATA["forbidden"])
    assert not m.consume_tokens([DATA["forbidden"]])  # what vLLM then refuses, ending the request
    fresh = _matcher(ll_tokenizer)  # the same tokens without the walk: the exact mask
    fresh.consume_tokens(DATA["prefix"] + DATA["then"])
    lt.fill_next_token_bitmask(fresh, bitmask, 0)
    assert not _allows(bitmask, 0, DATA["forbidden"]) and _allows(bitmask, 0, DATA["allowed"])


def test_vllm_guidance_grammar_fills_exact_masks_once_patched(ll_tokenizer):
    """vLLM's own `GuidanceGrammar` (a subclass, so the class other tests use is left as it is) with
    the workaround: the same walk leaves the next mask exact; patching twice wraps once."""
    import llguidance.torch as lt
    from vllm.v1.structured_output.backend_guidance import GuidanceGrammar

    from agentspec_sdk.backends.vllm_grammar import patch_guidance

    class Probe(GuidanceGrammar):
        pass

    patch_guidance(Probe)
    patched = Probe.fill_bitmask
    patch_guidance(Probe)
    assert Probe.fill_bitmask is patched
    grammar = Probe(ll_matcher=_matcher(ll_tokenizer), ll_tokenizer=ll_tokenizer,
                    vocab_size=ll_tokenizer.vocab_size)
    bitmask = lt.allocate_token_bitmask(len(DATA["draft"]) + 1, ll_tokenizer.vocab_size)
    _walk_then_mask(lambda t: grammar.accept_tokens("r", t), grammar.fill_bitmask, grammar.rollback,
                    bitmask)
    assert not _allows(bitmask, 0, DATA["forbidden"]) and _allows(bitmask, 0, DATA["allowed"])
    for row, token in enumerate(DATA["draft"][1:], start=1):  # masks along the walk are the walk's own
        assert _allows(bitmask, row, token)


def test_the_workaround_refuses_a_class_it_cannot_hook_and_is_inert_unless_asked(monkeypatch):
    from agentspec_sdk.backends import vllm_grammar
    from agentspec_sdk.errors import BackendError

    class NoMask:
        pass

    with pytest.raises(BackendError, match="fill_bitmask"):
        vllm_grammar.patch_guidance(NoMask)
    calls = []
    monkeypatch.setattr(vllm_grammar, "patch_guidance", lambda: calls.append("masks"))
    monkeypatch.setattr(vllm_grammar, "patch_slices", lambda: calls.append("slices"))
    monkeypatch.delenv(vllm_grammar.EXACT_MASKS_ENV, raising=False)
    vllm_grammar.register()
    assert calls == []
    monkeypatch.setenv(vllm_grammar.EXACT_MASKS_ENV, "1")
    vllm_grammar.register()  # in vLLM's own processes: exact masks and the marker slices
    assert calls == ["masks", "slices"]


def test_structure_on_the_long_context_turn_is_token_identical_to_off(tmp_path):
    """The real engines (bench, spawned): the turn where structure's output ended in vLLM's grammar
    error is identical to `off` now."""
    traces = ROOT / "agentspec_sdk" / "replay" / "traces" / "bfcl_long_context.jsonl"
    lines = traces.read_text().splitlines()
    trace = tmp_path / "episode.jsonl"
    trace.write_text(next(line for line in lines if '"bfcl/multi_turn_long_context_6"' in line) + "\n")
    out = tmp_path / "bench"
    subprocess.run([sys.executable, "-m", "agentspec_sdk.cli", "bench", "--arms", "D", "--traces", str(trace),
                    "--modes", "off,structure", "--gammas", "8", "--batches", "1", "--n", "1",
                    "--max-segments", "1", "--no-prefix-check", "--no-entropies", "--out", str(out)],
                   check=True, cwd=ROOT, timeout=900, capture_output=True)
    report = json.loads((out / "report.json").read_text())
    assert report["lossless"]["compared"] >= 1 and report["lossless"]["mismatched"] == 0
