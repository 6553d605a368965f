"""Exact grammar masks under speculation (backends.inside_vllm.vllm_grammar): llguidance keeps the last
mask it computed (its bias cache) past a rollback, so after vLLM's draft walk a later mask allowed a token the
grammar forbids and vLLM ended the request with an error (the long_context traces, structure γ 8 and
16: 4 of 652 outputs differed from `off`). Masks now come from matchers that never roll back: the
masks are those of a fresh copy per mask (`copy-per-fill`, the patch before), at vLLM's own count of
llguidance calls plus one copy per row and step (counted here, not timed)."""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = json.loads((ROOT / "tests" / "data" / "exact_masks.json").read_text())


@pytest.fixture(scope="module")
def mask_cost():
    """benchmarks/mask_cost.py: vLLM's grammar calls per step on the captured turns."""
    spec = importlib.util.spec_from_file_location("mask_cost", ROOT / "benchmarks" / "mask_cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def setup(mask_cost):
    return mask_cost.Setup()


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

    from agentspec_sdk.backends.inside_vllm.vllm_grammar import patch_guidance

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


@pytest.mark.parametrize("name", ["tool_calls", "code", "react"])
def test_masks_equal_a_fresh_copy_per_mask_at_vllms_calls_plus_one_copy_per_row(mask_cost, setup, name):
    """B 64, γ 8, the captured turns driven through vLLM's grammar calls (grammar_bitmask, then the
    kept tokens, then validate_tokens; drafts rejected at random positions): every mask equals the
    copy-per-fill patch's (exact by construction), with vLLM's own llguidance work per row and step
    (masks, consumes, validations) less its rollback plus at most one deep copy, where copy-per-fill
    copies once per mask."""
    turns, grammars = mask_cost.load_set(name)
    turns = [t for t in turns if mask_cost.accepted_prefix(setup, t, grammars[t["grammar"]]) == len(t["out"])]
    arms = ["vllm", "agentspec", "copy-per-fill"] if name != "react" else ["agentspec", "copy-per-fill"]
    counts = {arm: {} for arm in arms}
    cell = mask_cost.run_cell(setup, turns, grammars, 64, arms, steps=4, warmup=1, gamma=8, seed=1,
                              counts=counts)
    assert cell["mask_rows"] > 64 * 4  # drafts were walked
    assert cell["arms"]["agentspec"]["differ"] == 0
    ours = cell["arms"]["agentspec"]["calls_per_row_step"]
    copies = cell["arms"]["copy-per-fill"]["calls_per_row_step"]
    assert ours.get("rollback", 0) == 0
    assert 0.5 < ours["deep_copy"] <= 1.25  # a walk's copy; new rows' first copies (< 0.25 a row-step)
    assert copies["deep_copy"] == copies["unsafe_compute_mask_ptr"] > 5
    assert ours["unsafe_compute_mask_ptr"] == copies["unsafe_compute_mask_ptr"]
    # a step without a draft walks its kept tokens on the copy: consumed once more at the next rollback
    assert ours["consume_tokens"] <= copies["consume_tokens"] + 0.1
    if "vllm" in counts:
        theirs = cell["arms"]["vllm"]["calls_per_row_step"]
        assert theirs["rollback"] > 0.5 and theirs.get("deep_copy", 0) == 0
        for call in ("unsafe_compute_mask_ptr", "validate_tokens"):
            assert ours[call] == theirs[call]
        assert ours["consume_tokens"] <= theirs["consume_tokens"] + 0.1


def test_the_benchmarks_walk_is_vllms_own(mask_cost, setup):
    """benchmarks/mask_cost.py's `grammar_bitmask` against vLLM's own
    `StructuredOutputManager.grammar_bitmask` (a manager with only what that method reads, no
    reasoning parser), on the same rows and drafts, stock and patched: the same bitmasks every step."""
    import types

    import llguidance.torch as lt
    import torch
    from vllm.v1.structured_output import StructuredOutputManager

    turns, grammars = mask_cost.load_set("tool_calls")
    gamma, rng = 8, random.Random(0)
    for arm in ("vllm", "agentspec"):
        vocab = setup.arms[arm][1].vocab_size
        theirs, ours = ([mask_cost.Row(setup, [arm], t, grammars[t["grammar"]], 1, None) for t in turns[:8]]
                        for _ in range(2))
        manager = StructuredOutputManager.__new__(StructuredOutputManager)
        manager.vllm_config = types.SimpleNamespace(
            num_speculative_tokens=gamma, scheduler_config=types.SimpleNamespace(max_num_seqs=8),
            model_config=types.SimpleNamespace(is_diffusion=False))
        manager.backend = types.SimpleNamespace(
            allocate_token_bitmask=lambda n, v=vocab: lt.allocate_token_bitmask(n, v))
        manager._grammar_bitmask, manager._full_mask = None, torch.tensor(-1, dtype=torch.int32)
        manager.fill_bitmask_parallel_threshold, manager.enable_in_reasoning = 128, True
        bitmask = lt.allocate_token_bitmask(8 * (gamma + 1), vocab)
        for _ in range(10):
            plans = [row.step(gamma, rng) for row in theirs]
            requests = {f"r{i}": types.SimpleNamespace(structured_output_request=types.SimpleNamespace(
                grammar=row.grammars[arm])) for i, row in enumerate(theirs)}
            drafts = [d for d, _ in plans]
            real = manager.grammar_bitmask(requests, list(requests), dict(zip(requests, drafts, strict=True)))
            n = mask_cost.grammar_bitmask(
                [(row.grammars[arm], d) for row, d in zip(ours, drafts, strict=True)], bitmask)
            assert (real == bitmask[:n].numpy()).all()
            for a, b, (_, keep) in zip(theirs, ours, plans, strict=True):
                for row in (a, b):
                    assert row.grammars[arm].accept_tokens("r", keep)
                a.advance(keep)
                b.advance(keep)
            live = [i for i, row in enumerate(theirs) if not row.done()]
            theirs, ours = [theirs[i] for i in live], [ours[i] for i in live]
            if not theirs:
                break


def _lockstep(ll_tokenizer, grammar_text: str, out: list[int], seed: int, ops: int = 400) -> dict:
    """Random vLLM-like calls on a patched GuidanceGrammar and on the copy-per-fill reference in
    lockstep (fills, accepts of the turn's tokens or of other tokens the grammar allows, rollbacks of
    any depth, validations, resets): every return value, flag and mask the same. Returns the counts
    of each call made."""
    import llguidance
    import llguidance.torch as lt
    import numpy as np
    from vllm.v1.structured_output.backend_guidance import GuidanceGrammar

    from agentspec_sdk.backends.inside_vllm.vllm_grammar import patch_guidance

    class Exact(GuidanceGrammar):
        pass

    class Reference(GuidanceGrammar):
        def fill_bitmask(self, bitmask, idx):
            lt.fill_next_token_bitmask(self.ll_matcher.deep_copy(), bitmask, idx)
            self.check_error()

    patch_guidance(Exact)
    serialized = llguidance.LLMatcher.grammar_from_lark(grammar_text)
    pair = [cls(ll_matcher=llguidance.LLMatcher(ll_tokenizer, serialized, log_level=0),
                ll_tokenizer=ll_tokenizer, vocab_size=ll_tokenizer.vocab_size) for cls in (Exact, Reference)]
    masks = lt.allocate_token_bitmask(2, ll_tokenizer.vocab_size)
    rng = random.Random(seed)
    hist: list[int] = []
    done = {"fill": 0, "accept": 0, "rollback": 0, "validate": 0, "reset": 0, "off_turn": 0}
    for _ in range(ops):
        op = rng.choices(["fill", "accept", "rollback", "validate", "reset"], [6, 6, 2, 1, 0.05])[0]
        if op == "fill":
            if pair[0].is_terminated() != pair[1].is_terminated():
                raise AssertionError("terminated differs")
            if pair[1].is_terminated():
                continue
            for row, g in enumerate(pair):
                g.fill_bitmask(masks, row)
            assert bool((masks[0] == masks[1]).all()), f"mask differs after {hist}"
        elif op == "accept":
            on_turn = hist == out[:len(hist)] and len(hist) < len(out)
            if on_turn and rng.random() < 0.8:
                tokens = out[len(hist):len(hist) + rng.randint(1, 3)]
            else:  # a token the grammar allows here (from a fresh copy: exact), not the turn's
                probe = pair[1].ll_matcher.deep_copy()
                allowed = np.flatnonzero(np.unpackbits(np.frombuffer(probe.compute_bitmask(), dtype=np.uint8),
                                                       bitorder="little"))
                if len(allowed) == 0:
                    continue
                tokens = [int(allowed[rng.randrange(len(allowed))])]
                done["off_turn"] += 1
            results = [g.accept_tokens("r", tokens) for g in pair]
            assert results[0] == results[1]
            if not results[1]:
                break  # an error state: vLLM ends the request
            hist += tokens
        elif op == "rollback" and hist:
            n = rng.randint(1, min(len(hist), 10))
            for g in pair:
                g.rollback(n)
            del hist[len(hist) - n:]
        elif op == "validate":
            tokens = out[len(hist):len(hist) + 8] if hist == out[:len(hist)] else [out[0]]
            assert pair[0].validate_tokens(tokens) == pair[1].validate_tokens(tokens)
        elif op == "reset":
            for g in pair:
                g.reset()
            hist = []
        else:
            continue
        assert (pair[0].terminated, pair[0].rollback_lag) == (pair[1].terminated, pair[1].rollback_lag)
        done[op] += 1
    return done


def test_any_sequence_of_vllms_calls_gives_the_masks_of_a_fresh_copy(ll_tokenizer, mask_cost):
    """Not only vLLM 0.32's order of calls: random fills, accepts (the turn's tokens and others the
    grammar allows), rollbacks past a walk into kept tokens, validations and resets, on the long_context
    turn of the bug and on a captured tool-call turn; the patched grammar and copy-per-fill agree on
    every mask, return value and flag."""
    turns, grammars = mask_cost.load_set("tool_calls")
    cases = [(DATA["grammar"], DATA["prefix"] + DATA["then"], 0),
             (grammars[turns[4]["grammar"]], turns[4]["out"], 1)]
    for grammar_text, out, seed in cases:
        done = _lockstep(ll_tokenizer, grammar_text, out, seed)
        assert done["fill"] > 100 and done["rollback"] > 20 and done["off_turn"] > 10, done


def test_a_draft_kept_whole_continues_on_its_walk_copy(ll_tokenizer):
    """vLLM's step where the target keeps the whole draft and adds its own token: the walk's copy
    becomes the mask matcher (one copy per step, no consume of the kept draft again)."""
    import llguidance.torch as lt
    from vllm.v1.structured_output.backend_guidance import GuidanceGrammar

    from agentspec_sdk.backends.inside_vllm.vllm_grammar import patch_guidance

    class Probe(GuidanceGrammar):
        pass

    patch_guidance(Probe)
    grammar = Probe(ll_matcher=_matcher(ll_tokenizer), ll_tokenizer=ll_tokenizer,
                    vocab_size=ll_tokenizer.vocab_size)
    bitmask = lt.allocate_token_bitmask(9, ll_tokenizer.vocab_size)
    out = DATA["prefix"] + DATA["then"]
    assert grammar.accept_tokens("r", out[:5])
    pos, copies = 5, []
    while pos + 5 <= len(out):
        draft = out[pos:pos + 4]
        for i, token in enumerate(draft):
            grammar.fill_bitmask(bitmask, i)
            assert grammar.accept_tokens("r", [token])
        grammar.fill_bitmask(bitmask, len(draft))
        walk = grammar.ll_matcher
        grammar.rollback(len(draft))
        assert grammar.accept_tokens("r", out[pos:pos + 5])  # the draft and the bonus token
        copies.append(grammar.ll_matcher is walk)
        pos += 5
    assert len(copies) > 3 and all(copies)
    fresh = _matcher(ll_tokenizer)
    fresh.consume_tokens(out[:pos])
    lt.fill_next_token_bitmask(fresh, bitmask, 1)
    grammar.fill_bitmask(bitmask, 0)
    assert bool((bitmask[0] == bitmask[1]).all())


def test_the_workaround_refuses_a_class_it_cannot_hook_and_is_inert_unless_asked(monkeypatch):
    from agentspec_sdk.backends.inside_vllm import vllm_grammar
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
