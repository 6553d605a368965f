"""`RemoteEngine`: the Engine API over a vLLM OpenAI-compatible server (one replica or a router).

Each turn is one chat completion carrying its grammar in `structured_outputs.grammar` (Lark for vLLM's
`guidance` backend). Failures that a retry can cure (connection refused or reset, timeouts, 5xx, 429)
are retried with exponential backoff by tenacity, up to `max_retries` and `retry_deadline_s`.

Idempotency: a turn has one stable `request_id` (the caller's, or a uuid given at submit). Its result
is committed once, from one complete response; an attempt that fails leaves nothing behind, and
submitting a request id that is already committed or in flight returns the same future instead of
generating again. The server sees `<request_id>.<attempt>` so that its logs show each attempt. When a
stream restarts after a failure, the events already delivered are not delivered again: the new attempt
(same seed, so the same text at temperature 0 or with a seed) is checked against them and continues.

Acceptance per request comes from the response (`metrics.speculative_decoding`, switched on by
`--per-request-spec-decode-metrics`); per law class from the proposer's records file when the client
can read it (`records_path`: a local server, or a shared volume). Server-wide acceptance per class,
kind and source comes from the `agentspec:*` families on the server's /metrics (`stats()["proposer"]`).
See docs/deployment.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import queue
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from agentspec_sdk.errors import BackendError

log = logging.getLogger("agentspec.remote")

PROBE_GRAMMAR = 'start: "agentspec probe " ("alpha" | "beta" | "gamma") "."'
PROBE_PATTERN = re.compile(r"agentspec probe (alpha|beta|gamma)\.")
_SPEC_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


class MalformedResponse(BackendError):
    """The server answered, but a field the client needs is missing or has the wrong type."""


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, openai.APIConnectionError | openai.APITimeoutError | httpx.TransportError):
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code >= 500 or exc.status_code == 429
    return isinstance(exc, _StreamBroken)


class _StreamBroken(Exception):
    """A stream ended without its final chunk (the server went away mid-answer)."""


def _field(obj: Any, path: str, kind: type | tuple[type, ...], *, optional: bool = False) -> Any:
    """obj at a dotted path ("choices.0.message.content"), type-checked; MalformedResponse names the path."""
    cur = obj
    for part in path.split("."):
        if isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        elif isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            cur = None
            break
    if cur is None:
        if optional:
            return None
        raise MalformedResponse(f"malformed response: field '{path}' is missing")
    if not isinstance(cur, kind):
        raise MalformedResponse(f"malformed response: field '{path}' should be "
                                f"{getattr(kind, '__name__', kind)}, got {type(cur).__name__}")
    return cur


def _int_list(obj: Any, path: str, *, optional: bool = False) -> list[int] | None:
    value = _field(obj, path, list, optional=optional)
    if value is not None and not all(isinstance(v, int) for v in value):
        raise MalformedResponse(f"malformed response: field '{path}' should hold integers")
    return value


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


def _seed_for(request_id: str) -> int:
    return int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:4], "little")


class RemoteEngine:
    """The Engine API against `base_url` (`http://host:port`, with or without `/v1`)."""

    def __init__(self, base_url: str, model: str | None = None, api_key: str = "EMPTY", *,
                 timeout: float = 120.0, max_retries: int = 6, retry_deadline_s: float = 300.0,
                 backoff_s: float = 0.5, max_backoff_s: float = 10.0, records_path: str | Path | None = None,
                 metrics_urls: list[str] | None = None, tools: Any = None, plan_path: str | Path | None = None,
                 max_workers: int = 64, ledger_size: int = 100_000):
        if not re.match(r"^https?://[^/\s]+", base_url or ""):
            raise BackendError(f"server URL must look like http://host:port, got {base_url!r}")
        self.root = re.sub(r"/v1/?$", "", base_url.rstrip("/"))
        self.model = model
        self.timeout = timeout
        self.max_retries = max_retries
        self.retry_deadline_s = retry_deadline_s
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        # Our retries, not the client's: they are logged, bounded in time, and keep the request id.
        self.client = openai.OpenAI(base_url=self.root + "/v1", api_key=api_key, timeout=timeout,
                                    max_retries=0)
        self.http = httpx.Client(timeout=min(timeout, 10.0))
        self.metrics_urls = [u.rstrip("/") for u in (metrics_urls or [self.root])]
        self.plan_path = Path(plan_path) if plan_path else None
        self._records = None
        if records_path:
            from agentspec_sdk.backends.vllm_metrics import RecordsTail

            self._records = RecordsTail(records_path)
        self._lock = threading.RLock()
        self._registry = None
        if tools is not None:
            self.register_tools(tools)
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="agentspec-remote")
        self._ledger: OrderedDict[str, Future] = OrderedDict()  # the idempotency window
        self._ledger_size = ledger_size
        self._idle_since: dict[str, float] = {}
        self._idle_s: dict[str, float] = {}
        self._totals = {"requests": 0, "errors": 0, "output_tokens": 0, "attempts": 0, "retries": 0,
                        "vllm_request_drafted": 0, "vllm_request_accepted": 0}
        self._acceptance: dict[str, dict[str, int]] = {}
        self._counters_at_start, self._agentspec_at_start = self._scrape(quiet=True)
        self._closed = False

    @classmethod
    def from_url(cls, url: str, **kwargs) -> RemoteEngine:
        """`agentspec replay --server URL`: everything else has working defaults."""
        return cls(url, **kwargs)

    # -- tools and grammars --------------------------------------------------------------------

    def register_tools(self, tools: Any) -> None:
        """Tools for the grammars and prompts this client builds. With `plan_path` (a server on this
        machine) the plan is updated too, so the proposer drafts for them; a remote server's tools are
        the ones given to `agentspec serve --tools`."""
        from agentspec_sdk.backends.vllm_engine import _as_registry
        from agentspec_sdk.structure.tools import ToolRegistry

        with self._lock:
            if self._registry is None:
                self._registry = ToolRegistry()
            for tool in _as_registry(tools):
                if tool.name not in self._registry:
                    self._registry.add(tool)
            self._update_plan(tools=self._registry.openai_tools())

    def _update_plan(self, tools: list[dict] | None = None, fmt: Any = None) -> None:
        if self.plan_path is None:
            return
        from agentspec_sdk.drafting.plan import DraftPlan

        plan = DraftPlan.load(self.plan_path)
        changed = False
        if tools is not None:
            have = {t["function"]["name"] for t in plan.tools if "function" in t}
            new = [t for t in tools if t["function"]["name"] not in have]
            plan.tools, changed = plan.tools + new, bool(new)
        if fmt is not None and fmt.to_dict() not in plan.formats:
            plan.formats = [f for f in plan.formats if f.get("name") != fmt.name] + [fmt.to_dict()]
            changed = True
        if changed:
            plan.save(self.plan_path)

    def _tools_of(self, req: Any):
        from agentspec_sdk.backends.vllm_engine import _as_registry
        from agentspec_sdk.structure.tools import ToolRegistry

        if req.tools is None:
            return self._registry or ToolRegistry()
        registry = _as_registry(req.tools)
        if self._registry is None or any(t.name not in self._registry for t in registry):
            self.register_tools(registry)
        return registry

    def grammar_for(self, fmt: Any, tools: Any) -> str:
        from agentspec_sdk.structure.turn_grammar import turn_grammar

        return turn_grammar(fmt, tools)

    def _prepare(self, req: Any) -> dict:
        """Chat arguments of a turn: the same messages, grammar and stop strings as the embedded engine."""
        from agentspec_sdk.backends.vllm_engine import chat_messages
        from agentspec_sdk.structure.formats import get_format

        fmt = get_format(req.fmt)
        if self.plan_path is not None:
            with self._lock:
                self._update_plan(fmt=fmt)
        tools = self._tools_of(req)
        grammar = self.grammar_for(fmt, tools) if req.grammar is None else req.grammar
        return {"fmt": fmt, "messages": chat_messages(req.messages, fmt, tools), "grammar": grammar or None,
                "stop": list(fmt.stop) or None}

    # -- requests ------------------------------------------------------------------------------

    def _model(self) -> str:
        """The served model (the first in /v1/models when not given); no retries of its own, it runs
        inside a turn's retried attempt."""
        if self.model is None:
            models = self._get_json("/v1/models", retry=False)
            data = _field(models, "data", list)
            self.model = _field(data, "0.id", str) if data else None
            if not self.model:
                raise BackendError(f"server {self.root} serves no model (/v1/models is empty)")
        return self.model

    def _kwargs(self, req: Any, turn: dict, request_id: str, attempt: int) -> dict:
        body: dict[str, Any] = {"request_id": f"{request_id}.{attempt}", "return_token_ids": True}
        if turn["grammar"]:
            body["structured_outputs"] = {"grammar": turn["grammar"]}
        if req.temperature and req.temperature > 0:
            body["seed"] = _seed_for(request_id)  # the same sample on every attempt
        return {"model": self._model(), "messages": turn["messages"], "max_tokens": req.max_tokens,
                "temperature": req.temperature, "stop": turn["stop"], "extra_body": body}

    def _retrying(self, request_id: str) -> Retrying:
        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            with self._lock:
                self._totals["retries"] += 1
            log.warning("agentspec remote: %s attempt %d failed (%s: %s); retrying in %.1f s",
                        _label(request_id), state.attempt_number, type(exc).__name__, _short(exc),
                        state.next_action.sleep if state.next_action else 0.0)

        return Retrying(retry=retry_if_exception(_retryable), reraise=True, before_sleep=before_sleep,
                        stop=stop_after_attempt(self.max_retries + 1) | stop_after_delay(self.retry_deadline_s),
                        wait=wait_exponential(multiplier=self.backoff_s, max=self.max_backoff_s))

    def _call(self, fn, request_id: str):
        started = time.monotonic()
        attempt = 0

        def once():
            nonlocal attempt
            attempt += 1
            with self._lock:
                self._totals["attempts"] += 1
            return fn(attempt)

        try:
            return self._retrying(request_id)(once)
        except Exception as exc:
            if _retryable(exc):
                raise BackendError(
                    f"server {self.root} failed {_label(request_id)} after {attempt} attempt(s) over "
                    f"{time.monotonic() - started:.1f} s: {type(exc).__name__}: {_short(exc)}") from exc
            raise

    def _turn(self, req: Any, request_id: str, count: bool = True) -> Any:
        started = time.perf_counter()
        try:
            turn = self._prepare(req)
        except Exception as exc:  # a bad turn fails alone, with the reason (as in the embedded engine)
            return self._error_result(req, request_id, f"{type(exc).__name__}: {exc}", started)

        def attempt(n: int) -> dict:
            raw = self.client.chat.completions.with_raw_response.create(
                **self._kwargs(req, turn, request_id, n))
            try:
                return raw.http_response.json()
            except ValueError as exc:
                raise MalformedResponse(f"malformed response: body is not JSON ({exc})") from None

        try:
            data = self._call(attempt, request_id)
        except openai.BadRequestError as exc:  # this request only (e.g. the grammar does not compile)
            return self._error_result(req, request_id, f"server rejected the request: {_short(exc)}", started)
        if not isinstance(data, dict):
            raise MalformedResponse(f"malformed response: body should be a JSON object, got {type(data).__name__}")
        _field(data, "choices.0", dict)
        text = _field(data, "choices.0.message.content", str, optional=True) or ""
        token_ids = _int_list(data, "choices.0.token_ids")
        prompt_ids = _int_list(data, "prompt_token_ids")
        finish = _field(data, "choices.0.finish_reason", str, optional=True)
        metrics = _field(data, "metrics", dict, optional=True)
        return self._result(req, turn["fmt"], request_id, text, token_ids, prompt_ids, finish, metrics,
                            time.perf_counter() - started, count)

    def _result(self, req, fmt, request_id, text, token_ids, prompt_ids, finish, metrics, e2e_s,
                count: bool = True) -> Any:
        from agentspec_sdk.backends.vllm_engine import TurnResult
        from agentspec_sdk.backends.vllm_metrics import merge_acceptance
        from agentspec_sdk.structure.segmenter import segment

        spec = _field({"metrics": metrics or {}}, "metrics.speculative_decoding", dict, optional=True)
        records, acceptance = self._acceptance_of(prompt_ids, token_ids, spec)
        timings = {"e2e_s": e2e_s}
        for key, name in (("queue_time_ms", "queue_s"), ("time_to_first_token_ms", "prefill_s"),
                          ("generation_time_ms", "decode_s")):
            value = (metrics or {}).get(key)
            if isinstance(value, int | float):
                timings[name] = value / 1000.0
        result = TurnResult(request_id=request_id, text=text, token_ids=token_ids,
                            prompt_token_ids=prompt_ids, finish_reason=finish, error=None,
                            spans=segment(fmt, text), records=records, acceptance=acceptance,
                            timings=timings, spec=spec, agent_id=req.agent_id)
        if count:  # health probes are not turns
            with self._lock:
                self._totals["requests"] += 1
                self._totals["output_tokens"] += len(token_ids)
                if spec:
                    self._totals["vllm_request_drafted"] += int(spec.get("num_draft_tokens", 0))
                    self._totals["vllm_request_accepted"] += int(spec.get("num_accepted_draft_tokens", 0))
                merge_acceptance(self._acceptance, acceptance)
        return result

    def _error_result(self, req, request_id: str, error: str, started: float) -> Any:
        from agentspec_sdk.backends.vllm_engine import TurnResult

        with self._lock:
            self._totals["errors"] += 1
        return TurnResult(request_id=request_id, error=error, agent_id=req.agent_id,
                          timings={"e2e_s": time.perf_counter() - started})

    def _acceptance_of(self, prompt_ids, token_ids, spec: dict | None) -> tuple[list[dict], dict]:
        """Per-class records from the proposer's records file when readable, else the server's
        per-request counters (class "all")."""
        if self._records is not None:
            from agentspec_sdk.backends.vllm_metrics import acceptance_by_class, settle_against_vllm

            with self._lock:
                self._records.poll()
                records = self._records.claim(prompt_ids, token_ids)
            settle_against_vllm(records, len(token_ids), spec)  # as the embedded engine: what vLLM verified
            return records, acceptance_by_class(records)
        if spec is None:
            return [], {}
        wrapped = {"metrics": {"speculative_decoding": spec}}
        base = "metrics.speculative_decoding."
        drafted = _field(wrapped, base + "num_draft_tokens", int)
        accepted = _field(wrapped, base + "num_accepted_draft_tokens", int)
        steps = _field(wrapped, base + "num_spec_steps", int)
        per_acc = _int_list(wrapped, base + "per_step_accepted", optional=True) or []
        per_draft = _int_list(wrapped, base + "per_step_drafted", optional=True) or []
        records = [{"law_class": "all", "kind": None, "source": "server", "drafted": int(d),
                    "accepted": int(a), "position": None} for a, d in zip(per_acc, per_draft, strict=False)]
        return records, {"all": {"rounds": steps, "drafted": drafted, "accepted": accepted}}

    # -- Engine API ----------------------------------------------------------------------------

    def submit(self, req: Any) -> Future:
        if self._closed:
            raise BackendError("RemoteEngine is closed")
        request_id = req.request_id or uuid.uuid4().hex
        with self._lock:
            fut = self._ledger.get(request_id)
            if fut is not None and not (fut.done() and fut.exception() is not None):
                return fut  # committed or in flight: never generate the same turn twice
            fut = self._pool.submit(self._turn, req, request_id)
            self._remember(request_id, fut)
        return fut

    def _remember(self, request_id: str, fut: Future) -> None:
        self._ledger[request_id] = fut
        self._ledger.move_to_end(request_id)
        while len(self._ledger) > self._ledger_size:
            oldest = next(iter(self._ledger))
            if not self._ledger[oldest].done():
                break
            del self._ledger[oldest]

    def generate(self, requests: list[Any]) -> list[Any]:
        futures = [self.submit(r) for r in requests]
        return [f.result() for f in futures]

    async def agenerate(self, req: Any) -> Any:
        return await asyncio.wrap_future(self.submit(req))

    def stream(self, req: Any) -> Iterator[Any]:
        """StreamEvents (text delta, segment kind, law class) as they arrive; the last carries the result.

        A stream cut by a failure is retried like any turn; the new attempt's text is checked against
        what was already delivered and only the rest is delivered."""
        from agentspec_sdk.backends.vllm_engine import StreamEvent
        from agentspec_sdk.structure.segmenter import Segmenter

        request_id = req.request_id or uuid.uuid4().hex
        with self._lock:
            done = self._ledger.get(request_id)
        if done is not None and done.done() and done.exception() is None:  # committed: replay, not regenerate
            result = done.result()
            yield StreamEvent(result.text, "", "")
            yield StreamEvent("", "", "", result=result)
            return
        started = time.perf_counter()
        try:
            turn = self._prepare(req)
        except Exception as exc:  # a bad turn fails alone, as in submit()
            yield StreamEvent("", "", "", result=self._error_result(req, request_id, f"{type(exc).__name__}: {exc}",
                                                                    started))
            return
        seg = Segmenter(turn["fmt"])
        delivered = ""
        final: dict = {}
        events: queue.Queue = queue.Queue()

        def emit(delta: str) -> None:  # split at segment boundaries, as the embedded engine does
            start = at = len(seg)
            for span in seg.feed(delta):
                if span.end > at:
                    events.put(StreamEvent(delta[at - start:span.end - start], span.kind, _law(span)))
                    at = span.end
            if at < start + len(delta):
                events.put(StreamEvent(delta[at - start:], seg.kind, _law(seg)))

        def attempt(n: int) -> None:
            nonlocal delivered
            text, ids, prompt_ids, finish, metrics, done = "", [], None, None, None, False
            stream = self.client.chat.completions.create(
                **self._kwargs(req, turn, request_id, n), stream=True,
                stream_options={"include_usage": True})
            with stream:
                for chunk in stream:
                    data = chunk.model_dump()
                    if data.get("prompt_token_ids") is not None:
                        prompt_ids = _int_list(data, "prompt_token_ids")
                    if data.get("usage") is not None and not data.get("choices"):
                        metrics, done = data.get("metrics"), True
                    for choice in data.get("choices") or []:
                        text += _field(choice, "delta.content", str, optional=True) or ""
                        ids += _int_list(choice, "token_ids", optional=True) or []
                        finish = choice.get("finish_reason") or finish
                        fresh = self._fresh(text, delivered, request_id)
                        if fresh:
                            delivered += fresh
                            emit(fresh)
            if not done:
                raise _StreamBroken(f"stream of turn {request_id} ended without its final usage chunk")
            final.update(text=text, ids=ids, prompt_ids=prompt_ids or [], finish=finish, metrics=metrics)

        worker = self._pool.submit(self._call, attempt, request_id)
        worker.add_done_callback(lambda _f: events.put(None))
        while (event := events.get()) is not None:
            yield event
        worker.result()
        result = self._result(req, turn["fmt"], request_id, final["text"], final["ids"], final["prompt_ids"],
                              final["finish"], final["metrics"], time.perf_counter() - started)
        committed: Future = Future()
        committed.set_result(result)
        with self._lock:
            self._remember(request_id, committed)
        yield StreamEvent("", "", "", result=result)

    @staticmethod
    def _fresh(text: str, delivered: str, request_id: str) -> str:
        """The part of `text` not yet delivered; a restarted stream must agree with what was sent."""
        if len(text) <= len(delivered):
            if not delivered.startswith(text):
                raise BackendError(f"turn {request_id}: the retried stream diverged from the text already "
                                   "delivered (use temperature 0 or a seed)")
            return ""
        if not text.startswith(delivered):
            raise BackendError(f"turn {request_id}: the retried stream diverged from the text already "
                               "delivered (use temperature 0 or a seed)")
        return text[len(delivered):]

    def mark_idle(self, agent_id: str) -> None:
        """The agent waits for a tool. The server's proposer sizes drafts over the requests in flight,
        which excludes idle agents by construction; here it only counts idle time."""
        with self._lock:
            self._idle_since.setdefault(agent_id, time.monotonic())

    def mark_active(self, agent_id: str) -> None:
        with self._lock:
            since = self._idle_since.pop(agent_id, None)
            if since is not None:
                self._idle_s[agent_id] = self._idle_s.get(agent_id, 0.0) + time.monotonic() - since

    def stats(self) -> dict:
        """The embedded engine's keys where they apply: request totals, per-class `acceptance`,
        `vllm` (the servers' spec-decode counters since this client started, summed over
        `metrics_urls`), `proposer` (with a readable records file); plus attempts, retries, idle time."""
        with self._lock:
            out = {"server": self.root, **self._totals,
                   "acceptance": {k: dict(v) for k, v in self._acceptance.items()},
                   "idle_s": dict(self._idle_s), "idle_agents": sorted(self._idle_since)}
        from agentspec_sdk.backends.prom_metrics import subtract, summarize

        now, ours = self._scrape(quiet=True)
        if now:
            base = self._counters_at_start or {}
            if any(now[k] < base.get(k, 0.0) for k in now):  # counters reset: a server restarted
                base, out["vllm_restarted"] = {}, True
            out["vllm"] = {k: int(now[k] - base.get(k, 0.0)) for k in now}
        if ours:  # the proposer's own counters since this client started (agentspec:* on /metrics)
            base = self._agentspec_at_start or {}
            if any(v < base.get(k, 0.0) for k, v in ours.items()):
                base, out["proposer_restarted"] = {}, True
            out["proposer"] = summarize(subtract(ours, base))
        if self._records is not None:
            with self._lock:
                self._records.poll()
                out["proposer" if not ours else "proposer_records"] = self._records.proposer_stats()
        return out

    def close(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.client.close()
        self.http.close()

    def __enter__(self) -> RemoteEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- health --------------------------------------------------------------------------------

    def _get(self, url: str, retry: bool = True) -> httpx.Response:
        if not retry:
            return self.http.get(url)
        try:
            return self._call(lambda _n: _raise_5xx(self.http.get(url)), f"GET {url}")
        except BackendError:
            raise
        except httpx.HTTPError as exc:
            raise BackendError(f"GET {url} failed: {exc}") from exc

    def _get_json(self, path: str, retry: bool = True) -> Any:
        resp = self._get(self.root + path, retry)
        if resp.status_code != 200:
            raise BackendError(f"GET {self.root}{path} answered HTTP {resp.status_code}")
        try:
            return resp.json()
        except ValueError:
            raise MalformedResponse(f"malformed response: {path} is not JSON") from None

    def _spec_counters(self, quiet: bool = False) -> dict[str, float]:
        return self._scrape(quiet)[0]

    def _scrape(self, quiet: bool = False) -> tuple[dict[str, float], dict[tuple, float]]:
        """vLLM's spec-decode counters and the proposer's agentspec:* counters, summed over
        `metrics_urls` (one GET of /metrics each)."""
        from agentspec_sdk.backends.prom_metrics import parse_agentspec

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

    def check(self, *, speculation: bool = True) -> dict:
        """Server reachable, model served, speculation on with per-request metrics, grammars honoured.

        Raises BackendError saying which of these fails. With `records_path`, also that our proposer
        runs inside the server (it logs every step it drafts for)."""
        health = self._get(self.root + "/health")
        if health.status_code != 200:
            raise BackendError(f"{self.root}/health answered HTTP {health.status_code}")
        model = self._model()
        report: dict[str, Any] = {"url": self.root, "model": model}
        if speculation:
            counters = self._spec_counters()
            if not counters:
                raise BackendError(f"{self.root} runs without speculative decoding: /metrics has no "
                                   "vllm:spec_decode_* counters (start it with `agentspec serve`, or pass "
                                   "the --speculative-config it prints)")
            report["spec_counters"] = counters
        steps_before = self._proposer_steps()
        metric_steps_before = self._metric_steps()
        from agentspec_sdk.backends.vllm_engine import TurnRequest

        probe = TurnRequest(messages=[{"role": "user", "content": "Reply with one word."}], fmt="tool_calls",
                            grammar=PROBE_GRAMMAR, max_tokens=16, temperature=0.0,
                            request_id=f"agentspec-check-{uuid.uuid4().hex[:8]}")
        res = self._turn(probe, probe.request_id, count=False)
        if res.error:
            raise BackendError(f"{self.root} rejected a grammar-constrained request: {res.error}")
        if not PROBE_PATTERN.fullmatch(res.text.strip()):
            raise BackendError(f"{self.root} ignores grammars: asked for {PROBE_PATTERN.pattern!r}, got "
                               f"{res.text[:80]!r} (needs vLLM >= 0.12 with structured outputs backend "
                               "'guidance')")
        report["grammar"] = "honoured"
        if speculation:
            if not res.acceptance and self._records is None:
                raise BackendError(f"{self.root} returns no per-request acceptance "
                                   "(metrics.speculative_decoding): start it with "
                                   "--per-request-spec-decode-metrics detailed")
            report["per_request_metrics"] = True
        if metric_steps_before is not None:  # agentspec:* on /metrics: our proposer is in there
            metric_steps_after = self._metric_steps() or 0
            if metric_steps_after <= metric_steps_before:
                raise BackendError(f"the AgentSpec proposer is not running in {self.root}: "
                                   "agentspec:proposer_seconds_count on /metrics did not grow during a request")
            report["proposer"] = {"steps": int(metric_steps_after), "source": "metrics"}
        if self._records is not None:
            steps_after = self._proposer_steps()
            if steps_after <= steps_before:
                raise BackendError(f"the AgentSpec proposer is not running in {self.root}: its records "
                                   f"file {self._records.path} did not grow during a request (is the "
                                   "server's --speculative-config method custom_class, and its "
                                   "AGENTSPEC_PLAN the plan naming this records file?)")
            report.setdefault("proposer", {"steps": steps_after, "source": "records"})
        return report

    def _metric_steps(self) -> float | None:
        """The proposer's step count summed over `metrics_urls`; None where no agentspec:* metrics."""
        ours = self._scrape(quiet=True)[1]
        return ours.get(("steps",), 0.0) if ours else None

    def _proposer_steps(self) -> int:
        if self._records is None:
            return 0
        with self._lock:
            self._records.poll()
            return self._records.steps


def _raise_5xx(resp: httpx.Response) -> httpx.Response:
    if resp.status_code >= 500:
        raise openai.InternalServerError(f"HTTP {resp.status_code}", response=resp, body=None)
    return resp


def _law(span_or_segmenter: Any) -> str:
    law = span_or_segmenter.law_class
    return getattr(law, "value", law)


def _label(request_id: str) -> str:
    return request_id if request_id.startswith("GET ") else f"turn {request_id}"


def _short(exc: BaseException | None) -> str:
    return str(exc).splitlines()[0][:200] if exc else ""
