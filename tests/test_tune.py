"""`agentspec tune`: episodes and their split, the per-kind choice, the law's decision per class, the
plan written whole or not at all, and a real replay of captured turns (tests/data) through the command."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentspec_sdk.backends.capture import CaptureWriter, read_capture
from agentspec_sdk.cli import app
from agentspec_sdk.drafting.plan import DraftPlan, segment_kinds
from agentspec_sdk.errors import TuneError
from agentspec_sdk.structure.formats import CODE_AGENT, REACT, TOOL_CALLS
from agentspec_sdk.tuning.candidates import Candidate, suffix_grid
from agentspec_sdk.tuning.choose import (
    best_stock,
    choose_clear_wins,
    choose_per_kind,
    clear_winner,
    composed_kinds,
    differences,
    paired_saving,
)
from agentspec_sdk.tuning.decisions import class_decisions
from agentspec_sdk.tuning.episodes import TurnSet, episodes_of, split_episodes
from agentspec_sdk.tuning.simulate import predecessors, simulate
from agentspec_sdk.tuning.tuner import (
    PER_FORMAT,
    PER_KIND,
    TuneOptions,
    kind_defaults,
    per_format_plan,
    suffix_tuned,
)

DATA = Path(__file__).resolve().parent / "data"


# -- episodes ---------------------------------------------------------------------------------------


def _conversations(n: int, seed: int = 0) -> list[dict]:
    """`n` conversations of 1-4 turns each, interleaved; every other one keyed, the rest linked only
    by their prompts (each turn's prompt extends the previous turn's prompt and output)."""
    rng = random.Random(seed)
    turns, open_ = [], []
    for c in range(n):
        open_.append([c, [1000 + c, 7], rng.randint(1, 4)])
    while open_:
        conv = rng.choice(open_)
        c, prompt, left = conv
        out = [rng.randint(10, 99) for _ in range(3)]
        turns.append({"prompt": list(prompt), "out": out, "episode": f"e{c}" if c % 2 else None, "conv": c})
        conv[1] = prompt + out + [5]
        conv[2] -= 1
        if conv[2] == 0:
            open_.remove(conv)
    return turns


def _reference_predecessors(turns: list[dict]) -> list[int | None]:
    """The replay's rule before it moved into the product (quadratic): the earlier turn with the
    longest prompt that begins this turn's prompt."""
    out = []
    for j, t in enumerate(turns):
        best = None
        for i in range(j):
            n = len(turns[i]["prompt"])
            if len(t["prompt"]) > n and t["prompt"][:n] == turns[i]["prompt"] \
                    and (best is None or n > len(turns[best]["prompt"])):
                best = i
        out.append(best)
    return out


def test_episodes_follow_the_key_else_the_prompt_they_extend():
    turns = _conversations(12)
    numbers = episodes_of(turns)
    by_conv = {}
    for t, e in zip(turns, numbers, strict=True):
        by_conv.setdefault(t["conv"], set()).add(e)
    assert all(len(es) == 1 for es in by_conv.values())  # one conversation, one episode
    assert len({next(iter(es)) for es in by_conv.values()}) == 12  # and none shared
    unkeyed = [dict(t, episode=None) for t in turns]
    assert predecessors(unkeyed) == _reference_predecessors(unkeyed)


@pytest.mark.parametrize("seed", range(6))
def test_the_split_never_cuts_an_episode(seed):
    turns = _conversations(15, seed)
    fit, held = split_episodes(turns, 0.5, seed)
    assert sorted(fit + held) == list(range(len(turns))) and fit and held
    fit_convs, held_convs = {turns[i]["conv"] for i in fit}, {turns[i]["conv"] for i in held}
    assert not fit_convs & held_convs
    assert len(held_convs) in (7, 8)
    assert split_episodes(turns, 0.5, seed) == (fit, held)  # a fixed seed, the same split


def test_a_split_needs_two_episodes_and_a_share_inside_zero_one():
    one = [{"prompt": [1], "out": [2, 3], "episode": "a"}, {"prompt": [4], "out": [5], "episode": "a"}]
    with pytest.raises(TuneError, match="at least 2 episodes"):
        split_episodes(one, 0.5, 0)
    with pytest.raises(TuneError, match="--holdout must be in"):
        split_episodes(_conversations(4), 1.0, 0)


# -- the per-kind choice, on a replay with fake drafters ----------------------------------------------


def _kind_turns() -> list[dict]:
    """Turns whose outputs alternate a run of kind "x" and a run of kind "y"."""
    rng = random.Random(3)
    turns = []
    for j in range(6):
        out, kinds = [], []
        for _ in range(3):
            for kind in ("x", "y"):
                n = 12
                out += [rng.randint(100, 999) for _ in range(n)]
                kinds += [kind] * n
        turns.append({"prompt": [j + 1], "out": out, "kinds": kinds})
    return turns


def _drafter(turns: list[dict], right_in: str):
    """A fake drafter: the next 4 true tokens where the row's next token is of kind `right_in`, 4 wrong
    tokens elsewhere."""
    def propose(histories):
        drafts = []
        for h in histories:
            turn = next(t for t in turns if t["prompt"][0] == int(h[0]))
            pos = len(h) - 1
            if pos < len(turn["out"]) and turn["kinds"][pos] == right_in:
                drafts.append(turn["out"][pos:pos + 4])
            else:
                drafts.append([0, 0, 0, 0])
        return drafts
    return propose


def test_choose_per_kind_takes_the_cheapest_candidate_in_each_kind():
    turns = _kind_turns()
    rows = {name: simulate([dict(t) for t in turns], _drafter(turns, kind), batch=2, schedule="agents")
            for name, kind in (("good-in-x", "x"), ("good-in-y", "y"))}
    rows["off"] = simulate([dict(t) for t in turns], lambda hs: [[] for _ in hs], batch=2)
    for row in rows.values():
        assert set(row["by_kind"]) == {"x", "y"}
        assert sum(c["passes"] for c in row["by_kind"].values()) == row["passes"]
    choice = choose_per_kind(rows, delta=0.2)
    assert choice == {"x": "good-in-x", "y": "good-in-y"}
    # at a price that makes every drafted token dearer than a pass, drafting never pays: off everywhere
    assert choose_per_kind(rows, delta=2.0) == {"x": "off", "y": "off"}
    policies = {"good-in-x": {"policy": "structure"}, "good-in-y": {"policy": "trees"},
                "off": {"policy": "off"}}
    assert composed_kinds(choice, policies) == {"x": {"policy": "structure"}, "y": {"policy": "trees"}}
    assert differences(choice, {"x": "good-in-x", "y": "off"}) == {"y": ("good-in-y", "off")}
    stock = {"ngram": {"passes": 10, "drafted": 10}, "suffix": {"passes": 9, "drafted": 20}}
    assert best_stock(stock, 0.2) == ("ngram", 12.0)


def _episode_row(costs: dict[str, list[int]]) -> dict:
    """A replay row whose episode e costs costs[kind][e] passes in each kind (nothing drafted)."""
    n = len(next(iter(costs.values())))
    by_episode = {}
    for e in range(n):
        kinds = {k: {"passes": v[e], "drafted": 0, "accepted": 0} for k, v in costs.items()}
        total = sum(v[e] for v in costs.values())
        by_episode[str(e)] = {"all": {"passes": total, "drafted": 0, "accepted": 0}, "kinds": kinds}
    by_kind = {k: {"passes": sum(v), "drafted": 0, "accepted": 0} for k, v in costs.items()}
    return {"passes": sum(sum(v) for v in costs.values()), "drafted": 0, "by_kind": by_kind,
            "by_episode": by_episode}


def test_the_clear_win_rule_keeps_trees_unless_another_policy_saves_beyond_its_spread():
    """In kind x the challenger saves 2 passes in every episode: a clear win. In kind y it saves more
    in all (8 against 0) but in one episode only: its mean (1.6) is not above two standard errors (3.2):
    trees stays, where least cost alone would have switched."""
    trees = _episode_row({"x": [20, 22, 19, 25, 21], "y": [30, 31, 29, 30, 30]})
    steady = _episode_row({"x": [18, 20, 17, 23, 19], "y": [30, 31, 29, 30, 22]})
    rows = {"trees": trees, "structure": steady}
    x = paired_saving(trees, steady, 0.2, "x")
    assert (x["saving"], x["se"], x["episodes"], x["total"]) == (2.0, 0.0, 5, 10.0)
    y = paired_saving(trees, steady, 0.2, "y")
    assert y["saving"] == pytest.approx(1.6) and y["se"] == pytest.approx(1.6)
    choice, why = choose_clear_wins(rows, 0.2)
    assert choice == {"x": "structure", "y": "trees"}
    assert choose_per_kind(rows, 0.2) == {"x": "structure", "y": "structure"}
    assert "above 2 se" in why["x"]["reason"] and "no policy saves more than 2 se" in why["y"]["reason"]
    # a lower bar takes y too; whole episodes: 3.6 a mean, clearly
    assert choose_clear_wins(rows, 0.2, z=0.5)[0] == {"x": "structure", "y": "structure"}
    assert clear_winner("trees", rows, 0.2)[0] == "structure"
    # one episode has no spread to judge: no clear win
    one = {n: {**r, "by_episode": {"0": r["by_episode"]["0"]}} for n, r in rows.items()}
    assert paired_saving(one["trees"], one["structure"], 0.2, "x")["se"] == float("inf")
    assert choose_clear_wins(one, 0.2)[0] == {"x": "trees", "y": "trees"}


def test_suffix_tuned_keeps_vllm_defaults_unless_a_grid_point_clearly_saves():
    """suffix-tuned's knobs: the grid point at vLLM's defaults unless another point saves over it
    beyond one standard error, paired by fitting episode. A point cheaper in total by one lucky
    episode is no tuning; a point cheaper in every episode is."""
    grid = suffix_grid()
    default = next(c for c in grid if c.knobs == {"max_spec_factor": 1.0, "min_token_prob": 0.1})
    base = [40, 42, 39, 45, 41]
    rows = {(c.name, "fit"): _episode_row({"x": base}) for c in grid}
    lucky, steady = grid[0], grid[-1]
    rows[(lucky.name, "fit")] = _episode_row({"x": [40, 42, 39, 45, 31]})  # 10 less, in one episode
    rows[(steady.name, "fit")] = _episode_row({"x": [39, 41, 38, 44, 40]})  # 5 less, one in each
    _, knobs, why = suffix_tuned(rows, 0.2, default.name, 1.0)
    assert knobs == steady.knobs and why["chosen"] == steady.name
    rows[(steady.name, "fit")] = _episode_row({"x": base})
    row, knobs, why = suffix_tuned(rows, 0.2, default.name, 1.0)
    assert knobs == default.knobs and row is rows[(default.name, "fit")]
    assert "no policy saves more than 1 se" in why["reason"]


def test_a_plan_that_drafts_as_suffix_everywhere_deploys_vllms_suffix(tmp_path):
    """Policy "trees" in every kind at one set of knobs: vLLM's own suffix drafter sends the same drafts,
    the advice is its command (vLLM's defaults: `agentspec serve --speculation suffix`; other knobs: the
    `vllm serve` speculative config); any kind on the structure drafter, or knobs that differ by kind:
    the structure drafter with the plan."""
    from agentspec_sdk.tuning.deploy import deploy_advice

    trees = {"policy": "trees"}
    plan = DraftPlan(formats=[TOOL_CALLS, CODE_AGENT], kinds={"*": trees})
    assert plan.suffix_equivalent() == (1.0, 0.1)
    advice = deploy_advice(plan, tmp_path / "plan.json", 8)
    assert advice["speculation"] == "suffix"
    assert advice["command"] == "agentspec serve --speculation suffix --gamma-max 8"
    served = CliRunner().invoke(app, [*advice["command"].split()[1:], "--dry-run"])  # the real launcher
    assert served.exit_code == 0, served.output
    assert """--speculative-config '{"method":"suffix","num_speculative_tokens":8}'""" in served.output
    tuned = DraftPlan(formats=[TOOL_CALLS], suffix_max_spec_factor=2.0,
                      kinds={"*": trees, "tool_call": {"policy": "trees", "tree_min_token_prob": 0.2}})
    assert tuned.suffix_equivalent() is None  # two sets of knobs
    tuned = DraftPlan(formats=[TOOL_CALLS], suffix_max_spec_factor=2.0, suffix_min_token_prob=0.2,
                      kinds={"*": trees})
    cmd = deploy_advice(tuned, "p.json", 16)["command"]
    assert cmd.startswith("vllm serve MODEL --speculative-config ")
    assert json.loads(cmd.split("--speculative-config ", 1)[1].strip("'")) == {
        "method": "suffix", "num_speculative_tokens": 16, "suffix_decoding_max_spec_factor": 2.0,
        "suffix_decoding_min_token_prob": 0.2}
    mixed = DraftPlan(formats=[TOOL_CALLS, CODE_AGENT], kinds={"*": trees, "tool_calls.tool_call": {}})
    assert mixed.suffix_equivalent() is None
    assert deploy_advice(mixed, tmp_path / "plan.json", 8)["command"] == \
        f"agentspec serve --speculation structure --plan {tmp_path / 'plan.json'} --gamma-max 8"
    # a kind no format names falls to "*": without it, the structure drafter
    assert DraftPlan(formats=[TOOL_CALLS], kinds={"reasoning": trees, "tool_call": trees,
                                                   "tool_response": trees}).suffix_equivalent() is None


def test_kind_defaults_follow_the_law_class():
    fields = {"formats": [TOOL_CALLS.to_dict(), CODE_AGENT.to_dict()]}
    by_class = kind_defaults(fields, qualified=True, rule="class")
    assert by_class["tool_calls.tool_call"] == "structure"
    assert by_class["tool_calls.reasoning"] == by_class["code_agent.reasoning"] == "trees"
    assert by_class["code_agent.code"] == "trees"
    assert kind_defaults(fields, qualified=False, rule="class")["tool_call"] == "structure"
    assert kind_defaults(fields, qualified=False, rule="trees") == "trees"
    # in x trees is no clear win over the default structure (it saves 1 in one episode, loses 1 in
    # the other); in y, by default trees, structure loses
    rows = {"trees": _episode_row({"x": [5, 7], "y": [5, 5]}),
            "structure": _episode_row({"x": [6, 6], "y": [6, 6]})}
    assert choose_clear_wins(rows, 0.2, {"x": "structure"})[0] == {"x": "structure", "y": "trees"}


def test_simulate_counts_per_turn_add_up_to_the_totals():
    turns = _kind_turns()
    row = simulate([dict(t) for t in turns], _drafter(turns, "x"), batch=2, schedule="agents", per_turn=True)
    assert len(row["by_turn"]) == len(turns)
    for key in ("passes", "drafted", "accepted"):
        assert sum(t["all"][key] for t in row["by_turn"]) == row[key]
        for kind in ("x", "y"):
            assert sum(t["kinds"][kind][key] for t in row["by_turn"]) == row["by_kind"][kind][key]


def test_the_law_decides_per_class_from_the_replayed_rounds():
    rounds = {"S": {"rounds": 50, "drafted": 400, "accepted": 360, "rejections": 10},
              "F": {"rounds": 50, "drafted": 100, "accepted": 5, "rejections": 48}}
    out = class_decisions(rounds, {"S": 600, "R": 0, "F": 400}, gamma=8, delta=0.2, d=0.0)
    assert out["classes"]["S"]["speculate"] is True and out["classes"]["F"]["speculate"] is False
    assert out["classes"]["R"]["speculate"] is None  # no R tokens: nothing to decide
    assert out["classes"]["S"]["alpha"] == pytest.approx(360 / 370)
    assert out["classes"]["R"]["alpha_assumed"]
    mix = out["mix"]
    assert mix["w_s"] == pytest.approx(0.6) and 0 < mix["w_s_breakeven"] < 1
    assert mix["speculate"] == (mix["w_s"] > mix["w_s_breakeven"])


# -- the command ------------------------------------------------------------------------------------


def _capture(directory: Path, name: str, *, episode: str | None = None) -> int:
    """tests/data's captured turns of set `name` (`<name>.capture.jsonl`) written again into `directory`,
    every turn in `episode` where one is given."""
    turns = read_capture([DATA / f"{name}.capture.jsonl"]).turns
    writer = CaptureWriter(directory, writer="replay", model="SmolLM2-135M-Instruct")
    for t in turns:
        writer.write_turn(id=t.id, episode=episode, prompt=t.prompt, out=t.out, temperature=t.temperature,
                          grammar=t.grammar, format=t.format, tools=t.tools, started=t.started,
                          finished=t.finished, finish_reason=t.finish_reason)
    writer.close()
    return len(turns)


def test_bad_input_writes_no_plan(tmp_path):
    runner = CliRunner()
    out = tmp_path / "plan.json"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "capture-1-0.jsonl").write_text('{"agentspec_capture": 99, "writer": "serve"}\n')
    result = runner.invoke(app, ["tune", str(bad), "--out", str(out), "--jobs", "1"])
    assert result.exit_code == 2
    assert "capture-1-0.jsonl:1: unknown capture version 99" in result.output
    one = tmp_path / "one"
    _capture(one, "react", episode="one")  # every turn in one episode: nothing to hold out
    out.write_text("previous plan")
    result = runner.invoke(app, ["tune", str(one), "--out", str(out), "--jobs", "1"])
    assert result.exit_code == 2 and "at least 2 episodes" in result.output
    assert out.read_text() == "previous plan"  # the old plan is untouched
    result = runner.invoke(app, ["tune", str(one), "--out", str(out), "--gamma", "0"])
    assert result.exit_code == 2 and "--gamma must be in [1, 64]" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "one", "plan.json"]  # no partial file


def test_tune_on_captured_react_turns_writes_a_plan_that_loads(tmp_path):
    """A real replay (vLLM's ngram and suffix peers, the structure drafter under each candidate policy)
    of the 8 captured ReAct turns: the plan loads, its kinds are the ReAct format's, the held-out cost
    and the stock drafters' are reported; the turns have no grammar, which the report says."""
    capture = tmp_path / "capture"
    n = _capture(capture, "react")
    with (capture / next(p.name for p in capture.iterdir())).open("a") as fh:
        fh.write('{"type": "turn", "id": "cut-')  # a writer killed mid-line
    out, report = tmp_path / "plan.json", tmp_path / "report"
    result = CliRunner().invoke(app, ["tune", str(capture), "--out", str(out), "--report", str(report),
                                      "--jobs", "1", "--gamma", "8", "--batch", "8"])
    assert result.exit_code == 0, result.output
    plan = DraftPlan.load(out)
    assert plan.kinds and set(plan.kinds) <= {"*", *segment_kinds([REACT])}
    assert plan.gamma_max == 8 and any(f["name"] == "react" for f in plan.formats)
    data = json.loads((report / "report.json").read_text())
    assert data["turns"] == n and data["episodes"]["fit"] >= 1 and data["episodes"]["held"] >= 1
    summary = data["held_out_summary"]
    stock = min(data["held_out"][name]["cost"] for name in ("ngram", "suffix", "suffix-tuned"))
    assert summary["best_stock_cost"] == pytest.approx(stock)
    tuned = data["held_out"]["structure-tuned"]["cost"]
    assert summary["best_stock_over_tuned"] == pytest.approx(stock / tuned)
    assert data["held_out"]["structure-tuned"]["passes"] < data["held_out"]["off"]["passes"]
    # the plan is the per-kind composition (trees where no policy clearly won, "*" trees), or one policy
    # everywhere where that clearly beat it on the fitting part
    assert {k: p.model_dump(exclude_none=True) for k, p in plan.kinds.items()} == data["kinds"]
    assert set(data["choice_why"]) == set(data["choice"])
    for kind, why in data["choice_why"].items():
        wins = [n for n, t in why["tests"].items() if t["saving"] > max(0.0, why["z"] * t["se"])]
        assert (why["chosen"] in wins) if wins else why["chosen"] == why["default"], (kind, why)
        # the default: the structure drafter in kinds of law class S, the peer's draft elsewhere
        assert why["default"] == ("structure" if kind in ("action", "action_input") else "trees")
    if data["plan_choice"] == "structure-per-kind":
        assert set(data["kinds"]) == set(data["choice"]) | {"*"}
        assert data["kinds"]["*"]["policy"] == "trees"
    else:
        assert data["plan_why"]["chosen"] == data["plan_choice"]
    notes = " ".join(data["notes"])
    assert "truncated last line skipped" in notes
    assert f"{n} of {n} turns have no grammar: replayed untrimmed" in notes
    assert "cannot be fitted" in notes
    md = (report / "report.md").read_text()
    assert "best stock ÷ structure-tuned" in md and "speculate" in md
    # what to run: vLLM's suffix where the plan drafts as it in every kind, else the structure drafter
    assert data["deploy"]["speculation"] == ("suffix" if plan.suffix_equivalent() else "structure")
    assert f"deploy: {data['deploy']['command']}" in result.output and data["deploy"]["command"] in md
    assert (report / "kind_costs.png").stat().st_size > 1000
    assert set(data["law"]["classes"]) == {"S", "R", "F"}


def test_a_turn_of_an_unknown_format_is_named(tmp_path):
    capture = tmp_path / "capture"
    writer = CaptureWriter(capture, writer="replay", model="SmolLM2-135M-Instruct")
    for j in range(2):
        writer.write_turn(id=str(j), episode=str(j), prompt=[1, 2], out=[3, 4, 5], temperature=0.0,
                          grammar=None, format="my_agent", tools=None, started=None, finished=None,
                          finish_reason="stop")
    writer.close()
    result = CliRunner().invoke(app, ["tune", str(capture), "--out", str(tmp_path / "plan.json")])
    assert result.exit_code == 2
    assert ".jsonl:2: unknown agent format 'my_agent'" in result.output and "--base-plan" in result.output
    assert not (tmp_path / "plan.json").exists()


def test_tune_on_two_formats_chooses_per_format_and_kind(tmp_path):
    """Tool-call turns and code turns in one capture: both formats have a kind `reasoning`; the plan
    keys each kind by its format ("code_agent.reasoning", "tool_calls.reasoning") and loads."""
    calls, code = tmp_path / "calls", tmp_path / "code"
    _capture(calls, "tool_calls")
    _capture(code, "code")
    out, report = tmp_path / "plan.json", tmp_path / "report"
    result = CliRunner().invoke(app, ["tune", str(calls), str(code), "--out", str(out),
                                      "--report", str(report), "--jobs", "1"])
    assert result.exit_code == 0, result.output
    data = json.loads((report / "report.json").read_text())
    assert {"code_agent.reasoning", "tool_calls.reasoning", "tool_calls.tool_call"} <= set(data["choice"])
    assert all("." in k for k in data["choice"])
    plan = DraftPlan.load(out)
    assert {f["name"] for f in plan.formats} >= {"tool_calls", "code_agent"}
    assert set(data["plan_why"]["per_format"]) == {"tool_calls", "code_agent"}  # the fallback per format
    if data["plan_choice"] == PER_KIND:
        assert set(plan.kinds) - {"*"} == set(data["choice"])
    else:
        assert data["plan_choice"] == PER_FORMAT, data["plan_choice"]
        for fmt, why in data["plan_why"]["per_format"].items():
            mine = {k: v for k, v in plan.kinds.items() if k.startswith(fmt + ".")}
            if why["chosen"] != PER_KIND:  # one policy in all the format's kinds
                assert len({repr(v) for v in mine.values()}) == 1, mine


def test_one_policy_replaces_the_composition_only_in_the_format_where_it_clearly_wins():
    """Two formats; on the tool-call episodes `lookup6` everywhere saves 3 passes an episode over the
    per-kind composition every time, on the code episodes it loses: the plan takes lookup6 in every
    tool-call kind and keeps the composition's code kinds."""
    turns = [{"prompt": [j], "out": [1, 2], "fmt": "tool_calls" if j < 4 else "code_agent",
              "episode": f"e{j}"} for j in range(8)]
    ts = TurnSet(turns, formats={"tool_calls": TOOL_CALLS, "code_agent": CODE_AGENT})

    def row(costs):  # {episode number: passes}
        return {"by_episode": {str(e): {"all": {"passes": p, "drafted": 0, "accepted": 0}, "kinds": {}}
                               for e, p in costs.items()}}

    composed_kinds = {"tool_calls.tool_call": {}, "code_agent.code": {"policy": "trees"}}
    plans = {PER_KIND: Candidate(PER_KIND, "structure", kinds=composed_kinds),
             "lookup6": Candidate("lookup6", "structure", kinds={"*": {"lookup_min_chars": 6}})}
    rows = {(PER_KIND, "fit"): row({e: 50 + e % 2 for e in range(8)}),
            ("lookup6", "fit"): row({e: (47 + e % 2) if e < 4 else 60 for e in range(8)})}
    policies = {"lookup6": {"lookup_min_chars": 6}}
    mixed, why = per_format_plan(ts, None, rows, plans, policies, TuneOptions())
    assert why["per_format"]["tool_calls"]["chosen"] == "lookup6"
    assert why["per_format"]["code_agent"]["chosen"] == PER_KIND
    assert mixed.name == PER_FORMAT
    assert {k for k in mixed.kinds if k.startswith("tool_calls.")} == {
        f"tool_calls.{k.name}" for k in TOOL_CALLS.kinds}
    assert all(mixed.kinds[f"tool_calls.{k.name}"] == {"lookup_min_chars": 6} for k in TOOL_CALLS.kinds)
    assert mixed.kinds["code_agent.code"] == {"policy": "trees"}
    # the code episodes alone: the composition kept, nothing to replay
    rows[("lookup6", "fit")] = row({e: 60 for e in range(8)})
    assert per_format_plan(ts, None, rows, plans, policies, TuneOptions())[0] is None
