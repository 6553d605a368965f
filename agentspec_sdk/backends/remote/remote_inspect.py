"""Server inspection for the server client (`RemoteEngine`): /metrics and health checks.

`ServerInspector` scrapes vLLM's spec-decode counters and the proposer's `agentspec:*` families from
each `metrics_urls` page and runs the health check (`RemoteEngine.check`).
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable
from typing import Any

import httpx

from agentspec_sdk.backends.inside_vllm.prom_metrics import parse_agentspec
from agentspec_sdk.backends.types import TurnRequest, TurnResult
from agentspec_sdk.errors import BackendError

PROBE_GRAMMAR = 'start: "agentspec probe " ("alpha" | "beta" | "gamma") "."'
PROBE_PATTERN = re.compile(r"agentspec probe (alpha|beta|gamma)\.")
_SPEC_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def parse_prometheus(text: str) -> dict[str, float]:
    """vLLM's spec-decode counters from a /metrics page, summed over engines and models."""
    out = dict.fromkeys(_SPEC_COUNTERS, 0.0)
    found = False
    for line in text.splitlines():
        if not line.startswith("vllm:spec_decode_"):
            continue
        name, _, rest = line.partition("{") if "{" in line else line.partition(" ")
        name = name.removeprefix("vllm:spec_decode_").removesuffix("_total")
        if name in out:
            found = True
            out[name] += float(rest.rsplit(" ", 1)[-1])
    return out if found else {}


class ServerInspector:
    """/metrics of `metrics_urls` (one GET each) and the proposer's records file when readable."""

    def __init__(self, root: str, http: httpx.Client, metrics_urls: list[str], records: Any = None):
        self.root = root
        self.http = http
        self.metrics_urls = metrics_urls
        self.records = records  # vllm_metrics.RecordsTail or None
        self._lock = threading.Lock()

    def scrape(self, quiet: bool = False) -> tuple[dict[str, float], dict[tuple, float]]:
        """vLLM's spec-decode counters and the proposer's agentspec:* counters, summed over
        `metrics_urls`. quiet: an unreachable page counts nothing instead of raising."""
        total: dict[str, float] = {}
        ours: dict[tuple, float] = {}
        for url in self.metrics_urls:
            try:
                resp = self.http.get(url + "/metrics")
            except httpx.HTTPError as exc:
                if quiet:
                    continue
                raise BackendError(f"GET {url}/metrics failed: {exc}") from exc
            for k, v in parse_prometheus(resp.text).items():
                total[k] = total.get(k, 0.0) + v
            try:
                parsed = parse_agentspec(resp.text)
            except ValueError:  # not a Prometheus page (a router's): vLLM's counters may still be there
                parsed = {}
            for k, v in parsed.items():
                ours[k] = ours.get(k, 0.0) + v
        return total, ours

    def metric_steps(self) -> float | None:
        """The proposer's step count summed over `metrics_urls`; None where no agentspec:* metrics."""
        ours = self.scrape(quiet=True)[1]
        return ours.get(("steps",), 0.0) if ours else None

    def proposer_steps(self) -> int:
        if self.records is None:
            return 0
        with self._lock:
            self.records.poll()
            return self.records.steps

    def records_stats(self) -> dict:
        with self._lock:
            self.records.poll()
            return self.records.proposer_stats()

    def claim(self, prompt_ids: list[int], token_ids: list[int]) -> list[dict]:
        with self._lock:
            self.records.poll()
            return self.records.claim(prompt_ids, token_ids)

    def check(self, *, get: Callable[[str], httpx.Response], model: Callable[[], str],
              probe: Callable[[TurnRequest], TurnResult], speculation: bool = True) -> dict:
        """Server reachable, model served, speculation on with per-request metrics, grammars honoured;
        BackendError says which fails. With a records file, also that our proposer runs in the server.
        `get` fetches a URL (retried), `model` names the served model, `probe` runs one turn uncounted."""
        health = get(self.root + "/health")
        if health.status_code != 200:
            raise BackendError(f"{self.root}/health answered HTTP {health.status_code}")
        report: dict[str, Any] = {"url": self.root, "model": model()}
        if speculation:
            counters = self.scrape()[0]
            if not counters:
                raise BackendError(f"{self.root} runs without speculative decoding: /metrics has no "
                                   "vllm:spec_decode_* counters (start it with `agentspec serve`, or pass "
                                   "the --speculative-config it prints)")
            report["spec_counters"] = counters
        steps_before = self.proposer_steps()
        metric_steps_before = self.metric_steps()
        req = TurnRequest(messages=[{"role": "user", "content": "Reply with one word."}], fmt="tool_calls",
                          grammar=PROBE_GRAMMAR, max_tokens=16, temperature=0.0,
                          request_id=f"agentspec-check-{uuid.uuid4().hex[:8]}")
        res = probe(req)
        if res.error:
            raise BackendError(f"{self.root} rejected a grammar-constrained request: {res.error}")
        if not PROBE_PATTERN.fullmatch(res.text.strip()):
            raise BackendError(f"{self.root} ignores grammars: asked for {PROBE_PATTERN.pattern!r}, got "
                               f"{res.text[:80]!r} (needs vLLM >= 0.12 with structured outputs backend "
                               "'guidance')")
        report["grammar"] = "honoured"
        if speculation:
            if not res.acceptance and self.records is None:
                raise BackendError(f"{self.root} returns no per-request acceptance "
                                   "(metrics.speculative_decoding): start it with "
                                   "--per-request-spec-decode-metrics detailed")
            report["per_request_metrics"] = True
        if metric_steps_before is not None:  # agentspec:* on /metrics: our proposer is in there
            metric_steps_after = self.metric_steps() or 0
            if metric_steps_after <= metric_steps_before:
                raise BackendError(f"the AgentSpec proposer is not running in {self.root}: "
                                   "agentspec:proposer_seconds_count on /metrics did not grow during a "
                                   "request")
            report["proposer"] = {"steps": int(metric_steps_after), "source": "metrics"}
        if self.records is not None:
            steps_after = self.proposer_steps()
            if steps_after <= steps_before:
                raise BackendError(f"the AgentSpec proposer is not running in {self.root}: its records "
                                   f"file {self.records.path} did not grow during a request (is the "
                                   "server's --speculative-config method custom_class, and its "
                                   "AGENTSPEC_PLAN the plan naming this records file?)")
            report.setdefault("proposer", {"steps": steps_after, "source": "records"})
        return report
