"""The proposer's Prometheus metrics, the bounded records file, and the readers of both.

No vLLM here: the real-server checks (metrics on vLLM's /metrics equal to the responses' own
speculative-decoding counts, the records soak) are in tests/test_server.py (-m server).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agentspec_sdk.backends.inside_vllm.prom_metrics import (
    ProposerMetrics,
    parse_agentspec,
    source_split,
    subtract,
    summarize,
)
from agentspec_sdk.backends.vllm_metrics import RecordsTail
from agentspec_sdk.drafting.plan import DraftPlan
from agentspec_sdk.drafting.records import (
    Accounting,
    DraftRound,
    RecordsFile,
    append_records,
    rotated_path,
)
from agentspec_sdk.errors import PlanError
from agentspec_sdk.law.estimators import OnlineAcceptance


def _metrics():
    reg = CollectorRegistry()
    return ProposerMetrics(reg), reg


def _page(reg) -> str:
    return generate_latest(reg).decode()


# -- settling rounds into counters ------------------------------------------------------------------


def test_source_runs_are_accepted_up_to_the_first_rejection():
    assert source_split(5, 3, "forced", ["forced", "forced", "lookup", "lookup", "forced"]) == [
        ("forced", 2, 2), ("lookup", 2, 1), ("forced", 1, 0)]
    assert source_split(4, 4, "lookup", None) == [("lookup", 4, 4)]
    assert source_split(3, 1, "repeat", ["a", "b"]) == [("repeat", 3, 1)]  # lengths disagree: first source


def test_accounting_feeds_the_counters_it_keeps_itself():
    metrics, reg = _metrics()
    acc = Accounting(OnlineAcceptance({"S": 0.8, "R": 0.4, "F": 0.3}))
    acc.observer = metrics
    rounds = [(DraftRound(10, 1, "tool_call", "S", "forced", 6, 6), ["forced"] * 4 + ["lookup"] * 2),
              (DraftRound(17, 2, "tool_call", "S", "forced", 5, 2),
               ["forced", "forced", "lookup", "lookup", "lookup"]),
              (DraftRound(30, 3, "content", "F", "lookup", 4, 0), None),
              (DraftRound(40, 4, "think", "R", "repeat", 3, 3), ["repeat"] * 3)]
    for rnd, sources in rounds:
        acc.add(rnd, sources)
    acc.sized([("S", 6, 4), ("F", 3, 0), ("R", 2, 2)])
    metrics.step(rows=3, seconds=0.002, row_errors=1, batch_error=False, interval=0.05)
    metrics.step(rows=2, seconds=0.001, row_errors=0, batch_error=True, interval=None)

    s = summarize(parse_agentspec(_page(reg)))
    own = acc.stats()["by_class"]
    for cls in ("S", "F", "R"):
        assert {k: s["by_class"][cls][k] for k in ("rounds", "drafted", "accepted")} == own[cls]
    assert s["by_source"]["S/forced"] == {"drafted": 6, "accepted": 6, "alpha": 1.0}
    assert s["by_source"]["S/lookup"] == {"drafted": 5, "accepted": 2, "alpha": 0.4}
    assert s["by_kind"]["S/tool_call"]["rounds"] == 2
    assert s["withheld"] == {"S": 2, "F": 3} and s["gated"] == {"F": 1}
    assert (acc.withheld, acc.gated) == (5, 1)
    assert s["steps"] == 2 and s["rows"] == 5 and s["errors"] == 2 and s["batch_errors"] == 1
    assert s["proposer_s"] == pytest.approx(0.003) and s["step_s"] == pytest.approx(0.05)
    page = _page(reg)
    for family in ("agentspec:draft_tokens_total", "agentspec:accepted_tokens_total",
                   "agentspec:draft_rounds_total",
                   "agentspec:budget_withheld_tokens_total", "agentspec:gated_rows_total",
                   "agentspec:proposer_seconds_bucket", "agentspec:drafter_errors_total"):
        assert family in page, family


def test_a_real_drafter_settles_rounds_into_the_counters(tmp_path):
    """The drafter resolves each draft at the next step against the tokens the row kept; the counters
    follow its own accounting exactly (same rounds, same accepted)."""
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.drafting.drafter import StructureDrafter
    from agentspec_sdk.drafting.rows import RowInput

    tok = AutoTokenizer.from_pretrained(resolve_model())
    metrics, reg = _metrics()
    drafter = StructureDrafter(DraftPlan(tools=[]), tok)
    drafter.accounting.observer = metrics
    msgs = [{"role": "user", "content": "Send it to Wilhelmina Oyelaran-Thistlewood."}]
    prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    target = tok.encode(prompt + '<tool_call>{"name": "send", "arguments": {"to": "Wilhelmina '
                        'Oyelaran-Thistlewood"}}</tool_call><|im_end|>')
    k = len(tok.encode(prompt)) + 1
    while k < len(target):
        draft = drafter.propose([RowInput(np.array(target[:k]))])[0]
        acc = 0
        for a, b in zip(draft, target[k:], strict=False):
            if a != b:
                break
            acc += 1
        k += acc + 1
    drafter.propose([RowInput(np.array(target))])
    s = summarize(parse_agentspec(_page(reg)))
    own = drafter.stats()["by_class"]
    assert own and {c: {k: v[k] for k in ("rounds", "drafted", "accepted")}
                    for c, v in s["by_class"].items()} == own
    assert sum(r.accepted for r in drafter.records) == sum(v["accepted"] for v in s["by_class"].values()) > 0


def test_metrics_of_another_process_reach_a_multiprocess_collector(tmp_path):
    """What vLLM's /metrics does with PROMETHEUS_MULTIPROC_DIR: the API server's registry is a
    MultiProcessCollector over the directory; our counters are written by another process (the
    engine core), which inherited the variable."""
    from prometheus_client import multiprocess

    prom = tmp_path / "prom"
    prom.mkdir()
    code = ("from agentspec_sdk.backends.inside_vllm.prom_metrics import proposer_metrics\n"
            "from agentspec_sdk.drafting.records import DraftRound\n"
            "m = proposer_metrics()\n"
            "m.round(DraftRound(1, 2, 'tool_call', 'S', 'forced', 4, 3), None)\n"
            "m.step(2, 0.001, 0, False, 0.03)\n")
    subprocess.run([sys.executable, "-c", code], check=True,
                   env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(prom)}, timeout=120)
    assert list(prom.glob("*.db"))
    reg = CollectorRegistry()
    multiprocess.MultiProcessCollector(reg, path=str(prom))
    s = summarize(parse_agentspec(_page(reg)))
    assert s["by_class"]["S"]["accepted"] == 3 and s["by_class"]["S"]["drafted"] == 4 and s["steps"] == 1


def test_subtract_gives_counts_since_a_baseline():
    metrics, reg = _metrics()
    metrics.round(DraftRound(1, 1, "tool_call", "S", "forced", 4, 4), None)
    base = parse_agentspec(_page(reg))
    metrics.round(DraftRound(5, 1, "tool_call", "S", "forced", 3, 1), None)
    s = summarize(subtract(parse_agentspec(_page(reg)), base))
    assert s["by_class"]["S"] == {"rounds": 1, "drafted": 3, "accepted": 1, "alpha": pytest.approx(1 / 3)}


# -- the bounded records file -------------------------------------------------------------------------


def _line(i: int) -> str:
    return json.dumps({"type": "draft", "position": i, "prefix_hash": i * 7, "kind": "tool_call",
                       "law_class": "S", "source": "forced", "tokens": [i, i + 1, i + 2]})


def test_records_rotate_at_the_cap_and_the_tail_follows(tmp_path):
    path = tmp_path / "records.jsonl"
    cap = 4096
    tail = RecordsTail(path)
    for i in range(400):
        append_records(path, [_line(i)], cap)
        assert path.stat().st_size <= cap
        if i % 10 == 0:
            tail.poll()
    tail.poll()
    assert rotated_path(path).is_file() and rotated_path(path).stat().st_size <= cap
    assert len(tail._drafts) == 400 and tail.lost_rotations == 0  # every line read once, across rotations
    assert [k[0] for k in tail._drafts] == list(range(400))


def test_the_records_file_stays_open_between_appends_and_follows_a_removal(tmp_path, monkeypatch):
    """The writer opens its file once (an append is a stat and a write), rotates it at the cap as
    `append_records` does (the tail reads every line), and opens it anew when someone else removed
    or renamed it."""
    from pathlib import Path

    opened = []  # the writer's opens (for appending), not the test's reads
    real_open = Path.open
    monkeypatch.setattr(Path, "open", lambda self, mode="r", *a, **k: (mode == "ab" and opened.append(self))
                        or real_open(self, mode, *a, **k))
    path = tmp_path / "records.jsonl"
    tail = RecordsTail(path)
    out = RecordsFile(path, 4096)
    for i in range(20):
        out.append([_line(i)])
    assert len(opened) == 1 and len(path.read_text().splitlines()) == 20
    for i in range(20, 200):
        out.append([_line(i)])
        assert path.stat().st_size <= 4096
        if i % 10 == 0:
            tail.poll()
    tail.poll()
    assert [k[0] for k in tail._drafts] == list(range(200)) and tail.lost_rotations == 0
    rotations = len(opened) - 1  # each rotation opens the new file
    assert rotations >= 3
    path.unlink()
    out.append([_line(200)])
    assert len(opened) == rotations + 2 and path.read_text() == _line(200) + "\n"
    path.rename(tmp_path / "elsewhere.jsonl")
    out.append([_line(201)])
    assert len(opened) == rotations + 3 and path.read_text() == _line(201) + "\n"
    out.close()


def test_a_file_rotated_twice_between_polls_is_counted_as_lost(tmp_path):
    path = tmp_path / "records.jsonl"
    tail = RecordsTail(path)
    append_records(path, [_line(0)], 4096)
    tail.poll()
    for i in range(1, 200):  # ~100 bytes a line: several rotations before the next poll
        append_records(path, [_line(i)], 4096)
    tail.poll()
    assert tail.lost_rotations == 1
    assert 199 in {k[0] for k in tail._drafts}


def test_accounting_writes_through_the_rotating_file(tmp_path):
    path = tmp_path / "r.jsonl"
    acc = Accounting(OnlineAcceptance({"S": 0.8}), path, records_max_bytes=4096)
    for i in range(300):
        acc.add(DraftRound(i, i, "tool_call", "S", "forced", 4, 2))
        acc.end_step(rows=1, drafted=4, seconds=0.001, errors=0)
    assert path.stat().st_size <= 4096 and rotated_path(path).stat().st_size <= 4096


@pytest.mark.parametrize("bad", [0, 100, -1, 2.5, True, "64"])
def test_plan_refuses_a_bad_records_cap(bad):
    with pytest.raises(PlanError, match="records_max_bytes"):
        DraftPlan(records_max_bytes=bad)
    assert DraftPlan(records_max_bytes=1 << 20).records_max_bytes == 1 << 20


# -- readers: RemoteEngine.stats() and `agentspec serve --status` -------------------------------------


class _MetricsServer:
    """Serves a /metrics page that the test changes between scrapes."""

    def __init__(self):
        self.page = ""
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                body = server.page.encode() if self.path == "/metrics" else b"{}"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


VLLM_LINES = ('vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {n}\n'
              'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {d}\n'
              'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {a}\n')


def test_remote_stats_read_the_proposer_metrics_since_the_client_started():
    from agentspec_sdk.backends.remote.openai_backend import RemoteEngine

    metrics, reg = _metrics()
    metrics.round(DraftRound(1, 1, "tool_call", "S", "forced", 4, 4), ["forced"] * 4)
    srv = _MetricsServer()
    try:
        srv.page = _page(reg) + VLLM_LINES.format(n=1, d=4, a=4)
        eng = RemoteEngine(srv.url, model="m")
        metrics.round(DraftRound(9, 2, "tool_call", "S", "forced", 4, 1),
                      ["forced", "lookup", "lookup", "lookup"])
        metrics.round(DraftRound(20, 3, "content", "F", "lookup", 2, 0), None)
        metrics.step(rows=2, seconds=0.004, row_errors=0, batch_error=False, interval=0.1)
        srv.page = _page(reg) + VLLM_LINES.format(n=3, d=10, a=5)
        stats = eng.stats()
        eng.close()
    finally:
        srv.close()
    prop = stats["proposer"]
    assert prop["source"] == "metrics"
    assert prop["by_class"]["S"]["accepted"] == 1 and prop["by_class"]["S"]["drafted"] == 4
    assert prop["by_class"]["F"] == {"rounds": 1, "drafted": 2, "accepted": 0, "alpha": 0.0}
    assert prop["by_source"]["S/lookup"]["drafted"] == 3 and prop["proposer_share"] == pytest.approx(0.04)
    assert stats["vllm"] == {"num_drafts": 2, "num_draft_tokens": 6, "num_accepted_tokens": 1}


def test_serve_status_prints_acceptance_per_class_from_metrics():
    import typer
    from typer.testing import CliRunner

    from agentspec_sdk.backends.serving.serve_cli import serve

    app = typer.Typer()
    app.command("serve")(serve)
    app.command("noop")(lambda: None)
    metrics, reg = _metrics()
    metrics.round(DraftRound(1, 1, "tool_call", "S", "forced", 6, 5), None)
    metrics.round(DraftRound(8, 1, "content", "F", "lookup", 4, 1), None)
    metrics.sized("F", 4, 0)
    srv = _MetricsServer()
    try:
        srv.page = _page(reg) + VLLM_LINES.format(n=2, d=10, a=6)
        out = CliRunner().invoke(app, ["serve", "--status", srv.url + "/v1"])
        srv.page = VLLM_LINES.format(n=2, d=10, a=6)  # a server without our proposer
        plain = CliRunner().invoke(app, ["serve", "--status", srv.url])
    finally:
        srv.close()
    assert out.exit_code == 0, out.output
    assert "6 of 10 draft tokens accepted (60.0 %)" in out.output
    rows = {line.split()[0]: line.split()[1:] for line in out.output.splitlines() if line[:2] in ("S ", "F ")}
    assert rows["S"][:3] == ["1", "6", "5"] and rows["F"][:3] == ["1", "4", "1"]
    assert "gated rows: F 1" in out.output
    assert plain.exit_code == 0 and "no agentspec:* metrics" in plain.output
    bad = CliRunner().invoke(app, ["serve", "--status", "localhost:1"])
    assert bad.exit_code == 2 and "--status needs the server's URL" in bad.output


def test_the_vllm_proposer_adapter_counts_steps_rows_and_batch_errors(tmp_path, monkeypatch):
    """AgentSpecProposer as vLLM calls it (sampled ids, num_tokens_no_spec, the token table): the
    process's metrics move with its steps; a drafter that raises counts one batch error."""
    from types import SimpleNamespace

    from prometheus_client import REGISTRY
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.inside_vllm.vllm_proposer import AgentSpecProposer
    from agentspec_sdk.backends.model_bundle import resolve_model

    model = resolve_model()
    tok = AutoTokenizer.from_pretrained(model)
    plan = DraftPlan(tools=[], tokenizer=str(model)).save(tmp_path / "plan.json")
    monkeypatch.setenv("AGENTSPEC_PLAN", str(plan))
    cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                          model_config=SimpleNamespace(max_model_len=2048, tokenizer=str(model)))
    proposer = AgentSpecProposer(cfg)
    before = parse_agentspec(generate_latest(REGISTRY).decode())
    msgs = [{"role": "user", "content": "Send it to Wilhelmina Oyelaran-Thistlewood."}]
    prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    target = tok.encode(prompt + '<tool_call>{"name": "send", "arguments": {"to": "Wilhelmina '
                        'Oyelaran-Thistlewood"}}</tool_call><|im_end|>')
    table = np.zeros((1, 2048), dtype=np.int64)
    table[0, : len(target)] = target
    k, steps = len(tok.encode(prompt)) + 1, 0
    while k < len(target):
        draft = proposer.propose([[target[k - 1]]], np.array([k]), table)[0]
        steps += 1
        acc = 0
        for a, b in zip(draft, target[k:], strict=False):
            if a != b:
                break
            acc += 1
        k += acc + 1
    proposer.drafter._propose = lambda *args: 1 / 0  # a drafter bug: the batch gets no drafts
    assert proposer.propose([[target[-1]]], np.array([len(target)]), table) == [[]]
    delta = subtract(parse_agentspec(generate_latest(REGISTRY).decode()), before)
    s = summarize(delta)
    assert s["steps"] == steps + 1 and s["rows"] == steps + 1 and s["batch_errors"] == 1
    assert s["step_s"] > 0 and delta[("busy_steps",)] == steps  # every step after the first continued the row
    own = proposer.drafter.stats()["by_class"]
    assert sum(v["accepted"] for v in s["by_class"].values()) == sum(v["accepted"] for v in own.values()) > 0
