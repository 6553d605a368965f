"""Shared fixtures. Real-engine fixtures start vLLM once per test session (≈40–70 s each on CPU).

Engine tests are marked `@pytest.mark.engine` and must run under the engine lock:
    flock /tmp/agentspec-engine.lock python -m pytest tests/test_x.py -q -m engine
Both engines use the same settings, so outputs of `engine_off` and `engine_structure` are comparable.
"""

from __future__ import annotations

import importlib.util

import pytest

ENGINE_SETTINGS = {"gamma_max": 8, "max_model_len": 2048, "kv_cache_gb": 1.0, "seed": 0}


def _start(speculation: str):
    if importlib.util.find_spec("vllm") is None:  # a broken install must fail the engine tests, not skip them
        pytest.fail("vLLM is not installed: run scripts/setup.sh (make test does)")
    from agentspec_sdk.backends.vllm_engine import Engine

    return Engine(speculation=speculation, **ENGINE_SETTINGS)


@pytest.fixture(scope="session")
def engine_structure():
    """The embedded engine with the structure proposer (one per session; tools register per request).
    Its teardown checks the contract's end (tests/test_engine_contract.py): the context manager gives
    the engine and closes it, a turn after close is refused, a second close does nothing."""
    from agentspec_sdk.backends.types import TurnRequest
    from agentspec_sdk.errors import BackendError

    engine = _start("structure")
    with engine as same:
        assert same is engine
        yield engine
    with pytest.raises(BackendError, match="closed"):
        engine.submit(TurnRequest(messages=[{"role": "user", "content": "hi"}], request_id="after-close"))
    engine.close()


@pytest.fixture(scope="session")
def engine_off():
    """The same engine settings without speculation (the reference for token identity)."""
    engine = _start("off")
    yield engine
    engine.close()
