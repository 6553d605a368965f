"""The embedded engine: `vllm.LLM` with off | ngram | suffix | structure | draft_model (| +cut |
structure+draft_model) speculation.

One background thread owns vLLM's `LLMEngine` (add_request / step); `submit()` from any thread or
agent queues a turn, so turns that arrive at different times share batches. Each turn carries its
per-turn Lark grammar (vLLM's `guidance` backend), which also trims drafts to what the grammar allows.
With `structure`, the in-vLLM proposer (`vllm_proposer.AgentSpecProposer`) reads the plan file named in
AGENTSPEC_PLAN and appends its drafts to the plan's records file; a finished turn claims its drafts
from that file (`vllm_metrics.RecordsTail`) and reports them next to vLLM's own per-request counters.
"""

from __future__ import annotations

import itertools
import os
import queue
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentspec_sdk.backends.chat_template import ChatTemplate
from agentspec_sdk.backends.contract import EngineBase
from agentspec_sdk.backends.embedded.engine_totals import EngineTotals
from agentspec_sdk.backends.embedded.pass_log import PassLog
from agentspec_sdk.backends.embedded.scheduler_probe import SchedulerProbe
from agentspec_sdk.backends.embedded.stock_observer import StockDraftObserver
from agentspec_sdk.backends.embedded.turn_capture import TurnCapture
from agentspec_sdk.backends.embedded.turn_sampling import TurnSampling
from agentspec_sdk.backends.embedded.vllm_start import in_process_drafter, start_llm
from agentspec_sdk.backends.engine_config import MODEL_DRAFTERS, STOCK, EngineConfig
from agentspec_sdk.backends.inside_vllm.vllm_hybrid import require_layer
from agentspec_sdk.backends.model_bundle import context_length, resolve_model
from agentspec_sdk.backends.prompts import prompt_text
from agentspec_sdk.backends.stream_split import StreamSplitter
from agentspec_sdk.backends.types import StreamEvent, TurnRequest, TurnResult, as_registry, merge_tools
from agentspec_sdk.backends.vllm_metrics import (
    RecordsTail,
    acceptance_by_class,
    label_records,
    settle_against_vllm,
    vllm_spec_counters,
)
from agentspec_sdk.drafting.plan import DraftPlan
from agentspec_sdk.errors import BackendError, PromptTooLong
from agentspec_sdk.structure.formats import AgentFormat, format_names
from agentspec_sdk.structure.segmenter import segment
from agentspec_sdk.structure.token_labels import TokenClassifier
from agentspec_sdk.structure.tools import ToolRegistry

# the modes whose drafts settle per class from the records file (ours, vLLM's stock and model drafters)
RECORDED = ("structure", *STOCK, *MODEL_DRAFTERS)


@dataclass
class _Live:
    req: TurnRequest
    request_id: str
    vllm_id: str  # unique inside vLLM even when callers reuse a request_id
    fmt: AgentFormat
    future: Future
    prompt_ids: list[int]
    sampling: Any
    events: queue.Queue | None = None
    splitter: StreamSplitter | None = None
    text: str = ""
    t_submit: float = 0.0
    t_added: float = 0.0
    t_first: float = 0.0
    seen: int = 0  # output tokens seen so far (the pass log counts each pass's new ones)
    passes: int = 0  # engine steps that gave this turn tokens (TurnResult.passes)
    emitted: int = 0  # output tokens when `passes` last counted


class Engine(EngineBase):
    """Embedded vLLM with structure-aware speculation. See docs/engine.md."""

    def __init__(self, model: str | os.PathLike | None = None, *, config: EngineConfig | None = None,
                 **settings: Any):
        """`Engine(model=..., speculation=..., gamma_max=..., ...)`: any `EngineConfig` field as a
        keyword; or `Engine(config=EngineConfig(...))` (keywords next to it override its fields)."""
        if model is not None:
            settings["model"] = model
        cfg = self.config = EngineConfig.of(config, **settings)
        speculation, gamma_max = cfg.speculation, cfg.gamma_max
        self.speculation, self.gamma_max = speculation, gamma_max
        self.model = resolve_model(cfg.model)
        # None: the model's own context length (config.json; SmolLM2-135M: 8192)
        self.max_model_len = cfg.max_model_len or context_length(self.model)
        from transformers import AutoTokenizer
        self.tokenizer = AutoTokenizer.from_pretrained(self.model)
        self.template = ChatTemplate.of(self.tokenizer)  # renders tools? the format "auto" stands for
        self.formats = {f.name: f for f in map(self.template.resolve, cfg.formats or format_names())}
        self.registry = as_registry(cfg.tools) if cfg.tools is not None else ToolRegistry()
        self._lock = threading.Lock()
        self._work = (Path(cfg.work_dir) if cfg.work_dir
                      else Path(tempfile.mkdtemp(prefix="agentspec-engine-")))
        self._work.mkdir(parents=True, exist_ok=True)
        self.plan_path = self._work / "plan.json"
        self.records_path = self._work / "records.jsonl"
        self.plan = DraftPlan(formats=list(self.formats.values()), tools=self.registry.openai_tools(),
                              tokenizer=self.model, gamma_max=gamma_max, step_budget=cfg.step_budget,
                              records_path=str(self.records_path), **(cfg.law or {}))
        self.plan.save(self.plan_path)
        # the bench's ablation switches reach the proposer in a file of their own, never in the plan
        lab_path = cfg.lab.save(self._work / "lab.json") if cfg.lab is not None else None
        self.records_path.touch()
        self._tail = RecordsTail(self.records_path)
        self._labels = TokenClassifier(self.tokenizer)
        self._sampling = TurnSampling()
        self.capture_to(cfg.capture)
        self._llm = start_llm(cfg, self.model, self.max_model_len, gamma_max, self.plan_path, lab_path)
        self._engine = self._llm.llm_engine
        require_layer(self)  # model drafter modes: our layer must be on vLLM's runner
        # vLLM's own drafters are watched (not changed) so their drafts settle per class like ours.
        drafter = self.proposer() if speculation in STOCK else None
        self._observer = StockDraftObserver(drafter, speculation, self.records_path,
                                            self.plan.records_max_bytes) if drafter else None
        # what each pass computed (prefill chunks, verified drafts), from vLLM's scheduler
        self._probe = SchedulerProbe.attach(self._engine)
        self._inbox: queue.Queue[_Live] = queue.Queue()
        self._live: dict[str, _Live] = {}
        self._ids = itertools.count()
        self._wake = threading.Event()
        self._closing, self._dead = False, None  # _dead: why vLLM stopped
        self._idle_agents: dict[str, float] = {}
        self._totals = EngineTotals()
        self._step_s, self._steps = 0.0, 0
        self._passes = PassLog(no_spec=speculation == "off")
        self._thread = threading.Thread(target=self._run, name="agentspec-engine", daemon=True)
        self._thread.start()

    # -- tools and formats ------------------------------------------------------------------------

    def register_tools(self, tools: ToolRegistry | list) -> None:
        """Add tools (new names only; a known name with another schema is an error) and update the plan."""
        with self._lock:
            if merge_tools(self.registry, tools):
                self.plan.tools = self.registry.openai_tools()
                self.plan.save(self.plan_path)

    def resolve_format(self, fmt: str | AgentFormat) -> AgentFormat:
        """`fmt` as a format; "auto": the one the model's chat template writes (`structure.detect`)."""
        return self.template.resolve(fmt)

    def capture_to(self, directory: str | os.PathLike | None) -> None:
        """Capture every turn that finishes from now on into `directory` (docs/capture.md); None: stop."""
        self._capture = TurnCapture.open(directory, self.model, self.registry, self.config.capture_sample)

    def _use_format(self, fmt: str | AgentFormat) -> AgentFormat:
        fmt = self.resolve_format(fmt)
        with self._lock:
            if self.formats.get(fmt.name) != fmt:
                self.formats[fmt.name] = fmt
                self.plan.formats = [f.to_dict() for f in self.formats.values()]
                self.plan.save(self.plan_path)
        return fmt

    # -- requests ---------------------------------------------------------------------------------

    def submit(self, req: TurnRequest) -> Future:
        """Queue one turn; the future resolves to its TurnResult (an `error` result for a bad turn)."""
        return self._submit(req, events=None)

    def stream(self, req: TurnRequest) -> Iterator[StreamEvent]:
        """Text deltas labelled with their segment kind and law class; the last event carries the result."""
        events: queue.Queue = queue.Queue()
        future = self._submit(req, events=events)
        yield from iter(events.get, None)  # None: the turn ended
        result = future.result()
        yield StreamEvent("", "", "", result=result)

    def _submit(self, req: TurnRequest, events: queue.Queue | None) -> Future:
        if self._dead:
            raise BackendError(f"engine stopped: {self._dead}")
        if self._closing:
            raise BackendError("engine is closed")
        future: Future = Future()
        request_id = req.request_id or f"turn-{next(self._ids)}-{uuid.uuid4().hex[:6]}"
        t_submit = time.perf_counter()
        try:
            fmt = self._use_format(req.fmt)
            registry = self._request_tools(req)
            prompt_ids = prompt_token_ids(self.tokenizer, req, fmt, registry, self.max_model_len,
                                          self.template)
            sampling = self._sampling.params(req, fmt, registry)
        except Exception as exc:  # a bad turn fails alone, with the reason
            self._totals.error()
            if events is not None:
                events.put(None)
            future.set_result(TurnResult(request_id, error=f"{type(exc).__name__}: {exc}",
                                         agent_id=req.agent_id))
            return future
        live = _Live(req, request_id, f"{request_id}#{next(self._ids)}", fmt, future, prompt_ids, sampling,
                     events, StreamSplitter(fmt) if events is not None else None, t_submit=t_submit)
        self._inbox.put(live)
        self._wake.set()
        return future

    def _request_tools(self, req: TurnRequest) -> ToolRegistry:
        if req.tools is None:
            return self.registry
        registry = as_registry(req.tools)
        unknown = [t for t in registry if t.name not in self.registry]
        if unknown:
            self.register_tools(unknown)
        return registry

    def grammar_for(self, fmt: str | AgentFormat, tools: ToolRegistry | list | None = None,
                    tool_choice: str = "auto") -> str:
        from agentspec_sdk.structure.turn_grammar import turn_grammar

        registry = self.registry if tools is None else as_registry(tools)
        return turn_grammar(self.resolve_format(fmt), registry, tool_choice=tool_choice)

    # -- agents -----------------------------------------------------------------------------------

    def mark_idle(self, agent_id: str) -> None:
        """The agent waits on a tool: it has no row in the batch, so its budget goes to active rows."""
        self._idle_agents[agent_id] = time.perf_counter()

    def mark_active(self, agent_id: str) -> None:
        self._idle_agents.pop(agent_id, None)

    # -- the stepping thread ----------------------------------------------------------------------

    def _run(self) -> None:
        from vllm.inputs import TokensPrompt

        try:
            while not self._closing:
                self._admit(TokensPrompt)
                if not self._engine.has_unfinished_requests():
                    self._wake.wait(0.05)
                    self._wake.clear()
                    continue
                at, started = time.time(), time.perf_counter()
                outputs = self._engine.step()
                seconds = time.perf_counter() - started
                scheduled = self._probe.take() if self._probe is not None else None
                self._step_s += seconds
                self._steps += 1
                self._passes.record(at, seconds, outputs, self._live, scheduled)
                for out in outputs:
                    self._on_output(out)
        except Exception as exc:  # vLLM itself failed: every waiting turn learns why
            self._dead = f"{type(exc).__name__}: {exc}"
            for live in list(self._live.values()):
                self._fail(live, f"engine failed: {self._dead}")
            self._live.clear()

    def _admit(self, tokens_prompt) -> None:
        while True:
            try:
                live = self._inbox.get_nowait()
            except queue.Empty:
                return
            live.t_added = time.perf_counter()
            try:
                self._engine.add_request(live.vllm_id, tokens_prompt(prompt_token_ids=live.prompt_ids),
                                         live.sampling)
            except Exception as exc:  # vLLM rejected this request only
                self._fail(live, f"{type(exc).__name__}: {exc}")
                continue
            self._live[live.vllm_id] = live

    def _on_output(self, out) -> None:
        live = self._live.get(out.request_id)
        if live is None:
            return
        comp = out.outputs[0]
        now = time.perf_counter()
        if len(comp.token_ids) > live.emitted:  # one target pass (the prefill's included) gave tokens
            live.passes += 1
            live.emitted = len(comp.token_ids)
        if not live.t_first and len(comp.token_ids):
            live.t_first = now
        if live.events is not None and (len(comp.text) > len(live.text) or out.finished):
            for event in live.splitter.feed(comp.text[len(live.text):], final=out.finished):
                live.events.put(event)
        live.text = comp.text
        if not out.finished:
            return
        del self._live[out.request_id]
        try:
            self._finish(live, out, comp, now)
        except Exception as exc:  # accounting failed for this turn: it still gets an answer
            self._fail(live, f"could not finish turn: {type(exc).__name__}: {exc}")

    def _finish(self, live: _Live, out, comp, now: float) -> None:
        prompt_ids = list(out.prompt_token_ids or live.prompt_ids)
        token_ids = list(comp.token_ids)
        self._tail.poll()
        records = self._tail.claim(prompt_ids, token_ids) if self.speculation in RECORDED else []
        spec = comp.spec_decode_metrics.to_dict() if comp.spec_decode_metrics is not None else None
        settle_against_vllm(records, len(token_ids), spec)
        spans = segment(live.fmt, comp.text)
        # the peer's drafts take the class of the token they began at
        if records and self.speculation in STOCK:
            label_records(records, self._labels.labels(comp.text, token_ids, spans),
                          self._labels.starts(comp.text, token_ids), spans)
        acceptance = acceptance_by_class(records)
        t_first = live.t_first or now
        result = TurnResult(
            request_id=live.request_id, text=comp.text, token_ids=token_ids, prompt_token_ids=prompt_ids,
            finish_reason=comp.finish_reason, spans=spans, records=records,
            acceptance=acceptance, spec=spec, agent_id=live.req.agent_id, logprobs=_logprobs(comp.logprobs),
            passes=live.passes,
            timings={"e2e_s": now - live.t_submit, "queue_s": live.t_added - live.t_submit,
                     "prefill_s": t_first - live.t_added, "decode_s": now - t_first})
        self._totals.finished(len(token_ids), records, spec, acceptance)
        if self._capture is not None:
            self._capture.record(live.req, live.fmt, live.sampling, result)
        if live.events is not None:
            live.events.put(None)
        live.future.set_result(result)

    def _fail(self, live: _Live, error: str) -> None:
        self._totals.error()
        if live.events is not None:
            live.events.put(None)
        if not live.future.done():
            live.future.set_result(TurnResult(live.request_id, error=error, agent_id=live.req.agent_id))

    # -- reading ----------------------------------------------------------------------------------

    def stats(self) -> dict:
        """Totals over finished turns: per-class acceptance settled from the proposer's drafts
        (`claimed_accepted`), vLLM's per-request spec-decode counts summed (`vllm`; they agree), the
        proposer's step log and step time. `vllm_process` is vLLM's Prometheus view, which is shared
        by every engine in the process."""
        self._tail.poll()
        totals, vllm, acceptance = self._totals.snapshot()
        proposer = self._tail.proposer_stats()
        return {
            "speculation": self.speculation, "gamma_max": self.gamma_max, **totals,
            "acceptance": acceptance, "proposer": proposer, "vllm": vllm,
            "vllm_process": vllm_spec_counters(self._engine),
            "steps": self._steps, "step_s": self._step_s,
            "proposer_share": proposer["proposer_s"] / self._step_s if self._step_s else 0.0,
            "idle_agents": sorted(self._idle_agents),
        }

    def step_log(self, start: float = 0.0, end: float = float("inf")) -> list[dict]:
        """The structure proposer's steps that began between `start` and `end` (time.time()):
        `{"t", "rows", "drafted"}`; the gap to the next step is the pass that verified the drafts."""
        self._tail.poll()
        return self._tail.steps_between(start, end)

    def pass_log(self, start: float = 0.0, end: float = float("inf")) -> list[dict]:
        """Every engine step (one target pass, any speculation mode) that began between `start` and
        `end` (time.time()), with what it computed: see `pass_log.PassLog.entries`."""
        return self._passes.entries(start, end)

    def proposer(self):
        """The in-process drafter (model drafters: our layer, backends.inside_vllm.vllm_hybrid); None out of
        process."""
        return in_process_drafter(self._engine, self.speculation)

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._wake.set()
        self._thread.join(timeout=30)
        for live in list(self._live.values()):
            self._fail(live, "engine closed")
        if getattr(self, "_probe", None) is not None:
            self._probe.close()
        try:
            self._engine.engine_core.shutdown()
        except Exception:  # shutting down twice or a half-started engine: nothing left to free
            pass
        self._llm = self._engine = None


def prompt_token_ids(tokenizer, req: TurnRequest, fmt: AgentFormat, registry: ToolRegistry,
                     max_model_len: int, template: ChatTemplate | None = None) -> list[int]:
    """The turn's prompt through the model's chat template (`prompts.prompt_text`: tools rendered by the
    template where it renders them for `fmt`, else our instructions); PromptTooLong when it and
    `max_tokens` do not fit the context."""
    text = prompt_text(tokenizer, req.messages, fmt, registry, template)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) + req.max_tokens > max_model_len:
        raise PromptTooLong(len(ids), req.max_tokens, max_model_len)
    return ids


def _logprobs(positions) -> list[dict[int, float]] | None:
    if positions is None:
        return None
    return [{int(tid): float(lp.logprob) for tid, lp in pos.items()} for pos in positions]
