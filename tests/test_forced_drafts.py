import numpy as np
import pytest

from agentspec_sdk.drafting.drafter import StructureDrafter
from agentspec_sdk.drafting.forced import CallMatcher, canonical_tokens
from agentspec_sdk.drafting.plan import DraftPlan
from agentspec_sdk.drafting.rows import RowInput
from agentspec_sdk.structure.turn_grammar import tool_call_grammar


def _tool(name, props, required):
    return {"type": "function", "function": {"name": name, "description": name, "parameters": {
        "type": "object", "properties": props, "required": required}}}


WEATHER = _tool("get_weather", {"city": {"type": "string"},
                                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                ["city", "unit"])
TIME = _tool("get_time", {"tz": {"type": "string"}}, ["tz"])


def _plan(**fields) -> DraftPlan:
    """These tests check what is drafted, not how much the price lets through: delta 0 sends every
    token of the candidate (the default prior, 0.04 a token, sends a forced run of 14 tokens at most
    until forced text's acceptance is learned)."""
    return DraftPlan(delta=0.0, **fields)


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model())


def _prompt(tok, user="What's the weather in Oslo, in fahrenheit?"):
    msgs = [{"role": "system", "content": "Call tools as <tool_call>{...}</tool_call>."},
            {"role": "user", "content": user}]
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def _draft(drafter, tok, text):
    ids = tok.encode(text)
    return drafter.propose([RowInput(np.array(ids, dtype=np.int32))])[0]


def test_call_opening_and_unique_tool_name_are_forced(tok):
    drafter = StructureDrafter(_plan(tools=[WEATHER], gamma_max=16), tok)
    draft = tok.decode(_draft(drafter, tok, _prompt(tok) + "<tool_call>"))
    assert draft.startswith('{"name":"get_weather","arguments":{"')
    assert '{"name":"get_weather","arguments":{"city":"'.startswith(draft)


def test_shared_name_prefix_is_forced_up_to_the_choice(tok):
    drafter = StructureDrafter(_plan(tools=[WEATHER, TIME]), tok)
    draft = tok.decode(_draft(drafter, tok, _prompt(tok) + "<tool_call>"))
    assert '{"name":"get_'.startswith(draft) and draft.startswith('{"name":"')
    # once the prefix is unique the rest of the name and the next key follow
    rest = tok.decode(_draft(drafter, tok, _prompt(tok) + '<tool_call>{"name":"get_w'))
    assert rest.startswith('eather","arguments":{"')


def test_enum_completion_closes_the_call_and_stops_at_the_close_marker(tok):
    drafter = StructureDrafter(_plan(tools=[WEATHER]), tok)
    text = _prompt(tok) + '<tool_call>{"name":"get_weather","arguments":{"city":"Oslo","unit":"f'
    draft = tok.decode(_draft(drafter, tok, text))
    assert draft == 'ahrenheit"}}</tool_call>'
    assert drafter.records == []
    assert drafter.stats()["errors"] == 0


def test_after_a_finished_object_only_the_close_marker_is_drafted(tok):
    drafter = StructureDrafter(_plan(tools=[WEATHER]), tok)
    text = _prompt(tok) + '<tool_call>{"name":"get_weather","arguments":{"city":"Oslo","unit":"celsius"}}'
    assert tok.decode(_draft(drafter, tok, text)) == "</tool_call>"
    assert tok.decode(_draft(drafter, tok, text + "\n")) == "</tool_call>"


def test_newline_after_the_open_marker_is_allowed(tok):
    drafter = StructureDrafter(_plan(tools=[WEATHER]), tok)
    draft = tok.decode(_draft(drafter, tok, _prompt(tok) + "<tool_call>\n"))
    assert draft.startswith('{"name":"get_weather"')


def test_text_outside_the_grammar_gets_no_forced_draft(tok):
    drafter = StructureDrafter(_plan(tools=[WEATHER]), tok)
    draft = _draft(drafter, tok, _prompt(tok) + '<tool_call>{"tool": "x", ')
    assert all(r.source != "forced" for r in drafter.records)
    assert drafter.stats()["errors"] == 0
    assert '"name"' not in tok.decode(draft)


def test_forced_drafts_are_the_canonical_tokenization(tok):
    drafter = StructureDrafter(_plan(tools=[WEATHER]), tok)
    text = _prompt(tok) + '<tool_call>{"name":"get_weather","arguments":{"city":"Oslo","unit":"f'
    ids = tok.encode(text)
    draft = drafter.propose([RowInput(np.array(ids))])[0]
    assert tok.encode(text + tok.decode(draft)) == ids + draft


def test_matcher_is_fed_incrementally_and_follows_a_changed_row(tok):
    drafter = StructureDrafter(_plan(tools=[WEATHER]), tok)
    full = _prompt(tok) + '<tool_call>{"name":"get_weather","arguments":{"city":"Oslo","unit":"celsius"}}'
    ids = tok.encode(full)
    start = len(tok.encode(_prompt(tok) + "<tool_call>"))
    matchers = set()
    for k in range(start, len(ids)):
        drafter.propose([RowInput(np.array(ids[:k]))])
        row = drafter.rows.states[0]
        matchers.add(id(row.call))
    assert len(matchers) == 1  # one matcher for the whole segment, never rebuilt
    assert drafter.stats()["rebuilds"] == 1
    # a different row (another request) replaces it: fresh state, correct forced text
    other = tok.encode(_prompt(tok, "Weather in Lima?") + '<tool_call>{"name":"get_weather","arguments":{"ci')
    assert tok.decode(drafter.propose([RowInput(np.array(other))])[0]).startswith('ty":"')
    assert drafter.stats()["rebuilds"] == 2


def test_call_matcher_rolls_back_a_changed_tail(tok):
    import llguidance.hf

    ll = llguidance.hf.from_tokenizer(tok)
    m = CallMatcher(ll, tool_call_grammar([*_registry([WEATHER])]), "</tool_call>")
    assert m.forced_text('{"name":"get_weather","arguments":{"ci') == 'ty":"'
    # re-tokenizing the longer text changes the last token: the matcher rolls it back, not restarts
    assert (m.forced_text('{"name":"get_weather","arguments":{"city":"Oslo","unit":"c')
            == 'elsius"}}</tool_call>')
    assert not m.dead


def test_canonical_tokens_drop_a_possibly_merging_last_token(tok):
    import llguidance.hf

    ll = llguidance.hf.from_tokenizer(tok)
    emitted = tok.encode('{"a')
    keep = canonical_tokens(ll, emitted, '{"a', '":"x', keep_last=True)
    drop = canonical_tokens(ll, emitted, '{"a', '":"x', keep_last=False)
    assert keep[:-1] == drop and tok.decode(keep) == '":"x'


def _registry(tools):
    from agentspec_sdk.structure.tools import ToolRegistry

    return ToolRegistry(tools).tools


def test_lookup_inside_a_call_is_trimmed_to_what_the_grammar_allows(tok):
    drafter = StructureDrafter(_plan(tools=[WEATHER], gamma_max=16), tok)
    prompt = _prompt(tok, "Weather for San Francisco\nand then Lima")
    draft = tok.decode(_draft(drafter, tok,
                              prompt + '<tool_call>{"name":"get_weather","arguments":{"city":"San'))
    assert draft.startswith(" Francisco")
    assert "\n" not in draft  # a raw newline cannot be inside a JSON string
    unchecked = StructureDrafter(_plan(tools=[], gamma_max=16), tok)
    raw = tok.decode(_draft(unchecked, tok,
                            prompt + '<tool_call>{"name":"get_weather","arguments":{"city":"San'))
    assert "\n" in raw


def _react_prompt(tok):
    msgs = [{"role": "system", "content": "Answer with Thought:, Action:, Action Input: and wait for "
                                          "Observation:."},
            {"role": "user", "content": "What's the weather in Oslo, in fahrenheit?"}]
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def test_react_action_name_and_action_input_are_forced(tok):
    drafter = StructureDrafter(_plan(formats=["react"], tools=[WEATHER, TIME], gamma_max=16), tok)
    head = _react_prompt(tok) + "Thought: I need the weather.\nAction: get_w"
    assert tok.decode(_draft(drafter, tok, head)) == "eather\n"  # stops before "Action Input:"
    text = head + 'eather\nAction Input: {"city":"Oslo","unit":"f'
    assert tok.decode(_draft(drafter, tok, text)) == 'ahrenheit"}'  # not the call wrapper's "}"
    other = _react_prompt(tok) + 'Thought: time.\nAction: get_time\nAction Input: '
    assert tok.decode(_draft(drafter, tok, other)).startswith('{"tz":"')
    assert drafter.stats()["errors"] == 0


def test_json_value_end():
    from agentspec_sdk.drafting.forced import json_value_end

    assert json_value_end('{"a":"}{","b":[1,{}]}}') == 21
    assert json_value_end('{"a":"\\"}"') is None


CALL = '{"name":"get_weather","arguments":{"city":"Oslo","unit":"celsius"}}'


def test_forced_text_chains_into_a_lookup_of_an_earlier_call(tok):
    drafter = StructureDrafter(_plan(tools=[WEATHER, TIME], gamma_max=32), tok)
    head = _prompt(tok) + f"<tool_call>{CALL}</tool_call>\n<tool_call>\n" + '{"name":"get_w'
    tokens = _draft(drafter, tok, head)
    # forced rest of the name, then the rest of the earlier call copied (up to the segment's end)
    assert tok.decode(tokens[:6]) == 'eather","arguments":{"'
    assert 'eather","arguments":{"city":"Oslo","unit":"celsius"}}</tool_call>'.startswith(tok.decode(tokens))
    assert len(tokens) >= 12
    assert drafter.pending_draft(0).source == "forced"


def test_a_repeated_call_is_copied_with_its_newline(tok):
    drafter = StructureDrafter(_plan(tools=[WEATHER, TIME], gamma_max=32), tok)
    head = _prompt(tok) + f"<tool_call>\n{CALL}</tool_call>\n<tool_call>"
    draft = tok.decode(_draft(drafter, tok, head))
    # (at delta 0 the draft runs on to the close marker; the price cuts it in use: row_prices)
    assert (draft.startswith('\n{"name":"get_weather","arguments":{"city":"Oslo')
            and (CALL + "</tool_call>").startswith(draft[1:]))


def test_a_begun_open_marker_is_completed_and_the_call_drafted(tok):
    drafter = StructureDrafter(_plan(tools=[WEATHER, TIME], gamma_max=32), tok)
    head = _prompt(tok) + f"<tool_call>{CALL}</tool_call>\n<"
    draft = tok.decode(_draft(drafter, tok, head))
    assert draft.startswith('tool_call>{"name":"get_weather","arguments":{"city"')
    assert f"tool_call>{CALL}</tool_call>".startswith(draft)
    assert drafter.pending_draft(0).law_class == "S"
    # without a begun marker the draft never crosses into the next segment
    drafter = StructureDrafter(_plan(tools=[WEATHER, TIME], gamma_max=32), tok)
    assert "<tool_call>" not in tok.decode(_draft(drafter, tok, head[:-1]))


def test_a_chained_draft_leaves_the_matcher_in_the_real_state(tok):
    drafter = StructureDrafter(_plan(tools=[WEATHER, TIME], gamma_max=32), tok)
    head = (_prompt(tok) + f"<tool_call>{CALL}</tool_call>\n<tool_call>"
            + '{"name":"get_weather","arguments":{"city":"')
    assert tok.decode(_draft(drafter, tok, head)).startswith('Oslo","unit":"celsius"}}')
    # the model wrote something else: the forced text follows the real text, not the old draft
    assert tok.decode(_draft(drafter, tok, head + 'Bergen","unit":"f')) == 'ahrenheit"}}</tool_call>'
    assert drafter.stats()["rebuilds"] == 1 and drafter.stats()["errors"] == 0


def test_chained_drafts_are_the_canonical_tokenization(tok):
    drafter = StructureDrafter(_plan(tools=[WEATHER, TIME], gamma_max=32), tok)
    text = (_prompt(tok) + f"<tool_call>{CALL}</tool_call>\n<tool_call>"
            + '{"name":"get_weather","arguments":{"')
    ids = tok.encode(text)
    draft = drafter.propose([RowInput(np.array(ids))])[0]
    assert tok.encode(text + tok.decode(draft)) == ids + draft


def test_a_held_angle_bracket_inside_a_call_is_not_a_new_call(tok):
    drafter = StructureDrafter(_plan(tools=[WEATHER, TIME], gamma_max=32), tok)
    draft = tok.decode(_draft(drafter, tok, _prompt(tok) + f"<tool_call>{CALL}<"))
    assert not draft.startswith("tool_call>")


def test_a_native_format_forces_its_own_call_syntax(tok):
    """Hermes writes the call object with json.dumps's spacing: the forced draft follows it."""
    drafter = StructureDrafter(_plan(formats=["hermes"], tools=[WEATHER], gamma_max=16), tok)
    draft = tok.decode(_draft(drafter, tok, _prompt(tok) + "<tool_call>\n"))
    assert draft.startswith('{"name": "get_weather", "arguments": {"')
    text = _prompt(tok) + '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "f'
    assert tok.decode(_draft(drafter, tok, text)).startswith('ahrenheit"}}')
    assert drafter.stats()["errors"] == 0


def _canonical(tok, drafter, text):
    """The draft after `text`, checked to be the tokenizer's own tokenization of its text."""
    ids = tok.encode(text)
    draft = drafter.propose([RowInput(np.array(ids, dtype=np.int32))])[0]
    assert tok.encode(text + tok.decode(draft)) == ids + draft
    return tok.decode(draft)


def _native(fmt, tools=(WEATHER,)):
    return StructureDrafter(_plan(formats=[fmt], tools=list(tools), gamma_max=16), _native.tok)


@pytest.fixture
def native(tok):
    _native.tok = tok
    return _native


def test_hermes_forces_the_newline_before_its_close_marker(tok, native):
    drafter = native("hermes")
    head = _prompt(tok) + '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "f'
    assert _canonical(tok, drafter, head) == 'ahrenheit"}}\n</tool_call>'
    assert _canonical(tok, drafter, head + 'ahrenheit"}}\n') == "</tool_call>"


def test_llama3_json_call_list_is_forced_after_the_tag_or_the_brace(tok, native):
    drafter = native("llama3_json")
    # (SmolLM2 writes the tag as text: its `>` and the forced `{"` are separate tokens)
    assert tok.decode(_draft(drafter, tok, _prompt(tok) + "<|python_tag|>")).startswith(
        '{"name": "get_weather", "parameters": {"')
    # without the tag the turn's first `{` opens the list: the draft continues it
    assert _canonical(tok, drafter, _prompt(tok) + '{"').startswith('name": "get_weather", "parameters": {"')
    head = _prompt(tok) + '{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "f'
    assert _canonical(tok, drafter, head) == 'ahrenheit"}}'
    two = native("llama3_json", (WEATHER, TIME))  # after `; ` the next call's head up to the name choice
    assert _canonical(tok, two, head + 'ahrenheit"}};') == ' {"name": "get_'
    assert drafter.stats()["errors"] == 0 and two.stats()["errors"] == 0


def test_mistral_call_list_is_forced_and_ends_with_the_list(tok, native):
    drafter = native("mistral")
    assert tok.decode(_draft(drafter, tok, _prompt(tok) + "[TOOL_CALLS]")).startswith(
        '[{"name": "get_weather", "arguments": {"')
    assert _canonical(tok, drafter, _prompt(tok) + '[TOOL_CALLS][{"').startswith('name": "get_weather", "')
    head = _prompt(tok) + '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "f'
    assert _canonical(tok, drafter, head) == 'ahrenheit"}}'
    assert _canonical(tok, drafter, head + 'ahrenheit"}},').startswith(' {"name": "get_weather", "arguments')
    # the list is closed: the turn ends, nothing is drafted
    assert _canonical(tok, drafter, head + 'ahrenheit"}}]') == ""
    assert drafter.stats()["errors"] == 0


def test_pythonic_call_list_forces_keyword_arguments(tok, native):
    drafter = native("pythonic")
    assert _canonical(tok, drafter, _prompt(tok) + "[").startswith('get_weather(city="')
    head = _prompt(tok) + '[get_weather(city="Oslo", unit="f'
    assert _canonical(tok, drafter, head) == 'ahrenheit")'
    assert _canonical(tok, drafter, head + 'ahrenheit"),').startswith(' get_weather(city="')
    assert drafter.stats()["errors"] == 0


def test_gemma_tool_code_block_forces_the_call_and_its_fence(tok, native):
    drafter = native("gemma_tool_code")
    assert _canonical(tok, drafter, _prompt(tok) + "```tool_code\n").startswith('get_weather(city="')
    head = _prompt(tok) + '```tool_code\nget_weather(city="Oslo", unit="f'
    assert _canonical(tok, drafter, head) == 'ahrenheit")\n```'
    assert drafter.stats()["errors"] == 0


class _CountingTokenizer:
    """An llguidance tokenizer that counts the bytes `CallMatcher._sync` tokenizes and keeps the texts
    given to `tokenize_str`."""

    def __init__(self, ll):
        self.ll, self.tokenized, self.texts = ll, 0, []

    def tokenize_bytes(self, data):
        self.tokenized += len(data)
        return self.ll.tokenize_bytes(data)

    def tokenize_str(self, text):
        self.texts.append(text)
        return self.ll.tokenize_str(text)

    def __getattr__(self, name):
        return getattr(self.ll, name)


def test_a_growing_call_is_tokenized_once_not_at_every_step(tok):
    """The matcher is synced with the call's text every step: only the text after what it consumed
    is tokenized (the whole call was, each sync: quadratic in the call's length). Forced text is
    the same as a fresh matcher's at every prefix."""
    import llguidance.hf

    ll = llguidance.hf.from_tokenizer(tok)
    grammar = tool_call_grammar([*_registry([WEATHER])])
    call = '{"name":"get_weather","arguments":{"city":"Oslo and a long name of a city","unit":"celsius"}}'
    m = CallMatcher(ll, grammar, "</tool_call>")
    counting = m.ll = _CountingTokenizer(ll)
    for k in range(1, len(call)):
        fresh = CallMatcher(ll, grammar, "</tool_call>")
        assert m.forced_text(call[:k]) == fresh.forced_text(call[:k]), call[:k]
    assert counting.tokenized == len(call) - 1  # each character of the call once (the whole call
    # at every step was 4.3k characters here)


def test_the_stable_end_probe_agrees_with_tokenizing_the_whole_text(tok):
    """`canonical_tokens` checks a draft's last token against likely next characters on the last
    few tokens only; on drafts of calls, code and prose it decides as tokenizing the whole text does."""
    import llguidance.hf

    from agentspec_sdk.drafting.candidates import FORCED_PROBES, TRIMMED_PROBES
    from agentspec_sdk.drafting.forced import _stable_end

    ll = llguidance.hf.from_tokenizer(tok)
    texts = ['{"name":"get_weather","arguments":{"city":"Os', "for f in files:\n    print(f, len(f",
             "Thought: I need the weather in Oslo first", '{"unit":"celsius"}}</tool_call', "x", "a b"]
    texts += [t[:k] for t in texts for k in range(1, len(t), 3)]
    for text in texts:
        toks = ll.tokenize_str(text)
        for probes in (FORCED_PROBES, TRIMMED_PROBES, ('\n',)):
            whole = all(ll.tokenize_str(text + p)[: len(toks)] == toks for p in probes)
            assert _stable_end(ll, text, toks, probes) == whole, (text, probes)


def test_a_matcher_tokenizes_recurring_text_once(tok):
    """The texts a tool-call matcher tokenizes recur (the forced text `_ends_object` checks, the
    lookup text `valid_prefix` trims: 67-78% of those calls on captured tool-call turns): given the
    drafter's `MemoTokenizer`, each distinct text reaches the tokenizer once, and every answer is the
    one the matcher gives without it."""
    import llguidance.hf

    from agentspec_sdk.drafting.tokenizer import MemoTokenizer

    ll = llguidance.hf.from_tokenizer(tok)
    grammar = tool_call_grammar([*_registry([WEATHER])])
    counting = _CountingTokenizer(ll)
    memo = CallMatcher(ll, grammar, "</tool_call>", text=MemoTokenizer(counting))
    plain = CallMatcher(ll, grammar, "</tool_call>")
    head = '{"name":"get_weather","arguments":{"city":"Oslo","unit":"'
    for _ in range(3):  # three steps of rows at the same point of the same call
        for m in (memo, plain):
            assert m.forced_text('{"name":"get_weather","arguments":{"ci') == 'ty":"'
        # lookup text past the value: the grammar allows the call's end, not what follows it
        lookup = 'celsius"}} and more'
        assert memo.allowed_after(head, lookup) == plain.allowed_after(head, lookup) == 'celsius"}}'
        assert memo.forced_text(head + 'celsius"') == plain.forced_text(head + 'celsius"') == "}}</tool_call>"
    assert counting.texts and len(counting.texts) == len(set(counting.texts))


def test_what_a_grammar_forces_at_its_start_is_computed_once_per_prototype(tok):
    """A fork's forced text before anything is consumed (a begun open marker's draft, a new call's
    first step: only whitespace typed) is its prototype's, computed by the first fork that asks:
    the same text and `finished` as a matcher computing it, and the matcher then goes on as one
    that computed it."""
    import llguidance.hf

    ll = llguidance.hf.from_tokenizer(tok)
    grammar = tool_call_grammar([*_registry([WEATHER])])
    proto = CallMatcher(ll, grammar, "</tool_call>")
    first, second = proto.fork(), proto.fork()
    opening = first.forced_text("")
    assert opening == CallMatcher(ll, grammar, "</tool_call>").forced_text("") and opening
    calls = []
    second.matcher = _Recording(second.matcher, calls)
    assert second.forced_text("\n") == opening and not second.finished
    assert "compute_ff_bytes" not in calls  # answered from the prototype's
    # once something is consumed, the matcher computes again
    assert second.forced_text('\n{"name":"get_weather","arguments":{"ci') == 'ty":"'
    assert "compute_ff_bytes" in calls


class _Recording:
    """Forwards to an llguidance matcher and records the names of the methods called."""

    def __init__(self, matcher, calls: list):
        self._matcher, self._calls = matcher, calls

    def __getattr__(self, name):
        attr = getattr(self._matcher, name)
        self._calls.append(name)
        return attr


def test_draft_text_the_row_keeps_is_not_consumed_again(tok):
    """Drafting ahead leaves the matcher over the draft (`keep_ahead`): when the row's text takes the
    draft's first tokens, the next sync consumes only what follows them, and the forced text is a
    fresh matcher's. A row whose text leaves the draft rolls back to where they part."""
    import llguidance.hf

    ll = llguidance.hf.from_tokenizer(tok)
    grammar = tool_call_grammar([*_registry([WEATHER])])
    head = '{"name":"get_weather","arguments":{"city":"'
    draft = 'Reykjavik and a long name of a city'
    m = CallMatcher(ll, grammar, "</tool_call>")
    m.forced_text(head)
    flags = m.flags()
    m.sync(head + draft)  # the chain drafting ahead
    m.keep_ahead(flags)
    counting = m.ll = _CountingTokenizer(ll)
    kept = head + draft[:20]
    fresh = CallMatcher(ll, grammar, "</tool_call>")
    assert m.forced_text(kept) == fresh.forced_text(kept)
    assert counting.tokenized < 20  # at most the draft's token that the row's text cut in two
    # the row's text left the draft: rolled back to where they part, the same forced text as a fresh one
    m.sync(head + draft)
    m.keep_ahead(m.flags())
    other = head + 'Oslo","unit":"c'
    fresh = CallMatcher(ll, grammar, "</tool_call>")
    assert m.forced_text(other) == fresh.forced_text(other) == 'elsius"}}</tool_call>'
