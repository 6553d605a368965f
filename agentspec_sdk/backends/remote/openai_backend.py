"""`RemoteEngine`: the engine contract (`backends.contract.AgentEngine`) over a vLLM OpenAI-compatible
server (one replica or a router).

Each turn is one chat completion carrying its grammar in `structured_outputs.grammar` (Lark for vLLM's
`guidance` backend), with the same prompt (`backends.prompts`), tools (`backends.types.merge_tools`)
and stream splitting (`backends.stream_split`) as the embedded engine. Transport, retries and
idempotency are in `remote_transport`; /metrics, health checks and the plan file in `remote_inspect`.

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
Episode key: a turn's `agent_id` is sent as the request's `user` field and as the `x-session-id`
header (`SESSION_HEADER`), which vllm-router's `consistent_hash` policy routes by: an agent's turns
stay on one replica, with its prefix cache and the proposer's state of its earlier turns.

See docs/deployment.md.
"""

from __future__ import annotations

import queue
import re
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai

from agentspec_sdk.backends.capture import FORMAT_HEADER
from agentspec_sdk.backends.contract import EngineBase
from agentspec_sdk.backends.inside_vllm.prom_metrics import subtract, summarize
from agentspec_sdk.backends.plan_file import PlanFile
from agentspec_sdk.backends.remote.remote_inspect import ServerInspector
from agentspec_sdk.backends.remote.remote_template import ServedTemplate, fetch_served
from agentspec_sdk.backends.remote.remote_transport import (
    Ledger,
    StreamReplay,
    Transport,
    field,
    int_list,
    seed_for,
)
from agentspec_sdk.backends.stream_split import StreamSplitter
from agentspec_sdk.backends.types import StreamEvent, TurnRequest, TurnResult, as_registry, merge_tools
from agentspec_sdk.backends.vllm_metrics import (
    RecordsTail,
    acceptance_by_class,
    merge_acceptance,
    settle_against_vllm,
)
from agentspec_sdk.errors import BackendError, MalformedResponse
from agentspec_sdk.structure.formats import AgentFormat, get_format
from agentspec_sdk.structure.segmenter import segment
from agentspec_sdk.structure.tools import ToolRegistry

SESSION_HEADER = "x-session-id"  # what vllm-router's consistent_hash policy keys on


class RemoteEngine(EngineBase):
    """The engine contract against `base_url` (`http://host:port`, with or without `/v1`)."""

    def __init__(self, base_url: str, model: str | None = None, api_key: str = "EMPTY", *,
                 timeout: float = 120.0, max_retries: int = 6, retry_deadline_s: float = 300.0,
                 backoff_s: float = 0.5, max_backoff_s: float = 10.0, records_path: str | Path | None = None,
                 metrics_urls: list[str] | None = None, tools: Any = None,
                 plan_path: str | Path | None = None,
                 max_workers: int = 64, ledger_size: int = 100_000):
        if not re.match(r"^https?://[^/\s]+", base_url or ""):
            raise BackendError(f"server URL must look like http://host:port, got {base_url!r}")
        self.root = re.sub(r"/v1/?$", "", base_url.rstrip("/"))
        self.model = model
        self.transport = Transport(self.root, api_key, timeout=timeout, max_retries=max_retries,
                                   retry_deadline_s=retry_deadline_s, backoff_s=backoff_s,
                                   max_backoff_s=max_backoff_s)
        self.client, self.http = self.transport.client, self.transport.http
        self.metrics_urls = [u.rstrip("/") for u in (metrics_urls or [self.root])]
        self.plan_path = Path(plan_path) if plan_path else None
        self._plan = PlanFile(self.plan_path) if self.plan_path else None
        self._records = RecordsTail(records_path) if records_path else None
        self.inspector = ServerInspector(self.root, self.http, self.metrics_urls, self._records)
        self._lock = threading.RLock()
        self._registry = ToolRegistry()
        self._served: ServedTemplate | None = None
        self._served_lock = threading.Lock()
        if tools is not None:
            self.register_tools(tools)
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="agentspec-remote")
        self._ledger = Ledger(ledger_size)
        self._idle_since: dict[str, float] = {}
        self._idle_s: dict[str, float] = {}
        self._totals = {"requests": 0, "errors": 0, "output_tokens": 0, "vllm_request_drafted": 0,
                        "vllm_request_accepted": 0}
        self._acceptance: dict[str, dict[str, int]] = {}
        self._counters_at_start, self._agentspec_at_start = self.inspector.scrape(quiet=True)
        self._closed = False

    # -- tools and grammars --------------------------------------------------------------------

    def register_tools(self, tools: Any) -> None:
        """Tools for the grammars and prompts this client builds (new names only; a known name with
        another schema is an error, as in the embedded engine). With `plan_path` (a server on this
        machine) the plan is updated too, so the proposer drafts for them; a remote server's tools are
        the ones given to `agentspec serve --tools`."""
        with self._lock:
            merge_tools(self._registry, tools)
            if self._plan is not None:
                self._plan.update(tools=self._registry.openai_tools())

    def _tools_of(self, req: TurnRequest) -> ToolRegistry:
        if req.tools is None:
            return self._registry
        registry = as_registry(req.tools)
        if any(t.name not in self._registry for t in registry):
            self.register_tools([t for t in registry if t.name not in self._registry])
        return registry

    def grammar_for(self, fmt: str | AgentFormat, tools: Any = None, tool_choice: str = "auto") -> str:
        from agentspec_sdk.structure.turn_grammar import turn_grammar

        registry = self._registry if tools is None else as_registry(tools)
        return turn_grammar(self.resolve_format(fmt), registry, tool_choice=tool_choice)

    def resolve_format(self, fmt: str | AgentFormat) -> AgentFormat:
        """`fmt` as a format; "auto": the one the model's chat template writes (asks the server)."""
        return self.served_template().resolve(fmt) if fmt == "auto" else get_format(fmt)

    def _prepare(self, req: TurnRequest) -> dict:
        """Chat arguments of a turn: the same messages, grammar and stop strings as the embedded engine."""
        served = self.served_template()
        fmt = served.resolve(req.fmt)  # = self.resolve_format
        if self._plan is not None:
            with self._lock:
                self._plan.update(fmt=fmt)
        tools = self._tools_of(req)
        grammar = self.grammar_for(fmt, tools, req.tool_choice) if req.grammar is None else req.grammar
        return {"fmt": fmt, "chat": served.chat_arguments(req.messages, fmt, tools),
                "grammar": grammar or None, "stop": list(fmt.stop) or None}

    def served_template(self, request_id: str = "GET /tokenizer_info") -> ServedTemplate:
        """The server's chat template decision (`remote_template.fetch`), read once."""
        with self._served_lock:  # not self._lock: stats() must not wait on this look-up's retries
            if self._served is None:
                self._served = fetch_served(self.transport, request_id)
            return self._served

    # -- requests ------------------------------------------------------------------------------

    def _model(self) -> str:
        """The served model (the first in /v1/models when not given); no retries of its own, it runs
        inside a turn's retried attempt."""
        if self.model is None:
            models = self.transport.get_json("/v1/models", retry=False)
            data = field(models, "data", list)
            self.model = field(data, "0.id", str) if data else None
            if not self.model:
                raise BackendError(f"server {self.root} serves no model (/v1/models is empty)")
        return self.model

    def _kwargs(self, req: TurnRequest, turn: dict, request_id: str, attempt: int) -> dict:
        body: dict[str, Any] = {"request_id": f"{request_id}.{attempt}", "return_token_ids": True}
        if turn["grammar"]:
            body["structured_outputs"] = {"grammar": turn["grammar"]}
        if req.temperature and req.temperature > 0:
            body["seed"] = seed_for(request_id)  # the same sample on every attempt
        kwargs = {"model": self._model(), **turn["chat"], "max_tokens": req.max_tokens,
                  "temperature": req.temperature, "stop": turn["stop"], "extra_body": body}
        kwargs["extra_headers"] = {FORMAT_HEADER: turn["fmt"].name}  # for a capturing server
        if req.agent_id:  # the episode key: a router keeps an agent's turns on one replica
            kwargs["user"] = req.agent_id
            kwargs["extra_headers"][SESSION_HEADER] = req.agent_id
        return kwargs

    def _turn(self, req: TurnRequest, request_id: str, count: bool = True) -> TurnResult:
        started = time.perf_counter()
        self.served_template(request_id)  # an unreachable server fails here, after its retries
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
            data = self.transport.call(attempt, request_id)
        except openai.BadRequestError as exc:  # this request only (e.g. the grammar does not compile)
            return self._error_result(req, request_id, f"server rejected the request: {_short(exc)}", started)
        if not isinstance(data, dict):
            raise MalformedResponse("malformed response: body should be a JSON object, got "
                                    f"{type(data).__name__}")
        field(data, "choices.0", dict)
        text = field(data, "choices.0.message.content", str, optional=True) or ""
        token_ids = int_list(data, "choices.0.token_ids")
        prompt_ids = int_list(data, "prompt_token_ids")
        finish = field(data, "choices.0.finish_reason", str, optional=True)
        metrics = field(data, "metrics", dict, optional=True)
        return self._result(req, turn["fmt"], request_id, text, token_ids, prompt_ids, finish, metrics,
                            time.perf_counter() - started, count)

    def _result(self, req, fmt, request_id, text, token_ids, prompt_ids, finish, metrics, e2e_s,
                count: bool = True) -> TurnResult:
        spec = field({"metrics": metrics or {}}, "metrics.speculative_decoding", dict, optional=True)
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

    def _error_result(self, req: TurnRequest, request_id: str, error: str, started: float) -> TurnResult:
        with self._lock:
            self._totals["errors"] += 1
        return TurnResult(request_id=request_id, error=error, agent_id=req.agent_id,
                          timings={"e2e_s": time.perf_counter() - started})

    def _acceptance_of(self, prompt_ids, token_ids, spec: dict | None) -> tuple[list[dict], dict]:
        """Per-class records from the proposer's records file when readable, else the server's
        per-request counters (class "all")."""
        if self._records is not None:
            records = self.inspector.claim(prompt_ids, token_ids)
            settle_against_vllm(records, len(token_ids), spec)  # as the embedded engine: what vLLM verified
            return records, acceptance_by_class(records)
        if spec is None:
            return [], {}
        wrapped = {"metrics": {"speculative_decoding": spec}}
        base = "metrics.speculative_decoding."
        drafted = field(wrapped, base + "num_draft_tokens", int)
        accepted = field(wrapped, base + "num_accepted_draft_tokens", int)
        steps = field(wrapped, base + "num_spec_steps", int)
        per_acc = int_list(wrapped, base + "per_step_accepted", optional=True) or []
        per_draft = int_list(wrapped, base + "per_step_drafted", optional=True) or []
        records = [{"law_class": "all", "kind": None, "source": "server", "drafted": int(d),
                    "accepted": int(a), "position": None} for a, d in zip(per_acc, per_draft, strict=False)]
        return records, {"all": {"rounds": steps, "drafted": drafted, "accepted": accepted}}

    # -- the engine contract -------------------------------------------------------------------

    def submit(self, req: TurnRequest) -> Future:
        if self._closed:
            raise BackendError("RemoteEngine is closed")
        request_id = req.request_id or uuid.uuid4().hex
        return self._ledger.claim(request_id, lambda: self._pool.submit(self._turn, req, request_id))

    def stream(self, req: TurnRequest) -> Iterator[StreamEvent]:
        """StreamEvents (text delta, segment kind, law class) as they arrive; the last carries the result.

        A stream cut by a failure is retried like any turn; the new attempt's text is checked against
        what was already delivered and only the rest is delivered."""
        request_id = req.request_id or uuid.uuid4().hex
        done = self._ledger.committed(request_id)
        if done is not None:  # committed: replay, not regenerate
            yield StreamEvent(done.text, "", "")
            yield StreamEvent("", "", "", result=done)
            return
        started = time.perf_counter()
        self.served_template(request_id)  # an unreachable server fails here, after its retries
        try:
            turn = self._prepare(req)
        except Exception as exc:  # a bad turn fails alone, as in submit()
            yield StreamEvent("", "", "",
                              result=self._error_result(req, request_id, f"{type(exc).__name__}: {exc}",
                                                                    started))
            return
        splitter = StreamSplitter(turn["fmt"])
        replay = StreamReplay(request_id)
        final: dict = {}
        events: queue.Queue = queue.Queue()

        def emit(fresh: str) -> None:
            for event in splitter.feed(fresh):
                events.put(event)

        def attempt(n: int) -> None:
            stream = self.client.chat.completions.create(
                **self._kwargs(req, turn, request_id, n), stream=True, stream_options={"include_usage": True})
            final.update(replay.read(stream, emit))

        worker = self._pool.submit(self.transport.call, attempt, request_id)
        worker.add_done_callback(lambda _f: events.put(None))
        while (event := events.get()) is not None:
            yield event
        worker.result()
        yield from splitter.feed("", final=True)  # text held back as a possible marker
        result = self._result(req, turn["fmt"], request_id, final["text"], final["ids"], final["prompt_ids"],
                              final["finish"], final["metrics"], time.perf_counter() - started)
        self._ledger.commit(request_id, result)
        yield StreamEvent("", "", "", result=result)

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
            out = {"server": self.root, **self._totals, **self.transport.counts,
                   "acceptance": {k: dict(v) for k, v in self._acceptance.items()},
                   "idle_s": dict(self._idle_s), "idle_agents": sorted(self._idle_since)}
        now, ours = self.inspector.scrape(quiet=True)
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
            out["proposer" if not ours else "proposer_records"] = self.inspector.records_stats()
        return out

    def check(self, *, speculation: bool = True) -> dict:
        """Server reachable, model served, speculation on with per-request metrics, grammars honoured.

        Raises BackendError saying which of these fails. With `records_path`, also that our proposer
        runs inside the server (it logs every step it drafts for)."""
        return self.inspector.check(get=self.transport.get, model=self._model,
                                    probe=lambda req: self._turn(req, req.request_id, count=False),
                                    speculation=speculation)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.transport.close()


def _short(exc: BaseException | None) -> str:
    return str(exc).splitlines()[0][:200] if exc else ""
