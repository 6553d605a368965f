"""Marker-free text as plain regexes (structure.marker_free) and the token slices vLLM's llguidance
tokenizer gets (backends.inside_vllm.vllm_grammar.patch_slices): the same language as the `&`/`~` lexemes they
replace, the same masks, and masks in free text filled from slices instead of a walk of the whole
vocabulary (0.29 ms → 5 µs per mask with SmolLM2's tokenizer; timed in docs/formats.md, not here)."""

from __future__ import annotations

import random
import re

import pytest

from agentspec_sdk.errors import FormatError
from agentspec_sdk.structure.formats import format_names, get_format
from agentspec_sdk.structure.marker_free import _cover, marker_free_regex, then_pieces, token_slices

# the formats the package ships (other tests register more, e.g. the replay's prose format)
BUILT_IN = ("code_agent", "gemma_tool_code", "hermes", "llama3_json", "mistral", "pythonic", "react",
            "tool_calls")


def test_the_package_ships_these_formats():
    assert set(BUILT_IN) <= set(format_names())


def _markers(fmt) -> list[str]:
    return sorted({m for kind in fmt.kinds for m in (*kind.open, *kind.close)})


def _reference(text: str, avoid, then, heads) -> bool:
    """The llguidance lexemes' language: `/(?s:.+)/ & ~/(?s:.*(?:A).*)/ & ~/(?:H)(?s:.*)/` and
    `/(?s:.*)M/ & ~/(?s:.*(?:A).+)/`."""
    if then is None:
        return bool(text) and not any(a in text for a in avoid) and not any(text.startswith(h) for h in heads)
    return text.endswith(then) and not any(a in text[:-1] for a in avoid)


def _samples(pieces: list[str], seed: int) -> list[str]:
    rnd = random.Random(seed)
    chars = sorted({c for p in pieces for c in p}) + ["x", " ", "\n"]
    out = ["".join(rnd.choice(chars) for _ in range(rnd.randint(0, 12))) for _ in range(2500)]
    out += ["".join(rnd.choice(pieces + ["x", "y "]) for _ in range(rnd.randint(0, 4))) for _ in range(2500)]
    return out


CASES = [(name, None, ()) for name in BUILT_IN] + [
    (name, then, ()) for name in BUILT_IN for then in _markers(get_format(name))[:3]
] + [
    ("tool_calls", None, ("{", "[")),  # an anchored kind's markers: not at the text's start
    (("ab", "bab"), None, ("ab",)),  # self-overlapping markers
    (("aa",), "aa", ()),
    (("<result>",), "```", ()),  # a final marker that is not avoided may occur before the end
]


@pytest.mark.parametrize(("markers", "then", "heads"), CASES)
def test_the_regex_is_the_language_of_the_llguidance_lexeme(markers, then, heads):
    avoid = tuple(_markers(get_format(markers))) if isinstance(markers, str) else markers
    if then is not None and any(a != then and a in then[:-1] for a in avoid):
        with pytest.raises(FormatError, match="no text avoids the markers"):  # one inside the final one
            marker_free_regex(avoid, then=then, not_first=heads)
        return
    pattern = re.compile(marker_free_regex(avoid, then=then, not_first=heads), re.S)
    wrong = [s for s in _samples(list(avoid) + ([then] if then else []) + list(heads), seed=len(avoid))
             if bool(pattern.fullmatch(s)) != _reference(s, avoid, then, heads)]
    assert not wrong, wrong[:5]


def test_react_markers_give_a_small_regex():
    """Every ReAct marker ends with `:` and holds it nowhere else: the regex is built from the words
    before it (731 characters), not by state elimination (92 KB before its restart step)."""
    react = _markers(get_format("react"))
    assert len(marker_free_regex(react)) < 2000
    assert len(marker_free_regex(react, then="Action:")) < 2000


def test_react_text_before_a_marker_is_pieces_that_each_end_at_a_colon():
    """ReAct's text then `Action:` is the rule PIECE* FINAL: the same language as the one regex."""
    react = _markers(get_format("react"))
    for then in ("Action:", "Final Answer:"):
        piece, final = then_pieces(react, then)
        pieces = re.compile(f"(?:{piece})*{final}", re.S)
        whole = re.compile(marker_free_regex(react, then=then), re.S)
        for text in _samples(react, seed=7):
            assert bool(pieces.fullmatch(text)) == bool(whole.fullmatch(text)), text
    assert then_pieces(_markers(get_format("code_agent")), "```") is None  # markers open with punctuation


def test_turn_grammars_for_llguidance_hold_no_intersection_or_complement():
    from agentspec_sdk.structure.tools import ToolRegistry
    from agentspec_sdk.structure.turn_grammar import turn_grammar

    def search(query: str) -> str:
        """Search."""
        return query

    for name in BUILT_IN:
        grammar = turn_grammar(get_format(name), ToolRegistry([search]))
        assert "& ~" not in grammar, name


def test_every_registered_marker_holds_a_character_the_plain_slices_leave_out():
    markers = [m for name in BUILT_IN for m in _markers(get_format(name))]
    cut = _cover(markers)
    assert cut == {":", "<", "[", "`", "{"}
    assert all(set(m) & cut for m in markers)
    slices = token_slices(markers)
    assert slices[1].startswith('[^"\\\\\\x00-\\x1F\\x7F\\x3A') and slices[-1].startswith("[^\\x3A")
    # llguidance's own JSON slices stay, after the plain ones
    import llguidance

    assert set(llguidance.LLTokenizer.general_slices()) <= set(slices)


@pytest.fixture(scope="module")
def tokenizers():
    import llguidance.hf

    from agentspec_sdk.backends.inside_vllm.vllm_grammar import with_marker_slices
    from agentspec_sdk.backends.model_bundle import load_tokenizer

    hf = load_tokenizer(None)
    return llguidance.hf.from_tokenizer(hf), with_marker_slices(llguidance.hf.from_tokenizer(hf))


OLD_LEXEMES = {  # the `&`/`~` lexemes the turn grammars had before (2026-12-05)
    "code": ('start: T "\\n"\nT: /(?s:.*)```/ & ~/(?s:.*(?:<result>|<code>|```).+)/',
             ("<result>", "<code>", "```"), "```"),
    "tool_calls": ('start: T "{"\nT: /(?s:.*)<tool_call>/ & ~/(?s:.*(?:<tool_response>|<tool_call>).+)/',
                   ("<tool_response>", "<tool_call>"), "<tool_call>"),
    "react": ('start: T "\\n"\nT: /(?s:.+)/ & ~/(?s:.*(?:Action Input:|Final Answer:|Observation:|'
              'Thought:|Action:).*)/', ("Action Input:", "Final Answer:", "Observation:", "Thought:",
                                        "Action:"), None),
}
OLD_LEXEMES["react_then"] = (
    'start: T " x"\nT: /(?s:.*)Action:/ & ~/(?s:.*(?:Action Input:|Final Answer:|Observation:|Thought:|'
    'Action:).+)/', ("Action Input:", "Final Answer:", "Observation:", "Thought:", "Action:"), "Action:")
TEXTS = {
    "code": "Let me list it.\n```python\nimport os\nprint(os.listdir('.'))  # <code> `x`\n```",
    "tool_calls": "I will call it now <tool_c and then <tool_call>",
    "react": "I need Act: the files first. Final Ans then Observation 3\n",
    "react_then": "I need Act: the files: first. Final Ans then Action: x",
}


@pytest.mark.parametrize("name", list(OLD_LEXEMES))
def test_masks_are_the_same_as_the_old_lexemes_with_llguidance_slices(tokenizers, name):
    """Real llguidance, SmolLM2's tokenizer: along a text, the mask of the old lexeme with
    llguidance's own slices and of the new regex with the marker slices agree at every position."""
    import llguidance
    import llguidance.numpy as ln
    import numpy as np

    default, sliced = tokenizers
    old, avoid, then = OLD_LEXEMES[name]
    pieces = then_pieces(avoid, then) if then else None
    if pieces is not None:  # as the turn grammar writes it: a rule of two lexemes
        new = f'start: t " x"\nt: PIECE* FINAL\nPIECE: /{pieces[0]}/\nFINAL: /{pieces[1]}/'
    else:
        new = old.split("T: ")[0] + "T: /" + marker_free_regex(avoid, then=then) + "/"
    matchers = [llguidance.LLMatcher(default, old, log_level=0),
                llguidance.LLMatcher(sliced, new, log_level=0)]
    assert not any(m.is_error() for m in matchers)
    masks = [ln.allocate_token_bitmask(1, default.vocab_size) for _ in matchers]
    tokens = default.tokenize_str(TEXTS[name])
    for i, token in enumerate(tokens):
        for m, mask in zip(matchers, masks, strict=True):
            ln.fill_next_token_bitmask(m.deep_copy(), mask, 0)
        assert np.array_equal(masks[0], masks[1]), (name, i)
        accepted = [m.consume_token(token) for m in matchers]
        assert accepted[0] == accepted[1]
        if not accepted[0]:
            break


def test_patch_slices_wraps_the_tokenizer_builder_once_and_tolerates_a_vllm_without_it(caplog):
    from agentspec_sdk.backends.inside_vllm.vllm_grammar import patch_slices

    built = []

    class Tokenizer:
        def with_slices(self, slices):
            built.append(slices)
            return ("sliced", tuple(slices))

    class Backend:
        @staticmethod
        def _build_ll_tokenizer(tokenizer, vocab_size):
            return Tokenizer()

    patch_slices(Backend)
    patch_slices(Backend)  # idempotent: one wrapper
    kind, slices = Backend._build_ll_tokenizer(object(), 10)
    assert kind == "sliced" and len(built) == 1 and slices[0] == "[\\x20\\x0A\\x0D\\x09]+"

    class OldBackend:
        pass

    with caplog.at_level("WARNING", logger="agentspec.backends"):
        patch_slices(OldBackend)
    assert "no _build_ll_tokenizer" in caplog.text
