"""The offline drafter replay (benchmarks/offline_drafting.py): simulated greedy verification and the
oracle bound it reports next to the drafters."""

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "offline_drafting.py"


@pytest.fixture(scope="module")
def offline():
    spec = importlib.util.spec_from_file_location("offline_drafting", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _turns(lengths):
    rng = np.random.default_rng(0)
    return [{"prompt": [1, 2, 3], "out": rng.integers(10, 1000, n).tolist()} for n in lengths]


@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_oracle_needs_one_pass_per_gamma_plus_one_tokens(offline, gamma):
    lengths = [1, 2, 9, 10, 30]
    row = offline.simulate(_turns(lengths), None, batch=2, gamma=gamma)
    # the first token comes from the prefill; every pass then accepts gamma drafted tokens plus one
    assert row["passes"] == sum(math.ceil((n - 1) / (gamma + 1)) for n in lengths)
    assert row["accepted"] == row["drafted"]


def test_no_draft_is_one_pass_per_token(offline):
    lengths = [5, 7]
    row = offline.simulate(_turns(lengths), lambda histories: [[] for _ in histories], batch=8)
    assert row == {"passes": sum(n - 1 for n in lengths), "drafted": 0, "accepted": 0}


def test_a_wrong_draft_token_ends_the_accepted_prefix(offline):
    turn = {"prompt": [1], "out": [5, 6, 7, 8, 9]}

    def propose(histories):  # right, right, wrong, right
        rest = turn["out"][len(histories[0]) - 1:]
        return [rest[:2] + [0] + rest[3:4]]

    row = offline.simulate([turn], propose, batch=1)
    # pass 1 drafts 6 7 0 9: 6, 7 accepted, the target writes 8; pass 2 drafts 9 0: 9 accepted
    assert row == {"passes": 2, "drafted": 6, "accepted": 3}


def test_grammar_trim_keeps_the_prefix_the_turn_grammar_allows(offline):
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model())
    out = tok.encode("hello world, hello moon", add_special_tokens=False)
    turn = {"prompt": [1], "out": out, "grammar": 0}
    trim = offline.GrammarTrim(['start: "hello world, hello " ("moon" | "sun")'])
    good = tok.encode(" hello moon", add_special_tokens=False)
    at = len(tok.encode("hello world,", add_special_tokens=False))
    assert tok.decode(out[:at]) + tok.decode(good) == "hello world, hello moon"
    assert trim(turn, at, good) == good
    bad = tok.encode(" hello mars", add_special_tokens=False)
    kept = trim(turn, at, bad)
    assert kept == bad[: len(kept)] and tok.decode(kept) == " hello"
    assert offline.GrammarTrim([])({"prompt": [1], "out": out}, 0, bad) == bad  # no grammar captured
