"""The offline drafter replay (benchmarks/offline_drafting.py): simulated greedy verification and the
oracle bound it reports next to the drafters."""

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "offline_drafting.py"
DATA = SCRIPT.parents[1] / "tests" / "data"


@pytest.fixture(scope="module")
def offline():
    spec = importlib.util.spec_from_file_location("offline_drafting", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _turns(lengths):
    rng = np.random.default_rng(0)
    return [{"prompt": [1, 2, 3], "out": rng.integers(10, 1000, n).tolist()} for n in lengths]


@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_oracle_needs_one_pass_per_gamma_plus_one_tokens(offline, gamma):
    lengths = [1, 2, 9, 10, 30]
    row = offline.simulate(_turns(lengths), None, batch=2, gamma=gamma)
    # the first token comes from the prefill; every pass then accepts gamma drafted tokens plus one
    assert row["passes"] == sum(math.ceil((n - 1) / (gamma + 1)) for n in lengths)
    assert row["accepted"] == row["drafted"]


def test_no_draft_is_one_pass_per_token(offline):
    lengths = [5, 7]
    row = offline.simulate(_turns(lengths), lambda histories: [[] for _ in histories], batch=8)
    assert row == {"passes": sum(n - 1 for n in lengths), "drafted": 0, "accepted": 0}


def test_a_wrong_draft_token_ends_the_accepted_prefix(offline):
    turn = {"prompt": [1], "out": [5, 6, 7, 8, 9]}

    def propose(histories):  # right, right, wrong, right
        rest = turn["out"][len(histories[0]) - 1:]
        return [rest[:2] + [0] + rest[3:4]]

    row = offline.simulate([turn], propose, batch=1)
    # pass 1 drafts 6 7 0 9: 6, 7 accepted, the target writes 8; pass 2 drafts 9 0: 9 accepted
    assert row == {"passes": 2, "drafted": 6, "accepted": 3}


def test_a_finished_rows_last_tokens_reach_the_drafter_once(offline):
    """Loss cause "last step" (a harness asymmetry): vLLM calls the proposer after every pass with
    every row of it, a row that has just finished included, so structure's trees learn each turn's
    last tokens as suffix's `retire` does. The replay does the same: each turn's whole output is seen
    once, its draft dropped (no pass, nothing drafted), the other rows keep their places."""
    turns = _turns([4, 9])
    seen = []

    def propose(histories):
        seen.append([tuple(h) for h in histories])
        return [[] for _ in histories]

    row = offline.simulate(turns, propose, batch=2)
    assert row == {"passes": 3 + 8, "drafted": 0, "accepted": 0}
    full = [tuple(t["prompt"] + t["out"]) for t in turns]
    assert sum(step.count(full[0]) for step in seen) == 1 and seen[-1] == [full[1]]
    # turn 0 finished in the third pass: the next call has it after the active row, then it is gone
    assert seen[3] == [full[1][:3 + 4], full[0]] and len(seen[4]) == 1


def test_agents_schedule_starts_a_turn_after_its_episodes_previous_one(offline):
    """Loss of fidelity "lockstep copies" (found on the demo's D-code turns, where later turns repeat
    earlier ones word for word): replayed 8 at a time ("groups"), a turn ran beside its own episode's
    earlier turn and drafted its repeat from the trees while both were written (structure accepted 244
    and suffix 245 of 282 tokens, the engine 205 and 208). "agents" starts a turn once a row is free
    and its predecessor (the turn whose prompt begins its prompt) has finished, as the engine's agents
    do (207 and 208)."""
    first = {"prompt": [1, 2], "out": [5, 6, 7, 8]}
    second = {"prompt": [1, 2, 5, 6, 7, 8, 9], "out": [5, 6, 7, 8]}  # the episode's next turn
    other = {"prompt": [3, 4], "out": [10, 11, 12]}
    turns = [first, other, second]
    assert offline.predecessors(turns) == [None, None, 0]
    together = []

    def propose(histories):
        together.append(len(histories))
        return [[] for _ in histories]

    offline.simulate(turns, propose, batch=8, schedule="agents")
    # first and other start together; second only once first is done (then first is seen a last time)
    assert together[0] == 2 and max(together) == 2
    groups = offline.simulate(turns, lambda h: [[] for _ in h], batch=8, schedule="groups")
    agents = offline.simulate(turns, lambda h: [[] for _ in h], batch=8, schedule="agents")
    assert groups == agents == {"passes": 3 + 2 + 3, "drafted": 0, "accepted": 0}
    with pytest.raises(ValueError, match="schedule must be one of"):
        offline.simulate(turns, None, batch=8, schedule="fifo")


def test_grammar_trim_keeps_the_prefix_the_turn_grammar_allows(offline):
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model())
    out = tok.encode("hello world, hello moon", add_special_tokens=False)
    turn = {"prompt": [1], "out": out, "grammar": 0}
    trim = offline.GrammarTrim(['start: "hello world, hello " ("moon" | "sun")'])
    good = tok.encode(" hello moon", add_special_tokens=False)
    at = len(tok.encode("hello world,", add_special_tokens=False))
    assert tok.decode(out[:at]) + tok.decode(good) == "hello world, hello moon"
    assert trim(turn, at, good) == good
    bad = tok.encode(" hello mars", add_special_tokens=False)
    kept = trim(turn, at, bad)
    assert kept == bad[: len(kept)] and tok.decode(kept) == " hello"
    assert offline.GrammarTrim([])({"prompt": [1], "out": out}, 0, bad) == bad  # no grammar captured


def test_suffix_row_on_a_copied_prompt(offline):
    """The output copies the prompt: vLLM's suffix proposer drafts at most match-length tokens (spec
    factor 1), so drafts grow 1, 3, 7, then gamma; the request's own tree is prompt + response."""
    prompt = list(range(100, 140))
    turn = {"prompt": prompt, "out": list(prompt)}
    row = offline.simulate([turn], offline.SuffixDrafter(8), batch=1)
    # steps at positions 1, 3, 7, 15, 24, 33; the last draft runs past the prompt's end into 100
    assert row == {"passes": 6, "drafted": 1 + 3 + 7 + 8 + 8 + 8, "accepted": 1 + 3 + 7 + 8 + 8 + 7}
    same = offline.simulate([dict(turn)], offline.SuffixTrees(8), batch=1)
    assert same == row


def test_suffix_global_tree_carries_responses_across_requests(offline):
    rng = np.random.default_rng(1)
    out = rng.integers(1000, 2000, 40).tolist()
    turns = [{"prompt": [1, 2, 3], "out": out}, {"prompt": [4, 5, 6], "out": list(out)}]
    full = offline.simulate(turns, offline.SuffixDrafter(8), batch=1)
    assert offline.simulate(turns, offline.SuffixTrees(8), batch=1) == full
    # one row at a time
    assert offline.simulate(turns, offline.SuffixTrees(8, share="finished"), batch=1) == full
    own = offline.simulate(turns, offline.SuffixTrees(8, share="none"), batch=1)
    # random tokens never recur inside one request: only the second request, from the global tree, drafts
    assert own == {"passes": 2 * 39, "drafted": 0, "accepted": 0}
    assert full["passes"] < 39 + 39 // 2 and full["accepted"] > 25
    keyed = offline.simulate(turns, offline.SuffixTrees(8, key=lambda prompt: int(prompt[0])), batch=1)
    assert keyed == own  # different prompts, different trees: nothing shared


def test_suffix_confidence_cut_drops_the_unlikely_tail(offline):
    assert offline._cut([5, 6, 7, 8], [0.9, 0.6, 0.3, 0.1], 0.5) == [5, 6]
    assert offline._cut([5, 6], [0.9, 0.6], 0.0) == [5, 6]


def test_union_longer_and_bound(offline):
    turn = {"prompt": [1], "out": list(range(10, 30))}

    def right(histories):  # two correct tokens
        return [turn["out"][len(h) - 1:len(h) + 1] for h in histories]

    def wrong(histories):  # four wrong tokens
        return [[0, 0, 0, 0] for _ in histories]

    longer = offline.simulate([turn], (right, wrong), batch=1, choose=offline.longer)
    assert longer == {"passes": 19, "drafted": 4 * 19, "accepted": 0, "picks": [0, 19]}
    bound = offline.simulate([dict(turn)], (wrong, right), batch=1, choose=offline.better)
    # 19 tokens after the first: passes accept 2 + 1 each; the last pass has one token left to write
    assert bound["picks"] == [0, 7] and bound["passes"] == 7 and bound["accepted"] == 6 * 2 + 1
    assert offline.better([[1, 2], [1, 2, 9]], [1, 2, 3]) == 0  # same accepted: the shorter draft


def test_expected_gain_sends_what_pays_and_learns_structure_acceptance(offline):
    structure = offline.StructureCall.__new__(offline.StructureCall)
    structure.classes = ["S"]
    suffix = offline.SuffixDrafter.__new__(offline.SuffixDrafter)
    suffix.probs = {7: [0.9, 0.8, 0.1]}
    choose = offline.ExpectedGain(structure, suffix, delta=0.2)
    truth = [1, 2, 3, 4]
    # prior a = 0.5: structure gains 0.3 + 0.05 with two tokens (a**3 = 0.125 <= delta);
    # suffix gains 0.7 + 0.6 with two tokens (0.1 <= delta is not sent): suffix, two tokens
    assert choose([[1, 2, 3], [1, 2, 9]], truth, key=7, index=0) == (1, 2)
    # the target revealed 3 tokens; the structure draft agreed with all 3 it had: S learns 3 hits, no miss
    assert choose.counts["S"] == [4, 1]
    # a = 0.8 now: 0.8 + 0.64 + 0.512 - 0.6 = 1.352 > suffix's 1.3: structure, all three tokens
    assert choose([[1, 2, 3], [1, 2, 9]], truth, key=7, index=0) == (0, 3)
    suffix.probs = {7: []}
    structure.classes = ["R"]
    choose.counts["R"] = [1, 9]  # a = 0.1 <= delta: nothing pays, no draft
    assert choose([[5, 6], []], truth, key=7, index=0) == (0, 0)
    assert choose.counts["R"] == [1, 10]


def test_per_class_split_by_the_token_a_draft_began_at(offline):
    turn = {"prompt": [1], "out": [5, 6, 7, 8, 9], "classes": "SSSRR"}

    def propose(histories):  # right, right, wrong, right
        rest = turn["out"][len(histories[0]) - 1:]
        return [rest[:2] + [0] + rest[3:4]]

    row = offline.simulate([turn], propose, batch=1)
    # pass 1 starts at out[1] (S): drafts 6 7 0 9, 2 accepted;
    # pass 2 starts at out[4] (R): drafts 9 0, 1 accepted
    assert row["by_class"] == {"R": {"passes": 1, "drafted": 2, "accepted": 1},
                               "S": {"passes": 1, "drafted": 4, "accepted": 2}}
    assert (row["passes"], row["drafted"], row["accepted"]) == (2, 6, 3)


def test_label_turns_classifies_a_tool_call_as_schema(offline):
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model())
    out = tok.encode('<tool_call>{"name":"ls","arguments":{}}</tool_call>', add_special_tokens=False)
    turns = [{"prompt": [1], "out": out}]
    offline.label_turns(turns)
    assert len(turns[0]["classes"]) == len(out) and set(turns[0]["classes"]) == {"S"}


@pytest.fixture(scope="module")
def react_turns(offline):
    data = offline.load_turns(DATA / "react.capture.jsonl")
    offline.label_turns(data["turns"])
    return data


def _explained(offline, data, boundary):
    structure = offline.structure_drafter(8, data["tools"], explain=True, boundary=boundary)
    explainer = offline.Explainer(structure, data["turns"], "bundled")
    row = offline.simulate(data["turns"], (structure, offline.SuffixDrafter(8)), batch=8, choose=explainer)
    lost = {}
    for r in explainer.rows:
        if r["kind"] == "loss":
            lost[r["cause"]] = lost.get(r["cause"], 0) + r["tokens"]
    return row, lost


def test_segment_cut_loss_on_captured_react_turns(offline, react_turns):
    """The loss cause --explain found first on ReAct (suffix's draft runs through `Action:` / `Action
    Input:` / the next Thought line, and the wall cuts it): on 8 captured turns the wall loses
    accepted tokens to it; pricing the tokens past the boundary (boundary "price") recovers most of
    them and needs fewer passes."""
    wall, wall_lost = _explained(offline, react_turns, "wall")
    price, price_lost = _explained(offline, react_turns, "price")
    assert wall_lost.get("segment cut", 0) >= 20
    assert price_lost.get("segment cut", 0) <= wall_lost["segment cut"] / 3
    assert price["passes"] < wall["passes"]
    # the explainer never changes what is drafted: the row is the structure drafter's own
    alone = offline.structure_drafter(8, react_turns["tools"], boundary="wall")
    plain = offline.simulate(react_turns["turns"], alone, batch=8)
    assert (plain["passes"], plain["drafted"], plain["accepted"]) == \
        (wall["passes"], wall["drafted"], wall["accepted"])


def test_the_rate_rule_sends_fewer_tail_tokens_on_captured_code_turns(offline):
    """The budget's "rate" rule (drafting.budget.TokenRate) on the 31 captured HumanEval turns, γ 16,
    b 8, the drafter priced at δ 0.2 per row of the pass as the cost counts it: it withholds the
    tail tokens the "value" rule sends (worth their price at one token per pass, not at the run's
    tokens per pass) and costs less at that δ (offline: 1215 against 1237; 1221 against 1275 before
    the estimates were calibrated, which withholds part of that tail under "value" too)."""
    data = offline.load_turns(DATA / "code.capture.jsonl")
    offline.label_turns(data["turns"])
    delta, batch = 0.2, 8
    r = delta / (batch * (1 - delta))  # the one-sequence price whose batch price at 8 rows is delta
    rows = {}
    for rule in ("value", "rate"):
        drafter = offline.structure_drafter(16, data["tools"], budget_rule=rule, delta=r / (1 + r),
                                            delta_ctx=0.0)
        rows[rule] = offline.simulate(data["turns"], drafter, batch,
                                      trim=offline.GrammarTrim(data["grammars"]), schedule="agents")
        rows[rule]["token_rate"] = drafter.drafter.rate.value()
    value, rate = rows["value"], rows["rate"]
    assert rate["drafted"] < 0.95 * value["drafted"]
    assert rate["passes"] + delta * rate["drafted"] < 0.99 * (value["passes"] + delta * value["drafted"])
    assert rate["token_rate"] > 1.5  # what it learned: tokens per unit of pass cost on these turns


@pytest.mark.parametrize("batch", [1, 2, 8])
@pytest.mark.parametrize("delta", [0.0, 0.05, 0.2])
def test_the_replay_prices_the_drafter_as_its_cost_charges(offline, batch, delta):
    """The structure rows are priced at the cost's delta per row of the replay's batch (the engine's
    drafter learns its price from the passes; a replay has none): the plan's prior does not move them."""
    from agentspec_sdk.drafting.budget import batch_price
    from agentspec_sdk.errors import LawInputError

    fields = offline.priced(delta, batch)
    assert fields["delta_ctx"] == 0.0
    assert batch_price(fields["delta"], batch) == pytest.approx(delta)
    with pytest.raises(LawInputError, match="per-row price must be in"):
        offline.priced(1.0, batch)


def test_a_tree_passed_over_for_an_untokenized_lookup_is_a_source_choice(offline):
    """`--explain`: a row where the tree lost to a lookup not worth sending (the drafter's rule
    "unpaid", nothing drafted) and the tree would have been accepted is a loss of the source choice."""
    from agentspec_sdk.drafting.rows import Candidate

    tree = Candidate([1, 2, 3], ["suffix"] * 3, "thought", "R", [0.9, 0.8, 0.3])
    lost = {"chosen": None, "own": None, "tree": tree, "rule": "unpaid", "sent": [], "tree_raw": tree.tokens}
    assert offline.loss_cause(lost, [1, 2, 3, 4], 2) == ("source choice", "lookup")
    assert offline.loss_cause(dict(lost, rule="own"), [1, 2, 3, 4], 2)[0] != "source choice"


def test_a_capture_becomes_the_replays_turns(offline, tmp_path):
    """`turns_from_capture`: Lark grammars indexed once each, a turn without one (or with another
    kind, which the replay cannot trim by) left without `grammar`, the tools of every turn once by
    name, the format as `fmt`; the token ids as captured."""
    from agentspec_sdk.backends.capture import CaptureWriter, Grammar, read_capture

    ls = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}
    cd = {"type": "function", "function": {"name": "cd", "parameters": {"type": "object"}}}
    writer = CaptureWriter(tmp_path, writer="serve", model="m")
    sent = [(Grammar("lark", "start: /a+/"), [ls], "tool_calls"), (None, None, None),
            (Grammar("json", "{}"), [ls, cd], "react"), (Grammar("lark", "start: /a+/"), [cd], "react"),
            (Grammar("lark", "start: /b+/"), None, "react")]
    for i, (grammar, tools, fmt) in enumerate(sent):
        writer.write_turn(id=str(i), episode=None, prompt=[1, i], out=[2, i], temperature=0.0,
                          grammar=grammar, format=fmt, tools=tools, started=None, finished=None,
                          finish_reason="stop")
    turns, grammars, tools = offline.turns_from_capture(read_capture([tmp_path]))
    assert grammars == ["start: /a+/", "start: /b+/"] and tools == [ls, cd]
    assert [t.get("grammar") for t in turns] == [0, None, None, 0, 1]
    assert [t.get("fmt") for t in turns] == ["tool_calls", None, "react", "react", "react"]
    assert [(t["prompt"], t["out"]) for t in turns] == [([1, i], [2, i]) for i in range(5)]
    assert offline.load_turns(tmp_path) == {"turns": turns, "grammars": grammars, "tools": tools}

