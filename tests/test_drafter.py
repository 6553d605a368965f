import json
import logging
import os
import time

import numpy as np
import pytest

from agentspec_sdk.drafting import drafter as drafter_mod
from agentspec_sdk.drafting import pricing as pricing_mod
from agentspec_sdk.drafting import rows as rows_mod
from agentspec_sdk.drafting import text as text_mod
from agentspec_sdk.drafting.drafter import StructureDrafter
from agentspec_sdk.drafting.fingerprint import RollingHash, prefix_hash, prefix_hashes
from agentspec_sdk.drafting.lab import LabSwitches
from agentspec_sdk.drafting.plan import DraftPlan, PlanWatcher
from agentspec_sdk.drafting.rows import RowInput
from agentspec_sdk.drafting.text import HistoryText, TokenBytes
from agentspec_sdk.errors import PlanError

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}}]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model())


def _prompt(tok, user):
    msgs = [{"role": "system", "content": "Call tools as <tool_call>{...}</tool_call>."},
            {"role": "user", "content": user}]
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def _accepted(draft, truth):
    n = 0
    for a, b in zip(draft, truth, strict=False):
        if a != b:
            break
        n += 1
    return n


# -- fingerprint ------------------------------------------------------------------------------

def test_prefix_hashes_agree_with_the_rolling_hash():
    ids = np.random.default_rng(0).integers(0, 50_000, 300)
    h = prefix_hashes(ids)
    r = RollingHash()
    for i, t in enumerate(ids):
        assert r.extend([t]) == int(h[i])
    assert prefix_hash(ids, 17) == int(h[16])
    whole = RollingHash.of(ids[:100])
    assert whole.value == int(h[99]) and whole.extend(ids[100:]) == int(h[-1])
    assert prefix_hash(ids[:0]) == 0
    assert prefix_hashes([1, 2]).tolist() != prefix_hashes([2, 1]).tolist()


# -- detokenisation ---------------------------------------------------------------------------

def test_history_text_handles_split_utf8_characters(tok):
    drafter = StructureDrafter(DraftPlan(tools=[]), tok)
    text = '도시 "서울" 날씨 ☀️ ok'
    ids = tok.encode(text)
    assert len(ids) > len(text.split())  # multi-byte characters are split over several tokens
    hist = HistoryText(drafter.token_bytes)
    for t in ids:
        hist.extend([t])
    assert hist.text == text
    assert hist.char_end[-1] == len(text)
    assert all(a <= b for a, b in zip(hist.char_end, hist.char_end[1:], strict=False))
    assert isinstance(drafter.token_bytes, TokenBytes)


def test_history_text_whole_token_texts_match_the_incremental_decoder(tok):
    """A token whose bytes are whole characters is taken as its text (the fast path a new row's
    prompt goes through); mixed with split characters, bulk or token by token, the text and the
    offsets are what the incremental decoder alone gives."""
    import codecs

    drafter = StructureDrafter(DraftPlan(tools=[]), tok)
    table = drafter.token_bytes
    text = 'def f(x):\n    return "서울 ☀️" + x  # ok\n' * 3 + "é\u00e9 ünï"
    ids = tok.encode(text)
    assert any(table.texts[t] is None for t in ids) and any(table.texts[t] for t in ids)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    ends, count = [], 0
    for t in ids:
        count += len(decoder.decode(table.table[t]))
        ends.append(count)
    bulk = HistoryText(table)
    assert bulk.extend(ids[:7]) + bulk.extend(ids[7:]) == text
    stepwise = HistoryText(table)
    for t in ids:
        stepwise.extend([t])
    assert bulk.text == stepwise.text == text
    assert bulk.char_end == stepwise.char_end == ends
    # a long run of whole-character tokens goes through numpy (`WHOLE_RUN`), then the mixed rest
    plain = "Station 12: city Town84, reading 59 degrees, wind calm.\n" * 12
    head = tok.encode(plain)
    assert len(head) > text_mod.WHOLE_RUN and all(table.texts[t] is not None for t in head)
    fast, slow = HistoryText(table), HistoryText(table)
    assert fast.extend(head) + fast.extend(ids) == plain + text
    for t in head + ids:
        slow.extend([t])
    assert fast.text == slow.text and fast.char_end == slow.char_end
    assert HistoryText(table).extend(head + ids) == plain + text  # a long run with a split character


# -- rows that change between steps ------------------------------------------------------------

def test_rows_reordered_keep_their_state_and_resolve_their_drafts(tok):
    plan = DraftPlan(tools=[])
    drafter = StructureDrafter(plan, tok)
    a = tok.encode(_prompt(tok, "Find the Trattoria Bellavista Downtown please.")
                   + '<tool_call>{"name": "find", "arguments": {"q": "Trattoria Bell')
    b = tok.encode(_prompt(tok, "Look up Quasimodo Pemberton Street for me.")
                   + '<tool_call>{"name": "look", "arguments": {"q": "Quasimodo Pemb')
    da, db = drafter.propose([RowInput(np.array(a)), RowInput(np.array(b))])
    assert da and db
    assert drafter.pending_draft(0).tokens == da and drafter.pending_draft(1).position == len(b)
    assert drafter.pending_draft(2) is None
    # next step: rows swapped; row a accepted its whole draft (+1 bonus token), row b nothing
    a2 = a + da + [tok.encode("X")[0]]
    b2 = b + [tok.encode("!")[0]]
    drafter.propose([RowInput(np.array(b2)), RowInput(np.array(a2))])
    stats = drafter.stats()
    assert stats["rebuilds"] == 2 and stats["errors"] == 0
    by_pos = {r.position: r for r in drafter.records}
    assert by_pos[len(a)].accepted == len(da) and by_pos[len(a)].drafted == len(da)
    assert by_pos[len(b)].accepted == 0 and by_pos[len(b)].drafted == len(db)
    assert by_pos[len(a)].prefix_hash == int(prefix_hashes(a2)[len(a) - 1])
    assert by_pos[len(a)].law_class == "S" and by_pos[len(a)].kind == "tool_call"


def test_replaced_row_is_rebuilt_and_its_old_draft_dropped(tok):
    drafter = StructureDrafter(DraftPlan(tools=[]), tok)
    a = tok.encode(_prompt(tok, "Find the Trattoria Bellavista Downtown please.")
                   + '<tool_call>{"name": "find", "arguments": {"q": "Trattoria Bell')
    assert drafter.propose([RowInput(np.array(a))])[0]
    # a new request that happens to share the old row's whole history plus a long new turn
    c = a + tok.encode('avista"}}</tool_call><|im_end|>\n<|im_start|>user\nthanks<|im_end|>\n'
                       '<|im_start|>assistant\n')
    drafter.propose([RowInput(np.array(c))])
    stats = drafter.stats()
    assert stats["rebuilds"] == 2 and stats["dropped"] == 1 and drafter.records == []


def test_undraftable_rows_get_nothing_and_keep_state(tok):
    drafter = StructureDrafter(DraftPlan(tools=[]), tok)
    a = tok.encode(_prompt(tok, "Find the Trattoria Bellavista Downtown please.")
                   + '<tool_call>{"name": "find", "arguments": {"q": "Trattoria Bell')
    assert drafter.propose([RowInput(np.array(a + [0, 0]), num_tokens=len(a), draftable=False)]) == [[]]
    assert drafter.propose([RowInput(np.array(a + [0, 0]), num_tokens=len(a))])[0]


# -- accounting -------------------------------------------------------------------------------

def test_accounting_follows_a_simulated_acceptance_sequence(tok, tmp_path):
    """Greedy verification simulated against a fixed target output: the drafter's records must equal
    the acceptance computed here, and records land in the JSONL file."""
    path = tmp_path / "rounds.jsonl"
    drafter = StructureDrafter(DraftPlan(tools=[], records_path=str(path)), tok)
    prompt = _prompt(tok, "Send the report to Wilhelmina Oyelaran-Thistlewood at 9 Elmstead Crescent.")
    out = ('<tool_call>{"name": "send", "arguments": {"to": "Wilhelmina Oyelaran-Thistlewood", '
           '"address": "9 Elmstead Crescent"}}</tool_call><|im_end|>')
    target = tok.encode(prompt + out)
    k = len(tok.encode(prompt)) + 1
    expected = []
    while k < len(target):
        draft = drafter.propose([RowInput(np.array(target[:k]))])[0]
        acc = _accepted(draft, target[k:])
        if draft and k + acc + 1 <= len(target):
            expected.append((k, len(draft), acc))
        k += acc + 1
    drafter.propose([RowInput(np.array(target))])
    got = [(r.position, r.drafted, r.accepted) for r in drafter.records]
    assert got == expected[: len(got)] and len(got) >= len(expected) - 1
    assert sum(r.accepted for r in drafter.records) > 0
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    rounds = [x for x in lines if x["type"] == "round"]
    steps = [x for x in lines if x["type"] == "step"]
    assert [(x["position"], x["drafted"], x["accepted"]) for x in rounds] == got
    assert len(steps) == drafter.stats()["steps"] and all(x["proposer_s"] >= 0 for x in steps)
    stats = drafter.stats()
    assert stats["by_class"]["S"]["accepted"] == sum(r.accepted for r in drafter.records
                                                     if r.law_class == "S")
    drafter.accounting.reset()
    assert drafter.records == [] and drafter.stats()["steps"] == 0


def test_a_round_never_accepts_more_than_the_step_that_verified_it(tok):
    """vLLM's `sampled_token_ids` say how many draft tokens the step accepted: a token the grammar
    trimmed was never verified, even when the target then wrote it, so the round is capped there."""
    drafter = StructureDrafter(DraftPlan(tools=TOOLS), tok)
    history = tok.encode(_prompt(tok, "Weather in Paris in celsius?") + "<tool_call>")
    draft = drafter.propose([RowInput(np.array(history))])[0]
    assert len(draft) >= 2, draft  # the forced '{"name": ' text and the only tool's name
    # the grammar trimmed the draft to its first token; vLLM accepted it and the target's bonus token
    # is the draft's second: the history matches two draft tokens, vLLM verified one
    after = np.array(history + draft[:2])
    drafter.propose([RowInput(after, sampled=2)])
    assert [(r.position, r.accepted) for r in drafter.records] == [(len(history), 1)]
    # without `sampled` (unknown) the common prefix stands
    other = StructureDrafter(DraftPlan(tools=TOOLS), tok)
    other.propose([RowInput(np.array(history))])
    other.propose([RowInput(after)])
    assert [r.accepted for r in other.records] == [2]


def test_acceptance_estimate_learns_from_rounds(tok):
    drafter = StructureDrafter(DraftPlan(tools=[]), tok)
    acc = drafter.accounting.acceptance
    before = acc.alpha("S", "lookup")
    from agentspec_sdk.drafting.records import DraftRound

    for _ in range(30):
        drafter.accounting.add(DraftRound(0, 0, "tool_call", "S", "lookup", 4, 0))
    assert acc.alpha("S", "lookup") < before / 2


def test_each_source_of_a_chained_draft_learns_from_its_own_tokens(tok):
    from agentspec_sdk.drafting.records import DraftRound

    drafter = StructureDrafter(DraftPlan(tools=[]), tok)
    acc = drafter.accounting.acceptance
    forced, lookup, repeat = acc.alpha("S", "forced"), acc.alpha("S", "lookup"), acc.alpha("S", "repeat")
    sources = ["forced"] * 3 + ["lookup"] * 3 + ["repeat"] * 2
    for _ in range(20):  # forced run accepted whole, lookup rejected at its 2nd token, repeat never judged
        drafter.accounting.add(DraftRound(0, 0, "tool_call", "S", "forced", 8, 4), sources)
    assert acc.alpha("S", "forced") > forced
    assert acc.alpha("S", "lookup") < lookup
    assert acc.alpha("S", "repeat") == repeat or acc.alpha("S", "repeat") == acc.alpha("S")


def test_draft_estimates_are_calibrated_by_what_the_target_accepted(tok):
    """A resolved draft's estimates reach the calibration per source run, with each token's depth in
    its run; the candidate's estimates then count times the factor of their source and depth, and as
    they are with plan `calibrate` false."""
    from agentspec_sdk.drafting.records import DraftRound
    from agentspec_sdk.drafting.rows import Candidate

    drafter = StructureDrafter(DraftPlan(tools=[]), tok)
    cal = drafter.accounting.calibration
    sources = ["forced"] + ["suffix"] * 4
    for _ in range(40):  # the forced token accepted, then the tree's second token (0.9) rejected
        drafter.accounting.add(DraftRound(0, 0, "prose", "F", "forced", 5, 2), sources,
                               [0.8, 1.0, 0.9, 1.0, 1.0])
    assert cal.factor("F", "prose", "suffix", 1) < 0.3  # estimated 0.9, never accepted
    assert cal.factor("F", "prose", "suffix", 0) == pytest.approx(1.0, abs=0.01)  # 1.0, always accepted
    assert cal.factor("F", "prose", "suffix", 2) == 1.0  # never judged
    assert cal.factor("F", "prose", "forced", 0) == 1.0  # not a calibrated source
    f1 = cal.factor("F", "prose", "suffix", 1)
    tree = Candidate([5, 6, 7], ["suffix", "suffix", "extend"], "prose", "F", [0.9, 0.9, 0.5])
    assert drafter.estimates.confidences(tree) == pytest.approx([0.9 * cal.factor("F", "prose", "suffix", 0),
                                                        0.9 * f1, 0.5])
    # depth counts within a source's run: a suffix token after a forced one is at depth 0
    chained = Candidate([5, 6], ["forced", "suffix"], "prose", "F", [1.0, 0.9])
    depth0 = cal.factor("F", "prose", "suffix", 0)
    assert drafter.estimates.confidences(chained)[1] == pytest.approx(0.9 * depth0)
    off = StructureDrafter(DraftPlan(tools=[]), tok, lab=LabSwitches(calibrate=False))
    off.accounting.calibration = cal
    fresh = Candidate([5, 6, 7], ["suffix", "suffix", "extend"], "prose", "F", [0.9, 0.9, 0.5])
    assert off.estimates.confidences(fresh) == [0.9, 0.9, 0.5]
    assert "F/prose/suffix/1" in drafter.stats()["calibration"]


def test_a_chained_draft_labels_each_token_with_its_source(tok):
    drafter = StructureDrafter(DraftPlan(tools=TOOLS), tok)
    prompt = _prompt(tok, 'Use {"city":"Reykjavik"} for the weather.')
    ids = tok.encode(prompt + '<tool_call>{"name":"get_weather","arguments":{"city":"Reyk')
    (draft,) = drafter.propose([RowInput(np.array(ids))])
    pending = drafter.pending_draft(0)
    assert pending.sources is not None and len(pending.sources) == len(draft)
    # the value from the user's message (trimmed by the grammar: `unit` is still required), then the
    # grammar's forced next key
    assert tok.decode(draft).startswith('javik","unit":"')
    first_forced = pending.sources.index("forced")
    assert set(pending.sources[:first_forced]) == {"lookup"} and first_forced >= 2
    assert tok.decode(draft[:first_forced]).startswith("javik")


def test_an_environment_segment_the_model_writes_gets_lookup_drafts_within_it(tok):
    """A small model sometimes writes its own <tool_response>: the segment is drafted from the
    observations in the prompt, and the draft still stops at the segment's close marker."""
    msgs = [{"role": "system", "content": "Call tools as <tool_call>{...}</tool_call>."},
            {"role": "user", "content": "List the files."},
            {"role": "assistant", "content": '<tool_call>{"name":"ls","arguments":{}}</tool_call>'},
            {"role": "user", "content": '<tool_response>{"current_directory_content": ["report.txt", '
                                        '"notes.md"]}</tool_response>'}]
    prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    plan = DraftPlan(tools=[], gamma_max=16, prior_acceptance={"S": 0.8, "R": 0.45, "F": 0.99})
    drafter = StructureDrafter(plan, tok)
    ids = tok.encode(prompt + '<tool_response>{"current_directory_content": ["rep')
    (draft,) = drafter.propose([RowInput(np.array(ids))])
    assert tok.decode(draft) == 'ort.txt", "notes.md"]}</tool_response>'
    assert drafter.pending_draft(0).kind == "tool_response" and drafter.pending_draft(0).law_class == "F"


def test_the_drafter_prices_tokens_with_the_delta_it_learns_from_its_step_times(tok, monkeypatch):
    """Steps 50 ms apart plus 5 ms per drafted token: delta for one sequence = 5 / 50 = 0.1."""
    clock = {"t": 1000.0}
    monkeypatch.setattr(drafter_mod.time, "time", lambda: clock["t"])
    drafter = StructureDrafter(DraftPlan(tools=TOOLS, delta=0.02), tok)
    fixed_plan = StructureDrafter(DraftPlan(tools=TOOLS, delta=0.02, learn_delta=False), tok)
    prompt = _prompt(tok, "Weather in Oslo in celsius?")
    calling = np.array(tok.encode(prompt + "<tool_call>"))  # drafts the forced call
    musing = np.array(tok.encode(prompt + "Zq"))  # nothing to draft
    rng = np.random.default_rng(0)
    for _ in range(160):
        rows = [RowInput(calling) for _ in range(int(rng.integers(0, 3)))]
        rows += [RowInput(musing) for _ in range(int(rng.integers(1, 3)))]
        drafts = drafter.propose(rows)
        fixed_plan.propose(rows)
        clock["t"] += 0.05 * len(rows) + 0.005 * sum(map(len, drafts))
    assert drafter.stats()["delta_learned"] and drafter.stats()["delta"] == pytest.approx(0.1, rel=0.1)
    assert fixed_plan.stats()["delta"] == 0.02 and not fixed_plan.stats()["delta_learned"]


# -- robustness -------------------------------------------------------------------------------

def test_a_row_that_raises_gets_no_draft_and_is_counted(tok, monkeypatch, caplog):
    drafter = StructureDrafter(DraftPlan(tools=[]), tok)
    good = tok.encode(_prompt(tok, "Find the Trattoria Bellavista Downtown please.")
                      + '<tool_call>{"name": "find", "arguments": {"q": "Trattoria Bell')
    bad = good[:-3] + [999_999_999]  # not a token id of this vocabulary; the fake below raises on it
    monkeypatch.setattr(rows_mod.RowState, "__init__", _raising_init(rows_mod.RowState.__init__))
    caplog.set_level(logging.ERROR, logger="agentspec.drafting")
    out = drafter.propose([RowInput(np.array(bad)), RowInput(np.array(good))])
    assert out[0] == [] and out[1]
    stats = drafter.stats()
    assert stats["errors"] == 1 and stats["batch_errors"] == 0
    assert stats["last_error"].startswith("row 0: Traceback") and "RuntimeError: boom" in stats["last_error"]
    [record] = [r for r in caplog.records if r.name == "agentspec.drafting"]
    assert "row 0 failed" in record.getMessage() and record.exc_info[0] is RuntimeError
    # the traceback reaches the log, down to the raising line
    assert 'raise RuntimeError("boom")' in caplog.text
    drafter.propose([RowInput(np.array(good))])
    assert drafter.stats()["last_error"] == stats["last_error"]  # kept until the next failure


def _raising_init(real):
    def init(self, drafter, ids, *args):
        if int(ids[-1]) == 999_999_999:
            raise RuntimeError("boom")
        real(self, drafter, ids, *args)
    return init


# -- plan -------------------------------------------------------------------------------------

def test_plan_round_trips_and_rejects_bad_fields(tmp_path):
    plan = DraftPlan(tools=TOOLS, gamma_max=5, step_budget=12)
    path = plan.save(tmp_path / "plan.json")
    again = DraftPlan.load(path)
    assert again.to_dict() == plan.to_dict() and again.version == 1
    with pytest.raises(PlanError, match="gamma_max"):
        DraftPlan(gamma_max=-1)
    with pytest.raises(PlanError, match="unknown fields"):
        DraftPlan.from_dict({"gama_max": 3})
    with pytest.raises(PlanError, match="prior_acceptance"):
        DraftPlan(prior_acceptance={"S": 1.5})
    with pytest.raises(PlanError, match="budget_rule='rate' is a lab switch"):
        DraftPlan(budget_rule="rate")
    with pytest.raises(PlanError, match="lab switches: .*budget_rule"):
        LabSwitches.of({"budget_rule": "ratio"})
    with pytest.raises(PlanError, match="lab switches: .*calibrate"):
        LabSwitches.of({"calibrate": "no"})
    with pytest.raises(PlanError, match="not valid JSON"):
        (tmp_path / "bad.json").write_text("{")
        DraftPlan.load(tmp_path / "bad.json")


def test_plan_from_env(tmp_path, monkeypatch):
    path = DraftPlan(gamma_max=3).save(tmp_path / "p.json")
    monkeypatch.setenv("AGENTSPEC_PLAN", str(path))
    assert DraftPlan.from_env().gamma_max == 3
    monkeypatch.delenv("AGENTSPEC_PLAN")
    with pytest.raises(PlanError, match="AGENTSPEC_PLAN"):
        DraftPlan.from_env()


def test_drafter_reloads_a_changed_plan(tok, tmp_path):
    path = DraftPlan(tools=[], gamma_max=8).save(tmp_path / "p.json")
    drafter = StructureDrafter(DraftPlan.load(path), tok, plan_path=str(path))
    ids = tok.encode(_prompt(tok, "Find the Trattoria Bellavista Downtown Riverside please.")
                     + '<tool_call>{"name": "find", "arguments": {"q": "Trattoria Bell')
    assert len(drafter.propose([RowInput(np.array(ids))])[0]) > 2
    plan = DraftPlan.load(path)
    plan.gamma_max = 2
    time.sleep(0.01)
    plan.save(path)
    drafter._watcher._next = 0.0  # skip the 0.5 s poll interval
    assert len(drafter.propose([RowInput(np.array(ids))])[0]) == 2
    assert drafter.plan.version == 2


def test_the_plan_watcher_sees_a_second_write_within_one_clock_tick(tmp_path):
    """Two writes of the same size and the same mtime (one tick of the file system's clock): the
    watcher compares the bytes, so the second is seen."""
    path = DraftPlan(gamma_max=3).save(tmp_path / "p.json")
    stamp, size = path.stat().st_mtime_ns, path.stat().st_size
    watcher = PlanWatcher(path, poll_s=0.0)
    assert watcher.poll() is None  # unchanged
    DraftPlan(gamma_max=4).save(path)
    os.utime(path, ns=(stamp, stamp))
    assert (path.stat().st_mtime_ns, path.stat().st_size) == (stamp, size)
    plan = watcher.poll()
    assert plan is not None and plan.gamma_max == 4 and watcher.plan is plan
    assert watcher.poll() is None
    path.write_text("{not json")  # a bad file keeps the old plan, and is parsed once
    assert watcher.poll() is None and watcher.plan.gamma_max == 4


def test_ablation_without_isolation_drafts_across_segments(tok):
    prompt = _prompt(tok, "hi")
    msgs_out = '<tool_call>{"name": "a", "arguments": {}}</tool_call>\nThen more text here.'
    ids = tok.encode(prompt + msgs_out + ' <tool_call>{"name": "a", "arguments": {}}</tool')
    # the wall: the draft stops at the segment end (boundary "price", the default, may price past it)
    iso = StructureDrafter(DraftPlan(tools=[], boundary="wall"), tok).propose([RowInput(np.array(ids))])[0]
    free = StructureDrafter(DraftPlan(tools=[]), tok, lab=LabSwitches(isolation=False)).propose(
        [RowInput(np.array(ids))])[0]
    assert tok.decode(iso) == "_call>"
    assert tok.decode(free).startswith("_call>\nThen")


def test_ablation_without_budget_drafts_fixed_lengths(tok):
    ids = tok.encode(_prompt(tok, "Find the Trattoria Bellavista Downtown Riverside Marina please.")
                     + '<tool_call>{"name": "find", "arguments": {"q": "Trattoria Bell')
    capped = StructureDrafter(DraftPlan(tools=[], gamma_max=8, step_budget=3), tok)
    assert len(capped.propose([RowInput(np.array(ids))])[0]) == 3
    fixed = StructureDrafter(DraftPlan(tools=[], gamma_max=8, step_budget=3), tok,
                             lab=LabSwitches(budget=False))
    assert len(fixed.propose([RowInput(np.array(ids))])[0]) > 3


def test_a_failing_step_drafts_nothing_and_is_counted(tok, monkeypatch, caplog):
    drafter = StructureDrafter(DraftPlan(tools=[]), tok)
    ids = tok.encode(_prompt(tok, "Find the Trattoria Bellavista Downtown please.")
                     + '<tool_call>{"name": "find", "arguments": {"q": "Trattoria Bell')

    def broken(*args, **kwargs):
        raise ValueError("allocator failed")

    monkeypatch.setattr(pricing_mod, "allocate", broken)
    caplog.set_level(logging.ERROR, logger="agentspec.drafting")
    assert drafter.propose([RowInput(np.array(ids)), RowInput(np.array(ids[:-1]))]) == [[], []]
    stats = drafter.stats()
    assert stats["errors"] == 2 and stats["batch_errors"] == 1
    assert stats["last_error"].startswith("step of 2 rows: Traceback")
    assert "ValueError: allocator failed" in stats["last_error"]
    [record] = [r for r in caplog.records if r.name == "agentspec.drafting"]
    assert "step of 2 rows failed" in record.getMessage() and record.exc_info[0] is ValueError
    assert 'raise ValueError("allocator failed")' in caplog.text
    for _ in range(drafter_mod.LOGGED_FAILURES + 2):  # a persistent bug: the log gets the first ones only
        drafter.propose([RowInput(np.array(ids))])
    logged = [r for r in caplog.records if r.name == "agentspec.drafting"]
    assert drafter.failures == drafter_mod.LOGGED_FAILURES + 3 and len(logged) == drafter_mod.LOGGED_FAILURES
    assert f"every {drafter_mod.LOG_EVERY}th" in logged[-1].getMessage()
    monkeypatch.undo()
    assert drafter.propose([RowInput(np.array(ids))])[0]  # the next step drafts again
    assert drafter.stats()["batch_errors"] == drafter_mod.LOGGED_FAILURES + 3


def test_an_unwritable_records_file_warns_once_and_drafting_goes_on(tok, tmp_path, caplog):
    records = tmp_path / "records.jsonl"
    records.mkdir()  # a directory: every append fails
    drafter = StructureDrafter(DraftPlan(tools=[], records_path=str(records)), tok)
    ids = tok.encode(_prompt(tok, "Find the Trattoria Bellavista Downtown please.")
                     + '<tool_call>{"name": "find", "arguments": {"q": "Trattoria Bell')
    caplog.set_level(logging.WARNING, logger="agentspec.drafting")
    for _ in range(3):
        assert drafter.propose([RowInput(np.array(ids))])[0]
    warned = [r for r in caplog.records if "cannot write draft records" in r.getMessage()]
    assert len(warned) == 1 and str(records) in warned[0].getMessage()
    assert drafter.stats()["errors"] == 0 and drafter.stats()["steps"] == 3


def test_an_unsupported_tool_schema_disables_forcing_only(tok):
    bad = {"type": "function", "function": {"name": "odd", "description": "", "parameters": {
        "type": "object", "properties": {"x": {"not": {"type": "string"}}}}}}
    drafter = StructureDrafter(DraftPlan(tools=[bad]), tok)
    assert "not" in drafter.stats()["grammar_error"]
    ids = tok.encode(_prompt(tok, "Find the Trattoria Bellavista Downtown please.")
                     + '<tool_call>{"name": "find", "arguments": {"q": "Trattoria Bell')
    assert tok.decode(drafter.propose([RowInput(np.array(ids))])[0]).startswith("avista")


def test_every_bench_ablation_reaches_the_engine_as_lab_switches_not_plan_fields():
    """The bench modes structure-no-budget, -no-isolation, -rate-rule, -uncalibrated and -no-suffix
    are engine settings (`EngineConfig.lab`, drafting.lab.ABLATIONS), each one switch off; a plan
    holds none of them (its file refuses an ablation's value, and accepts the defaults older files
    hold)."""
    from agentspec_sdk.backends.engine_config import EngineConfig
    from agentspec_sdk.drafting.lab import ABLATIONS, LAB_FIELDS
    from agentspec_sdk.replay.arms import MODES, engine_kwargs

    for name in ("no-budget", "no-isolation", "rate-rule", "uncalibrated", "no-suffix"):
        kw = engine_kwargs(f"structure-{name}", 8)
        lab = EngineConfig(**kw).lab
        assert lab is ABLATIONS[name.replace("-", "_")] and not lab.is_default
        changed = {k for k, v in lab.model_dump().items() if v != LAB_FIELDS[k]}
        assert len(changed) == 1
        (field,) = changed
        with pytest.raises(PlanError, match=f"{field}=.* is a lab switch"):
            DraftPlan.from_dict({"tools": TOOLS, field: getattr(lab, field)})
    assert "lab" not in MODES["structure"] and not set(LAB_FIELDS) & set(DraftPlan(tools=TOOLS).to_dict())
    assert DraftPlan.from_dict({"tools": TOOLS, **LAB_FIELDS}) == DraftPlan(tools=TOOLS)


def test_the_lab_switches_reach_the_proposer_through_their_own_file_only(tmp_path, monkeypatch):
    """`AGENTSPEC_LAB` (written by an engine given `lab=`) names the switches the in-vLLM proposer's
    drafter runs with; unset, the drafter runs as it ships; a bad file names itself."""
    from types import SimpleNamespace

    from agentspec_sdk.backends.inside_vllm.vllm_proposer import AgentSpecProposer
    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.drafting.lab import ABLATIONS, LAB_ENV
    from agentspec_sdk.drafting.plan import PLAN_ENV

    plan_path = DraftPlan(tools=TOOLS, tokenizer=str(resolve_model())).save(tmp_path / "plan.json")
    monkeypatch.setenv(PLAN_ENV, str(plan_path))
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                             model_config=SimpleNamespace(max_model_len=512, tokenizer=resolve_model()))
    monkeypatch.delenv(LAB_ENV, raising=False)
    assert AgentSpecProposer(config).drafter.lab.is_default
    monkeypatch.setenv(LAB_ENV, str(ABLATIONS["no_isolation"].save(tmp_path / "lab.json")))
    proposer = AgentSpecProposer(config)
    assert proposer.drafter.lab == ABLATIONS["no_isolation"] and proposer.drafter.max_model_len == 512
    assert "isolation" not in json.loads(plan_path.read_text())
    (tmp_path / "bad.json").write_text('{"isolation": "no"}')
    monkeypatch.setenv(LAB_ENV, str(tmp_path / "bad.json"))
    with pytest.raises(PlanError, match=f"lab switches {tmp_path / 'bad.json'}: isolation: Input should be"):
        AgentSpecProposer(config)


ABLATION_CHILD = """
import json, sys
from agentspec_sdk.backends.embedded.vllm_engine import Engine
from agentspec_sdk.backends.types import TurnRequest
from agentspec_sdk.bfcl import tool_call_prompts
from agentspec_sdk.replay.arms import engine_kwargs

if __name__ == "__main__":
    settings = engine_kwargs("structure-no-budget", 8)
    with Engine(max_model_len=2048, kv_cache_gb=1.0, seed=0, **settings) as engine:
        drafter = engine.proposer().drafter
        results = engine.generate([TurnRequest(messages=p.messages, tools=p.tools, tool_choice="call",
                                               max_tokens=48, request_id=p.id) for p in tool_call_prompts(3)])
        stats = drafter.stats()
        print(json.dumps({"lab": drafter.lab.model_dump(), "plan": json.loads(engine.plan_path.read_text()),
                          "tokens": [len(r.token_ids) for r in results], "errors": stats["errors"],
                          "drafted": sum(c["drafted"] for c in stats["by_class"].values())}))
"""


@pytest.mark.engine
def test_a_bench_ablation_mode_runs_in_the_engine_with_its_lab_switches(tmp_path):
    """`agentspec bench`'s mode structure-no-budget in real vLLM: the engine's proposer runs with the
    mode's switches (budget off), drafts, and the plan file the engine wrote holds no switch. In a process
    of its own: closing a third in-process engine would take vLLM's parallel state from the session's."""
    import subprocess
    import sys

    from agentspec_sdk.drafting.lab import ABLATIONS, LAB_FIELDS

    script = tmp_path / "ablation_child.py"
    script.write_text(ABLATION_CHILD)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["lab"] == ABLATIONS["no_budget"].model_dump() and not got["lab"]["budget"]
    assert not set(LAB_FIELDS) & set(got["plan"])
    assert all(got["tokens"]) and got["drafted"] > 0 and got["errors"] == 0
