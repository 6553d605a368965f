"""A new row that continues its episode's previous turn (its history begins with that turn's whole
history: agents resend the prompt and the answer) takes that row's state over instead of building
it: the prompt tree is extended by the tokens between, not built over the whole prompt; only those
tokens are decoded and only the previous turn is segmented. The drafts are those of a row built
anew. Real captured turns (tests/data/tool_calls.capture.jsonl, code.capture.jsonl)."""

import numpy as np
import pytest
from captured_turns import captured

from agentspec_sdk.drafting import suffix_source
from agentspec_sdk.drafting.drafter import StructureDrafter
from agentspec_sdk.drafting.plan import DraftPlan
from agentspec_sdk.drafting.rows import Parking, RowInput, RowState
from agentspec_sdk.drafting.text import HistoryText
from agentspec_sdk.structure import segmenter as segmenter_mod
from agentspec_sdk.structure.formats import CODE_AGENT, REACT, TOOL_CALLS


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model())


def _episode_pairs(name: str):
    """(data, previous turn, turn) for every captured turn whose prompt begins with its previous
    turn's prompt and output."""
    data = captured(name)
    turns, pairs = data["turns"], []
    for j, t in enumerate(turns):
        for i in range(j):
            head = turns[i]["prompt"] + turns[i]["out"]
            if len(t["prompt"]) > len(head) and t["prompt"][:len(head)] == head:
                pairs.append((turns[i], t))
    return data, pairs


def _drafter(tok, tools, parked: bool) -> StructureDrafter:
    plan = DraftPlan(formats=[REACT, TOOL_CALLS, CODE_AGENT], tools=tools, learn_delta=False)
    drafter = StructureDrafter(plan, tok)
    if not parked:
        drafter.rows.parked = Parking(max_rows=0)
    return drafter


def _replay(drafter, turn) -> list[list[int]]:
    """The turn's steps, one row, greedy verification against its recorded output; the drafts."""
    out, pos, drafts = turn["out"], 1, []
    while pos < len(out):
        [draft] = drafter.propose([RowInput(np.asarray(turn["prompt"] + out[:pos]))])
        drafts.append(draft)
        a = 0
        while a < len(draft) and pos + a < len(out) and draft[a] == out[pos + a]:
            a += 1
        pos += a + 1
    drafter.propose([RowInput(np.asarray(turn["prompt"] + out))])  # the finished row's last call
    return drafts


@pytest.mark.parametrize("name", ["tool_calls", "code"])
def test_a_new_turn_takes_its_previous_turns_row_over_and_drafts_the_same(tok, monkeypatch, name):
    data, pairs = _episode_pairs(name)
    assert len(pairs) >= 5
    for prev, turn in pairs[:5]:
        with monkeypatch.context() as m:
            _continue_one(tok, m, data["tools"], prev, turn)


def _continue_one(tok, monkeypatch, tools, prev, turn) -> None:
    taken, built = _drafter(tok, tools, True), _drafter(tok, tools, False)
    for drafter in (taken, built):
        _replay(drafter, prev)
    counts = {"start": 0, "decoded": 0, "segmented": 0}
    start, extend, segment = taken.trees.start, HistoryText.extend, segmenter_mod.segment

    def count(key, n):
        counts[key] += n

    monkeypatch.setattr(taken.trees, "start", lambda ids: count("start", 1) or start(ids))
    monkeypatch.setattr(HistoryText, "extend",
                        lambda self, ids: count("decoded", len(ids)) or extend(self, ids))
    monkeypatch.setattr("agentspec_sdk.drafting.rows.segment",
                        lambda fmt, text, **kw: count("segmented", len(text)) or segment(fmt, text, **kw))
    first = [RowInput(np.asarray(turn["prompt"] + turn["out"][:1]))]
    draft = taken.propose(first)
    monkeypatch.undo()
    assert draft == built.propose(first)
    assert taken.stats()["continued"] == 1 and built.stats()["continued"] == 0
    between = len(turn["prompt"]) + 1 - len(prev["prompt"]) - len(prev["out"])
    # no tree over the whole prompt; only the tokens between the turns decoded; of the prompt's model
    # turns only the previous one segmented (it is shorter than the prompt's text)
    assert counts["start"] == 0
    assert counts["decoded"] == between
    assert 0 < counts["segmented"] < len(tok.decode(turn["prompt"])) / 2
    # the state is a new row's, and the rest of the turn drafts as a row built anew
    st, fresh = taken.rows.states[0], built.rows.states[0]
    assert st.text.text == fresh.text.text and st.turn_char == fresh.turn_char
    assert {k: c.text for k, c in st.corpora.items()} == {k: c.text for k, c in fresh.corpora.items()}
    pairs = [(st.prompt_text, fresh.prompt_text)] + [(st.corpora[k], fresh.corpora[k]) for k in st.corpora]
    for a, b in pairs:
        assert (a.tables is None) == (b.tables is None)
        if a.tables is not None:
            assert all(np.array_equal(a.tables[g], b.tables[g]) for g in b.tables)
    assert _replay(taken, turn) == _replay(built, turn)


def test_a_row_whose_history_does_not_begin_with_a_parked_one_is_built(tok):
    data, pairs = _episode_pairs("tool_calls")
    prev, turn = pairs[0]
    drafter = _drafter(tok, data["tools"], True)
    _replay(drafter, prev)
    other = list(turn["prompt"])
    other[len(prev["prompt"]) - 3] += 1  # one token of the previous prompt differs
    drafter.propose([RowInput(np.asarray(other + turn["out"][:1]))])
    assert drafter.stats()["continued"] == 0 and drafter.stats()["parked"] == 1


def test_parking_keeps_its_bounds_and_forgets_the_oldest(tok):
    data = captured("code")
    drafter = _drafter(tok, data["tools"], True)
    ctx = drafter.rows.context
    parking = Parking(max_rows=2, max_tokens=10 ** 6)
    states = [RowState(ctx, np.asarray(t["prompt"] + t["out"])) for t in data["turns"][:3]]
    forest = drafter.trees.forest
    for st in states:
        parking.park(st)
    assert len(parking) == 2 and not forest.active(states[0].tree_key) and forest.active(states[2].tree_key)
    small = Parking(max_rows=8, max_tokens=len(data["turns"][1]["prompt"]) + len(data["turns"][1]["out"]))
    small.park(states[1])
    small.park(states[2])  # over the token bound: the older one goes
    assert len(small) == 1 and not forest.active(states[1].tree_key)
    parking.clear()
    small.clear()
    assert forest.num_active() == 0


def test_a_stopped_tree_is_torn_down_by_the_reaper(tok):
    """Stopping a row takes its prompt tree out of the forest at once; the reaper thread frees it
    (without the GIL) off the caller's path."""
    import time

    data = captured("code")
    trees = suffix_source.SuffixTrees()
    key = trees.start(np.asarray(data["turns"][0]["prompt"]))
    before = suffix_source._REAPER.dropped
    trees.stop(key)
    assert not trees.forest.active(key) and trees.forest.num_active() == 0
    deadline = time.monotonic() + 10
    while suffix_source._REAPER.dropped == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert suffix_source._REAPER.dropped > before
    assert trees.speculate(key, np.asarray(data["turns"][0]["prompt"]), 8) == ([], [])
