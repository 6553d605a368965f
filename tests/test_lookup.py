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


@pytest.fixture
def index_settings():
    """The compiled index's class settings (DIRECT, CAP, KEY_MASK), restored after the test (they
    are the module's own values, not Python attributes monkeypatch could put back)."""
    from agentspec_sdk.drafting.lookup import CorpusIndex

    saved = {name: getattr(CorpusIndex, name) for name in ("DIRECT", "CAP", "KEY_MASK")}
    yield CorpusIndex
    for name, value in saved.items():
        setattr(CorpusIndex, name, value)


def _reference_match(query: str, corpus: str, end: int, min_k: int, max_k: int, start: int = 0):
    """`longest_match` by its definition, in Python: the longest suffix (min_k..max_k characters) of
    `query` that `str.rfind` finds in corpus[start:end], its most recent occurrence."""
    for k in range(min(max_k, len(query)), min_k - 1, -1):
        if end <= 0:
            break
        pos = corpus.rfind(query[-k:] if k else query, start, end)
        if pos >= 0:
            return k, pos
    return 0, -1


def _random_text(rng, alphabet, lo, hi):
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))


def test_longest_match_is_the_string_search_of_its_definition():
    import random

    rng = random.Random(4)
    for _ in range(3000):
        alphabet = 'ab c"{é\U0001f600'[: rng.randint(2, 8)]
        corpus, query = _random_text(rng, alphabet, 0, 120), _random_text(rng, alphabet, 0, 30)
        end, start, min_k = rng.randint(-1, len(corpus) + 2), rng.randint(0, 8), rng.randint(1, 4)
        assert longest_match(query, corpus, end, min_k, 64, start) == \
            _reference_match(query, corpus, end, min_k, 64, start)


def test_corpus_index_finds_what_the_string_search_finds(index_settings):
    """The index answers as `longest_match` over its text (grams occurring at most CAP times)."""
    import random

    CorpusIndex = index_settings
    CorpusIndex.DIRECT = 0  # the index even for short texts

    rng = random.Random(0)
    for _ in range(2000):
        alphabet = 'ab c"{é'[: rng.randint(2, 7)]
        text = _random_text(rng, alphabet, 0, 120)
        index = CorpusIndex(text[:50])
        index.extend(text[50:])
        query = _random_text(rng, alphabet, 0, 30)
        end = rng.randint(0, len(text) + 1)
        assert index.longest_match(query, end, 3, 64) == _reference_match(query, text, end, 3, 64)
    corpus = 'x "city": "Paris" y "city": "Rome" z'
    cont, _, k = continuation('{"city": "', [(CorpusIndex(corpus), len(corpus))], min_chars=3)
    assert (cont[:4], k) == ("Rome", 9)  # the most recent occurrence of the longest match


def test_grams_that_share_a_key_are_told_apart_by_their_text(index_settings):
    """The index keys a gram by a 32-bit hash; with every gram forced onto one key (and CAP above the
    text's length) each candidate is still compared as text, so the answers stay exact."""
    import random

    CorpusIndex = index_settings
    CorpusIndex.DIRECT = 0
    CorpusIndex.CAP = 1000
    CorpusIndex.KEY_MASK = 0
    rng = random.Random(2)
    for _ in range(500):
        alphabet = 'ab c"{é'[: rng.randint(2, 7)]
        text = _random_text(rng, alphabet, 0, 120)
        index = CorpusIndex(text)
        query = _random_text(rng, alphabet, 0, 30)
        end = rng.randint(0, len(text) + 1)
        assert index.longest_match(query, end, 3, 64) == _reference_match(query, text, end, 3, 64)
        index.prepare()
        if index.tables is not None:
            assert not (index.tables[3] >> np.uint64(32)).any()  # one key: 0


def test_a_key_with_more_than_cap_occurrences_keeps_its_most_recent():
    """A gram that occurs thousands of times: the index examines its CAP most recent occurrences
    only, and finds the longest match among them at its latest place."""
    from agentspec_sdk.drafting.lookup import CorpusIndex

    text = "xyz." * 3000 + "needle xyz"
    index = CorpusIndex(text)
    k, pos = index.longest_match("q.xyz", len(text), 3, 64)
    assert (k, pos) == (4, len(text) - len("needle xyz") - 5)  # the last ".xyz"
    assert 0 < index.checked <= CorpusIndex.CAP


def test_text_appended_after_the_index_is_searched_without_a_rebuild(index_settings):
    """A corpus grows a segment at a time: the index stays as built and the text appended since
    (up to DIRECT characters) is searched as a string; answers are those of `longest_match` over
    the whole text, and the index is rebuilt only once the appended text outgrows DIRECT."""
    import random

    CorpusIndex = index_settings
    CorpusIndex.DIRECT = 16
    rng = random.Random(1)
    for _ in range(1500):
        alphabet = 'ab c"{é'[: rng.randint(2, 7)]
        text = _random_text(rng, alphabet, 40, 140)
        index = CorpusIndex(text[:40])
        at = 40
        while at < len(text):
            piece = text[at:at + rng.randint(1, 12)]
            index.extend(piece)
            at += len(piece)
            query = _random_text(rng, alphabet, 3, 30)
            end = rng.randint(1, at + 1)
            assert index.longest_match(query, end, 3, 64) == _reference_match(query, text[:at], end, 3, 64)
        # one build per DIRECT characters appended, not one per piece
        assert index.builds <= 1 + (len(text) - 40) // 16


def _reference_tables(text: str) -> dict:
    """The gram tables by their definition, in Python integers: per gram length, sorted, each
    window's key (3 characters: their code points, 21 bits each; 8: the polynomial hash mod 2**64 of
    prime 0x100000001B3; then times 0x9E3779B97F4A7C15, the high half) above its end offset."""
    mask, prime, mix = (1 << 64) - 1, 0x100000001B3, 0x9E3779B97F4A7C15
    tables = {}
    for gram in (3, 8):
        entries = []
        for end in range(gram, len(text) + 1):
            window = [ord(c) for c in text[end - gram:end]]
            if gram == 3:
                code = (window[0] << 42) | (window[1] << 21) | window[2]
            else:
                code = 0
                for c in window:
                    code = (code * prime + c) & mask
            entries.append((((code * mix) & mask) >> 32) << 32 | end)
        tables[gram] = sorted(entries)
    return tables


def test_gram_tables_built_in_parts_are_those_of_one_build(index_settings):
    """An index rebuilt after text was appended, or taken over by a longer text (`extending`: a row
    continuing its episode's turn), merges the new grams into the tables it has: the tables equal
    those of one build over the whole text, and those of the keys' definition."""
    import random

    CorpusIndex = index_settings
    CorpusIndex.DIRECT = 0
    rng = random.Random(3)
    for _ in range(300):
        alphabet = 'ab c"{é\U0001f600'[: rng.randint(2, 8)]
        text = _random_text(rng, alphabet, 0, 200)
        cut = rng.randint(0, len(text))
        base = CorpusIndex(text[:cut])
        base.prepare()
        parts = CorpusIndex.extending(base, text)
        parts.prepare()
        whole = CorpusIndex(text)
        whole.prepare()
        if whole.tables is None:
            continue
        expected = _reference_tables(text)
        for gram in (CorpusIndex.SHORT, CorpusIndex.LONG):
            assert np.array_equal(parts.tables[gram], whole.tables[gram])
            assert whole.tables[gram].tolist() == expected[gram]
