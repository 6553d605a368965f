"""The embedded engine: `vllm.LLM` with off | ngram | suffix | structure | draft_model speculation.

One background thread owns vLLM's `LLMEngine` (add_request / step); `submit()` from any thread or
agent queues a turn, so turns that arrive at different times share batches. Each turn carries its
per-turn Lark grammar (vLLM's `guidance` backend), which also trims drafts to what the grammar allows.
With `structure`, the in-vLLM proposer (`vllm_proposer.AgentSpecProposer`) reads the plan file named in
AGENTSPEC_PLAN and appends its drafts to the plan's records file; a finished turn claims its drafts
from that file (`vllm_metrics.RecordsTail`) and reports them next to vLLM's own per-request counters.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentspec_sdk.backends.contract import EngineBase
from agentspec_sdk.backends.engine_config import (
    CPU_BLOCK_SIZE,
    PROPOSER_CLASS,
    STOCK,
    EngineConfig,
    stock_speculative_config,
)
from agentspec_sdk.backends.model_bundle import context_length, resolve_model
from agentspec_sdk.backends.prompts import chat_messages
from agentspec_sdk.backends.scheduler_probe import SchedulerProbe
from agentspec_sdk.backends.stock_observer import StockDraftObserver
from agentspec_sdk.backends.stream_split import StreamSplitter
from agentspec_sdk.backends.types import StreamEvent, TurnRequest, TurnResult, as_registry, merge_tools
from agentspec_sdk.backends.vllm_metrics import (
    RecordsTail,
    acceptance_by_class,
    label_records,
    merge_acceptance,
    settle_against_vllm,
    vllm_spec_counters,
)
from agentspec_sdk.drafting.plan import PLAN_ENV, DraftPlan
from agentspec_sdk.errors import BackendError, PromptTooLong
from agentspec_sdk.structure.formats import AgentFormat, format_names, get_format
from agentspec_sdk.structure.segmenter import segment
from agentspec_sdk.structure.token_labels import TokenClassifier
from agentspec_sdk.structure.tools import ToolRegistry

MAX_PASS_LOG = 1_000_000


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


class Engine(EngineBase):
    """Embedded vLLM with structure-aware speculation. See docs/engine.md."""

    def __init__(self, model: str | os.PathLike | None = None, *, config: EngineConfig | None = None,
                 **settings: Any):
        """`Engine(model=..., speculation=..., gamma_max=..., ...)`: any `EngineConfig` field as a
        keyword; or `Engine(config=EngineConfig(...))` (keywords next to it override its fields)."""
        if model is not None:
            settings["model"] = model
        cfg = self.config = EngineConfig.of(config, **settings)
        speculation, gamma_max, ablation = cfg.speculation, cfg.gamma_max, cfg.ablation
        self.speculation = speculation
        self.gamma_max = gamma_max
        self.model = resolve_model(cfg.model)
        # None: the model's own context length (config.json; SmolLM2-135M: 8192)
        self.max_model_len = cfg.max_model_len or context_length(self.model)
        self.formats = {f.name: f for f in (get_format(x) for x in (cfg.formats or format_names()))}
        self.registry = as_registry(cfg.tools) if cfg.tools is not None else ToolRegistry()
        self._lock = threading.Lock()
        self._work = (Path(cfg.work_dir) if cfg.work_dir
                      else Path(tempfile.mkdtemp(prefix="agentspec-engine-")))
        self._work.mkdir(parents=True, exist_ok=True)
        self.plan_path = self._work / "plan.json"
        self.records_path = self._work / "records.jsonl"
        self.plan = DraftPlan(formats=list(self.formats.values()), tools=self.registry.openai_tools(),
                              tokenizer=self.model, gamma_max=gamma_max, step_budget=cfg.step_budget,
                              isolation=ablation != "no_isolation", budget=ablation != "no_budget",
                              records_path=str(self.records_path), **(cfg.law or {}))
        self.plan.save(self.plan_path)
        self.records_path.touch()
        self._tail = RecordsTail(self.records_path)

        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.model)
        self._labels = TokenClassifier(self.tokenizer)
        self._grammar_errors: dict[str, str] = {}
        self._llm = self._start_vllm(cfg)
        self._engine = self._llm.llm_engine
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
        self._closing = False
        self._dead: str | None = None
        self._idle_agents: dict[str, float] = {}
        self._acceptance: dict[str, dict[str, int]] = {}
        self._totals = {"requests": 0, "errors": 0, "output_tokens": 0, "claimed_drafted": 0,
                        "claimed_accepted": 0}
        self._vllm = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
        self._step_s = 0.0
        self._steps = 0
        # (t, s, rows, tokens, ctx, prefill, new, grammar, scheduled composition or None)
        self._passes: deque[tuple] = deque(maxlen=MAX_PASS_LOG)
        self._thread = threading.Thread(target=self._run, name="agentspec-engine", daemon=True)
        self._thread.start()

    # -- start ------------------------------------------------------------------------------------

    def _start_vllm(self, cfg: EngineConfig):
        speculation = cfg.speculation
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{cfg.kv_cache_gb:g}")
        # vLLM 0.32's AOT compile cache fails to reload on CPU; the inductor cache reloads (≈35 s start).
        os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if cfg.in_process else "1"
        if cfg.reserved_cpus is not None:
            os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(cfg.reserved_cpus)
        spec: dict[str, Any] | None = None
        if speculation in STOCK:
            spec = stock_speculative_config(speculation, self.gamma_max, ngram_min=cfg.ngram_min,
                                            ngram_max=cfg.ngram_max)
        elif speculation == "structure":
            spec = {"method": "custom_class", "model": PROPOSER_CLASS,
                    "num_speculative_tokens": self.gamma_max}
        elif speculation == "draft_model":
            spec = {"method": "draft_model", "model": resolve_model(cfg.draft_model),
                    "num_speculative_tokens": self.gamma_max}
        block = cfg.block_size or _default_block_size()
        extra = {"block_size": block} if block else {}
        previous = os.environ.get(PLAN_ENV)
        os.environ[PLAN_ENV] = str(self.plan_path)
        try:
            from vllm import LLM

            return LLM(model=self.model, dtype=cfg.dtype or _default_dtype(),
                       max_model_len=self.max_model_len,
                       enable_prefix_caching=cfg.enable_prefix_caching, seed=cfg.seed,
                       max_num_seqs=cfg.max_num_seqs, **extra,
                       structured_outputs_config={"backend": "guidance"}, speculative_config=spec,
                       per_request_spec_decode_metrics="detailed" if spec else "none",
                       disable_log_stats=False, enforce_eager=cfg.enforce_eager)
        finally:
            if previous is None:
                os.environ.pop(PLAN_ENV, None)
            else:
                os.environ[PLAN_ENV] = previous

    # -- tools and formats ------------------------------------------------------------------------

    def register_tools(self, tools: ToolRegistry | list) -> None:
        """Add tools (new names only; a known name with another schema is an error) and update the plan."""
        with self._lock:
            if merge_tools(self.registry, tools):
                self.plan.tools = self.registry.openai_tools()
                self.plan.save(self.plan_path)

    def _use_format(self, fmt: str | AgentFormat) -> AgentFormat:
        fmt = get_format(fmt)
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
        while True:
            ev = events.get()
            if ev is None:
                break
            yield ev
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
            prompt_ids = self._prompt_ids(req, fmt, registry)
            sampling = self._sampling(req, fmt, registry)
        except Exception as exc:  # a bad turn fails alone, with the reason
            with self._lock:
                self._totals["errors"] += 1
            if events is not None:
                events.put(None)
            future.set_result(TurnResult(request_id, error=f"{type(exc).__name__}: {exc}",
                                         agent_id=req.agent_id))
            return future
        live = _Live(req, request_id, f"{request_id}#{next(self._ids)}", fmt, future, prompt_ids, sampling,
                     events,
                     StreamSplitter(fmt) if events is not None else None, t_submit=t_submit)
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

    def _prompt_ids(self, req: TurnRequest, fmt: AgentFormat, registry: ToolRegistry) -> list[int]:
        messages = chat_messages(req.messages, fmt, registry)
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) + req.max_tokens > self.max_model_len:
            raise PromptTooLong(len(ids), req.max_tokens, self.max_model_len)
        return ids

    def grammar_for(self, fmt: str | AgentFormat, tools: ToolRegistry | list | None = None,
                    tool_choice: str = "auto") -> str:
        from agentspec_sdk.structure.turn_grammar import turn_grammar

        registry = self.registry if tools is None else as_registry(tools)
        return turn_grammar(get_format(fmt), registry, tool_choice=tool_choice)

    def _sampling(self, req: TurnRequest, fmt: AgentFormat, registry: ToolRegistry):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        grammar = req.grammar
        if grammar is None:
            grammar = self.grammar_for(fmt, registry, req.tool_choice)
        structured = None
        if grammar:
            error = self._check_grammar(grammar)
            if error:
                raise BackendError(f"grammar failed to compile: {error}")
            structured = StructuredOutputsParams(grammar=grammar)
        return SamplingParams(temperature=req.temperature, max_tokens=req.max_tokens,
                              stop=list(fmt.stop) or None, structured_outputs=structured,
                              logprobs=req.logprobs, output_kind=RequestOutputKind.CUMULATIVE)

    def _check_grammar(self, grammar: str) -> str:
        if grammar not in self._grammar_errors:
            import llguidance

            try:
                error = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(grammar))
            except Exception as exc:  # llguidance raises on some malformed inputs instead of reporting
                error = str(exc)
            if len(self._grammar_errors) > 512:
                self._grammar_errors.clear()
            self._grammar_errors[grammar] = error.strip()
        return self._grammar_errors[grammar]

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
                rows = tokens = ctx = prefill = new = grammar = 0
                for out in outputs:
                    live = self._live.get(out.request_id)
                    if live is not None:  # what this pass computed: new tokens, context, first-token prefill
                        n = len(out.outputs[0].token_ids)
                        rows, tokens, ctx = rows + 1, tokens + n - live.seen, ctx + len(live.prompt_ids) + n
                        grammar += getattr(live.sampling, "structured_outputs", None) is not None
                        if not live.seen and n:
                            prefill += len(live.prompt_ids) - int(getattr(out, "num_cached_tokens", 0) or 0)
                            new += 1
                        live.seen = n
                    self._on_output(out)
                self._passes.append((at, seconds, rows, tokens, ctx, prefill, new, grammar, scheduled))
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
        records = self._tail.claim(prompt_ids, token_ids) if self.speculation in ("structure", *STOCK) else []
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
            timings={"e2e_s": now - live.t_submit, "queue_s": live.t_added - live.t_submit,
                     "prefill_s": t_first - live.t_added, "decode_s": now - t_first})
        with self._lock:
            self._totals["requests"] += 1
            self._totals["output_tokens"] += len(token_ids)
            self._totals["claimed_drafted"] += sum(r["drafted"] for r in records)
            self._totals["claimed_accepted"] += sum(r["accepted"] for r in records)
            if spec:
                self._vllm["num_drafts"] += spec["num_spec_steps"]
                self._vllm["num_draft_tokens"] += spec["num_draft_tokens"]
                self._vllm["num_accepted_tokens"] += spec["num_accepted_draft_tokens"]
            merge_acceptance(self._acceptance, acceptance)
        if live.events is not None:
            live.events.put(None)
        live.future.set_result(result)

    def _fail(self, live: _Live, error: str) -> None:
        with self._lock:
            self._totals["errors"] += 1
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
        with self._lock:
            totals = dict(self._totals)
            vllm = dict(self._vllm)
            acceptance = json.loads(json.dumps(self._acceptance))
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
        `end` (time.time()): `{"t", "s" (seconds), "rows" (requests that got tokens), "tokens" (new
        tokens), "ctx" (their context lengths summed), "prefill" (uncached prompt tokens of requests
        whose first token came in this pass), "new" (those requests: their decode starts after it),
        "grammar" (rows decoding under a grammar: a token bitmask per row and pass)}`, and where vLLM's
        scheduler is in this process what the pass computed (`scheduler_probe.FIELDS`: prefill chunk
        tokens and their context, decoding rows, the draft tokens they verify); `no_spec`: 1 for an
        engine without speculative decoding (vLLM's plain sampling path, a pass cost term of its own)."""
        return [{"t": t, "s": s, "rows": r, "tokens": k, "ctx": c, "prefill": p, "new": n, "grammar": g,
                 "no_spec": int(self.speculation == "off"), **(sched or {})}
                for t, s, r, k, c, p, n, g, sched in list(self._passes) if start <= t <= end]

    def proposer(self):
        """The in-process proposer object (None when vLLM runs its engine core in another process)."""
        try:
            core = self._engine.engine_core.engine_core
            return core.model_executor.driver_worker.worker.model_runner.drafter
        except AttributeError:
            return None

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



def _default_dtype() -> str:
    try:
        from vllm.platforms import current_platform

        return "float32" if current_platform.is_cpu() else "auto"
    except Exception:
        return "auto"


def _default_block_size() -> int | None:
    try:
        from vllm.platforms import current_platform

        return CPU_BLOCK_SIZE if current_platform.is_cpu() else None
    except Exception:
        return None


def _logprobs(positions) -> list[dict[int, float]] | None:
    if positions is None:
        return None
    return [{int(tid): float(lp.logprob) for tid, lp in pos.items()} for pos in positions]
