"""Replicas behind vLLM's router (`agentspec serve --replicas N --router POLICY`,
backends/serving/replicas.py) and the plan gauges that tell replicas' plans apart.

The first tests build commands and read metric pages (fast). The `server` tests start one deployment
on 127.0.0.1 (2 replicas of the default model with the structure proposer, the real `vllm-router` under
`consistent_hash`) and send a plain OpenAI client and `RemoteEngine` through it; the last one kills a
replica mid-replay. Run them under the engine lock:

    flock /tmp/agentspec-engine.lock pytest -m server tests/test_router.py
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from typer.testing import CliRunner

from agentspec_sdk.backends.serving.replicas import ReplicaSet, RouterSpec, router_binary, split_cores
from agentspec_sdk.backends.serving.server import ServerSpec
from agentspec_sdk.drafting.plan import DraftPlan
from agentspec_sdk.errors import BackendError

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}]
OTHER_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a timezone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}


# -- commands, cores and plan gauges (no server) --------------------------------------------------


def test_replicas_listen_after_the_routers_port_and_share_one_plan(tmp_path):
    plan = DraftPlan(formats=["tool_calls"]).save(tmp_path / "plan.json")
    spec = ServerSpec(model="/models/smollm2-135m-instruct", port=9000, plan_path=plan)
    deployment = ReplicaSet(spec, 2, "consistent_hash")
    ports = [r.spec.port for r in deployment.replicas]
    assert ports == [9001, 9002]
    assert [r.spec.plan_path for r in deployment.replicas] == [plan, plan]
    assert {tuple(r.spec.model_names()) for r in deployment.replicas} == {
        ("smollm2-135m-instruct", "/models/smollm2-135m-instruct")}
    dirs = {r.spec.multiproc_dir() for r in deployment.replicas}
    assert len(dirs) == 2  # each replica's metrics on its own /metrics, never merged
    router = deployment.router.spec.command()
    assert router[router.index("--port") + 1] == "9000"
    assert router[router.index("--policy") + 1] == "consistent_hash"
    urls = router[router.index("--worker-urls") + 1:router.index("--worker-urls") + 3]
    assert urls == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    assert router[router.index("--prometheus-port") + 1] == "9003"
    assert len(deployment.commands()) == 3


def test_each_replica_gets_its_own_cores():
    assert split_cores(2, [0, 1]) == ["0", "1"]
    assert split_cores(2, [0, 1, 2, 3, 4]) == ["0,1", "2,3"]
    assert split_cores(3, [4]) == ["4", "4", "4"]
    spec = ServerSpec(model="m", speculation="off", port=9000)
    env = ReplicaSet.replica_spec(spec, 2, "1").env()
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in spec.env()


def test_bad_deployments_are_refused_naming_the_problem():
    spec = ServerSpec(model="m", speculation="off", port=9000)
    with pytest.raises(BackendError, match="'sticky'.*cache_aware, consistent_hash"):
        ReplicaSet(spec, 2, "sticky")
    with pytest.raises(BackendError, match="--replicas must be at least 1, got 0"):
        ReplicaSet(spec, 0)
    with pytest.raises(BackendError, match="past 65535"):
        ReplicaSet(ServerSpec(model="m", speculation="off", port=65534), 2)
    with pytest.raises(BackendError, match="at least one worker"):
        RouterSpec([])


def test_a_missing_router_names_the_extra(tmp_path, monkeypatch):
    from agentspec_sdk.cli import app

    monkeypatch.setattr("sys.executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BackendError, match=r"`router` extra .*agentspec-sdk\[router\]"):
        router_binary()
    result = CliRunner().invoke(app, ["serve", "--speculation", "off", "--no-tool-parser", "--replicas", "2",
                                      "--dry-run"])
    assert result.exit_code == 2, result.output
    assert "vllm-router is not installed: it comes with the `router` extra" in result.output


def test_serve_dry_run_prints_every_replica_and_the_router(tmp_path):
    from agentspec_sdk.cli import app

    plan = tmp_path / "plan.json"
    result = CliRunner().invoke(app, ["serve", "--plan", str(plan), "--port", "9100", "--replicas", "2",
                                      "--router", "round_robin", "--dry-run", "--", "--enforce-eager"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if not line.startswith("#")]
    assert len(lines) == 3, lines
    assert "--port 9101" in lines[0] and "--port 9102" in lines[1]
    assert all(f"AGENTSPEC_PLAN={plan.resolve()}" in line and "--enforce-eager" in line for line in lines[:2])
    assert "vllm-router" in lines[2] and "--policy round_robin" in lines[2]
    assert "http://127.0.0.1:9101 http://127.0.0.1:9102" in lines[2]


def test_plan_gauges_tell_plans_apart():
    from prometheus_client import CollectorRegistry, generate_latest

    from agentspec_sdk.backends.inside_vllm.prom_metrics import ProposerMetrics, plan_identity

    plan = DraftPlan(formats=["tool_calls"], tools=TOOLS)
    plan.version = 3
    registry = CollectorRegistry()
    metrics = ProposerMetrics(registry=registry)

    def shown():
        return plan_identity(generate_latest(registry).decode())

    assert shown() == {"version": 0, "digest": "0" * 12}  # nothing loaded yet
    metrics.plan_loaded(plan)
    assert shown() == {"version": 3, "digest": f"{plan.digest():012x}"}
    same = DraftPlan(formats=["tool_calls"], tools=TOOLS)
    assert same.digest() == plan.digest()  # the version aside
    other = DraftPlan(formats=["tool_calls"], tools=[*TOOLS, OTHER_TOOL])
    assert other.digest() != plan.digest()
    metrics.plan_loaded(other)
    assert shown()["digest"] == f"{other.digest():012x}"
    assert plan_identity("vllm:num_requests_running 0\n") is None


def test_a_mixed_deployment_is_refused(monkeypatch):
    deployment = ReplicaSet(ServerSpec(model="m", speculation="off", port=9000), 2)
    plans = {"http://127.0.0.1:9001": {"version": 2, "digest": "aaaaaaaaaaaa"},
             "http://127.0.0.1:9002": {"version": 2, "digest": "bbbbbbbbbbbb"}}
    monkeypatch.setattr(deployment, "plans", lambda: plans)
    with pytest.raises(BackendError, match="different plans: .*9001 digest aaaaaaaaaaaa.*9002 digest bbbb"):
        deployment.check_plans()
    plans["http://127.0.0.1:9002"] = dict(plans["http://127.0.0.1:9001"])
    deployment.check_plans()


# -- the real deployment --------------------------------------------------------------------------


def _free_ports(count: int) -> int:
    """A base port with `count` free ports from it on."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base = sock.getsockname()[1]
        if base + count >= 65535:
            continue
        try:
            for port in range(base, base + count):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no run of free ports")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    from agentspec_sdk.backends.inside_vllm.tool_prompt import write_chat_template
    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.backends.serving.serve_cli import write_plan

    router_binary()  # the `router` extra is part of the test install (scripts/setup.sh)
    work = tmp_path_factory.mktemp("replicas")
    (work / "tools.json").write_text(json.dumps(TOOLS))
    model = resolve_model()
    plan = write_plan(model, work / "plan.json", tools_file=work / "tools.json", formats="tool_calls,react",
                      gamma_max=4)
    template = write_chat_template(model, "tool_calls", work / "chat-template.jinja")
    # --enforce-eager: no torch.compile warm-up (as tests/test_server.py)
    spec = ServerSpec(model=model, port=_free_ports(4), gamma_max=4, plan_path=plan, max_model_len=2048,
                      extra_args=["--enforce-eager"], metrics_dir=work / "prom", chat_template=template)
    replicas = ReplicaSet(spec, 2, "consistent_hash", log_dir=work)
    started = time.monotonic()
    with replicas:
        replicas.start(timeout=900)
        print(f"2 replicas and the router ready in {time.monotonic() - started:.0f} s")
        yield replicas, work


def _requests(url: str) -> int:
    import httpx

    text = httpx.get(url + "/metrics", timeout=10).text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:request_success_total{")))


def _landed(replicas: ReplicaSet, before: list[int], timeout: float = 10.0) -> int:
    """The index of the one replica whose finished requests grew by one since `before`."""
    deadline = time.monotonic() + timeout
    while True:
        now = [_requests(r.base_url) for r in replicas.replicas]
        grown = [i for i, (a, b) in enumerate(zip(now, before, strict=True)) if a > b]
        if sum(a - b for a, b in zip(now, before, strict=True)) >= 1 or time.monotonic() > deadline:
            assert len(grown) == 1 and now[grown[0]] - before[grown[0]] == 1, (before, now)
            return grown[0]
        time.sleep(0.2)


def _check_calls(calls: list[tuple[str, dict]]) -> None:
    import jsonschema

    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    assert calls
    for name, arguments in calls:
        assert name in schemas, name
        jsonschema.validate(arguments, schemas[name])


def _question(city: str) -> list[dict]:
    return [{"role": "system", "content": "You are a weather assistant. Always call a tool first."},
            {"role": "user", "content": f"What is the weather in {city} right now?"}]


@pytest.mark.server
def test_plain_client_and_remote_engine_get_valid_tool_calls_through_the_router(deployment):
    import openai

    from agentspec_sdk.backends.remote.openai_backend import RemoteEngine
    from agentspec_sdk.backends.types import TurnRequest
    from agentspec_sdk.structure.formats import get_format
    from agentspec_sdk.structure.turns import parse_calls

    replicas, _ = deployment
    client = openai.OpenAI(base_url=replicas.base_url + "/v1", api_key="EMPTY", max_retries=0, timeout=300)
    assert client.models.list().data[0].id == "smollm2-135m-instruct"  # the short name, as each replica
    resp = client.chat.completions.create(model="smollm2-135m-instruct", messages=_question("Paris"),
                                          tools=TOOLS, tool_choice="required", max_tokens=48, temperature=0,
                                          user="episode-a", extra_headers={"x-session-id": "episode-a"})
    calls = resp.choices[0].message.tool_calls or []
    _check_calls([(c.function.name, json.loads(c.function.arguments)) for c in calls])
    assert resp.model_extra["metrics"]["speculative_decoding"]["num_draft_tokens"] > 0

    with RemoteEngine(replicas.base_url, tools=TOOLS,
                      metrics_urls=[r.base_url for r in replicas.replicas]) as eng:
        res = eng.submit(TurnRequest(messages=_question("Oslo"), fmt="tool_calls", tool_choice="call",
                                     max_tokens=64, request_id="router/Oslo", agent_id="episode-b")).result()
        stats = eng.stats()
    assert res.error is None, res.error
    print(f"RemoteEngine through the router: {res.text!r}")
    _check_calls([(c.name, c.arguments) for c in parse_calls(get_format("tool_calls"), res.text)])
    assert res.spec["num_draft_tokens"] > 0
    assert stats["proposer"]["steps"] > 0  # the proposer's counters, summed over both replicas' /metrics


@pytest.mark.server
def test_consistent_hash_keeps_each_episode_on_one_replica(deployment):
    """Episode keys are tried until both replicas got a first turn; every second turn of an episode
    lands where its first did (each replica's own request counter shows where each turn went)."""
    from agentspec_sdk.backends.remote.openai_backend import RemoteEngine
    from agentspec_sdk.backends.types import TurnRequest

    replicas, _ = deployment
    first: dict[str, int] = {}
    with RemoteEngine(replicas.base_url, tools=TOOLS) as eng:
        def turn(key: str, t: int) -> int:
            before = [_requests(r.base_url) for r in replicas.replicas]
            res = eng.submit(TurnRequest(messages=_question(key), fmt="tool_calls", max_tokens=12,
                                         request_id=f"{key}/{t}", agent_id=key)).result()
            assert res.error is None, res.error
            return _landed(replicas, before)

        for i in range(24):
            key = f"episode-{i}"
            first[key] = turn(key, 0)
            if len(set(first.values())) == 2 and len(first) >= 4:
                break
        assert set(first.values()) == {0, 1}, first  # both replicas serve some episode
        second = {key: turn(key, 1) for key in first}
    print("episode -> replica:", first)
    assert second == first


@pytest.mark.server
def test_plan_reloads_show_on_every_replicas_metrics(deployment):
    """Both replicas show the shared plan's digest; an edit of the plan file reaches both gauges."""
    import httpx

    from agentspec_sdk.backends.inside_vllm.prom_metrics import plan_identity
    from agentspec_sdk.backends.plan_file import PlanFile

    replicas, work = deployment
    plan_path = work / "plan.json"
    shown = replicas.plans()
    plan = DraftPlan.load(plan_path)
    want = {"version": plan.version, "digest": f"{plan.digest():012x}"}
    assert list(shown.values()) == [want, want], shown
    replicas.check_plans()
    PlanFile(plan_path).update(tools=[OTHER_TOOL])
    edited = DraftPlan.load(plan_path)
    assert edited.version == want["version"] + 1
    time.sleep(0.6)  # the watcher reads the file at most every 0.5 s, at a step
    for replica in replicas.replicas:  # one step on each replica: its proposer reloads
        httpx.post(replica.base_url + "/v1/completions", timeout=120,
                   json={"model": "smollm2-135m-instruct", "prompt": "Hello", "max_tokens": 4})
    for replica in replicas.replicas:
        page = httpx.get(replica.base_url + "/metrics", timeout=10).text
        assert plan_identity(page) == {"version": edited.version, "digest": f"{edited.digest():012x}"}


@pytest.mark.server
def test_a_replica_killed_mid_replay_loses_and_repeats_no_turn(deployment, caplog):
    """Agents on both replicas; between their first and second turns the replica one of them used is
    killed. The router takes it out (a failed health check) and sends the rest to the survivor; every
    turn is answered exactly once, each transcript whole. Runs last: the deployment is one replica
    short afterwards."""
    from agentspec_sdk.backends.remote.openai_backend import RemoteEngine
    from agentspec_sdk.backends.types import TurnRequest

    replicas, _ = deployment
    agents, turns_each = [f"episode-{i}" for i in range(4)], 3
    committed: list[str] = []
    transcripts: dict[str, list[dict]] = {}
    errors: list[BaseException] = []
    first_done = threading.Barrier(len(agents) + 1)
    killed = threading.Event()
    eng = RemoteEngine(replicas.base_url, tools=TOOLS, timeout=120, max_retries=200, backoff_s=0.5,
                       max_backoff_s=3.0, retry_deadline_s=600)

    def agent(key: str) -> None:
        messages = _question(key)
        try:
            for t in range(turns_each):
                if t == 1:
                    first_done.wait(timeout=300)
                    killed.wait(timeout=300)
                res = eng.submit(TurnRequest(messages=list(messages), fmt="tool_calls", max_tokens=24,
                                             request_id=f"{key}/{t}", agent_id=key)).result()
                assert res.error is None, res.error
                committed.append(res.request_id)
                messages.append({"role": "assistant", "content": res.text})
                messages.append({"role": "tool", "content": json.dumps({"city": key, "temp_c": 10 + t})})
            transcripts[key] = messages
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    before = [_requests(r.base_url) for r in replicas.replicas]
    threads = [threading.Thread(target=agent, args=(key,)) for key in agents]
    for th in threads:
        th.start()
    try:
        first_done.wait(timeout=300)
    except threading.BrokenBarrierError:
        pytest.fail(f"the first turns did not finish: {errors}")
    after_first = [_requests(r.base_url) for r in replicas.replicas]
    victim = 0 if after_first[0] > before[0] else 1
    survivor = 1 - victim
    replicas.replicas[victim].kill()
    killed.set()
    for th in threads:
        th.join(timeout=900)
    stats = eng.stats()
    eng.close()

    assert not errors, errors
    expected = [f"{key}/{t}" for key in agents for t in range(turns_each)]
    assert sorted(committed) == sorted(expected)  # none lost, none twice
    for key, messages in transcripts.items():
        assert [m["role"] for m in messages] == ["system", "user"] + ["assistant", "tool"] * turns_each, key
    assert stats["requests"] == len(expected)
    later = len(agents) * (turns_each - 1)
    assert _requests(replicas.replicas[survivor].base_url) - after_first[survivor] >= later
    print(f"killed replica {victim + 1}; client retries {stats['retries']}")
