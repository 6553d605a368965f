"""Run a measurement plan: each engine configuration is measured in a process of its own (the engine
in-process there, so vLLM's per-process state never carries over between modes). Up to
MAX_LIVE_ENGINES processes live at once, as many as memory holds (`replay.memory`; the rest run in a
later group, after the first group's engines are closed), and take turns: every arm at every
batch size is replayed by each engine in turn before the next arm, so the modes compared on one
arm run minutes apart and the machine's drift lands on all of them alike. A report is written
after each round, so an interrupted run (Ctrl-C) still leaves a valid report, marked partial.

With `repeats` N > 1 the whole plan is measured N times, on fresh engines each time (an engine that
replayed an arm holds its outputs in its prefix cache and suffix trees), the modes interleaved in
every repeat with the order rotating; the report is built from the first repeat, and its `repeats`
table gives every (arm, mode, γ, b)'s decode tok/s median and range over the N beside the
deterministic counts."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentspec_sdk.errors import BackendError
from agentspec_sdk.replay import accounting, memory
from agentspec_sdk.replay.aggregate import clean_json, run_key, summarize
from agentspec_sdk.replay.arms import PROSE, SUFFIX_TUNED, Arm, engine_kwargs
from agentspec_sdk.replay.loop import TurnLog
from agentspec_sdk.replay.passes import PASS_LOGS, write_logs
from agentspec_sdk.replay.replayer import replay
from agentspec_sdk.replay.report import build_report, write_report

if TYPE_CHECKING:
    from agentspec_sdk.backends.contract import AgentEngine


@dataclass(frozen=True)
class ModeConfig:
    """One engine of a measurement plan: speculation mode, draft length cap, prefix caching (the
    engine's own settings are `backends.EngineConfig`)."""

    mode: str
    gamma: int
    prefix_cache: bool = True


@dataclass
class Plan:
    configs: list[ModeConfig]
    arms: list[Arm]
    batches: list[int]
    primary: dict
    model: str | None = None
    seed: int = 0
    max_model_len: int | None = None  # None: the model's own context length (config.json)
    latency_scale: float = 1.0
    enforce_eager: bool = True  # skip torch.compile: ~15 s per engine start instead of ~90 s here
    entropies: bool = False  # after the timed runs: the target's next-token entropies per class (kappa fit)
    # prompt + output tokens scored at most (None: target_entropy's default)
    entropy_tokens: int | None = None
    meta: dict = field(default_factory=dict)
    repeats: int = 1  # the whole plan measured this many times, fresh engines each time
    suffix_tuned: tuple[float, float] = SUFFIX_TUNED  # `suffix-tuned`: (max_spec_factor, min_token_prob)
    # the `off` runs' turns, captured into this directory after the warm-up (docs/capture.md)
    capture: Path | None = None

    def __post_init__(self) -> None:
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise BackendError(f"repeats must be an integer >= 1, got {self.repeats!r}")

    def expected_turns(self) -> int:
        per = 0
        for arm in self.arms:
            for ep in arm.episodes:
                segs = ep.user_segments()[:arm.max_segments]
                per += sum(max(1, min(sum(t.role == "assistant" for t in s) or 1, arm.max_steps or 99))
                           for s in segs)
        return per * len(self.configs) * len(self.batches) * self.repeats


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


def build_engine(plan: Plan, cfg: ModeConfig):
    from agentspec_sdk.backends.embedded.vllm_engine import Engine
    from agentspec_sdk.structure.formats import CODE_AGENT, REACT, TOOL_CALLS

    # The proposer picks a row's format by the open markers its prompt mentions, ties going to the
    # first: prose prompts mention none, so `prose` goes first, and only when arm A needs it.
    builtins = [REACT, TOOL_CALLS, CODE_AGENT]
    formats = [PROSE, *builtins] \
        if any(a.episodes and a.episodes[0].format == PROSE.name for a in plan.arms) \
        else builtins
    return Engine(model=plan.model, formats=formats,
                  enable_prefix_caching=cfg.prefix_cache, max_model_len=plan.max_model_len, seed=plan.seed,
                  enforce_eager=plan.enforce_eager, in_process=True,
                  **engine_kwargs(cfg.mode, cfg.gamma, plan.suffix_tuned))


def _warm_up(engine: AgentEngine) -> None:
    """One short request before anything is timed (first-step costs of a fresh engine)."""
    from agentspec_sdk.backends.types import TurnRequest
    from agentspec_sdk.errors import BackendError

    (res,) = engine.generate([TurnRequest(messages=[{"role": "user", "content": "Hello"}], fmt="tool_calls",
                                          grammar="", tools=[],
                                          max_tokens=4, agent_id="warmup")])
    if res.error:
        raise BackendError(f"engine warm-up request failed: {res.error}")


# the mode whose turns `Plan.capture` keeps: the target's own outputs, what `agentspec tune` replays
CAPTURED_MODE = "off"


def prepare_engine(plan: Plan, engine: AgentEngine, cfg: ModeConfig | None = None) -> None:
    """Every arm's tools registered and one warm-up turn, before anything is timed; then, on the
    `off` engine of a plan with `capture`, the capture started (the warm-up is not captured)."""
    tools = _unique_tools(plan.arms)
    if tools and hasattr(engine, "register_tools"):
        engine.register_tools(tools)
    _warm_up(engine)
    if plan.capture is not None and cfg is not None and cfg.mode == CAPTURED_MODE:
        if not hasattr(engine, "capture_to"):
            raise BackendError(f"{type(engine).__name__} cannot capture its turns (Engine can; a server: "
                               "agentspec serve --capture)")
        engine.capture_to(plan.capture)


def measure_run(plan: Plan, cfg: ModeConfig, engine: AgentEngine, tokenizer: Any, arm: Arm, b: int,
                emit: Callable[[tuple], None], repeat: int = 0) -> None:
    """Replay one arm at batch size `b` on a prepared engine; `emit` receives ("status", text),
    ("turn", TurnLog) and ("run", summary, logs, proposer steps, engine passes) events in order.
    With `plan.repeats` > 1 the summary carries its `repeat` (0-based), part of its run key."""
    emit(("status", f"{_label(cfg)}: arm {arm.name}, b={b}"
                    + (f", repeat {repeat + 1}/{plan.repeats}" if plan.repeats > 1 else "")))
    began = time.time()
    run = replay(engine, arm.episodes, tokenizer=tokenizer, concurrency=b,
                 max_tokens=arm.max_tokens, max_steps=arm.max_steps,
                 max_segments=arm.max_segments, tool_choice=arm.tool_choice,
                 latency_scale=plan.latency_scale, on_turn=lambda log: emit(("turn", log)),
                 grammar=arm.grammar, fmt=arm.fmt)
    summary = summarize(run.logs, arm=arm.name, mode=cfg.mode, gamma=cfg.gamma, batch=b,
                        wall_s=run.wall_s, prefix_cache=cfg.prefix_cache,
                        interrupted=run.interrupted, matches=run.matches, episodes=run.episodes)
    if plan.repeats > 1:
        summary["repeat"] = repeat
    summary.update(_drafter_price(engine))
    ended = time.time()
    steps = engine.step_log(began, ended) if hasattr(engine, "step_log") else []
    passes = engine.pass_log(began, ended) if hasattr(engine, "pass_log") else []
    emit(("run", summary, run.logs, steps, passes))
    if run.interrupted:
        raise KeyboardInterrupt


def _drafter_price(engine: AgentEngine) -> dict:
    """The in-process drafter's price of a draft token as the run ended: the learned delta, the
    step-time fit it is shrunk from (law.OnlineStepCost) and the run's tokens per unit of pass cost
    (budget.TokenRate, what budget_rule "rate" multiplies prices by); nothing for other drafters."""
    drafter = engine.proposer() if hasattr(engine, "proposer") else None
    stats = drafter.stats() if drafter is not None and hasattr(drafter, "stats") else {}
    if "delta" not in stats:
        return {}
    return {"drafter_delta": stats["delta"], "drafter_delta_fit": stats.get("delta_fit"),
            "drafter_delta_fit_se": stats.get("delta_fit_se"), "drafter_token_rate": stats.get("token_rate")}


def measure_config(plan: Plan, cfg: ModeConfig, engine: AgentEngine, tokenizer: Any,
                   emit: Callable[[tuple], None], t0: float, batches: list[int] | None = None,
                   repeat: int = 0) -> None:
    """Replay every arm at each batch size of `batches` (default: the plan's) on one engine (built
    since `t0`, a perf_counter time); `emit` receives ("started", seconds to a warm engine), then
    `measure_run`'s events per run."""
    prepare_engine(plan, engine, cfg)
    emit(("started", time.perf_counter() - t0))
    for arm in plan.arms:
        for b in plan.batches if batches is None else batches:
            measure_run(plan, cfg, engine, tokenizer, arm, b, emit, repeat)


def _label(cfg: ModeConfig) -> str:
    return f"{cfg.mode} γ={cfg.gamma}{'' if cfg.prefix_cache else ' no-prefix-cache'}"


def _child(plan: Plan, cfg: ModeConfig, events, commands) -> None:
    """Body of one measuring process: its engine, then the runs the parent asks for (("run", arm
    index, batch, repeat) on `commands`, each answered by its events and ("ran",)) until ("stop",)."""
    from agentspec_sdk.backends.model_bundle import load_tokenizer
    from agentspec_sdk.replay.arms import ensure_prose_format

    # Ctrl-C reaches the whole process group; the parent decides (it stops this process).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ensure_prose_format()
        tokenizer = load_tokenizer(plan.model)
        t0 = time.perf_counter()
        engine = build_engine(plan, cfg)
        try:
            prepare_engine(plan, engine, cfg)
            events.put(("started", time.perf_counter() - t0))
            while (cmd := commands.get())[0] == "run":
                measure_run(plan, cfg, engine, tokenizer, plan.arms[cmd[1]], cmd[2], events.put, cmd[3])
                events.put(("ran",))
        finally:
            engine.close()
        events.put(("done",))
    except BaseException as exc:  # reported to the parent, which raises it
        events.put(("error", f"{type(exc).__name__}: {exc}"))


# Engines alive at once at most while their runs interleave; fewer where memory does not hold them
# (`replay.memory`: each holds its model and KV cache, ≈ 3–4 GB with SmolLM2-135M, ≈ 6–7 GB with
# Gemma 3 270M).
MAX_LIVE_ENGINES = 4


class _Worker:
    """The parent's handle on one measuring process."""

    def __init__(self, plan: Plan, cfg: ModeConfig, handle: Callable[[tuple], None]):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.cfg, self.handle = cfg, handle
        self.events, self.commands = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=_child, args=(plan, cfg, self.events, self.commands),
                                name=f"agentspec-{cfg.mode}", daemon=True)
        self.proc.start()

    def pump(self, until: str) -> None:
        """Hand this process's events to `handle` up to and including one of kind `until`."""
        import queue as queue_mod

        while True:
            try:
                event = self.events.get(timeout=1.0)
            except queue_mod.Empty:
                if not self.proc.is_alive():
                    raise BackendError(f"measuring process for {_label(self.cfg)} died "
                                       f"(exit code {self.proc.exitcode})") from None
                continue
            if event[0] == "error":
                raise BackendError(f"{_label(self.cfg)}: {event[1]}")
            self.handle(event)
            if event[0] == until:
                return

    def stop(self) -> None:
        if self.proc.is_alive():
            self.commands.put(("stop",))
            try:
                self.pump("done")
            except BackendError:
                pass
            self.proc.join(timeout=60)

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=10)
            if self.proc.is_alive():
                self.proc.kill()
        for q in (self.events, self.commands):
            q.close()
            q.join_thread()


def interleaved_rounds(n_arms: int, batches: list[int], n_workers: int,
                       repeat: int = 0) -> list[tuple[int, int, list[int]]]:
    """(arm index, batch size, the workers' order) of each round of `_measure_interleaved`: every
    arm at every batch size, the workers taking turns from a first one that moves on by one each
    round and, in repeat r, starts r places on."""
    rounds = [(i, b) for i in range(n_arms) for b in batches]
    out = []
    for r, (arm_index, b) in enumerate(rounds):
        first = (r + repeat) % n_workers
        out.append((arm_index, b, [*range(first, n_workers), *range(first)]))
    return out


def _measure_interleaved(plan: Plan, configs: list[ModeConfig], handler: Callable[[ModeConfig], Callable],
                         after_round: Callable[[], None], batches: list[int], repeat: int = 0,
                         on_status: Callable[[str], None] | None = None) -> list[ModeConfig]:
    """Measure the first of `configs` that fit in memory together (`_start_group`), one live process
    each, their runs interleaved: for every arm and batch size each engine replays it in turn (the
    order rotating from one round to the next), so the modes compared on an arm run minutes apart,
    not a whole plan apart. On a shared machine the speed drifts over minutes; interleaving puts the
    drift into every mode alike instead of into the ratios between them; repeat r of a plan starts
    the rotation r places on. Returns the configs left for a later group."""
    workers: list[_Worker] = []
    try:
        rest = _start_group(plan, configs, handler, workers)
        if on_status and rest:
            on_status(f"{len(workers)} engine(s) fit in memory at once; "
                      f"{', '.join(_label(c) for c in rest)} after them")
        for arm_index, b, order in interleaved_rounds(len(plan.arms), batches, len(workers), repeat):
            for w in (workers[i] for i in order):
                w.commands.put(("run", arm_index, b, repeat))
                w.pump("ran")
            after_round()
        for w in workers:
            w.stop()
    finally:
        for w in workers:
            w.kill()
    return rest


def _start_group(plan: Plan, configs: list[ModeConfig], handler: Callable[[ModeConfig], Callable],
                 workers: list[_Worker]) -> list[ModeConfig]:
    """Start engines for `configs` one after another (their start-up is not timed against each
    other) into `workers`: the first always, each further one while fewer than MAX_LIVE_ENGINES live
    and the memory available holds one more of the largest footprint measured so far. Returns the
    configs not started."""
    footprint: int | None = None
    for at, cfg in enumerate(configs):
        if workers and (len(workers) >= MAX_LIVE_ENGINES
                        or not memory.room_for_another(footprint, memory.mem_available())):
            return configs[at:]
        w = _Worker(plan, cfg, handler(cfg))
        workers.append(w)
        w.pump("started")
        size = memory.tree_rss(w.proc.pid)
        footprint = size if footprint is None or size is None else max(footprint, size)
    return []


@contextmanager
def _ctrl_c_held() -> Iterator[None]:
    """Hold a Ctrl-C that arrives inside the block until the block ends, then hand it to the
    handler that was in place (Python's default raises KeyboardInterrupt).

    A report write cut short would leave temporary files, and a KeyboardInterrupt inside the first
    (lazy) import of matplotlib leaves a half-initialised module that breaks the partial report
    written next (measured: exit 1 instead of 130). Where SIGINT is ignored (a background job) or
    not handled in Python, or outside the main thread (signals cannot be handled there), the block
    runs as is."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return
    caught: list[tuple[int, Any]] = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        previous(*caught[0])


def run_plan(plan: Plan, out_dir: str | Path, *, tokenizer: Any,
             on_turn: Callable[[TurnLog], None] | None = None,
             on_status: Callable[[str], None] | None = None, plots: bool = True,
             engine_factory: Callable[[Plan, ModeConfig], Any] | None = None) -> dict:
    """Measure every config × arm × batch; return the final report (also written to `out_dir`).

    By default each config runs in a spawned process of its own; with `engine_factory` (tests, a
    custom backend) the engines are built here, one after another, and `tokenizer` is used."""
    runs: list[dict] = []
    logs: dict[tuple, list[TurnLog]] = {}
    steps: dict[tuple, list[dict]] = {}
    passes: dict[tuple, list[dict]] = {}
    starts: dict[str, float] = {}
    meta = _plan_meta(plan, starts, in_process=engine_factory is not None)
    entropies: dict[str, list[float]] = {}

    order = {(c.mode, c.gamma, c.prefix_cache): i for i, c in enumerate(plan.configs)}
    arm_order = {a.name: i for i, a in enumerate(plan.arms)}

    def report(partial: bool) -> dict:
        # runs in plan order (config, arm, batch, repeat), however they were interleaved in time
        runs.sort(key=lambda r: (order.get((r["mode"], r["gamma"], r["prefix_cache"]), len(order)),
                                 arm_order.get(r["arm"], len(arm_order)), r["batch"], r.get("repeat", 0)))
        if plan.repeats == 1:
            rep = build_report(runs, logs, meta=meta, primary=plan.primary, partial=partial, steps=steps,
                               entropies=entropies or None, passes=passes)
        else:  # the report of the first repeat, and every repeat's wall time and counts beside it
            rep = build_report([r for r in runs if r["repeat"] == 0], first_repeat(logs), meta=meta,
                               primary=plan.primary, partial=partial, steps=first_repeat(steps),
                               entropies=entropies or None, passes=first_repeat(passes))
            # build_report gave the first repeat's runs their steady rates; the other repeats need theirs
            accounting.add_steady_rates([r for r in runs if r["repeat"] != 0], passes,
                                        lambda r: (run_key(r), r["mode"]))
            rep["repeats"] = clean_json(accounting.repeat_table(runs, steps, rep["verify_price"],
                                                                           lambda r: (run_key(r), r["mode"])))
        with _ctrl_c_held():
            write_report(rep, out_dir, plots=plots)
            write_logs(Path(out_dir) / PASS_LOGS, steps, passes)
        return rep

    def handler(cfg: ModeConfig) -> Callable[[tuple], None]:
        def handle(event: tuple) -> None:
            kind = event[0]
            if kind == "turn" and on_turn:
                on_turn(event[1])
            elif kind == "status" and on_status:
                on_status(event[1])
            elif kind == "started":
                starts[_label(cfg)] = event[1]
            elif kind == "run":
                summary, run_logs = event[1], event[2]
                if "engine_groups" in meta:  # spawned engines: which group of live engines measured it
                    summary["engine_group"] = len(meta["engine_groups"])
                runs.append(summary)
                key = (run_key(summary), cfg.mode)
                logs[key] = run_logs
                steps[key] = event[3]
                passes[key] = event[4] if len(event) > 4 else []
        return handle

    try:
        if engine_factory is None:
            _measure_spawned(plan, handler, lambda: report(partial=True), on_status,
                             meta.setdefault("engine_groups", []))
        else:
            _measure_in_process(plan, engine_factory, tokenizer, handler, lambda: report(partial=True),
                                on_status)
        if plan.entropies and engine_factory is None:
            _measure_entropies(plan, first_repeat(logs), entropies, meta, on_status)
    except KeyboardInterrupt:
        report(partial=True)
        raise
    return report(partial=False)


def first_repeat(by_key: dict[tuple, Any]) -> dict[tuple, Any]:
    """The entries of a per (run key, mode) dict that belong to the first repeat."""
    return {k: v for k, v in by_key.items() if len(k[0]) < 5 or k[0][4] == 0}


def _plan_meta(plan: Plan, starts: dict[str, float], *, in_process: bool) -> dict:
    extra: dict[str, Any] = {"repeats": plan.repeats} if plan.repeats > 1 else {}
    if any(c.mode == "suffix-tuned" for c in plan.configs):
        factor, prob = plan.suffix_tuned
        extra["suffix_tuned"] = {"max_spec_factor": factor, "min_token_prob": prob}
    return {**plan.meta, **extra, "model": plan.model or "default (SmolLM2-135M-Instruct)", "seed": plan.seed,
            "arms": [a.name for a in plan.arms], "batches": plan.batches,
            "configs": [c.__dict__ for c in plan.configs], "engine_start_s": starts,
            "enforce_eager": plan.enforce_eager,
            "engine_process": "in-process" if in_process
            else f"one spawned process per config, up to {MAX_LIVE_ENGINES} alive as memory allows "
                 "(engine_groups: the ones alive together), their runs interleaved"}


def _measure_spawned(plan: Plan, handler: Callable, partial_report: Callable[[], Any],
                     on_status: Callable[[str], None] | None, groups: list[list[str]]) -> None:
    # fresh engines per batch size: a second batch size on the same engine would replay the
    # very prompts it has just answered (prefix cache warm, suffix trees holding the outputs)
    # (and per repeat, for the same reason); `groups` gets the labels of each group that ran together
    for repeat in range(plan.repeats):
        for b in plan.batches:
            pending = list(plan.configs)
            while pending:
                if on_status:
                    labels = ", ".join(_label(c) for c in pending)
                    on_status(f"starting engines (b={b}{_of(plan, repeat)}) as memory allows: {labels}")
                rest = _measure_interleaved(plan, pending, handler, partial_report, [b], repeat, on_status)
                groups.append([_label(c) for c in pending[:len(pending) - len(rest)]])
                pending = rest


def _of(plan: Plan, repeat: int) -> str:
    return f", repeat {repeat + 1}/{plan.repeats}" if plan.repeats > 1 else ""


def _measure_in_process(plan: Plan, engine_factory: Callable[[Plan, ModeConfig], Any], tokenizer: Any,
                        handler: Callable, partial_report: Callable[[], Any],
                        on_status: Callable[[str], None] | None) -> None:
    # in-process engines (tests, a custom backend): one after another, fresh per batch size and repeat
    # too, the configs' order rotating from one repeat to the next
    n = len(plan.configs)
    for repeat, b, cfg in [(r, b, plan.configs[(i + r) % n]) for r in range(plan.repeats)
                           for b in plan.batches for i in range(n)]:
        if on_status:
            on_status(f"starting engine: {_label(cfg)} (b={b}{_of(plan, repeat)})")
        t0 = time.perf_counter()
        engine = engine_factory(plan, cfg)
        try:
            measure_config(plan, cfg, engine, tokenizer, handler(cfg), t0, [b], repeat)
        finally:
            engine.close()
        partial_report()


def _measure_entropies(plan: Plan, logs: dict[tuple, list[TurnLog]], entropies: dict[str, list[float]],
                       meta: dict, on_status: Callable[[str], None] | None) -> None:
    """The target's entropies per law class over the `off` turns, into `entropies`; a failure is
    written to `meta` (the timed results stand without them)."""
    from agentspec_sdk.backends.embedded.target_entropy import class_entropies

    if on_status:
        on_status("entropies of the target per class")
    t0 = time.perf_counter()
    try:
        # shortest turns first: under a token bound every class (a prose slice too) gets scored
        off_logs = sorted((log for (key, mode), ls in logs.items() if mode == "off" for log in ls),
                          key=lambda log: len(log.prompt_ids) + len(log.token_ids))
        bound = {"max_tokens": plan.entropy_tokens} if plan.entropy_tokens else {}
        entropies.update(class_entropies(plan.model, off_logs, **bound))
    except Exception as exc:  # the timed results stand without them; the report says why
        meta["entropy_error"] = f"{type(exc).__name__}: {exc}"
    meta["entropy_s"] = time.perf_counter() - t0
    meta["entropy_positions"] = {c: len(h) for c, h in entropies.items()}
