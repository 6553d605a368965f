import json

import pytest

from agentspec_sdk.errors import FormatError
from agentspec_sdk.structure.formats import (
    CODE_AGENT,
    REACT,
    TOOL_CALLS,
    AgentFormat,
    LawClass,
    SegmentKind,
    format_names,
    get_format,
    register_format,
)
from agentspec_sdk.structure.segmenter import segment


@pytest.mark.parametrize("fmt", [REACT, TOOL_CALLS, CODE_AGENT])
def test_builtin_round_trips_through_json(fmt):
    data = json.loads(json.dumps(fmt.to_dict()))
    assert AgentFormat.from_dict(data) == fmt
    assert get_format(fmt.name) is fmt


def test_builtin_classes_and_writers():
    assert REACT.kind("action_input").law_class is LawClass.S
    assert REACT.kind("thought").law_class is LawClass.R
    assert REACT.kind("observation").writer == "env"
    assert TOOL_CALLS.kind("tool_call").content == "json"
    assert CODE_AGENT.kind("code").law_class is LawClass.R  # the documented default for code
    assert TOOL_CALLS.stop == ("<tool_response>",)
    assert "<|im_end|>" in TOOL_CALLS.turn_end


def test_with_classes_remaps_without_touching_the_original():
    strict = CODE_AGENT.with_classes({"code": "S"})
    assert strict.kind("code").law_class is LawClass.S
    assert CODE_AGENT.kind("code").law_class is LawClass.R
    with pytest.raises(FormatError, match="no segment kind 'nope'"):
        CODE_AGENT.with_classes({"nope": "S"})
    with pytest.raises(FormatError, match="law_class must be one of S, R, F"):
        CODE_AGENT.with_classes({"code": "X"})


USER_FORMAT = {
    "name": "xml_agent",
    "initial": "plan",
    "layout": "tool_calls",
    "stop": ["<output>"],
    "kinds": [
        {"name": "plan", "law_class": "R"},
        {"name": "tool_call", "law_class": "S", "open": ["<invoke>"], "close": ["</invoke>"],
         "content": "json"},
        {"name": "output", "law_class": "F", "writer": "env", "open": ["<output>"], "close": ["</output>"]},
    ],
}


def test_user_defined_format_registers_and_segments():
    fmt = register_format(USER_FORMAT)
    assert get_format("xml_agent") is fmt
    assert "xml_agent" in format_names()
    text = 'think<invoke>{"name":"f","arguments":{"a":"</invoke>"}}</invoke><output>1</output>'
    kinds = [(s.kind, text[s.start : s.end]) for s in segment(fmt, text)]
    assert kinds == [
        ("plan", "think"),
        ("tool_call", '<invoke>{"name":"f","arguments":{"a":"</invoke>"}}</invoke>'),
        ("output", "<output>1</output>"),
    ]
    with pytest.raises(FormatError, match="already registered"):
        register_format({**USER_FORMAT, "stop": []})
    with pytest.raises(FormatError, match="built in"):
        register_format({**USER_FORMAT, "name": "react"})


def _kinds(*kinds):
    return {"name": "f", "initial": "a", "kinds": list(kinds)}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"name": "f", "initial": "a", "kinds": []}, "'kinds' must be a non-empty list"),
        (_kinds({"name": "a", "law_class": "Q"}), "law_class must be one of S, R, F"),
        (_kinds({"name": "a", "law_class": "R"}, {"name": "a", "law_class": "R", "open": ["x"]}),
         "duplicate segment kind"),
        (_kinds({"name": "a", "law_class": "R"}, {"name": "b", "law_class": "R"}),
         "only the initial kind may have no open marker"),
        (_kinds({"name": "a", "law_class": "R"},
                {"name": "b", "law_class": "S", "open": ["<", "["], "close": [">"]}),
         "pair one close marker"),
        (_kinds({"name": "a", "law_class": "R"}, {"name": "b", "law_class": "S", "open": [""]}),
         "non-empty strings"),
        (_kinds({"name": "a", "law_class": "R", "writer": "user"}), "writer must be 'model' or 'env'"),
        ({**_kinds({"name": "a", "law_class": "R"}), "initial": "zzz"}, "initial kind 'zzz'"),
        ({**_kinds({"name": "a", "law_class": "R"}, {"name": "b", "law_class": "R", "open": ["B:"]}),
          "stop": ["B:"]}, "env-written"),
        ({**_kinds({"name": "a", "law_class": "R"}), "layout": "tool_calls"},
         "needs a segment kind named 'tool_call'"),
        ({**_kinds({"name": "a", "law_class": "R"}), "layout": "nope"}, "unknown layout"),
        ({**_kinds({"name": "a", "law_class": "R"}), "colour": 1}, "unknown keys"),
        (_kinds({"name": "a", "law_class": "R"}, {"name": "b", "law_class": "R", "open": ["x"]},
                {"name": "c", "law_class": "R", "open": ["x"]}), "used by both"),
    ],
)
def test_invalid_formats_name_the_problem(data, message):
    with pytest.raises(FormatError, match=message):
        AgentFormat.from_dict(data)


def test_get_format_unknown_lists_known():
    with pytest.raises(FormatError, match="unknown format 'nope'.*react"):
        get_format("nope")


def test_segment_kind_is_json_able():
    kind = SegmentKind("code", LawClass.R, "model", ("```",), ("```",), "code")
    assert SegmentKind.from_dict(json.loads(json.dumps(kind.to_dict()))) == kind
