"""The drafter's per-step work does not grow with the row's context: counted in operations (tokens
decoded, characters segmented, characters a string search may scan, index entries examined, whole-text
joins), not timed. The same tool-call turn is replayed after prompts of about 1k, 3k and 6k tokens."""

import numpy as np
import pytest

from agentspec_sdk.drafting import lookup as lookup_mod
from agentspec_sdk.drafting.drafter import StructureDrafter
from agentspec_sdk.drafting.lab import LabSwitches
from agentspec_sdk.drafting.plan import DraftPlan
from agentspec_sdk.drafting.rows import TAIL, RowInput
from agentspec_sdk.drafting.text import HistoryText
from agentspec_sdk.structure.segmenter import Segmenter

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}}]
CALL = '<tool_call>{"name":"get_weather","arguments":{"city":"Reykjavik","unit":"celsius"}}</tool_call>'


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model())


def _prompt(tok, tokens: int) -> list[int]:
    """A chat prompt of about `tokens` tokens: a system text of numbered station records (observations
    a lookup may copy from), then the question."""
    lines, ids = [], []
    while len(ids) < tokens:
        k = len(lines)
        lines.extend(f"Station {k + j}: city Town{(k + j) * 7 % 1000}, reading {(k + j) * 13 % 97} "
                     "degrees celsius, wind calm." for j in range(8))
        system = "Call tools as <tool_call>{...}</tool_call>.\n" + "\n".join(lines)
        msgs = [{"role": "system", "content": system},
                {"role": "user", "content": "What is the weather in Reykjavik in celsius?"}]
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = tok.encode(text, add_special_tokens=False)
    return list(ids)


def _work(monkeypatch, tok, context: int) -> dict:
    counts = dict.fromkeys(("decoded", "segmented", "scanned", "indexed", "joins", "tree_tokens"), 0)
    extend, feed, text = HistoryText.extend, Segmenter.feed, HistoryText.text

    def count(key, n):
        counts[key] += n

    monkeypatch.setattr(HistoryText, "extend", lambda self, ids: count("decoded", len(ids))
                        or extend(self, ids))
    monkeypatch.setattr(Segmenter, "feed", lambda self, chunk: count("segmented", len(chunk))
                        or feed(self, chunk))
    monkeypatch.setattr(HistoryText, "text", property(lambda self: count("joins", 1) or text.fget(self)))
    prompt, out = _prompt(tok, context), tok.encode(CALL, add_special_tokens=False)
    drafter = StructureDrafter(DraftPlan(tools=TOOLS, learn_delta=False), tok)
    if drafter.trees is not None:  # the tokens the step's call adds to the trees (a request's second field)
        tree_step = drafter.trees.step
        monkeypatch.setattr(drafter.trees, "step", lambda rows:
                            count("tree_tokens", sum(len(r[1]) for r in rows)) or tree_step(rows))
    pos, steps = 1, 0
    drafter.propose([RowInput(np.asarray(prompt + out[:pos]))])  # builds the row's state: not counted
    for key in counts:
        counts[key] = 0
    searched = lookup_mod.work()  # (characters a string search may scan, index entries examined)
    drafts = drafter.propose([RowInput(np.asarray(prompt + out[:pos]))])
    while True:
        steps += 1
        truth = out[pos:]
        a = 0
        while a < len(drafts[0]) and a < len(truth) and drafts[0][a] == truth[a]:
            a += 1
        pos += a + 1
        if pos >= len(out):
            break
        drafts = drafter.propose([RowInput(np.asarray(prompt + out[:pos]))])
        assert drafter.stats()["rebuilds"] == 1  # the row is followed, never rebuilt
        assert len(drafter.rows.states[0].tail) <= TAIL
    counts["scanned"], counts["indexed"] = (now - then for now, then in zip(lookup_mod.work(), searched,
                                                                             strict=True))
    return {"steps": steps, "prompt": len(prompt), **counts}


def test_per_step_work_does_not_grow_with_the_context(monkeypatch, tok):
    work = {}
    for context in (1000, 3000, 6000):
        with monkeypatch.context() as m:
            work[context] = _work(m, tok, context)
    small, large = work[1000], work[6000]
    assert large["prompt"] >= 5 * small["prompt"]
    assert large["steps"] == small["steps"] >= 3  # the same turn, drafted the same way
    for key in ("decoded", "segmented", "tree_tokens", "joins"):  # only the tokens each step added
        assert large[key] == small[key], (key, work)
    assert large["joins"] == 0 and large["tree_tokens"] > 0
    # what a search may scan (the current segment) and what the indexes examine are bounded: not 6x
    for key in ("scanned", "indexed"):
        assert large[key] <= 1.2 * small[key] + 50, (key, work)
    assert work[3000]["scanned"] <= 1.2 * small["scanned"] + 50


def _free_text_row(tok):
    """A row in the middle of the model's prose whose text repeats the user's message: a lookup
    continues it."""
    msgs = [{"role": "system", "content": "Answer in plain words."},
            {"role": "user", "content": "Summarise: the northern ridge trail closes at dusk every day."}]
    prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return np.array(tok.encode(prompt + "In short, the northern ridge trail closes"))


@pytest.mark.parametrize("budget", [True, False])
def test_a_lookup_whose_first_token_is_not_worth_its_price_is_not_tokenized(tok, monkeypatch, budget):
    """Under the budget a draft whose first token's estimate is below the row's price is sent empty,
    so a lookup found where it would begin the draft is not tokenized; priced lower, it is, and
    drafts the user's words. Without the budget it is tokenized whatever its price."""
    from agentspec_sdk.drafting import candidates

    tokenized = []
    real = candidates.canonical_tokens
    monkeypatch.setattr(candidates, "canonical_tokens", lambda *a, **k: tokenized.append(1) or real(*a, **k))
    ids = _free_text_row(tok)
    prior = {"S": 0.8, "R": 0.3, "F": 0.3}
    dear = StructureDrafter(DraftPlan(tools=[], learn_delta=False, delta=0.5, prior_acceptance=prior), tok,
                            lab=LabSwitches(suffix_trees=False, budget=budget))
    (draft,) = dear.propose([RowInput(ids)])
    price = float(dear.sizer.step_prices[0])
    assert price > 0.3
    if budget:
        assert draft == [] and tokenized == [] and dear.choice.own.candidate(dear.rows.states[0], price) == (
            None, ("reasoning", "lookup"))
    else:  # tokenized; whether it is sent is the law's gate's call (`budget.fixed`)
        assert tokenized
    tokenized.clear()
    cheap = StructureDrafter(DraftPlan(tools=[], learn_delta=False, delta=0.05, prior_acceptance=prior), tok,
                             lab=LabSwitches(suffix_trees=False, budget=budget))
    (draft,) = cheap.propose([RowInput(ids)])
    price = float(cheap.sizer.step_prices[0])
    assert tokenized and tok.decode(draft).startswith(" at dusk")
    assert cheap.choice.own.candidate(cheap.rows.states[0], price)[1] is None


def test_the_row_choice_weighs_an_untokenized_lookup_as_the_built_one(tok):
    """The lookup not tokenized (`Estimates.lookup_pays`) is weighed in the row's choice as the built
    one would be, worth 0 at the row's price: the same winner and the same contest to learn from,
    whatever the bias learned for (kind, lookup)."""
    from types import SimpleNamespace

    from agentspec_sdk.drafting.rows import Candidate

    drafter = StructureDrafter(DraftPlan(tools=[], learn_delta=False), tok)
    price, choice, worth = 0.2, drafter.choice, drafter.estimates.worth
    tree = Candidate([1, 2, 3], ["suffix"] * 3, "thought", "R", [0.9, 0.8, 0.3])
    built = Candidate([7, 8, 9], ["lookup"] * 3, "thought", "R", [0.1, 0.9, 0.9])  # first token unpaid
    assert worth(built, price) == 0.0 < worth(tree, price)
    key = ("thought", "lookup")
    for bias in (0.0, 1.0, 5.0):  # the tree wins, then loses to own's bias
        drafter.choices.bias[key] = bias
        rows = [SimpleNamespace(contest=None), SimpleNamespace(contest=None)]
        wins = [choice.tree_wins(rows[0], built, tree, price),
                choice.tree_wins(rows[1], None, tree, price, key)]
        assert wins[0] == wins[1] == (bias < worth(tree, price))
        assert rows[0].contest == rows[1].contest

    # what `_chain` leaves when it does not tokenize the lookup it found
    choice.own = SimpleNamespace(candidate=lambda st, price: (None, key))
    choice.tree = SimpleNamespace(candidate=lambda st, note=None: tree)
    note = {}
    assert choice.choose(SimpleNamespace(contest=None), price, note) is None and note["rule"] == "unpaid"
    drafter.choices.bias[key] = 0.0
    assert choice.choose(SimpleNamespace(contest=None), price, note) is tree and note["rule"] == "tree"


def test_a_text_tokenized_again_is_answered_from_memory():
    """`MemoTokenizer`: a repeated `tokenize_str` reaches the tokenizer once, every answer is a copy
    (a caller that keeps and changes it changes nothing), and the memory is bounded."""
    from agentspec_sdk.drafting.tokenizer import MemoTokenizer

    class Counting:
        def __init__(self):
            self.calls = []

        def tokenize_str(self, text):
            self.calls.append(text)
            return [ord(c) for c in text]

    ll = Counting()
    memo = MemoTokenizer(ll, size=3)
    first = memo.tokenize_str("ab")
    first.append(0)
    assert memo.tokenize_str("ab") == [97, 98] and ll.calls == ["ab"]
    for text in ("c", "d", "e"):  # the fourth distinct text clears the memory
        memo.tokenize_str(text)
    assert memo.tokenize_str("ab") == [97, 98] and ll.calls == ["ab", "c", "d", "e", "ab"]


def test_bytes_tokenized_again_are_answered_from_memory():
    """`MemoTokenizer.tokenize_bytes` (what a tool-call matcher's sync tokenizes): the same as
    `tokenize_str`'s memory, kept apart from it, every answer a copy."""
    from agentspec_sdk.drafting.tokenizer import MemoTokenizer

    class Counting:
        def __init__(self):
            self.calls = []

        def tokenize_bytes(self, data):
            self.calls.append(data)
            return list(data)

        def tokenize_str(self, text):
            self.calls.append(text)
            return [ord(c) for c in text]

    ll = Counting()
    memo = MemoTokenizer(ll, size=2)
    first = memo.tokenize_bytes(b"ab")
    first.append(0)
    assert memo.tokenize_bytes(b"ab") == [97, 98] and ll.calls == [b"ab"]
    assert memo.tokenize_str("ab") == [97, 98] and ll.calls == [b"ab", "ab"]  # a memory of its own
    memo.tokenize_bytes(b"\xe2\x82")  # a character cut in two is remembered too
    assert memo.tokenize_bytes(b"\xe2\x82") == [0xE2, 0x82] and ll.calls.count(b"\xe2\x82") == 1
    memo.tokenize_bytes(b"c")  # the third distinct text clears the memory
    assert memo.tokenize_bytes(b"ab") == [97, 98] and ll.calls.count(b"ab") == 2


class _Counting:
    """Forwards to an llguidance object and counts the calls (a matcher's copies count too)."""

    def __init__(self, obj, counts: dict, key: str):
        self._obj, self._counts, self._key = obj, counts, key

    def __getattr__(self, name):
        attr = getattr(self._obj, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self._counts[self._key] += 1
            out = attr(*args, **kwargs)
            return _Counting(out, self._counts, self._key) if name == "deep_copy" else out
        return call


def test_per_row_work_at_64_rows_is_bounded(monkeypatch, tok):
    """64 rows of captured tool-call turns (tests/data), six steps after the rows are built: one call
    into the trees a step, which adds every row's tokens and drafts each row at most once (the draft
    and its extension together), only the tokens the row gained decoded, and a bounded number of calls
    into llguidance (matcher and tokenizer)."""
    import llguidance
    from captured_turns import captured

    from agentspec_sdk.structure.formats import CODE_AGENT, REACT, TOOL_CALLS

    data = captured("tool_calls")
    counts = dict.fromkeys(("matcher", "tokenizer", "tree_calls", "tree_rows", "tree_drafts", "decoded"), 0)
    real = llguidance.LLMatcher
    monkeypatch.setattr(llguidance, "LLMatcher", lambda *a, **k: _Counting(real(*a, **k), counts, "matcher"))
    plan = DraftPlan(formats=[REACT, TOOL_CALLS, CODE_AGENT], tools=data["tools"], learn_delta=False)
    drafter = StructureDrafter(plan, tok)
    assert drafter.trees is not None  # the compiled trees (`pip install` builds them)
    drafter.memo_tokenizer.ll = _Counting(drafter.memo_tokenizer.ll, counts, "tokenizer")
    extend = HistoryText.extend

    def count(key, n=1):
        counts[key] += n

    class CountedForest:  # the forest's calls of a step counted, and the rows and drafts they hold
        def __init__(self, forest):
            self.forest = forest

        def step(self, rows):
            count("tree_calls")
            count("tree_rows", len(rows))
            count("tree_drafts", sum(1 for row in rows if row[3]))
            return self.forest.step(rows)

        def __getattr__(self, name):  # start, adopt, stop, active: a row's set-up and teardown
            return getattr(self.forest, name)

    drafter.trees.forest = CountedForest(drafter.trees.forest)
    monkeypatch.setattr(HistoryText, "extend",
                        lambda self, ids: count("decoded", len(ids)) or extend(self, ids))
    turns = (data["turns"] * 4)[:64]
    pos = [1] * len(turns)
    drafter.propose([RowInput(np.asarray(t["prompt"] + t["out"][:1])) for t in turns])  # builds the rows
    for key in counts:
        counts[key] = 0
    told = list(pos)  # where each row's history stood at its last call
    row_steps = gained = 0
    for _ in range(6):
        live = [i for i in range(len(turns)) if pos[i] < len(turns[i]["out"])]
        gained += sum(pos[i] - told[i] for i in live)
        drafts = drafter.propose([RowInput(np.asarray(turns[i]["prompt"] + turns[i]["out"][:pos[i]]))
                                  for i in live])
        for i, draft in zip(live, drafts, strict=True):
            told[i] = pos[i]
            out, a = turns[i]["out"], 0
            while a < len(draft) and pos[i] + a < len(out) and draft[a] == out[pos[i] + a]:
                a += 1
            pos[i] = min(len(out), pos[i] + a + 1)
        row_steps += len(live)
    assert row_steps >= 250 and drafter.stats()["rebuilds"] == 64 and drafter.stats()["errors"] == 0
    per_row = {k: v / row_steps for k, v in counts.items()}
    assert counts["decoded"] == gained, per_row
    assert counts["tree_calls"] == 6 and counts["tree_rows"] == row_steps, per_row
    assert row_steps / 4 < counts["tree_drafts"] <= row_steps, per_row
    assert per_row["matcher"] <= 16 and per_row["tokenizer"] <= 5, per_row  # 11.3 and 3.1 on 2026-12-07
