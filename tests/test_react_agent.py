"""ReAct recording and replay: the acting turn's grammar (llguidance on SmolLM2's real tokens), the
agent policy, episode stubs. The real engine replays the bundled ReAct traces in test_code_agent."""

from __future__ import annotations

import pytest

from agentspec_sdk import bfcl
from agentspec_sdk.replay import loop
from agentspec_sdk.replay.record import bfcl_episode_stub
from agentspec_sdk.structure.formats import REACT
from agentspec_sdk.structure.tools import ToolRegistry
from agentspec_sdk.structure.turn_grammar import turn_grammar


@pytest.fixture(scope="module")
def episode():
    return bfcl_episode_stub(bfcl.multi_turn_entries()[0], "base", 2, "react")


@pytest.fixture(scope="module")
def accepts(episode):
    import llguidance
    import llguidance.hf
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model

    hf = AutoTokenizer.from_pretrained(str(resolve_model()))
    tokenizer = llguidance.hf.from_tokenizer(hf)
    grammar = turn_grammar(REACT, ToolRegistry(episode.tools), tool_choice="call",
                           thought_chars=loop.THOUGHT_CHARS)
    assert llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(grammar),
                                                 tokenizer) == ""

    def check(text: str) -> bool:
        matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar))
        ids = hf.encode(text, add_special_tokens=False)
        return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()

    return check


def test_stub_is_the_bfcl_episode_in_react(episode):
    assert episode.id == "bfcl-react/multi_turn_base_0" and episode.format == "react"
    assert episode.tools == bfcl_episode_stub(bfcl.multi_turn_entries()[0], "base", 2).tools


def test_an_acting_turn_is_one_thought_line_then_a_forced_action(accepts):
    assert accepts('Thought: I list the files first.\nAction: ls\nAction Input: {"a":true}\n')
    assert accepts("Thought: go\nAction: pwd\nAction Input: {}")
    assert not accepts("I will just talk about it.")  # the turn starts with Thought:
    assert not accepts("Thought: " + "x" * (loop.THOUGHT_CHARS + 1) + "\nAction: pwd\nAction Input: {}")
    assert not accepts("Thought: a\nb\nAction: pwd\nAction Input: {}")  # one line
    assert not accepts("Thought: x\nAction: teleport\nAction Input: {}")  # only the episode's tools
    assert not accepts('Thought: x\nAction: ls\nAction Input: {"a":"yes"}')  # schema-valid arguments only
    assert not accepts("Thought: x\nAction: pwd\nAction Input: {}\nObservation: /")  # the turn ends here
    assert not accepts("Thought: x\nFinal Answer: done")  # an acting turn acts


def test_the_policy_acts_first_and_may_answer_last(episode):
    acting = loop._GRAMMARS.get(episode, "call")
    assert acting == turn_grammar(REACT, ToolRegistry(episode.tools), tool_choice="required",
                                  thought_chars=loop.THOUGHT_CHARS)
    last = loop._GRAMMARS.get(episode, "auto")
    assert "Final Answer:" in last and last != acting
    calls = loop.turn_calls(REACT, 'Thought: x\nAction: cd\nAction Input: {"folder":"document"}\n')
    assert calls == [{"name": "cd", "arguments": {"folder": "document"}}]


def test_the_acting_grammar_survives_a_drafter_validating_drafts(episode):
    """vLLM validates every row's draft against the request grammar at every step. The thought line
    once was `[^\\n]{1,200}` intersected with "no marker", whose derivatives llguidance's lexer
    builds per (length, marker prefix): validating drafts taken from the text itself (what suffix
    trees draft) put the matcher in "lexer error: too many expressions constructed" after 4 tokens
    (issue 21: every later draft of that turn was then rejected)."""
    import llguidance
    import llguidance.hf
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model

    hf = AutoTokenizer.from_pretrained(str(resolve_model()))
    grammar = turn_grammar(REACT, ToolRegistry(episode.tools), tool_choice="call",
                           thought_chars=loop.THOUGHT_CHARS)
    matcher = llguidance.LLMatcher(llguidance.hf.from_tokenizer(hf),
                                   llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    text = ('Thought: I need to find the "Action Input" of the booking first, so I call the tool that '
            'lists every file and then check the folder before I decide what to do next.\nAction: ls\n'
            'Action Input: {"a":true}\n')
    ids = hf.encode(text, add_special_tokens=False)
    for i, token in enumerate(ids):
        if i < 12:  # the error came within the first tokens of the line
            for k in range(0, len(ids), 2):
                matcher.validate_tokens(ids[k:k + 16])
        assert matcher.consume_token(token), (i, matcher.get_error())
    assert not matcher.is_error() and matcher.is_accepting()
