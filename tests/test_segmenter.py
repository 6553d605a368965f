import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentspec_sdk.structure.formats import (
    CODE_AGENT,
    GEMMA_TOOL_CODE,
    LLAMA3_JSON,
    MISTRAL,
    PYTHONIC,
    REACT,
    TOOL_CALLS,
    AgentFormat,
    LawClass,
)
from agentspec_sdk.structure.segmenter import Segmenter, Span, label_tokens, segment

REACT_TEXT = (
    'Thought: I need to search.\nAction: search\nAction Input: {"q": "Observation: x \\"Thought:\\""}\n'
    "Observation: 42\nThought: done\nFinal Answer: 42"
)
TOOL_TEXT = (
    'Let me call.<tool_call>{"name": "f", "arguments": {"s": "</tool_call> <tool_response>"}}</tool_call>\n'
    '<tool_call>{"name":"g","arguments":{"e":"\\\\"}}</tool_call><tool_response>ok</tool_response>'
)
CODE_TEXT = ('I will compute.\n```python\nprint("Thought: <result>")\n```\n'
             '<result>3</result>Done <code>x</code>')


def pieces(fmt, text):
    return [(s.kind, text[s.start : s.end]) for s in segment(fmt, text)]


def test_react_spans():
    assert pieces(REACT, REACT_TEXT) == [
        ("thought", "Thought: I need to search.\n"),
        ("action", "Action: search\n"),
        ("action_input", 'Action Input: {"q": "Observation: x \\"Thought:\\""}\n'),
        ("observation", "Observation: 42\n"),
        ("thought", "Thought: done\n"),
        ("final_answer", "Final Answer: 42"),
    ]


def test_tool_call_marker_text_inside_json_strings_is_not_a_boundary():
    assert pieces(TOOL_CALLS, TOOL_TEXT) == [
        ("reasoning", "Let me call."),
        ("tool_call",
         '<tool_call>{"name": "f", "arguments": {"s": "</tool_call> <tool_response>"}}</tool_call>'),
        ("reasoning", "\n"),
        ("tool_call", '<tool_call>{"name":"g","arguments":{"e":"\\\\"}}</tool_call>'),
        ("tool_response", "<tool_response>ok</tool_response>"),
    ]


def test_markers_inside_code_are_not_boundaries():
    assert pieces(CODE_AGENT, CODE_TEXT) == [
        ("reasoning", "I will compute.\n"),
        ("code", '```python\nprint("Thought: <result>")\n```'),
        ("reasoning", "\n"),
        ("result", "<result>3</result>"),
        ("reasoning", "Done "),
        ("code", "<code>x</code>"),
    ]


def test_law_classes_on_spans():
    spans = segment(TOOL_CALLS, TOOL_TEXT)
    assert {s.kind: s.law_class for s in spans} == {
        "reasoning": LawClass.R,
        "tool_call": LawClass.S,
        "tool_response": LawClass.F,
    }


def test_marker_split_across_chunks_is_found():
    seg = Segmenter(REACT)
    assert seg.feed("Thought: a\nObs") == []
    assert seg.pending == "Obs"
    assert seg.current.kind == "thought"
    closed = seg.feed("ervation: 1")
    assert closed == [Span(0, 11, "thought", LawClass.R)]
    assert seg.current == Span(11, 25, "observation", LawClass.F)


def test_escape_split_across_chunks():
    seg = Segmenter(TOOL_CALLS)
    for chunk in ['<tool_call>{"a": "x\\', '"</tool_call>', '"}', "</tool_call>"]:
        seg.feed(chunk)
    assert [s.kind for s in seg.spans] == ["tool_call"]
    assert seg.spans[0].end == len(seg.text)


def test_clone_is_independent_and_shares_history():
    seg = Segmenter(REACT)
    seg.feed("Thought: a\nAction: s\n")
    twin = seg.clone()
    twin.feed("Action Input: {}\nObservation: 1")
    seg.feed("Final Answer: b")
    assert [s.kind for s in seg.all_spans()] == ["thought", "action", "final_answer"]
    assert [s.kind for s in twin.all_spans()] == ["thought", "action", "action_input", "observation"]
    assert seg.text == "Thought: a\nAction: s\nFinal Answer: b"
    assert twin.text == "Thought: a\nAction: s\nAction Input: {}\nObservation: 1"
    grandchild = twin.clone()
    grandchild.feed("\nThought: c")
    assert grandchild.text.endswith("Observation: 1\nThought: c")
    assert len(twin.spans) == 3 and len(grandchild.spans) == 4


def test_boundary_in():
    seg = Segmenter(TOOL_CALLS)
    seg.feed('ok <tool_call>{"name":"f","arguments":{"a":"x')
    # a close marker inside the string is not a boundary
    assert seg.boundary_in('</tool_call>') is None
    draft = '"}}</tool_call>\nmore'
    cut = seg.boundary_in(draft)
    assert draft[:cut] == '"}}</tool_call>'  # drafting the close marker is allowed, past it is not
    assert seg.current.kind == "tool_call"  # probing does not change the state
    assert len(seg.text) == len('ok <tool_call>{"name":"f","arguments":{"a":"x')

    react = Segmenter(REACT)
    react.feed("Thought: I will")
    text = " search.\nAction: search"
    assert text[: react.boundary_in(text)] == " search.\n"  # an open marker belongs to the next segment
    react.feed("\nObserv")
    assert react.boundary_in("ation: 3") == 0  # the boundary lies in text already fed but held back
    assert react.boundary_in("e nothing") is None
    assert Segmenter(REACT).boundary_in("Thought: x") is None  # same kind, empty span: no boundary
    assert Segmenter(TOOL_CALLS).boundary_in("<tool_call>{") == 0


def test_label_tokens_with_real_tokenizer():
    transformers = pytest.importorskip("transformers", reason="extra: cpu (transformers not installed)")
    from agentspec_sdk.backends.model_bundle import resolve_model

    tok = transformers.AutoTokenizer.from_pretrained(str(resolve_model()))
    text = 'I will look.<tool_call>{"name":"search","arguments":{"q":"Observation"}}</tool_call>'
    ids = tok.encode(text)
    pieces_ = [tok.decode([i]) for i in ids]
    assert "".join(pieces_) == text
    labels = label_tokens(TOOL_CALLS, pieces_)
    spans = segment(TOOL_CALLS, text)
    offset = 0
    for piece, (kind, law_class) in zip(pieces_, labels, strict=True):
        expected = next(s for s in spans if s.start <= offset < s.end)
        assert (kind, law_class) == (expected.kind, expected.law_class)
        offset += len(piece)
    assert labels[0] == ("reasoning", LawClass.R)
    assert labels[-1] == ("tool_call", LawClass.S)


def test_spans_tile_the_text():
    for fmt, text in ((REACT, REACT_TEXT), (TOOL_CALLS, TOOL_TEXT), (CODE_AGENT, CODE_TEXT)):
        spans = segment(fmt, text)
        assert spans[0].start == 0 and spans[-1].end == len(text)
        assert all(a.end == b.start for a, b in zip(spans, spans[1:], strict=False))
        assert all(s.end > s.start for s in spans)


# -- any chunking gives the same spans ---------------------------------------------------------

# Overlapping and prefix markers stress the held-back text logic.
STRESS = AgentFormat.from_dict({
    "name": "stress", "initial": "t",
    "kinds": [
        {"name": "t", "law_class": "R"},
        {"name": "short", "law_class": "S", "open": ["ab"]},
        {"name": "long", "law_class": "S", "open": ["abcd"], "content": "json"},
        {"name": "inner", "law_class": "F", "open": ["bc"], "close": ["cb"]},
        {"name": "fenced", "law_class": "R", "open": ["<<"], "content": "code"},
    ],
})

IPYTHON = "<|start_header_id|>ipython<|end_header_id|>"
FRAGMENTS = {
    STRESS: ["a", "b", "c", "d", "ab", "abc", "bc", "cb", "<", "<<", "`", "```", '"', "\\"],
    REACT: ["Thought:", "Action:", "Action Input:", "Observation:", "Final Answer:", "Act", "Obs", '"',
            "\\", "{", "}", " ", "\n", "x", "ion"],
    TOOL_CALLS: ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<tool", "</", '"',
                 "\\", "{", "}", "a", "<", ">"],
    CODE_AGENT: ["```", "`", "``", "<code>", "</code>", "<result>", "</result>", "<", "/", "x", "\n", '"'],
    # native formats: anchored kinds (markers live at the first character only) and fenced calls
    LLAMA3_JSON: ["<|python_tag|>", "<|py", "{", "}", '"', "\\", "; ", "x", IPYTHON, "<|eot_id|>", "<|"],
    PYTHONIC: ["[", "]", "f(", ")", '"', "\\", "a=1", ", ", " ", IPYTHON, "<|eot_id|>"],
    MISTRAL: ["[TOOL_CALLS]", "[TOOL", "[", "]", '"', "{", "}", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "x"],
    GEMMA_TOOL_CODE: ["```tool_code", "```tool_output", "```", "`", "\n", "f()", "x", "``"],
}


@st.composite
def text_and_cuts(draw):
    fmt = draw(st.sampled_from(list(FRAGMENTS)))
    text = "".join(draw(st.lists(st.sampled_from(FRAGMENTS[fmt]), max_size=40)))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    return fmt, text, cuts


@settings(max_examples=400, deadline=None)
@given(text_and_cuts())
def test_any_chunking_gives_the_same_spans(case):
    fmt, text, cuts = case
    whole = Segmenter(fmt)
    whole.feed(text)
    chunked = Segmenter(fmt)
    emitted = []
    for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
        emitted += chunked.feed(text[a:b])
    assert chunked.all_spans() == whole.all_spans()
    assert emitted == chunked.spans
    assert chunked.text == text


@settings(max_examples=200, deadline=None)
@given(text_and_cuts())
def test_boundary_in_agrees_with_feeding(case):
    fmt, text, cuts = case
    cut = cuts[0] if cuts else len(text) // 2
    seg = Segmenter(fmt)
    seg.feed(text[:cut])
    probe = seg.boundary_in(text[cut:])
    twin = seg.clone()
    twin.feed(text[cut:])
    start, kind = seg.current.start, seg.current.kind
    first = next((s for s in twin.all_spans() if s.start == start), None)
    if cut == len(text):
        expected = None
    elif first is None or first.kind != kind:
        expected = 0  # the kind changed where the open span was still empty
    elif first in twin.spans:
        expected = max(0, first.end - cut)
    else:
        expected = None  # still in the open span
    assert probe == expected
