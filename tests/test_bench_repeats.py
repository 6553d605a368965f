"""`agentspec bench --repeats` with the tuned suffix peer, end to end on the real engine (subprocesses:
vLLM needs its own process). The fast tests of the plan, the repeats table and the tuned mode's
speculative config are in tests/test_report.py and tests/test_peers.py."""

import json
import os
import subprocess
import sys

import pytest

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


@pytest.mark.engine
def test_bench_repeats_with_the_tuned_suffix_peer(tmp_path):
    cmd = [sys.executable, "-m", "agentspec_sdk.replay.cli", "bench", "--arms", "B",
           "--modes", "suffix,suffix-tuned", "--n", "1", "--max-tokens", "8", "--repeats", "2",
           "--batches", "1", "--gammas", "4", "--no-prefix-check", "--no-entropies", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=ENV)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["meta"]["repeats"] == 2
    assert rep["meta"]["suffix_tuned"] == {"max_spec_factor": 4.0, "min_token_prob": 0.3}
    assert [(r["mode"], r["repeat"]) for r in rep["runs"]] == [("suffix", 0), ("suffix-tuned", 0)]
    rows = {r["mode"]: r for r in rep["repeats"]}
    assert set(rows) == {"suffix", "suffix-tuned"}
    for r in rows.values():
        assert r["repeats"] == [0, 1] and all(s > 0 for s in r["decode_tok_s"])
        assert r["decode_tok_s_min"] <= r["decode_tok_s_median"] <= r["decode_tok_s_max"]
        assert r["drafted"][0] > 0
        # the engine's pass log gives every repeat its decode rate apart from the waits on prefills
        assert all(v is not None and v > 0 for v in r["steady_tok_s"])
        assert all(0.0 <= w <= 1.0 for w in r["prefill_wait_share"])
        # fresh engines, temperature 0: the second repeat computes what the first did
        assert len(set(r["passes"])) == 1 and len(set(r["accepted"])) == 1
    assert rep["peers"] == []  # no structure run to compare
    assert "## Repeats: decode tok/s over 2 interleaved repeats" in proc.stdout
    assert "| B | suffix-tuned | 4 | 1 | on | 2 |" in proc.stdout


@pytest.mark.engine
def test_the_tuned_knobs_are_vllms_running_setting():
    script = ("from agentspec_sdk.backends.embedded.vllm_engine import Engine\n"
              "if __name__ == '__main__':\n"
              "    e = Engine(speculation='suffix', gamma_max=4, suffix_max_spec_factor=2.0,\n"
              "               suffix_min_token_prob=0.3, enforce_eager=True)\n"
              "    s = e._engine.vllm_config.speculative_config\n"
              "    print('KNOBS', s.method, s.suffix_decoding_max_spec_factor,\n"
              "          s.suffix_decoding_min_token_prob)\n"
              "    e.close()\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          env=ENV)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "KNOBS suffix 2.0 0.3" in proc.stdout
