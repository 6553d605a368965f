"""What each pass computed, read from vLLM's scheduler (`backends.embedded.scheduler_probe`): prefill chunks
and the drafts each pass verifies, on fakes of the scheduler's output and on the real engine."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from agentspec_sdk.backends.embedded.scheduler_probe import FIELDS, SchedulerProbe, composition, merge
from agentspec_sdk.replay.passes import pass_table, read_logs, write_logs


def _req(prompt, computed):
    return SimpleNamespace(num_prompt_tokens=prompt, num_computed_tokens=computed)


def test_a_chunked_prefill_and_decoding_rows_are_told_apart():
    # after schedule(): a 3000-token prompt got its second 1024-token chunk (computed 1024 -> 2048),
    # a decoding row verifies 3 drafts over 500 tokens of context, one row decodes without drafts
    requests = {"long": _req(3000, 2048), "spec": _req(400, 504), "plain": _req(100, 151)}
    out = SimpleNamespace(num_scheduled_tokens={"long": 1024, "spec": 4, "plain": 1},
                          scheduled_spec_decode_tokens={"spec": [11, 12, 13]})
    comp = composition(out, requests)
    assert comp["prefill_tokens"] == 1024
    assert comp["prefill_ctx"] == pytest.approx(1024 * (1024 + 512) / 1000)
    assert comp["decode_rows"] == 2 and comp["decode_ctx"] == 500 + 150
    assert comp["spec_drafted"] == 3 and comp["spec_drafted_ctx"] == 3 * 500


def test_the_last_chunk_counts_only_prompt_tokens():
    # the last chunk of a prompt (2900 -> 3000) also samples the first token: 100 prefill tokens
    out = SimpleNamespace(num_scheduled_tokens={"a": 100}, scheduled_spec_decode_tokens={})
    comp = composition(out, {"a": _req(3000, 3000)})
    assert comp["prefill_tokens"] == 100 and comp["decode_rows"] == 0


def test_probe_wraps_schedule_and_hands_back_the_scheduler_output():
    out = SimpleNamespace(num_scheduled_tokens={"a": 1}, scheduled_spec_decode_tokens={})
    sched = SimpleNamespace(requests={"a": _req(10, 11)}, schedule=lambda *a, **k: out)
    probe = SchedulerProbe(sched)
    assert sched.schedule() is out and sched.schedule() is out
    assert probe.take() == merge([composition(out, sched.requests)] * 2)
    assert probe.take() is None
    broken = SimpleNamespace(num_scheduled_tokens={"gone": 1})  # unknown request: skipped, never raises
    sched.schedule = lambda *a, **k: broken
    probe = SchedulerProbe(sched)
    assert sched.schedule() is broken and probe.take() == dict.fromkeys(FIELDS, 0.0)
    probe.close()
    assert sched.schedule() is broken


def test_the_pass_table_takes_the_schedulers_counts():
    passes = [{"t": 0.0, "s": 0.1, "rows": 2, "new": 1, "prefill": 3000, "ctx": 900,
               "prefill_tokens": 1000, "prefill_ctx": 2500.0, "spec_drafted": 0, "spec_drafted_ctx": 0},
              {"t": 0.2, "s": 0.1, "rows": 2, "new": 0, "prefill": 0, "ctx": 902,
               "prefill_tokens": 0, "prefill_ctx": 0.0, "spec_drafted": 5, "spec_drafted_ctx": 2000}]
    steps = [{"t": 0.05, "rows": 2, "drafted": 6, "drafted_ctx": 2400, "drafted_s": 3, "proposer_s": 0.002}]
    table = pass_table(passes, steps)
    assert table[0]["prefill"] == 1000 and table[0]["prefill_ctx"] == 2500.0
    # 6 made, 5 verified (one trimmed by the grammar); the schema share of the made drafts is kept
    assert table[1]["drafted"] == 5 and table[1]["drafted_ctx"] == 2000 and table[1]["drafted_s"] == 2.5


def test_pass_logs_round_trip(tmp_path):
    key = (("D", 8, 8, True), "structure")
    steps, passes = {key: [{"t": 1.0, "rows": 2}]}, {key: [{"t": 1.0, "s": 0.1, "rows": 2}]}
    write_logs(tmp_path / "passes.jsonl", steps, passes)
    assert read_logs(tmp_path / "passes.jsonl") == (steps, passes)


@pytest.mark.engine
def test_the_engines_pass_log_counts_what_vllm_computed(engine_structure):
    from agentspec_sdk.backends.types import TurnRequest

    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    began = time.time()
    (res,) = engine_structure.generate([TurnRequest(
        messages=[{"role": "user", "content": f"Weather in Reykjavik, please ({began:.6f})."}],
        tools=tools, tool_choice="call", max_tokens=40, request_id="probe")])
    assert res.ok, res.error
    passes = engine_structure.pass_log(began, time.time())
    assert passes and all("spec_drafted" in p and p["no_spec"] == 0 for p in passes)
    # no chunking at this prompt length: the scheduler's prefill equals the output-based count
    assert sum(p["prefill_tokens"] for p in passes) == sum(p["prefill"] for p in passes) > 0
    # the drafts the passes verified are the drafts vLLM counted for the request
    assert sum(p["spec_drafted"] for p in passes) == res.spec["num_draft_tokens"] > 0
    # every pass that gave the request a token decoded it, except the one that prefilled it (passes
    # without rows: the engine stepped while the request's grammar was still compiling)
    assert sum(p["decode_rows"] for p in passes) == sum(1 for p in passes if p["rows"]) - 1
