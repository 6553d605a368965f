"""vLLM's own drafters as peers: `suffix` configuration, the missing-package error, and the observer
that lets their drafts settle per class without changing them. The real-engine check is
tests/test_demo.py (the quick demo replays `suffix` beside `structure`)."""

from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace

import numpy as np
import pytest

from agentspec_sdk.backends import engine_config
from agentspec_sdk.backends.embedded.stock_observer import StockDraftObserver
from agentspec_sdk.backends.engine_config import stock_speculative_config
from agentspec_sdk.backends.serving.server import ServerSpec
from agentspec_sdk.backends.vllm_metrics import RecordsTail
from agentspec_sdk.errors import BackendError


def _no_arctic(monkeypatch):
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name.startswith("arctic_inference"):
            return None
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_suffix_config_is_vllms_own():
    assert stock_speculative_config("suffix", 8) == {"method": "suffix", "num_speculative_tokens": 8}
    args = ServerSpec(model="m", speculation="suffix", gamma_max=8).args()
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {"method": "suffix", "num_speculative_tokens": 8}
    assert "--per-request-spec-decode-metrics" in args


def test_missing_arctic_inference_names_the_install_step(monkeypatch):
    _no_arctic(monkeypatch)
    with pytest.raises(BackendError, match="arctic-inference.*pip install") as err:
        ServerSpec(model="m", speculation="suffix").args()
    assert "ARCTIC_INFERENCE_ENABLED" not in str(err.value)
    with pytest.raises(BackendError, match="arctic-inference"):
        engine_config.require_suffix_decoding()


def test_engine_refuses_suffix_without_the_package_before_vllm_starts(monkeypatch):
    _no_arctic(monkeypatch)
    from agentspec_sdk.backends.embedded import vllm_engine

    def no_model(*a, **k):
        raise AssertionError("the engine went on to load a model")

    monkeypatch.setattr(vllm_engine, "resolve_model", no_model)
    with pytest.raises(BackendError, match="speculation='suffix'.*arctic-inference"):
        vllm_engine.Engine(speculation="suffix")


class _Ngram:
    """The shape of vLLM's NgramProposer.propose (num_spec, sampled, num_tokens_no_spec, token_ids_cpu)."""

    def propose(self, num_spec, sampled, num_tokens, token_ids, slot_mappings=None):
        return [[int(token_ids[i, num_tokens[i] - 1]) + 1] * 3 if sampled[i] else []
                for i in range(len(sampled))]


def test_observer_keeps_drafts_and_records_them_for_the_claim(tmp_path):
    path = tmp_path / "records.jsonl"
    path.touch()
    drafter = _Ngram()
    original = drafter.propose
    obs = StockDraftObserver(drafter, "ngram", path)
    ids = np.zeros((2, 16), dtype=np.int64)
    ids[0, :5] = [10, 11, 12, 13, 14]
    ids[1, :3] = [20, 21, 22]
    num = np.array([5, 3])
    drafts = drafter.propose(8, [[14], []], num, ids)
    assert drafts == original(8, [[14], []], num, ids)  # untouched
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    draft_lines = [x for x in lines if x["type"] == "draft"]
    assert (len(draft_lines) == 1 and draft_lines[0]["position"] == 5
            and draft_lines[0]["tokens"] == [15, 15, 15])
    step = next(x for x in lines if x["type"] == "step")
    assert step["rows"] == 2 and step["drafted"] == 3 and step["ctx"] == 8
    tail = RecordsTail(path)
    tail.poll()
    [rec] = tail.claim([10, 11, 12], [13, 14, 15, 15, 9])  # the target kept two of the three
    assert rec["position"] == 2 and rec["drafted"] == 3 and rec["accepted"] == 2 and rec["law_class"] is None
    assert tail.step_log and tail.step_log[-1]["rows"] == 2
    obs.close()
    assert drafter.propose == original


def test_observer_reads_suffix_rows_from_the_input_batch(tmp_path):
    path = tmp_path / "records.jsonl"

    class _Suffix:
        def propose(self, num_spec, input_batch, sampled, slot_mappings=None):
            return [[7, 8]]

    batch = SimpleNamespace(num_tokens_no_spec=np.array([4]), token_ids_cpu=np.array([[1, 2, 3, 4, 0]]))
    drafter = _Suffix()
    StockDraftObserver(drafter, "suffix", path)
    assert drafter.propose(8, batch, [[4]]) == [[7, 8]]
    [draft] = [json.loads(x) for x in path.read_text().splitlines() if '"draft"' in x]
    assert draft["position"] == 4 and draft["source"] == "suffix"


def test_observer_failure_never_breaks_decoding(tmp_path):
    drafter = _Ngram()
    obs = StockDraftObserver(drafter, "ngram", tmp_path)  # a folder: every append fails
    ids = np.ones((1, 4), dtype=np.int64)
    assert drafter.propose(8, [[1]], np.array([2]), ids) == [[2, 2, 2]]
    assert drafter.propose(8, [[1]], np.array([2]), ids) == [[2, 2, 2]]
    assert obs.failures == 2


def test_settling_never_counts_a_draft_token_vllm_did_not_verify():
    from agentspec_sdk.backends.vllm_metrics import settle_against_vllm

    # the second draft's last token was trimmed by the grammar (vLLM verified 1 of it), yet the
    # target then wrote that same token: the common prefix says 2, vLLM's step says 1
    records = [{"position": 0, "drafted": 3, "accepted": 3}, {"position": 4, "drafted": 2, "accepted": 2},
               {"position": 7, "drafted": 2, "accepted": 0}]
    settle_against_vllm(records, 20, {"per_step_accepted": [3, 1, 0]})
    assert [r["accepted"] for r in records] == [3, 1, 0]
    # steps that cannot be matched one to one leave the records as they are
    records = [{"position": 0, "drafted": 3, "accepted": 3}]
    settle_against_vllm(records, 20, {"per_step_accepted": [1, 1]})
    assert records[0]["accepted"] == 3


def test_a_draft_without_a_verify_step_counts_nothing():
    from agentspec_sdk.backends.vllm_metrics import settle_against_vllm

    # a code-agent turn as vLLM reported it: six drafts, five verify steps; the last draft's first
    # token completes the grammar, vLLM trimmed it (no step), and the target wrote it anyway
    spec = {"num_accepted_draft_tokens": 37, "per_step_accepted": [7, 7, 7, 8, 8],
            "per_step_drafted": [7, 7, 8, 8, 8]}
    records = [{"position": p, "drafted": d, "accepted": a}
               for p, d, a in [(1, 7, 7), (9, 7, 7), (17, 8, 7), (25, 8, 8), (34, 8, 8), (43, 5, 1)]]
    settle_against_vllm(records, 44, spec)
    assert [r["accepted"] for r in records] == [7, 7, 7, 8, 8, 0]
    assert sum(r["accepted"] for r in records) == spec["num_accepted_draft_tokens"]
    assert records[-1]["unverified"] == 1 and "beyond_output" not in records[-1]
    # a fully trimmed draft in the middle is skipped, the steps after it still pair with their drafts
    records = [{"position": 0, "drafted": 3, "accepted": 3}, {"position": 4, "drafted": 2, "accepted": 0},
               {"position": 5, "drafted": 4, "accepted": 2}]
    settle_against_vllm(records, 20, {"per_step_accepted": [3, 2], "per_step_drafted": [3, 4]})
    assert [r["accepted"] for r in records] == [3, 0, 2]


def test_tuned_suffix_knobs_reach_vllms_speculative_config():
    import dataclasses

    from vllm.config.speculative import SpeculativeConfig

    from agentspec_sdk.backends.embedded.vllm_start import engine_speculative_config
    from agentspec_sdk.backends.engine_config import EngineConfig
    from agentspec_sdk.replay.arms import SUFFIX_TUNED, engine_kwargs

    kw = engine_kwargs("suffix-tuned", 8)
    assert SUFFIX_TUNED == (4.0, 0.3)
    assert kw == {"speculation": "suffix", "gamma_max": 8, "suffix_max_spec_factor": 4.0,
                  "suffix_min_token_prob": 0.3}
    assert engine_kwargs("suffix-tuned", 16, (2, 0.3))["suffix_max_spec_factor"] == 2.0
    assert "suffix_max_spec_factor" not in engine_kwargs("suffix", 8)  # the default peer stays vLLM's own
    spec = engine_speculative_config(EngineConfig(**kw), 8)
    assert spec == {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_spec_factor": 4.0,
                    "suffix_decoding_min_token_prob": 0.3}
    # the keys are vLLM's own field names, and the defaults we name are vLLM's
    known = {f.name: f.default for f in dataclasses.fields(SpeculativeConfig)}
    assert known["suffix_decoding_max_spec_factor"] == engine_config.SUFFIX_MAX_SPEC_FACTOR
    assert known["suffix_decoding_min_token_prob"] == engine_config.SUFFIX_MIN_TOKEN_PROB
    assert set(spec) <= set(known)
    args = ServerSpec(model="m", speculation="suffix", gamma_max=8, suffix_max_spec_factor=2.0,
                      suffix_min_token_prob=0.3).args()
    assert json.loads(args[args.index("--speculative-config") + 1])["suffix_decoding_max_spec_factor"] == 2.0


def test_bad_suffix_knobs_are_refused_by_name():
    from agentspec_sdk.backends.engine_config import EngineConfig

    with pytest.raises(BackendError, match="suffix_min_token_prob must be a number in \\[0, 1\\], got 1.5"):
        EngineConfig(speculation="suffix", suffix_min_token_prob=1.5)
    with pytest.raises(BackendError, match="suffix_max_spec_factor must be a number >= 0"):
        stock_speculative_config("suffix", 8, suffix_max_spec_factor=-1)
    with pytest.raises(BackendError, match="apply to speculation='suffix' only, not 'ngram'"):
        EngineConfig(speculation="ngram", suffix_max_spec_factor=2.0)


def test_one_speculative_config_for_the_embedded_engine_and_the_server(tmp_path):
    """`engine_config.speculative_config` is the one builder: the engine's and the server's configs are
    the same for the same mode and settings, model-drafter modes included."""
    from agentspec_sdk.backends.embedded.vllm_start import engine_speculative_config
    from agentspec_sdk.backends.engine_config import EngineConfig
    from agentspec_sdk.backends.inside_vllm.vllm_hybrid import MODE_ENV

    plan = tmp_path / "plan.json"
    for mode in ("off", "ngram", "structure"):
        server = ServerSpec(model="m", speculation=mode, gamma_max=6, plan_path=plan)
        assert server.speculative_config() == engine_speculative_config(EngineConfig(speculation=mode), 6)
    assert ServerSpec(model="m", speculation="ngram").speculative_config()["prompt_lookup_max"] == 5
    draft = str(tmp_path / "draft")
    for mode in ("draft_model", "draft_model+cut", "structure+draft_model"):
        server = ServerSpec(model="m", speculation=mode, gamma_max=4, draft_model=draft, plan_path=plan)
        assert server.speculative_config() == {"method": "draft_model", "model": draft,
                                               "num_speculative_tokens": 4}
        assert server.env()[MODE_ENV] == engine_config.MODEL_DRAFTERS[mode]
        assert "--no-async-scheduling" in server.args()
    with pytest.raises(BackendError, match="needs draft_model"):
        ServerSpec(model="m", speculation="draft_model")
    with pytest.raises(BackendError, match="draft_model applies to speculation"):
        ServerSpec(model="m", speculation="ngram", draft_model=draft)
