"""Regression tests of the loss causes `benchmarks/offline_drafting.py --explain` found where boundary
"price" lost to "wall" (bundled tool_calls, code_agent, long_context), each on captured turns (offline,
no engine): replaying the captured group with boundary "price" must cost no more than with "wall"
(cost = passes + 0.05 drafted, grammar-trimmed greedy verification), and the mechanism must be gone.

tests/data/tool_calls.capture.jsonl: 18 turns of the bundled arm-D capture (SmolLM2-135M, temperature 0;
`GROUPS` names which turns replay together, in the batch they were replayed in)."""

import pytest
from captured_turns import captured as captured_set
from captured_turns import offline_drafting

# the turns of tool_calls.capture.jsonl that replay together (indexes in capture order)
GROUPS = {"end_token": [0, 1], "forced_then_tree": list(range(2, 10)), "priced_choice": list(range(10, 18))}
DELTA = 0.05
# The drafter's prior when these causes were found (2026-12-01 to 03): delta 0.02 at a fixed 1.5k-token
# reference, about 0.005 a token for one sequence on these short prompts. The prior is now 0.04 at each
# step's own mean context (docs/drafting.md); the mechanisms are checked at the price they were found at.
FOUND_AT = {"delta": 0.02, "ctx_ref": 1500}


@pytest.fixture(scope="module")
def offline():
    return offline_drafting()


@pytest.fixture(scope="module")
def captured():
    return captured_set("tool_calls")


def _replay(offline, data, group: str, boundary: str, batch: int):
    """(row, explain notes of every step) of the structure drafter on one captured group."""
    turns = [dict(data["turns"][i]) for i in GROUPS[group]]
    structure = offline.structure_drafter(8, data["tools"], explain=True, boundary=boundary, **FOUND_AT)
    notes = []

    def keep(drafts, truth, key=None, index=0):
        notes.append(structure.notes[index] if index < len(structure.notes) else {})
        return 0

    def nothing(histories):
        return [[] for _ in histories]

    row = offline.simulate(turns, (structure, nothing), batch, trim=offline.GrammarTrim(data["grammars"]),
                           choose=keep)
    return row, notes, structure.drafter


def _cost(row) -> float:
    return row["passes"] + DELTA * row["drafted"]


def test_no_draft_runs_through_the_turn_end(offline, captured):
    """Cause "turn end inside a draft": a tree draft priced past `</tool_call>` went on with
    `<|im_end|>` (the turn's end: accepted, it saves nothing, and the turn is over after it). Only
    trailing end tokens were dropped; a draft that ended `</tool_call><|im_end|>` after the grammar
    trim still paid for it (turns 66 and 70: 140 drafted tokens against the wall's 138)."""
    wall, _, _ = _replay(offline, captured, "end_token", "wall", batch=2)
    price, notes, drafter = _replay(offline, captured, "end_token", "price", batch=2)
    assert not any(drafter.end_ids.intersection(n.get("sent") or []) for n in notes)
    assert not any(n.get("chosen") is not None and drafter.end_ids.intersection(n["chosen"].tokens)
                   for n in notes)
    assert price["drafted"] <= wall["drafted"] and _cost(price) <= _cost(wall)


def test_tree_tokens_inside_the_segment_are_not_priced_as_crossing(offline, captured):
    """Cause "forced text continued in-segment as cross": after forced `first_name":"` the tree's
    in-segment guess `Michael","last_` was appended as source `cross` (turn 52: 4 tokens verified
    and rejected). Own is continued only where it ends at its segment's end: in a tool call, a
    draft's `cross` tokens come right after `</tool_call>`."""
    wall, _, _ = _replay(offline, captured, "forced_then_tree", "wall", batch=8)
    price, notes, drafter = _replay(offline, captured, "forced_then_tree", "price", batch=8)
    for n in notes:
        chosen = n.get("chosen")
        if chosen is None or "cross" not in chosen.sources or chosen.source in ("suffix", "cross"):
            continue
        first = chosen.sources.index("cross")
        before = b"".join(drafter.token_bytes[t] for t in chosen.tokens[:first]).decode("utf-8", "replace")
        assert before.endswith("</tool_call>"), before
    # what the cause cost was rejected tokens: "price" verifies no more of them than "wall". Since the
    # replay hands each finished turn's last tokens to the trees (as vLLM does), the two trees differ
    # later in this group by one pass (139 against 138, 392 drafted against 398): tree content, no rule
    assert price["drafted"] - price["accepted"] <= wall["drafted"] - wall["accepted"]
    assert price["passes"] <= wall["passes"] + 1


def test_source_choice_weighs_what_the_budget_sends(offline, captured):
    """Cause "tree chosen for tokens the budget withholds": priced past the segment end, a tree draft
    (`tool` + `call>` as cross) outweighed own's lookup `tool_call` by expected length, then the
    budget sent only `tool` (turn 15: one pass more). The choice now weighs each candidate by the
    tokens the budget would send at this step's price (turns 8-15: price 45.05 against wall 44.15
    before)."""
    wall, _, _ = _replay(offline, captured, "priced_choice", "wall", batch=8)
    price, notes, drafter = _replay(offline, captured, "priced_choice", "price", batch=8)
    assert _cost(price) <= _cost(wall)
    worth, at = drafter.estimates.worth, float(drafter.sizer.step_prices[-1])  # the last row's price
    for n in notes:  # a chosen tree draft is worth at least own's, as sent
        own, tree = n.get("own"), n.get("tree")
        if n.get("rule") == "tree" and own is not None:
            assert worth(tree, at) > worth(own, at)


def test_worth_counts_only_the_tokens_the_budget_sends(offline, captured):
    from agentspec_sdk.drafting.rows import Candidate

    drafter = offline.structure_drafter(8, [], boundary="price").drafter
    tree = Candidate([1, 2, 3], ["suffix", "cross", "cross"], "reasoning", "R", [0.9, 0.2, 0.9])
    # at a row price of 0.3, 0.9 is sent; 0.9 * 0.2 = 0.18 < 0.3 is not, nor anything after it
    assert drafter.estimates.worth(tree, 0.3) == pytest.approx(0.9)
    assert drafter.estimates.expected(tree) == pytest.approx(0.9 + 0.18 + 0.162)




def test_acceptance_is_learned_per_segment_kind_on_code_turns(offline):
    """Cause "one class, two kinds" (code_agent: `reasoning` and `code` are both class R): a lookup in
    the code block copies the task's signature and docstring and is accepted whole, a lookup in the
    reasoning copies prose and is rejected. Learned over the class, the code block's lookups made
    the reasoning's 8 tokens long (31 captured turns: 806.0 against 793.9 before turn-end tokens were
    cut, which had hidden it: first-token `<|im_end|>` lookups, grammar-trimmed to nothing, counted as
    rejections). Keyed by (class, source, kind), the two are priced apart (780.1 against 784.8 since
    the estimates are calibrated per kind as well, `law.OnlineCalibration`)."""
    from agentspec_sdk.law.estimators import OnlineAcceptance

    data = captured_set("code")

    def replay():  # 3-character matches in code too, as when this cause was found
        structure = offline.structure_drafter(8, data["tools"], lookup_min_chars_code=3, **FOUND_AT)
        row = offline.simulate([dict(t) for t in data["turns"]], structure, 8,
                               trim=offline.GrammarTrim(data["grammars"]))
        return row, structure.drafter.accounting.acceptance

    keyed, acc = replay()
    assert acc.alpha("R", "lookup", "code") > acc.alpha("R", "lookup", "reasoning") + 0.2
    alpha = OnlineAcceptance.alpha
    try:  # the same replay with the acceptance pooled over kinds (the class's, as before)
        OnlineAcceptance.alpha = lambda self, cls, source=None, kind=None: alpha(self, cls, source)
        pooled, _ = replay()
    finally:
        OnlineAcceptance.alpha = alpha
    assert _cost(keyed) < _cost(pooled) - 3


def test_short_matches_in_code_are_not_continued(offline):
    """Cause "lookup rejected" (code_agent, the largest pay class: 84 steps, 421 tokens verified and
    rejected): a lookup continued after a 3-7 character match inside a code block (`(self`, `    re`:
    fragments with many continuations) was accepted 9-24% of the time, after 8+ characters 42-80%.
    Inside code (segment kinds of content "code") a lookup now needs 6 characters; the reasoning and
    every other format keep 3. On the 31 captured HumanEval turns that drafts fewer tokens in fewer or
    equal passes (784.2 → 770.7 in the benchmark's replay)."""
    from agentspec_sdk.drafting.plan import DraftPlan, PlanError

    data = captured_set("code")

    def replay(**fields):
        structure = offline.structure_drafter(8, data["tools"], **{**FOUND_AT, **fields})
        return offline.simulate([dict(t) for t in data["turns"]], structure, 8,
                                trim=offline.GrammarTrim(data["grammars"]))

    assert DraftPlan(formats=["code_agent"]).lookup_min_chars_code == 6
    code6, code3 = replay(), replay(lookup_min_chars_code=3)
    assert code6["drafted"] < code3["drafted"] - 150 and code6["passes"] <= code3["passes"]
    assert _cost(code6) < _cost(code3) - 8
    with pytest.raises(PlanError, match="lookup_min_chars_code: Input should be greater than or equal to 1"):
        DraftPlan(formats=["code_agent"], lookup_min_chars_code=0)


def test_the_row_choice_is_learned_from_which_source_went_further(offline):
    """Cause "tree chosen" (code_agent at b 1, issue 21: 39 steps, 162 tokens at γ 16 against suffix
    tuned): the row chose the tree where its own lookup was accepted further, because a lookup's
    learned acceptance is learned only on the rows it wins, the ones where the tree was weak (0.73
    at b 1 against 0.95 at b 8 on the same turns). The choice now learns a bias per (kind, source)
    from which of the two the target's tokens show went further. On the 31 captured HumanEval turns
    at b 1 (agents schedule): 747.1 → 731.7 at γ 16, 816.1 → 805.8 at γ 8; the bias favoured the
    lookups in code and in the reasoning. With the estimates calibrated per depth
    (`law.OnlineCalibration`, which prices a lookup's weak first token) 818.5 → 802.7 at γ 8: the bias
    still favours the reasoning's lookups, the code block's are near even."""
    data = captured_set("code")

    def replay(**fields):
        structure = offline.structure_drafter(8, data["tools"], **{**FOUND_AT, **fields})
        row = offline.simulate([dict(t) for t in data["turns"]], structure, 1,
                               trim=offline.GrammarTrim(data["grammars"]), schedule="agents")
        return row, structure.drafter.choices.bias

    learned, bias = replay()
    fixed, none = replay(learn_choice=False)
    assert none == {}
    assert ("code", "lookup") in bias and bias[("reasoning", "lookup")] > 0
    assert _cost(learned) < _cost(fixed) - 6 and learned["passes"] < fixed["passes"]
