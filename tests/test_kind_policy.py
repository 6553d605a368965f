"""The draft plan's policy per segment kind (`DraftPlan.kinds`): "structure", "trees" (exactly vLLM's
suffix proposer's draft) and "off"; its validation, naming the key; and the policies in real vLLM."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from captured_turns import captured

from agentspec_sdk.drafting.plan import DraftPlan, KindPolicy, segment_kinds
from agentspec_sdk.errors import PlanError
from agentspec_sdk.structure.formats import CODE_AGENT, REACT, TOOL_CALLS

DATA = Path(__file__).resolve().parent / "data"
SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "offline_drafting.py"
TURN_SETS = ("tool_calls", "react", "code")  # tests/data/<set>.capture.jsonl
GAMMA = 8


@pytest.fixture(scope="module")
def offline():
    spec = importlib.util.spec_from_file_location("offline_drafting", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load(name: str) -> dict:
    data = captured(name)
    return {"tools": data["tools"], "turns": [dict(t) for t in data["turns"]]}


# -- the plan ---------------------------------------------------------------------------------------


def test_segment_kinds_lists_each_kind_of_the_formats_once():
    kinds = segment_kinds([TOOL_CALLS, "react", CODE_AGENT.to_dict()])
    assert kinds[:3] == list(TOOL_CALLS.kind_names)
    assert set(kinds) == set(TOOL_CALLS.kind_names) | set(REACT.kind_names) | set(CODE_AGENT.kind_names)
    assert len(kinds) == len(set(kinds))


def test_kinds_round_trip_through_the_plan_file(tmp_path):
    plan = DraftPlan(formats=[TOOL_CALLS, REACT], kinds={
        "*": {"policy": "trees", "tree_spec_factor": 2.0},
        "tool_call": KindPolicy(policy="structure", boundary="wall", lookup_min_chars=5, extend_factor=0)})
    again = DraftPlan.load(plan.save(tmp_path / "plan.json"))
    assert again == plan and again.version == 1
    rules = again.kind_rules()
    assert {kind for _, kind in rules} == set(segment_kinds([TOOL_CALLS, REACT]))
    call, thought = rules[("tool_calls", "tool_call")], rules[("react", "thought")]
    assert (call.policy, call.boundary, call.lookup_min_chars) == ("structure", "wall", 5)
    assert call.extend_factor is None
    assert (call.tree_spec_factor, call.tree_min_token_prob) == (plan.suffix_max_spec_factor,
                                                                plan.suffix_min_token_prob)
    assert (thought.policy, thought.tree_spec_factor, thought.boundary) == ("trees", 2.0, plan.boundary)
    # no kinds: structure everywhere
    assert DraftPlan().kind_rules()[("tool_calls", "tool_call")].policy == "structure"


def test_a_format_and_kind_key_wins_over_the_kind_and_the_star():
    """code_agent's `reasoning` and tool_calls' `reasoning` share a name: "<format>.<kind>" sets one
    apart; the most specific key applies, then the kind's, then "*"."""
    plan = DraftPlan(formats=[TOOL_CALLS, CODE_AGENT, REACT], kinds={
        "code_agent.reasoning": {"policy": "trees", "tree_spec_factor": 3.0},
        "reasoning": {"policy": "off"}, "*": {"policy": "structure", "boundary": "wall"}})
    rules = plan.kind_rules()
    assert rules[("code_agent", "reasoning")].policy == "trees"
    assert rules[("code_agent", "reasoning")].tree_spec_factor == 3.0
    assert rules[("tool_calls", "reasoning")].policy == "off"
    assert (rules[("react", "thought")].policy, rules[("react", "thought")].boundary) == ("structure", "wall")
    assert plan.kind_policy("reasoning", "code_agent").policy == "trees"
    assert plan.kind_policy("reasoning").policy == "off" and plan.kind_policy("code").boundary == "wall"
    assert DraftPlan.from_dict(plan.to_dict()) == plan
    # the code lookup minimum stays per the format's kind content
    plain = DraftPlan(formats=[TOOL_CALLS, CODE_AGENT]).kind_rules()
    assert plain[("code_agent", "code")].lookup_min_chars == plan.lookup_min_chars_code
    assert plain[("tool_calls", "reasoning")].lookup_min_chars == plan.lookup_min_chars


def test_a_plan_file_written_before_kinds_and_lab_switches_still_loads(tmp_path):
    """The fields an older engine wrote (the lab switches at their defaults among them, no `kinds`)."""
    old = {"formats": [TOOL_CALLS.to_dict()], "tools": [], "tokenizer": None, "turn_start": None,
           "gamma_max": 8, "step_budget": None, "kappa": 1.0, "delta": 0.04, "learn_delta": True, "d": 0.0,
           "delta_ctx": 0.013, "ctx_ref": None, "prior_acceptance": {"S": 0.8, "R": 0.45, "F": 0.3},
           "gate": True, "isolation": True, "budget": True, "budget_rule": "value", "boundary": "price",
           "records_path": None, "records_max_bytes": None, "lookup_min_chars": 3, "lookup_min_chars_code": 6,
           "suffix_trees": True, "suffix_max_spec_factor": 1.0, "suffix_min_token_prob": 0.1,
           "suffix_extend_factor": 2.0, "learn_choice": True, "calibrate": True, "version": 4}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(old))
    plan = DraftPlan.load(path)
    assert plan.version == 4 and plan.kinds == {} and plan == DraftPlan(version=4)


GE = "Input should be greater than or equal to"
KIND_ERRORS = [
    ({"tool_cal": {}},
     r"kinds\.tool_cal: no segment kind .* named 'tool_cal'; known: \['\*', 'reasoning', 'tool_call', "
     r"'tool_response'\]"),
    ({"tool_call": {"policy": "suffix"}},
     r"kinds\.tool_call\.policy: Input should be 'structure', 'trees' or 'off'"),
    ({"*": {"boundary": "soft"}}, r"kinds\.\*\.boundary: Input should be 'wall' or 'price'"),
    ({"reasoning": {"lookup_min_chars": 0}}, rf"kinds\.reasoning\.lookup_min_chars: {GE} 1"),
    ({"reasoning": {"lookup_min_chars": 2.5}},
     r"kinds\.reasoning\.lookup_min_chars: Input should be a valid int"),
    ({"reasoning": {"extend_factor": -1}}, rf"kinds\.reasoning\.extend_factor: {GE} 0"),
    ({"reasoning": {"tree_spec_factor": 0}},
     r"kinds\.reasoning\.tree_spec_factor: Input should be greater than 0"),
    ({"reasoning": {"tree_min_token_prob": 1.5}},
     r"kinds\.reasoning\.tree_min_token_prob: Input should be less than or equal to 1"),
    ({"reasoning": {"polcy": "off"}}, r"kinds\.reasoning\.polcy: Extra inputs are not permitted"),
    ({"reasoning": "off"}, r"kinds\.reasoning: Input should be a valid dictionary or instance of KindPolicy"),
    ({"code_agent.reasoning": {}}, r"kinds\.code_agent\.reasoning: the plan has no format 'code_agent'; its "
                                   r"formats: \['tool_calls'\]"),
    ({"tool_calls.thought": {}}, r"kinds\.tool_calls\.thought: format 'tool_calls' has no segment kind "
                                 r"'thought'; its kinds: \['reasoning', 'tool_call', 'tool_response'\]"),
    ({"tool_calls.reasoning": {"policy": "tree"}},
     r"kinds\.tool_calls\.reasoning\.policy: Input should be 'structure', 'trees' or 'off'"),
    ([], r"kinds: Input should be a valid dictionary"),
]


@pytest.mark.parametrize(("kinds", "message"), KIND_ERRORS)
def test_a_bad_kind_policy_names_the_file_and_the_key(tmp_path, kinds, message):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"formats": [TOOL_CALLS.to_dict()], "kinds": kinds}))
    with pytest.raises(PlanError, match=f"^{path}: {message}"):
        DraftPlan.load(path)
    with pytest.raises(PlanError, match=f"^plan: {message}"):
        DraftPlan(formats=[TOOL_CALLS], kinds=kinds)


def test_a_plan_changed_into_a_bad_one_is_refused_and_keeps_its_value():
    plan = DraftPlan()
    with pytest.raises(PlanError, match=r"plan: gamma_max: Input should be less than or equal to 64"):
        plan.gamma_max = 65
    with pytest.raises(PlanError, match=r"kinds\.thought: no segment kind"):
        plan.kinds = {"thought": KindPolicy(policy="off")}  # a ReAct kind; the plan has tool_calls only
    assert plan.gamma_max == 8 and plan.kinds == {}


# -- the drafter, offline on captured turns ---------------------------------------------------------


def _compare(offline, data: dict, batch: int, kinds: dict) -> list[tuple[str | None, list[int], list[int]]]:
    """Replay the turns through the structure drafter under `kinds` and vLLM's suffix proposer
    (offline_drafting.SuffixDrafter) side by side, untrimmed: per step and row, (the segment kind the
    row was in, the drafter's draft, suffix's draft). The replay goes on with suffix's drafts."""
    structure = offline.structure_drafter(GAMMA, data["tools"], finished_first=True, kinds=kinds)
    steps = []

    def record(drafts, truth, key=None, index=0):
        steps.append((structure.kinds[index], drafts[0], drafts[1]))
        return 1

    offline.simulate(data["turns"], (structure, offline.SuffixDrafter(GAMMA)), batch, choose=record,
                     schedule="agents")
    assert structure.drafter.stats()["errors"] == 0
    return steps


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("name", TURN_SETS)
def test_trees_everywhere_drafts_what_vllms_suffix_proposer_drafts(offline, name, batch):
    """With every kind "trees" the drafter sends, step by step and row by row, exactly the draft vLLM
    0.32's SuffixDecodingProposer (its replica) sends on the same histories: the rows' trees are fed
    as vLLM feeds them (a new row's first sampled token is its response), an episode's next turn
    that takes over its previous turn's tree (parking) holds what a new request's tree holds."""
    steps = _compare(offline, _load(name), batch, {"*": {"policy": "trees"}})
    differing = [(k, i, mine, theirs) for k, (i, mine, theirs) in enumerate(steps) if mine != theirs]
    assert not differing, f"{len(differing)} of {len(steps)} drafts differ, first: {differing[:3]}"
    assert sum(map(len, (s[2] for s in steps))) > 100  # suffix drafted: the comparison compared something
    assert len({s[0] for s in steps}) > 1  # rows in several segment kinds


def test_off_drafts_nothing_in_its_kind_and_a_mixed_plan_drafts_per_kind(offline):
    data = _load("tool_calls")
    off = _compare(offline, data, 8, {"tool_call": {"policy": "off"}})
    assert any(k == "tool_call" for k, _, _ in off)
    assert all(not mine for k, mine, _ in off if k == "tool_call")
    assert any(mine for k, mine, _ in off if k != "tool_call")  # the other kinds still draft
    # tool calls by the trees, the rest by the structure drafter
    mixed = _compare(offline, data, 8, {"tool_call": {"policy": "trees"}})
    calls = [(mine, theirs) for k, mine, theirs in mixed if k == "tool_call"]
    assert calls and all(mine == theirs for mine, theirs in calls)
    rest = [(mine, theirs) for k, mine, theirs in mixed if k != "tool_call"]
    assert any(mine for mine, _ in rest) and any(mine != theirs for mine, theirs in rest)


def test_the_drafter_applies_the_policy_of_the_rows_format(offline):
    """Tool-call turns and code turns replayed together (the plan has both formats, the drafter picks
    each row's format from its prompt): a "code_agent.reasoning" policy governs the code rows'
    reasoning, the plain "reasoning" key the tool-call rows'."""
    calls, code = _load("tool_calls"), _load("code")
    data = {"tools": calls["tools"] + [t for t in code["tools"] if t not in calls["tools"]],
            "turns": calls["turns"] + code["turns"]}
    fmt_of = [t["fmt"] for t in data["turns"]]
    assert set(fmt_of) == {"tool_calls", "code_agent"}
    steps = _compare_rows(offline, data, 8, {"code_agent.reasoning": {"policy": "off"}})
    code_reasoning = [mine for f, k, mine, _ in steps if (f, k) == ("code_agent", "reasoning")]
    call_reasoning = [mine for f, k, mine, _ in steps if (f, k) == ("tool_calls", "reasoning")]
    assert code_reasoning and not any(code_reasoning)
    assert any(call_reasoning)
    steps = _compare_rows(offline, data, 8, {"code_agent.reasoning": {"policy": "trees"},
                                             "reasoning": {"policy": "off"}})
    code_reasoning = [(mine, theirs) for f, k, mine, theirs in steps if (f, k) == ("code_agent", "reasoning")]
    call_reasoning = [mine for f, k, mine, _ in steps if (f, k) == ("tool_calls", "reasoning")]
    assert all(mine == theirs for mine, theirs in code_reasoning) and any(m for m, _ in code_reasoning)
    assert call_reasoning and not any(call_reasoning)


def test_a_begun_open_marker_takes_the_policy_of_the_kind_it_opens():
    """The model has written "<tool_" at the end of its reasoning: the held-back text already belongs
    to the tool call (the structure drafter completes the marker and drafts the call), so the row
    drafts under the tool call's policy and its draft is attributed to the tool call."""
    import numpy as np
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.drafting.drafter import StructureDrafter
    from agentspec_sdk.drafting.rows import RowInput

    tok = AutoTokenizer.from_pretrained(resolve_model())
    msgs = [{"role": "system", "content": "Call tools as <tool_call>{...}</tool_call>."},
            {"role": "user", "content": "Weather in Lima?"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) + "I will look.\n<tool_"
    ids = np.asarray(tok.encode(text, add_special_tokens=False))

    def step(kinds: dict) -> tuple[list[int], list]:
        drafter = StructureDrafter(DraftPlan(formats=[TOOL_CALLS], kinds=kinds, learn_delta=False), tok)
        draft = drafter.propose([RowInput(ids)])[0]
        assert drafter.rows.states[0].seg.kind == "reasoning" and drafter.rows.states[0].seg.pending
        return draft, drafter.last_kinds

    draft, kinds = step({"tool_call": {"policy": "off"}})
    assert draft == [] and kinds == ["tool_call"]
    draft, kinds = step({"reasoning": {"policy": "off"}})
    assert tok.decode(draft).startswith("call>") and kinds == ["tool_call"]


def test_a_plan_switched_to_off_sends_nothing_from_the_next_step_on(tmp_path):
    """A row drafting under structure, the plan file rewritten to `{"*": off}` while the row goes on:
    from the next step the row gets no draft and the drafter accounts no drafted token (no path
    drafts outside the per-row policy; the reload rebuilds the rows, dropping the draft pending)."""
    import numpy as np
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.drafting.drafter import StructureDrafter
    from agentspec_sdk.drafting.rows import RowInput

    tok = AutoTokenizer.from_pretrained(resolve_model())
    tools = [{"type": "function", "function": {"name": "find", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}]
    msgs = [{"role": "system", "content": "Call tools as <tool_call>{...}</tool_call>."},
            {"role": "user", "content": "Find the Trattoria Bellavista Downtown Riverside please."}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) \
        + '<tool_call>{"name": "find", "arguments": {"q": "Trattoria Bell'
    ids = tok.encode(text, add_special_tokens=False)
    path = DraftPlan(tools=tools, learn_delta=False).save(tmp_path / "plan.json")
    drafter = StructureDrafter(DraftPlan.load(path), tok, plan_path=str(path))
    first = drafter.propose([RowInput(np.asarray(ids))])[0]
    assert len(first) >= 2

    def drafted() -> int:
        return sum(c["drafted"] for c in drafter.stats()["by_class"].values())

    before = drafted()
    plan = DraftPlan.load(path)
    plan.kinds = {"*": KindPolicy(policy="off")}
    plan.save(path)
    drafter._watcher._next = 0.0  # skip the poll interval
    ids = ids + first[:2] + [first[2] if len(first) > 2 else first[0]]  # two accepted, one more sampled
    assert drafter.propose([RowInput(np.asarray(ids), sampled=3)])[0] == []
    assert drafter.plan.kinds["*"].policy == "off"
    ids = ids + tok.encode("avista", add_special_tokens=False)
    assert drafter.propose([RowInput(np.asarray(ids))])[0] == []
    assert drafted() == before and drafter.stats()["errors"] == 0


def _compare_rows(offline, data: dict, batch: int, kinds: dict) -> list[tuple[str, str | None, list, list]]:
    """`_compare` with the format of each row's turn: (format, kind, the drafter's draft, suffix's)."""
    structure = offline.structure_drafter(GAMMA, data["tools"], finished_first=True, kinds=kinds)
    steps = []

    def record(drafts, truth, key=None, index=0):
        steps.append((data["turns"][key]["fmt"], structure.kinds[index], drafts[0], drafts[1]))
        return 1

    offline.simulate(data["turns"], (structure, offline.SuffixDrafter(GAMMA)), batch, choose=record,
                     schedule="agents")
    assert structure.drafter.stats()["errors"] == 0
    return steps


# -- in real vLLM -----------------------------------------------------------------------------------


KINDS_CHILD = """
import json, time
from agentspec_sdk.backends.embedded.vllm_engine import Engine
from agentspec_sdk.backends.types import TurnRequest
from agentspec_sdk.bfcl import tool_call_prompts
from agentspec_sdk.drafting.plan import KindPolicy

if __name__ == "__main__":
    with Engine(speculation="structure", max_model_len=2048, kv_cache_gb=1.0, seed=0) as engine:
        drafter = engine.proposer().drafter
        requests = [TurnRequest(messages=p.messages, tools=p.tools, tool_choice="call", max_tokens=64,
                                request_id=p.id) for p in tool_call_prompts(4)]
        for r in requests:
            engine.register_tools(r.tools)
        out = {}
        for policy in ("off", "trees"):
            engine.plan.kinds = {"*": KindPolicy(policy=policy)}
            time.sleep(0.05)
            engine.plan.save(engine.plan_path)
            time.sleep(0.6)  # past the proposer's plan poll interval
            results = engine.generate([TurnRequest(**{**r.__dict__, "request_id": f"{r.request_id}-{policy}"})
                                       for r in requests])
            out[policy] = {"kinds": {k: v.policy for k, v in drafter.plan.kinds.items()},
                           "tokens": [r.token_ids for r in results],
                           "drafted": sum((r.spec or {}).get("num_draft_tokens", 0) for r in results)}
        out["errors"] = drafter.stats()["errors"]
        print(json.dumps(out))
"""


@pytest.mark.engine
def test_kind_policies_in_the_engine(tmp_path):
    """A running engine's plan rewritten (the proposer re-reads it): "off" everywhere drafts nothing,
    "trees" everywhere drafts (vLLM's own count of verified draft tokens), and the outputs are the same
    tokens (lossless). A fresh engine in a process of its own."""
    import subprocess
    import sys

    script = tmp_path / "kinds_child.py"
    script.write_text(KINDS_CHILD)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["off"]["kinds"] == {"*": "off"} and got["trees"]["kinds"] == {"*": "trees"}
    assert got["off"]["drafted"] == 0 and got["trees"]["drafted"] > 0
    assert got["trees"]["tokens"] == got["off"]["tokens"]
    assert got["errors"] == 0
