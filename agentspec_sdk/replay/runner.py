"""Run a measurement plan: engines built one after another (each closed before the next), every
arm replayed at every batch size on each, a report written after each engine so an interrupted
run (Ctrl-C) still leaves a valid report, marked partial."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentspec_sdk.replay.arms import PROSE, Arm, engine_kwargs
from agentspec_sdk.replay.loop import TurnLog
from agentspec_sdk.replay.replayer import replay
from agentspec_sdk.replay.report import build_report, summarize, write_report


@dataclass(frozen=True)
class EngineConfig:
    mode: str
    gamma: int
    prefix_cache: bool = True


@dataclass
class Plan:
    configs: list[EngineConfig]
    arms: list[Arm]
    batches: list[int]
    primary: dict
    model: str | None = None
    seed: int = 0
    max_model_len: int = 4096
    latency_scale: float = 1.0
    enforce_eager: bool = True  # skip torch.compile: ~15 s per engine start instead of ~90 s here
    meta: dict = field(default_factory=dict)

    def expected_turns(self) -> int:
        per = 0
        for arm in self.arms:
            for ep in arm.episodes:
                segs = ep.user_segments()[:arm.max_segments]
                per += sum(max(1, min(sum(t.role == "assistant" for t in s) or 1, arm.max_steps or 99))
                           for s in segs)
        return per * len(self.configs) * len(self.batches)


def _unique_tools(arms: list[Arm]) -> list[dict]:
    seen, out = set(), []
    for arm in arms:
        for ep in arm.episodes:
            for t in ep.tools:
                name = t["function"]["name"]
                if name not in seen:
                    seen.add(name)
                    out.append(t)
    return out


def build_engine(plan: Plan, cfg: EngineConfig, cfg_index: int = 0):
    from agentspec_sdk.backends.vllm_engine import Engine
    from agentspec_sdk.structure.formats import CODE_AGENT, REACT, TOOL_CALLS

    # The proposer picks a row's format by the open markers its prompt mentions, ties going to the
    # first: prose prompts mention none, so `prose` goes first, and only when arm A needs it.
    builtins = [REACT, TOOL_CALLS, CODE_AGENT]
    formats = [PROSE, *builtins] if any(a.episodes and a.episodes[0].format == PROSE.name for a in plan.arms) \
        else builtins
    return Engine(model=plan.model, formats=formats,
                  enable_prefix_caching=cfg.prefix_cache, max_model_len=plan.max_model_len, seed=plan.seed,
                  enforce_eager=plan.enforce_eager,
                  # vLLM 0.32 on CPU cannot initialise a third in-process worker (its Triton kernel
                  # overrides are re-registered over a scan of every loaded module and fail): the
                  # first two engines run in-process, later ones get their own engine-core process.
                  in_process=cfg_index < 2,
                  **engine_kwargs(cfg.mode, cfg.gamma))


def _warm_up(engine: Any) -> None:
    """One short request before anything is timed (first-step costs of a fresh engine)."""
    from agentspec_sdk.backends.vllm_engine import TurnRequest
    from agentspec_sdk.errors import BackendError

    (res,) = engine.generate([TurnRequest(messages=[{"role": "user", "content": "Hello"}], fmt="tool_calls",
                                          grammar="", tools=[],
                                          max_tokens=4, agent_id="warmup")])
    if res.error:
        raise BackendError(f"engine warm-up request failed: {res.error}")


def run_plan(plan: Plan, out_dir: str | Path, *, tokenizer: Any, on_turn: Callable[[TurnLog], None] | None = None,
             on_status: Callable[[str], None] | None = None, plots: bool = True,
             engine_factory: Callable[[Plan, EngineConfig], Any] | None = None) -> dict:
    """Measure every config × arm × batch; return the final report (also written to `out_dir`)."""
    runs: list[dict] = []
    logs: dict[tuple, list[TurnLog]] = {}
    starts: dict[str, float] = {}
    meta = {**plan.meta, "model": plan.model or "default (SmolLM2-135M-Instruct)", "seed": plan.seed,
            "arms": [a.name for a in plan.arms], "batches": plan.batches,
            "configs": [c.__dict__ for c in plan.configs], "engine_start_s": starts,
            "enforce_eager": plan.enforce_eager}
    tools = _unique_tools(plan.arms)

    def report(partial: bool) -> dict:
        rep = build_report(runs, logs, meta=meta, primary=plan.primary, partial=partial)
        write_report(rep, out_dir, plots=plots)
        return rep

    try:
        for index, cfg in enumerate(plan.configs):
            label = f"{cfg.mode} γ={cfg.gamma}{'' if cfg.prefix_cache else ' no-prefix-cache'}"
            if on_status:
                on_status(f"starting engine: {label}")
            t0 = time.perf_counter()
            engine = build_engine(plan, cfg, index) if engine_factory is None else engine_factory(plan, cfg)
            try:
                if tools and hasattr(engine, "register_tools"):
                    engine.register_tools(tools)
                _warm_up(engine)
                starts[label] = time.perf_counter() - t0
                for arm in plan.arms:
                    for b in plan.batches:
                        if on_status:
                            on_status(f"{label}: arm {arm.name}, b={b}")
                        run = replay(engine, arm.episodes, tokenizer=tokenizer, concurrency=b,
                                     max_tokens=arm.max_tokens, max_steps=arm.max_steps,
                                     max_segments=arm.max_segments, tool_choice=arm.tool_choice,
                                     latency_scale=plan.latency_scale, on_turn=on_turn, grammar=arm.grammar)
                        summary = summarize(run.logs, arm=arm.name, mode=cfg.mode, gamma=cfg.gamma, batch=b,
                                            wall_s=run.wall_s, prefix_cache=cfg.prefix_cache,
                                            interrupted=run.interrupted, matches=run.matches,
                                            episodes=run.episodes)
                        runs.append(summary)
                        logs[((arm.name, b, cfg.gamma, cfg.prefix_cache), cfg.mode)] = run.logs
                        if run.interrupted:
                            raise KeyboardInterrupt
            finally:
                engine.close()
            report(partial=True)
    except KeyboardInterrupt:
        report(partial=True)
        raise
    return report(partial=False)
