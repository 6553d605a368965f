"""Noise-proof accounting: passes, the verify price from a step log, cost, the oracle, the peer table,
and per-class rows for vLLM's own drafters."""

from __future__ import annotations

import numpy as np
import pytest

from agentspec_sdk.backends.vllm_metrics import label_records
from agentspec_sdk.replay import accounting
from agentspec_sdk.replay.aggregate import summarize
from agentspec_sdk.replay.loop import TurnLog
from agentspec_sdk.replay.passes import pass_table, steady_decode
from agentspec_sdk.structure.formats import LawClass
from agentspec_sdk.structure.segmenter import Span
from agentspec_sdk.structure.token_labels import TokenClassifier


def test_oracle_passes_emit_gamma_plus_one_per_pass():
    assert accounting.oracle_passes(1, 8) == (1, 0)  # the prefill pass writes the only token
    assert accounting.oracle_passes(10, 8) == (2, 8)  # 1 + 9 tokens in one verify pass
    assert accounting.oracle_passes(11, 8) == (3, 8)
    assert accounting.oracle_passes(0, 8) == (0, 0)
    passes, drafted = accounting.oracle_passes(100, 4)
    assert passes + drafted == 100 and passes == 1 + 20


def _steps(a, b, c, n_steps=200, seed=0):
    rng = np.random.default_rng(seed)
    t, out = 1000.0, []
    for _ in range(n_steps):
        rows, drafted = int(rng.integers(1, 9)), int(rng.integers(0, 40))
        out.append({"t": t, "rows": rows, "drafted": drafted})
        t += a + b * rows + c * drafted
    return out


def test_verify_price_recovers_known_terms():
    price = accounting.verify_price({"run": _steps(0.05, 0.006, 0.003)})
    assert price is not None
    assert price["a_s"] == pytest.approx(0.05, rel=1e-3)
    assert price["b_s_per_row"] == pytest.approx(0.006, rel=1e-3)
    assert price["c_s_per_token"] == pytest.approx(0.003, rel=1e-3)
    # one drafted token per row of an 8-row step, in units of that row's share of the pass
    assert accounting.price_at(price, 8) == pytest.approx(0.003 * 8 / (0.05 + 0.006 * 8), rel=1e-3)


def test_a_negative_term_is_noise_and_is_dropped():
    steps = _steps(0.09, 0.0, 0.01)
    for i, s in enumerate(steps):  # other work on the machine slows the small steps: b < 0 unconstrained
        s["t"] -= 0.004 * sum(x["rows"] for x in steps[:i])
    price = accounting.verify_price({"run": steps})
    assert price["b_s_per_row"] == 0.0 and price["dropped"] == ["b_s_per_row"]
    assert price["a_s"] > 0 and price["c_s_per_token"] > 0


def test_verify_price_needs_enough_steps():
    assert accounting.verify_price({"run": _steps(0.05, 0.006, 0.003, n_steps=5)}) is None


def _run(mode, passes, drafted, tok_s, gamma=8, oracle=(50, 150)):
    return {"arm": "D", "mode": mode, "gamma": gamma, "batch": 8, "prefix_cache": True, "passes": passes,
            "drafted": drafted, "decode_tok_s": tok_s, "oracle_passes": oracle[0],
            "oracle_drafted": oracle[1]}


def test_costs_and_peer_table():
    runs = [_run("off", 200, 0, 10.0), _run("ngram", 120, 100, 15.0), _run("suffix", 110, 60, 16.0),
            _run("structure", 90, 120, 18.0)]
    steps = {(("D", 8, 8, True), m): _steps(0.05, 0.006, 0.003) for m in ("ngram", "suffix", "structure")}
    price = accounting.add_costs(runs, steps,
                                 lambda r: (("D", r["batch"], r["gamma"], r["prefix_cache"]), r["mode"]))
    assert price is not None
    off, ngram, suffix, structure = runs
    assert off["cost"] == 200 + off["delta_hat"] * 0
    assert structure["cost"] == pytest.approx(90 + structure["delta_hat"] * 120)
    [row] = accounting.peer_table(runs)
    best = min(ngram, suffix, key=lambda r: r["cost"])
    assert row["best_stock_by_cost"] == best["mode"]
    assert row["best_stock_by_tok_s"] == "suffix"
    assert row["cost_vs_best_stock"] == pytest.approx(best["cost"] / structure["cost"])
    assert row["tok_s_vs_best_stock"] == pytest.approx(18.0 / 16.0)
    gain = best["cost"] - structure["oracle_cost"]
    assert row["oracle_share"] == pytest.approx((best["cost"] - structure["cost"]) / gain)


def test_decode_speed_is_compared_within_the_group_of_engines_measured_together():
    """A fifth engine runs after the four that fit in memory, alone and minutes later: its decode
    tok/s is not compared with structure's; its cost is (counts do not drift)."""
    runs = [_run("off", 200, 0, 10.0), _run("suffix", 110, 60, 16.0), _run("structure", 90, 120, 18.0),
            _run("suffix-tuned", 100, 200, 25.0)]
    for r, group in zip(runs, (0, 0, 0, 1), strict=True):
        r["engine_group"] = group
        r["cost"] = r["passes"] + 0.05 * r["drafted"]
    [row] = accounting.peer_table(runs)
    assert row["best_stock_by_tok_s"] == "suffix" and row["tok_s_vs_best_stock"] == pytest.approx(18.0 / 16.0)
    assert row["best_stock_by_cost"] == "suffix-tuned"
    for r in runs:  # measured one after another (no groups): every peer counts
        del r["engine_group"]
    [row] = accounting.peer_table(runs)
    assert row["best_stock_by_tok_s"] == "suffix-tuned"


def test_repeat_medians_are_compared_within_the_group_of_engines_measured_together():
    """`bench --repeats`: a peer measured in a later engine group in every repeat is left out of the
    decode tok/s median comparison, as in `peer_table`; with no groups every peer counts."""
    runs = []
    for repeat in range(3):
        for mode, tok_s, group in (("suffix", 16.0 + repeat, 0), ("structure", 18.0 + repeat, 0),
                                   ("suffix-tuned", 25.0 + repeat, 1)):
            r = _run(mode, 100, 50, tok_s)
            r.update(repeat=repeat, engine_group=group, accepted=40)
            runs.append(r)
    by = {r["mode"]: r for r in accounting.repeat_table(runs, {}, None, lambda r: None)}
    assert by["structure"]["best_stock_by_tok_s_median"] == "suffix"
    assert by["structure"]["tok_s_median_vs_best_stock"] == pytest.approx(19.0 / 17.0)
    for r in runs:
        del r["engine_group"]
    by = {r["mode"]: r for r in accounting.repeat_table(runs, {}, None, lambda r: None)}
    assert by["structure"]["best_stock_by_tok_s_median"] == "suffix-tuned"


def test_without_a_step_log_cost_is_passes():
    runs = [_run("off", 200, 0, 10.0), _run("structure", 90, 120, 18.0)]
    assert accounting.add_costs(runs, {}, lambda r: None) is None
    assert runs[1]["cost"] == 90


def _log(records, labels, out_tokens, spec=None):
    return TurnLog(episode="e", segment=0, step=0, prompt_tokens=10, output_tokens=out_tokens, text="",
                   acceptance={}, error=None, token_ids=list(range(out_tokens)), finish_reason="stop",
                   records=records, spec=spec, tokens_by_class={c: labels.count(c) for c in "SRF"},
                   token_classes=labels, timings={"decode_s": 1.0})


def test_summarize_classifies_peer_drafts_by_the_token_they_began_at():
    labels = "RRRRSSSSSS"
    records = [{"position": 1, "law_class": None, "source": "ngram", "drafted": 3, "accepted": 1},
               {"position": 5, "law_class": None, "source": "ngram", "drafted": 4, "accepted": 4}]
    run = summarize([_log(records, labels, 10)], arm="D", mode="ngram", gamma=8, batch=1, wall_s=1.0)
    assert run["by_class"]["R"]["drafted"] == 3 and run["by_class"]["R"]["accepted"] == 1
    assert run["by_class"]["S"]["drafted"] == 4 and run["by_class"]["S"]["accepted"] == 4
    assert run["passes"] == 10 - 5
    assert (run["oracle_passes"], run["oracle_drafted"]) == accounting.oracle_passes(10, 8)


def test_passes_without_records_take_vllm_counts():
    run = summarize([_log([], "SSSS", 4, spec={"num_accepted_draft_tokens": 2, "num_draft_tokens": 3})],
                    arm="D", mode="ngram", gamma=8, batch=1, wall_s=1.0)
    assert run["passes"] == 2


def test_passes_are_the_engines_count_where_it_has_one():
    """A draft accepted through the turn's last token leaves that pass without a bonus token, so
    output tokens − accepted is one short; the engine's per-step count is what the target computed."""
    records = [{"position": 1, "law_class": "S", "source": "suffix", "drafted": 3, "accepted": 3},
               {"position": 5, "law_class": "S", "source": "suffix", "drafted": 6, "accepted": 5}]
    counted = _log(records, "SSSSSSSSSS", 10)  # prefill 1 token, pass 2: 3 + 1, pass 3: the last 5 drafted
    counted.passes = 3
    estimated = _log(records, "SSSSSSSSSS", 10)
    run = summarize([counted, estimated], arm="D", mode="suffix", gamma=8, batch=1, wall_s=1.0)
    assert run["passes_from_tokens"] == 2 * (10 - 8)
    assert run["passes"] == 3 + (10 - 8)


def test_verified_drafts_are_vllms_count_beside_the_proposed_ones():
    """The grammar trims a draft before verification: `drafted` is what the drafter proposed (the
    records), `drafted_verified` what vLLM verified; without vLLM's counts for a turn it is None."""
    records = [{"position": 1, "law_class": "S", "source": "suffix", "drafted": 4, "accepted": 2},
               {"position": 4, "law_class": "S", "source": "suffix", "drafted": 5, "accepted": 1}]
    spec = {"num_draft_tokens": 7, "num_accepted_draft_tokens": 3}
    run = summarize([_log(records, "SSSSSSSSSS", 10, spec=spec)], arm="D", mode="suffix", gamma=8, batch=1,
                    wall_s=1.0)
    assert (run["drafted"], run["drafted_verified"]) == (9, 7)
    run = summarize([_log(records, "SSSSSSSSSS", 10)], arm="D", mode="suffix", gamma=8, batch=1, wall_s=1.0)
    assert run["drafted_verified"] is None


class _Tok:
    def decode(self, ids):
        return "ab" if ids[0] % 2 else "c"


def test_label_records_from_token_starts():
    text = "cabcab"  # tokens 0,1,0,1 -> starts 0,1,3,4
    spans = [Span(0, 3, "reasoning", LawClass.R), Span(3, 6, "tool_call", LawClass.S)]
    clf = TokenClassifier(_Tok())
    ids = [0, 1, 0, 1]
    labels = clf.labels(text, ids, spans)
    assert labels == "RRSS" and clf.starts(text, ids) == [0, 1, 3, 4]
    records = [{"position": 2, "law_class": None, "kind": None},
               {"position": 0, "law_class": "S", "kind": "x"}]
    label_records(records, labels, clf.starts(text, ids), spans)
    assert records[0]["law_class"] == "S" and records[0]["kind"] == "tool_call"
    assert records[1] == {"position": 0, "law_class": "S", "kind": "x"}  # the proposer's own labels stay


def _pass(t, s, rows, tokens, new=0, prefill=0):
    return {"t": t, "s": s, "rows": rows, "tokens": tokens, "ctx": 100 * rows, "prefill": prefill, "new": new,
            "grammar": 0}


def test_steady_decode_leaves_out_the_waits_on_other_requests_prefills():
    """Two decoding rows, then a third agent's prompt prefilled in a long pass: the rows' wait there
    is in `prefill_wait_share`, not in `steady_tok_s` (their tokens per second of the other passes)."""
    table = [_pass(0.0, 0.2, 1, 1, new=1, prefill=300),  # the first row's own prefill: not a decode pass
             _pass(0.2, 0.1, 2, 5, new=1, prefill=200),  # row 2's prefill while row 1 decodes: a wait
             _pass(0.3, 0.05, 2, 8), _pass(0.35, 0.05, 2, 6),
             _pass(0.4, 0.3, 3, 3, new=1, prefill=500),  # row 3's prefill: both rows wait 0.3 s
             _pass(0.7, 0.05, 3, 9)]
    got = steady_decode(pass_table(table))
    steady_s = 2 * 0.05 + 2 * 0.05 + 3 * 0.05
    assert got["steady_tok_s"] == pytest.approx((8 + 6 + 9) / steady_s)
    wait_s = 1 * 0.1 + 2 * 0.3
    assert got["prefill_wait_share"] == pytest.approx(wait_s / (wait_s + steady_s))
    assert steady_decode([]) == {"steady_tok_s": None, "prefill_wait_share": None}


def test_steady_rates_reach_the_peer_and_repeat_tables():
    runs = [_run("suffix", 110, 60, 16.0), _run("structure", 90, 120, 15.0)]
    logs = {"suffix": [_pass(0.0, 0.2, 1, 1, new=1, prefill=300)] + [_pass(0.2 + 0.1 * i, 0.1, 1, 4)
                                                                       for i in range(5)],
            "structure": [_pass(0.0, 0.2, 1, 1, new=1, prefill=300)] + [_pass(0.2 + 0.1 * i, 0.1, 1, 5)
                                                                          for i in range(5)]}
    accounting.add_steady_rates(runs, logs, lambda r: r["mode"])
    assert runs[0]["steady_tok_s"] == pytest.approx(40.0) and runs[1]["steady_tok_s"] == pytest.approx(50.0)
    [row] = accounting.peer_table(runs)
    assert row["tok_s_vs_best_stock"] == pytest.approx(15.0 / 16.0)  # the whole decode time
    assert row["best_stock_by_steady"] == "suffix" and row["steady_vs_best_stock"] == pytest.approx(1.25)
    for r in runs:
        r.update(repeat=0, accepted=40)
    by = {r["mode"]: r for r in accounting.repeat_table(runs, {}, None, lambda r: None)}
    assert by["structure"]["steady_tok_s_median"] == pytest.approx(50.0)
    assert by["structure"]["steady_median_vs_best_stock"] == pytest.approx(1.25)
