"""`agentspec tune CAPTURE… --out plan.json`: the draft plan tuned on captured traffic, offline."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from agentspec_sdk.errors import AgentSpecError
from agentspec_sdk.tuning.choose import CLEAR_WIN_SE

__all__ = ["tune"]

DEFAULT_DELTA = 0.2  # a drafted token's verify cost per row of an 8-row pass (the bench's step-log fit, CPU)


def _progress_bar(total: int):
    """A tqdm bar over replayed output tokens (stderr), or nothing when stderr is not a terminal."""
    from tqdm import tqdm

    return tqdm(total=total, unit="tok", unit_scale=True, desc="replaying", file=sys.stderr,
                disable=not sys.stderr.isatty())


def tune(
    captures: list[Path] = typer.Argument(..., exists=True, help="capture files or directories (*.jsonl)"),
    out: Path = typer.Option(..., "--out", help="the tuned draft plan (JSON), written whole or not at all"),
    report: Path | None = typer.Option(None, "--report",
                                       help="folder for report.md, report.json and the plot"),
    base_plan: Path | None = typer.Option(None, "--base-plan", exists=True, dir_okay=False,
                                          help="a plan whose fields (formats, tools, prices) the tuned "
                                               "plan keeps"),
    gamma: int = typer.Option(8, "--gamma", help="the deployment's draft length (num_speculative_tokens)"),
    batch: int = typer.Option(8, "--batch", help="the deployment's concurrent rows"),
    delta: float = typer.Option(DEFAULT_DELTA, "--delta",
                                help="a drafted token's verify cost per row of a pass, in passes"),
    d: float = typer.Option(0.0, "--d", help="the drafter's cost per drafted token, in passes"),
    holdout: float = typer.Option(0.5, "--holdout", help="share of the episodes held out"),
    seed: int = typer.Option(0, "--seed", help="seed of the episode split"),
    jobs: int = typer.Option(0, "--jobs", help="replays run at once in worker processes; 0: one process "
                                               "below 50k output tokens, else up to 2"),
    model: str | None = typer.Option(None, "--model", help="the tokenizer the turns were captured with "
                                                           "(default: the default model)"),
    clear_win_se: float = typer.Option(CLEAR_WIN_SE, "--clear-win-se",
                                       help="a policy replaces a kind's default only where its mean saving "
                                            "per episode exceeds this many standard errors"),
    kind_default: str = typer.Option("class", "--kind-default",
                                     help="the policy a kind keeps unless another clearly wins: class "
                                          "(structure in schema kinds, trees elsewhere) or trees"),
) -> None:
    """Replay captured turns through vLLM's drafters and the structure drafter under per-segment-kind
    policies; choose per kind on one part of the episodes, report on the other, write the plan."""
    try:
        _tune(captures, out, report, base_plan, gamma, batch, delta, d, holdout, seed, jobs, model,
              clear_win_se, kind_default)
    except AgentSpecError as exc:
        typer.echo(f"agentspec tune: {exc}", err=True)
        raise typer.Exit(2) from None


def _tune(captures, out, report, base_plan, gamma, batch, delta, d, holdout, seed, jobs, model,
          clear_win_se, kind_default) -> None:
    from agentspec_sdk.backends.capture import read_capture
    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.drafting.plan import DraftPlan
    from agentspec_sdk.structure.formats import AgentFormat
    from agentspec_sdk.tuning.deploy import deploy_advice
    from agentspec_sdk.tuning.episodes import turn_set
    from agentspec_sdk.tuning.report import write_report
    from agentspec_sdk.tuning.tuner import TuneOptions, tune, tuned_plan

    base = DraftPlan.load(base_plan) if base_plan is not None else None
    known = [AgentFormat.from_dict(f) for f in base.formats] if base is not None else []
    ts = turn_set(read_capture(captures), known)
    opts = TuneOptions(gamma=gamma, batch=batch, delta=delta, d=d, holdout=holdout, seed=seed, jobs=jobs,
                       model=resolve_model(model), clear_win_se=clear_win_se, kind_default=kind_default)
    opts.check()
    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = _progress_bar(total)
        bar.update(done - bar.n)

    try:
        result = tune(ts, opts, base, progress=progress)
    finally:
        if bar is not None:
            bar.close()
    plan = tuned_plan(base, ts, result)
    result["deploy"] = deploy_advice(plan, out, gamma)
    if report is not None:
        write_report(result, report)
    plan.save(out)
    h = result["held_out_summary"]
    typer.echo(f"{result['turns']} turns, {result['episodes']['all']} episodes, {result['seconds']:.0f} s; "
               f"chosen per kind: {result['choice']}; plan: {result['plan_choice']}")
    typer.echo(f"held-out cost: structure-tuned {h['structure_tuned']:.1f}, best stock {h['best_stock']} "
               f"{h['best_stock_cost']:.1f} (best stock ÷ structure-tuned {h['best_stock_over_tuned']:.3f})")
    for note in result["notes"]:
        typer.echo(f"note: {note}")
    typer.echo(f"plan -> {out}" + (f"; report -> {report}/report.md" if report is not None else ""))
    typer.echo(f"deploy: {result['deploy']['command']}  # {result['deploy']['why']}")
