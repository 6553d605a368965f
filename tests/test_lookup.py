import numpy as np
import pytest

from agentspec_sdk.drafting.drafter import StructureDrafter
from agentspec_sdk.drafting.lookup import SEPARATOR, continuation, longest_match
from agentspec_sdk.drafting.plan import DraftPlan
from agentspec_sdk.drafting.rows import RowInput


@pytest.fixture(scope="module")
def smollm_tokenizer():
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model())


def test_longest_match_prefers_longest_then_most_recent():
    corpus = "ab xyz-1 ab xyz-2 b xyz-3"
    k, pos = longest_match("...ab xyz", corpus, len(corpus), 3, 64)
    assert (k, corpus[pos + k:pos + k + 2]) == (6, "-2")
    assert longest_match("qqq", corpus, len(corpus), 3, 64) == (0, -1)


def test_match_must_end_before_end_bound():
    text = "abcabc"
    k, pos = longest_match(text, text, len(text) - 1, 3, 64)
    assert (k, pos) == (3, 0)


def test_continuation_stops_at_separator_and_prefers_earlier_corpus_on_ties():
    first = "key: alpha" + SEPARATOR + "zzz"
    second = "key: beta"
    cont, follow, k = continuation("the key: ", [(first, len(first)), (second, len(second))], min_chars=3)
    assert cont == "alpha" and follow == "" and k == 5
    cont, follow, k = continuation("key: ", [(second, len(second))], min_chars=3, max_chars=2)
    assert (cont, follow) == ("be", "ta")


def _user_prompt(tok, text):
    msgs = [{"role": "system", "content": "Call tools as <tool_call>{...}</tool_call>."},
            {"role": "user", "content": text}]
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def test_lookup_copies_an_argument_from_the_user_message(smollm_tokenizer):
    tok = smollm_tokenizer
    prompt = _user_prompt(tok, "Book a table at Trattoria Bellavista Downtown for four people.")
    plan = DraftPlan(tools=[], gamma_max=8)  # no tools: no forced drafts, lookup only
    drafter = StructureDrafter(plan, tok)
    ids = tok.encode(prompt + '<tool_call>{"name": "book", "arguments": {"place": "Trattoria Bell')
    draft = drafter.propose([RowInput(np.array(ids))])[0]
    assert draft, "lookup found nothing"
    assert tok.decode(draft).startswith("avista Downtown")
    assert drafter.records == []  # nothing resolved yet


def test_lookup_in_reasoning_reads_the_prompt_and_stops_at_the_segment_end(smollm_tokenizer):
    tok = smollm_tokenizer
    prompt = _user_prompt(tok, "Book a table at Trattoria Bellavista Downtown.<tool_call>")
    plan = DraftPlan(tools=[], prior_acceptance={"S": 0.8, "R": 0.99, "F": 0.3})
    drafter = StructureDrafter(plan, tok)
    ids = tok.encode(prompt + "I will book Trattoria Bell")
    (draft,) = drafter.propose([RowInput(np.array(ids))])
    # the marker that followed in the user's text would open a tool-call segment: the draft stops before it
    assert tok.decode(draft) == "avista Downtown."


def test_lookup_reuses_an_earlier_tool_call_of_the_prompt(smollm_tokenizer):
    tok = smollm_tokenizer
    msgs = [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": '<tool_call>{"name": "weather_lookup", "arguments": {"q": 1}}'
                                             '</tool_call>'},
            {"role": "user", "content": "again"}]
    prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    drafter = StructureDrafter(DraftPlan(tools=[]), tok)
    ids = tok.encode(prompt + '<tool_call>{"name": "weather_lo')
    draft = drafter.propose([RowInput(np.array(ids))])[0]
    text = tok.decode(draft)
    assert text.startswith('okup", "arguments"'), text
    assert "<|im_end|>" not in text


def test_corpus_index_finds_what_the_string_search_finds(monkeypatch):
    """The index answers as `longest_match` over its text (grams occurring at most CAP times)."""
    import random

    from agentspec_sdk.drafting.lookup import CorpusIndex

    monkeypatch.setattr(CorpusIndex, "DIRECT", 0)  # the index even for short texts

    rng = random.Random(0)
    for _ in range(2000):
        alphabet = 'ab c"{é'[: rng.randint(2, 7)]
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 120)))
        index = CorpusIndex(text[:50])
        index.extend(text[50:])
        query = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        end = rng.randint(0, len(text) + 1)
        assert index.longest_match(query, end, 3, 64) == longest_match(query, text, end, 3, 64)
    corpus = 'x "city": "Paris" y "city": "Rome" z'
    cont, _, k = continuation('{"city": "', [(CorpusIndex(corpus), len(corpus))], min_chars=3)
    assert (cont[:4], k) == ("Rome", 9)  # the most recent occurrence of the longest match


def test_grams_that_share_a_key_are_told_apart_by_their_text(monkeypatch):
    """The index keys a gram by a 32-bit hash; with every gram forced onto one key (and CAP above the
    text's length) each candidate is still compared as text, so the answers stay exact."""
    import random

    import numpy as np

    from agentspec_sdk.drafting import lookup as lookup_mod

    monkeypatch.setattr(lookup_mod.CorpusIndex, "DIRECT", 0)
    monkeypatch.setattr(lookup_mod.CorpusIndex, "CAP", 1000)
    monkeypatch.setattr(lookup_mod, "_gram_keys",
                        lambda codes, gram: np.zeros(len(codes) - gram + 1, np.uint64))
    monkeypatch.setattr(lookup_mod, "_key_hash", lambda key: 0)
    rng = random.Random(2)
    for _ in range(500):
        alphabet = 'ab c"{é'[: rng.randint(2, 7)]
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 120)))
        index = lookup_mod.CorpusIndex(text)
        query = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        end = rng.randint(0, len(text) + 1)
        assert index.longest_match(query, end, 3, 64) == longest_match(query, text, end, 3, 64)


def test_text_appended_after_the_index_is_searched_without_a_rebuild(monkeypatch):
    """A corpus grows a segment at a time: the index stays as built and the text appended since
    (up to DIRECT characters) is searched as a string; answers are those of `longest_match` over
    the whole text, and the index is rebuilt only once the appended text outgrows DIRECT."""
    import random

    from agentspec_sdk.drafting.lookup import CorpusIndex

    monkeypatch.setattr(CorpusIndex, "DIRECT", 16)
    builds = []
    build = CorpusIndex._build
    monkeypatch.setattr(CorpusIndex, "_build", lambda self: builds.append(len(self.text)) or build(self))
    rng = random.Random(1)
    for _ in range(1500):
        alphabet = 'ab c"{é'[: rng.randint(2, 7)]
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(40, 140)))
        index = CorpusIndex(text[:40])
        at = 40
        builds.clear()
        while at < len(text):
            piece = text[at:at + rng.randint(1, 12)]
            index.extend(piece)
            at += len(piece)
            query = "".join(rng.choice(alphabet) for _ in range(rng.randint(3, 30)))
            end = rng.randint(1, at + 1)
            assert index.longest_match(query, end, 3, 64) == longest_match(query, text[:at], end, 3, 64)
        # one build per DIRECT characters appended, not one per piece
        assert len(builds) <= 1 + (len(text) - 40) // 16


def test_gram_tables_built_in_parts_are_those_of_one_build(monkeypatch):
    """An index rebuilt after text was appended, or taken over by a longer text (`extending`: a row
    continuing its episode's turn), merges the new grams into the tables it has: the tables equal
    those of one build over the whole text, and the long grams' hash (by doubling) is the polynomial
    hash of its definition."""
    import random

    import numpy as np

    from agentspec_sdk.drafting import lookup as lookup_mod

    CorpusIndex = lookup_mod.CorpusIndex
    monkeypatch.setattr(CorpusIndex, "DIRECT", 0)
    rng = random.Random(3)
    for _ in range(300):
        alphabet = 'ab c"{é\U0001f600'[: rng.randint(2, 8)]
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 200)))
        cut = rng.randint(0, len(text))
        base = CorpusIndex(text[:cut])
        base.prepare()
        parts = CorpusIndex.extending(base, text)
        parts.prepare()
        whole = CorpusIndex(text)
        whole.prepare()
        if whole._tables is None:
            continue
        for gram in (CorpusIndex.SHORT, CorpusIndex.LONG):
            assert np.array_equal(parts._tables[gram], whole._tables[gram])
    codes = np.array([rng.randrange(0x110000) for _ in range(300)], dtype=np.uint64)
    prime, mask = int(lookup_mod._PRIME), (1 << 64) - 1
    for gram in (2, 5, 8):
        expected = [sum(int(codes[i + j]) * pow(prime, gram - 1 - j, 1 << 64) for j in range(gram)) & mask
                    for i in range(len(codes) - gram + 1)]
        assert lookup_mod._gram_codes(codes, gram).tolist() == expected
