"""Suffix trees (arctic-inference's trees, kept as its SuffixDecodingCache keeps them, compiled in
`drafting._trees`) as a draft source of the structure drafter, and the budget pricing each of their
tokens by its own confidence."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from agentspec_sdk.drafting.drafter import StructureDrafter
from agentspec_sdk.drafting.lab import LabSwitches
from agentspec_sdk.drafting.plan import DraftPlan
from agentspec_sdk.drafting.rows import Candidate, RowInput
from agentspec_sdk.drafting.suffix_source import SuffixTrees, available
from agentspec_sdk.structure.formats import CODE_AGENT


def test_the_compiled_trees_are_built():
    assert available()  # `pip install` builds `agentspec_sdk.drafting._trees` (csrc/suffix_trees)


def test_trees_draft_from_the_prompt_with_conditional_confidences():
    trees = SuffixTrees()
    key = trees.start(np.array([1, 2, 3, 4, 5, 1, 2, 3, 4, 6, 1, 2, 3, 4, 5]))
    tokens, conf = trees.speculate(key, np.array([9, 1, 2, 3]), 8)
    # after "1 2 3" comes 4 (3 of 3 times), then 5 (2 of 3) or 6: the path probability 2/3 at "5"
    assert tokens[:2] == [4, 5]
    assert conf[0] == pytest.approx(1.0) and conf[1] == pytest.approx(2 / 3, rel=1e-4)
    assert all(0.0 <= c <= 1.0 for c in conf)
    # vLLM's spec factor 1.0: no more tokens than the matched context is long
    assert len(tokens) <= 3


def test_finished_rows_feed_the_global_tree():
    trees = SuffixTrees()
    a = trees.start(np.array([100, 101]))
    trees.extend(a, np.array([7, 8, 9, 10, 11]))
    trees.stop(a)
    b = trees.start(np.array([200]))
    tokens, _ = trees.speculate(b, np.array([200, 7, 8, 9]), 8)
    assert tokens[:2] == [10, 11]  # another request's response, as in vLLM's global tree
    assert trees.speculate(a, np.array([7, 8]), 8) == ([], [])  # a stopped row drafts nothing


def test_extension_is_the_longer_draft_past_suffix_own():
    """At spec factor 1 a 3-token match drafts 3 tokens; the extension at factor 2 holds the next 3,
    and nothing where suffix's own draft already fills the room or no extension is set."""
    trees = SuffixTrees(extend_factor=2.0)
    key = trees.start(np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]))
    context = np.array([50, 1, 2, 3])
    base, conf, more, more_conf = trees.draft(key, context, 16)
    assert base == [4, 5, 6] and (base, conf) == trees.speculate(key, context, 16)
    assert more == [7, 8, 9] and len(more_conf) == 3 and all(0.0 <= c <= 1.0 for c in more_conf)
    assert trees.draft(key, context, 3)[2:] == ([], [])  # suffix's own draft already fills γ
    assert trees.draft(key, context, 16, extend_factor=0.0)[2:] == ([], [])
    trees.extend_factor = None
    assert trees.draft(key, context, 16)[2:] == ([], [])


def _cache_draft(cache, key, history, max_tokens, factor, prob, extend_factor):
    """What the structure drafter drafts through arctic-inference's own cache: its draft at `factor`
    and, at `extend_factor`, the tokens past it where the longer draft begins with it."""
    def confident(draft):
        conf, before = [], 1.0
        for p in map(float, draft.probs):
            conf.append((1.0 if p / before > 1.0 else p / before) if before > 0 else 0.0)
            before = p
        return list(map(int, draft.token_ids)), conf

    context = np.ascontiguousarray(history[-24:], dtype=np.int32)
    base = confident(cache.speculate(key, context, max_spec_tokens=max_tokens, max_spec_factor=factor,
                                     min_token_prob=prob))
    more = [], []
    if extend_factor > factor and len(base[0]) < max_tokens and (base[0] or factor < 1):
        tokens, conf = confident(cache.speculate(key, context, max_spec_tokens=max_tokens,
                                                 max_spec_factor=extend_factor, min_token_prob=prob))
        n = len(base[0])
        if len(tokens) > n and tokens[:n] == base[0]:
            more = tokens[n:], conf[n:]
    return (*base, *more)


def test_the_compiled_trees_draft_what_arctics_cache_drafts():
    """`SuffixTrees` (the compiled forest) and arctic-inference's `SuffixDecodingCache` fed the same
    rows: the same drafts, confidences and extensions, step after step, on rows that share the global
    tree, continue another row's tree, stop, and where the cache evicts the oldest responses."""
    arctic = pytest.importorskip("arctic_inference.suffix_decoding",
                                 reason="extra: cpu (arctic-inference: scripts/setup.sh builds it)")
    rng = np.random.default_rng(0)
    compared = extended = 0
    for vocab, cached in ((6, 3), (40, 10_000), (4, -1)):
        trees = SuffixTrees(max_cached_requests=cached)
        cache = arctic.SuffixDecodingCache(max_tree_depth=24, max_cached_requests=cached)
        rows: dict[int, tuple[int, np.ndarray]] = {}  # our key: (cache's key, history)
        for op in range(400):
            pick = int(rng.integers(0, 100))
            if pick < 12 or not rows:
                history = rng.integers(0, vocab, size=int(rng.integers(1, 120))).astype(np.int32)
                key, response = trees.start(history, 1), len(rows) + op * 1000
                cache.start_request(response, history[:-1])
                cache.add_active_response(response, history[-1:])
                rows[key] = response, history
            elif pick < 18:  # the next turn of a row: its tree taken over, extended by the new tokens
                old = list(rows)[int(rng.integers(0, len(rows)))]
                ckey, history = rows.pop(old)
                new = rng.integers(0, vocab, size=int(rng.integers(1, 30))).astype(np.int32)
                key = trees.adopt(old, new, 1)
                nkey = ckey + 1_000_000
                tree = cache._local_trees.pop(ckey)
                tree.extend_ndarray(0, new[:-1])
                cache._local_trees[nkey] = tree
                cache._generate_seq_id(nkey)
                cache.add_active_response(nkey, new[-1:])
                rows[key] = nkey, np.concatenate([history, new])
            elif pick < 25:
                key = list(rows)[int(rng.integers(0, len(rows)))]
                ckey, _ = rows.pop(key)
                trees.stop(key)
                cache.stop_request(ckey)
                assert trees.draft(key, np.arange(5), 8) == ([], [], [], [])
            elif pick < 60:
                key = list(rows)[int(rng.integers(0, len(rows)))]
                ckey, history = rows[key]
                new = rng.integers(0, vocab, size=int(rng.integers(1, 6))).astype(np.int32)
                trees.extend(key, new)
                cache.add_active_response(ckey, new)
                rows[key] = ckey, np.concatenate([history, new])
            else:
                key = list(rows)[int(rng.integers(0, len(rows)))]
                ckey, history = rows[key]
                gamma = int(rng.choice([3, 8, 16]))
                factor, prob = float(rng.choice([0.5, 1.0, 1.5])), float(rng.choice([0.0, 0.1, 0.3]))
                extend = float(rng.choice([0.0, 2.0, 4.0]))
                ours = trees.draft(key, history, gamma, extend, factor, prob)
                assert ours == _cache_draft(cache, ckey, history, gamma, factor, prob, extend)
                assert trees.speculate(key, history, gamma, factor, prob) == ours[:2]
                compared += bool(ours[0])
                extended += bool(ours[2])
        assert trees.forest.num_cached() == len(cache.cached_requests)
    assert compared > 200 and extended > 20  # drafts and extensions were compared, not only empties


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model())


def _history(tok, reasoning: str) -> np.ndarray:
    msgs = [{"role": "system", "content": "Think, then call tools as <tool_call>{...}</tool_call>."},
            {"role": "user", "content": "Plan the trip. Say: " + reasoning}]
    prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return np.array(tok.encode(prompt + reasoning), dtype=np.int64)


def test_drafter_drafts_what_another_row_wrote_and_stops_at_the_segment_end(tok):
    """Row A writes a sentence and a tool call; row B, another agent with another prompt, begins the
    same sentence: only the global tree (A's response) knows how it goes on — in-segment lookup over
    B's own prompt cannot. B's draft comes from the tree and ends where B's reasoning segment ends."""
    drafter = StructureDrafter(DraftPlan(tools=[]), tok)
    assert drafter.trees is not None
    said = " First we book the train to Lyon, then the hotel near the station."
    a_prompt = _history(tok, "")
    a_out = np.array(tok.encode(said + "<tool_call>"), dtype=np.int64)
    for n in range(0, len(a_out) + 1, 4):  # A decodes: its response grows the global tree
        drafter.propose([RowInput(np.concatenate([a_prompt, a_out[:n]]))])
    drafter.propose([RowInput(np.concatenate([a_prompt, a_out]))])
    msgs = [{"role": "system", "content": "Think, then call tools as <tool_call>{...}</tool_call>."},
            {"role": "user", "content": "Another user, another request entirely."}]
    b_prompt = tok.encode(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
    b_ids = np.array(b_prompt + a_out[:10].tolist(), dtype=np.int64)
    a_ids = np.concatenate([a_prompt, a_out])
    drafts = drafter.propose([RowInput(a_ids), RowInput(b_ids)])
    b_draft = drafts[1]
    assert b_draft == a_out[10:10 + len(b_draft)].tolist() and len(b_draft) >= 2
    assert drafter.pending_draft(1).source == "suffix"
    assert "<tool_call>" not in tok.decode(b_draft)  # the reasoning segment ends at the marker
    assert drafter.stats()["suffix_chosen"] >= 1


def test_structure_drafter_without_trees_when_the_plan_says_so(tok):
    drafter = StructureDrafter(DraftPlan(tools=[]), tok, lab=LabSwitches(suffix_trees=False))
    assert drafter.trees is None and drafter.stats()["suffix_trees"] is False


def test_budget_prices_each_token_by_its_own_confidence(tok):
    drafter = StructureDrafter(DraftPlan(tools=[], learn_delta=False, delta=0.3), tok)
    confident = Candidate([1, 2, 3, 4], ["suffix"] * 4, "reasoning", "R", [0.95, 0.95, 0.9, 0.2])
    weak = Candidate([5, 6, 7], ["suffix"] * 3, "reasoning", "R", [0.25, 1.0, 1.0])
    sizes = [len(d) for d in drafter.sizer.size([confident, weak])]
    price = drafter.price
    # a token is sent while the product of confidences up to it pays its price (at this step's rows)
    from agentspec_sdk.drafting.budget import batch_price

    p = batch_price(price, 2)
    want_confident = int(np.sum(np.cumprod([0.95, 0.95, 0.9, 0.2]) >= p))
    want_weak = int(np.sum(np.cumprod([0.25, 1.0, 1.0]) >= p))
    assert sizes == [want_confident, want_weak]
    assert sizes[0] == 3 and sizes[1] == 0


def test_expected_value_compares_tree_and_learned_candidates(tok):
    drafter = StructureDrafter(DraftPlan(tools=[]), tok)
    tree = Candidate([1, 2], ["suffix", "suffix"], "reasoning", "R", [0.9, 0.9])
    assert drafter.estimates.expected(tree) == pytest.approx(0.9 + 0.81)
    lookup = Candidate([1, 2, 3], ["lookup"] * 3, "reasoning", "R")
    a = drafter.accounting.acceptance.alpha("R", "lookup")
    assert drafter.estimates.expected(lookup) == pytest.approx(a + a * a + a ** 3)


def _two_agents(tok, plan: DraftPlan, then: str = "<tool_call>", left: int = 4):
    """Row A writes a sentence and `then` (opens a tool call); row B begins the same sentence and has
    `left` tokens of it to write: B's draft."""
    drafter = StructureDrafter(plan, tok)
    said = " First we book the train to Lyon, then the hotel near the station."
    a_prompt = _history(tok, "")
    a_out = np.array(tok.encode(said + then), dtype=np.int64)
    for n in range(0, len(a_out) + 1, 4):
        drafter.propose([RowInput(np.concatenate([a_prompt, a_out[:n]]))])
    drafter.propose([RowInput(np.concatenate([a_prompt, a_out]))])
    msgs = [{"role": "system", "content": "Think, then call tools as <tool_call>{...}</tool_call>."},
            {"role": "user", "content": "Another user, another request entirely."}]
    b_prompt = tok.encode(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
    at = len(tok.encode(said)) - left  # `left` tokens of the sentence left, then the marker
    b_ids = np.array(b_prompt + a_out[:at].tolist(), dtype=np.int64)
    drafts = drafter.propose([RowInput(np.concatenate([a_prompt, a_out])), RowInput(b_ids)])
    return drafts[1], drafter.pending_draft(1), a_out[at:].tolist()


def test_boundary_price_switch(tok):
    """boundary "wall": B's draft stops where its reasoning segment ends. boundary "price": the tree's
    tokens past the end (the `<tool_call>` A wrote next) stay in the candidate as source "cross",
    worth their confidence times the class's learned acceptance (here the prior, R 0.45), and are
    sent where that pays: at delta 0.02 (price 0.04 per row of 2) they are, at delta 0.3 (0.46) not."""
    wall, wall_pending, truth = _two_agents(tok, DraftPlan(tools=[], learn_delta=False, boundary="wall"))
    assert "<tool_call>" not in tok.decode(wall) and "cross" not in wall_pending.sources
    cheap, pending, _ = _two_agents(tok, DraftPlan(tools=[], learn_delta=False, boundary="price",
                                                   delta=0.02))
    assert cheap == truth[:len(cheap)] and len(cheap) > len(wall)
    assert "<tool" in tok.decode(cheap) and "cross" in pending.sources
    assert pending.sources[:len(wall)] == ["suffix"] * len(wall)
    dear, dear_pending, _ = _two_agents(tok, DraftPlan(tools=[], learn_delta=False, boundary="price",
                                                       delta=0.3))
    assert dear == wall and "cross" not in dear_pending.sources
    with pytest.raises(Exception, match="boundary"):
        DraftPlan(boundary="open")


def test_extension_past_the_spec_factor_is_priced(tok):
    """B has written 3 tokens of A's sentence: the global tree matches those 3, so suffix's spec factor
    1 drafts 3 tokens; the extension (factor 2) adds the next 3 as source "extend", worth their
    confidence times the learned acceptance of (R, "extend") (here the prior, 0.45), sent where that
    pays: at delta 0.02 they are, at delta 0.3 not; with no extension factor, never."""
    left = len(tok.encode(" First we book the train to Lyon, then the hotel near the station.")) - 3
    cheap, pending, truth = _two_agents(tok, DraftPlan(tools=[], learn_delta=False, delta=0.02), left=left)
    assert pending.sources == ["suffix"] * 3 + ["extend"] * 3 and cheap == truth[:6]
    dear, dear_pending, _ = _two_agents(tok, DraftPlan(tools=[], learn_delta=False, delta=0.3), left=left)
    assert dear == truth[:3] and dear_pending.sources == ["suffix"] * 3
    off, off_pending, _ = _two_agents(tok, DraftPlan(tools=[], learn_delta=False, suffix_extend_factor=None),
                                      left=left)
    assert off == truth[:3] and off_pending.sources == ["suffix"] * 3
    with pytest.raises(Exception, match="suffix_extend_factor"):
        DraftPlan(suffix_extend_factor=-1)


def test_the_row_choice_weighs_the_tree_without_its_extension(tok):
    """Loss cause (code_agent, issue 21): weighed with its `extend` tokens a tree draft won rows where
    the row's own lookup was accepted further. The choice weighs the tree as suffix would draft it;
    the extension only lengthens a tree draft that won."""
    drafter = StructureDrafter(DraftPlan(tools=[], learn_delta=False), tok)
    tree = Candidate([1, 2, 3, 4, 5, 6], ["suffix"] + ["extend"] * 5, "code", "R", [0.5] + [1.0] * 5)
    own = Candidate([7, 8, 9], ["lookup"] * 3, "code", "R", [0.9, 0.9, 0.9])
    choice, price = _sources(drafter, own, tree)
    worth = drafter.estimates.worth
    assert worth(tree, price) > worth(own, price)  # the whole tree draft would have won
    row = SimpleNamespace(fmt=CODE_AGENT, contest=None)  # a code agent's row (its kinds' rules)
    assert choice.choose(row, price) is own
    better = Candidate([1, 2, 3, 4, 5], ["suffix"] * 3 + ["extend"] * 2, "code", "R", [1.0] * 5)
    choice.tree = SimpleNamespace(candidate=lambda st, note=None: better)
    assert choice.choose(row, price) is better  # won on suffix's own tokens: sent with its extension


def _sources(drafter, own, tree):
    """The drafter's row choice with its sources giving `own` and `tree`, and a row's price (0)."""
    choice = drafter.choice
    choice.own = SimpleNamespace(candidate=lambda st, price: (own, None))
    choice.tree = SimpleNamespace(candidate=lambda st, note=None: tree)
    return choice, 0.0


def test_the_row_choice_learns_its_bias_from_the_tokens_revealed(tok):
    """A wrong choice moves the bias of own's (kind, source) one step toward the candidate passed
    over (judged on the tokens the target wrote after the draft), until the choice flips; a right
    choice or a tie leaves it; `learn_choice: false` compares the worths as they are."""
    from agentspec_sdk.drafting.choice import CHOICE_STEP

    drafter = StructureDrafter(DraftPlan(tools=[], learn_delta=False), tok)
    tree = Candidate([1, 2, 3], ["suffix"] * 3, "code", "R", [1.0, 0.5, 0.5])
    own = Candidate([1, 7, 8, 9], ["lookup"] * 4, "code", "R", [0.6] * 4)
    choice, price = _sources(drafter, own, tree)
    choices = drafter.choices
    gap = drafter.estimates.worth(tree, price) - drafter.estimates.worth(own, price)
    assert gap > 0
    row = SimpleNamespace(fmt=CODE_AGENT, contest=None)
    key = ("code", "lookup")
    choices.judge((key, True, [1, 7]), 1, [1, 2, 5])  # a tie at 1 token: no move
    assert key not in choices.bias
    flips = 0
    while choice.choose(row, price) is tree and flips < 100:  # the target writes own's tokens: a wrong pick
        assert row.contest == (key, True, [1, 7, 8, 9])  # own as the budget would send it
        choices.judge(row.contest, 1, [1, 7, 8, 9, 4])
        flips += 1
    assert flips == int(gap // CHOICE_STEP) + 1 and choices.bias[key] > gap
    assert row.contest == (key, False, [1, 2, 3])
    assert drafter.stats()["choice_bias"]["code/lookup"] == pytest.approx(choices.bias[key], abs=1e-3)
    before = choices.bias[key]
    choices.judge(row.contest, 4, [1, 7, 8, 9, 4])  # own chosen and right: no move
    assert choices.bias[key] == before
    choices.judge(row.contest, 1, [1, 2, 3, 4])  # own chosen, the tree went further
    assert choices.bias[key] == pytest.approx(before - CHOICE_STEP)
    off = StructureDrafter(DraftPlan(tools=[], learn_delta=False), tok, lab=LabSwitches(learn_choice=False))
    off.choices.bias[key] = 10.0
    off_choice, _ = _sources(off, own, tree)
    row = SimpleNamespace(fmt=CODE_AGENT, contest=None)
    assert off_choice.choose(row, price) is tree and row.contest is None


def test_a_draft_never_ends_with_the_turn_end(tok):
    """Accepted, a trailing turn end saves nothing (the target's own token in the same pass ends the
    turn too): the tree's draft that ends the turn loses its last token, with any boundary."""
    for boundary in ("wall", "price"):
        draft, pending, truth = _two_agents(tok, DraftPlan(tools=[], learn_delta=False, boundary=boundary),
                                            then="<|im_end|>")
        assert truth[-1] == 2 and draft == truth[:len(draft)] and draft and 2 not in draft


def test_prompt_trees_built_on_builder_threads_draft_as_trees_built_inline():
    """Rows started with `defer` (the drafter's way) get their long prompt trees from builder threads
    while the caller goes on; a step waits for them: the same drafts, step after step, as trees built
    on the caller's thread, and the builders' CPU is counted apart."""
    from agentspec_sdk.drafting._trees import Forest

    from agentspec_sdk.drafting import suffix_source

    rng = np.random.default_rng(1)
    threaded, inline = SuffixTrees(build_threads=2), SuffixTrees(build_threads=0)
    cpu_before = Forest.build_cpu_seconds()
    histories = [rng.integers(0, 30, size=int(rng.integers(suffix_source.MIN_BUILT, 1500)))
                 for _ in range(12)]
    keys = [[t.start(h, 1, defer=True) for h in histories] for t in (threaded, inline)]
    assert all(threaded.forest.active(k) for k in keys[0])
    for _ in range(5):
        none = np.zeros(0, dtype=np.int32)
        asks = [[t.request(k, none, h, 1, 8, 1.0, 0.1, 2.0) for k, h in zip(ks, histories, strict=True)]
                for t, ks in zip((threaded, inline), keys, strict=True)]
        drafted = [t.step(a) for t, a in zip((threaded, inline), asks, strict=True)]
        assert drafted[0] == drafted[1] and any(d[0] for d in drafted[0])
        gained = [rng.integers(0, 30, size=3) for _ in histories]
        histories = [np.concatenate([h, g]) for h, g in zip(histories, gained, strict=True)]
        for t, ks in zip((threaded, inline), keys, strict=True):
            t.step([t.request(k, g, h, 0) for k, g, h in zip(ks, gained, histories, strict=True)])
    assert Forest.build_cpu_seconds() > cpu_before


def test_builder_threads_are_set_by_the_environment(monkeypatch):
    import os

    from agentspec_sdk.drafting import suffix_source
    from agentspec_sdk.errors import PlanError

    monkeypatch.setenv(suffix_source.BUILDERS_ENV, "3")
    assert suffix_source._build_threads() == 3
    monkeypatch.setenv(suffix_source.BUILDERS_ENV, "many")
    with pytest.raises(PlanError, match="AGENTSPEC_TREE_BUILDERS='many'"):
        SuffixTrees()
    monkeypatch.delenv(suffix_source.BUILDERS_ENV)
    assert suffix_source._build_threads() == min(4, (os.cpu_count() or 1) // 4)
