"""`agentspec law`: the Draft Law's numbers for one operating point, and its two figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from agentspec_sdk.errors import LawInputError
from agentspec_sdk.law.closed_forms import DEFAULT_GAMMA_MAX, ClassMix, LawParams, evaluate

HELP = """The Draft Law for one operating point: expected accepted prefix tau per class (S, R, F) and
mixed, net saving s, net speedup, the small-eps threshold eps*, the breakeven schema share w_S*
(small-eps rule and exact root) and the optimal gamma. w_F = 1 - w_S - w_R. The breakeven takes
the non-schema predictability rho_n = (w_R rho_R + w_F rho_F) / (w_R + w_F) at the given R:F ratio."""

# The paper's illustrative operating point: only used to fill what `law plot` is not given.
EXAMPLE = {"w_s": 0.5, "w_r": 0.3, "rho_s": 0.95, "rho_r": 0.6, "rho_f": 0.4, "kappa": 0.8,
           "delta": 0.05, "d": 0.02, "gamma": 8}

app = typer.Typer(help=HELP, invoke_without_command=True, no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False)

WS = Annotated[float | None, typer.Option("--w-s", help="schema-bound share w_S")]
WR = Annotated[float | None, typer.Option("--w-r", help="reasoning share w_R (w_F = 1 - w_S - w_R)")]
RS = Annotated[float | None, typer.Option("--rho-s", help="rho_S = exp(-H_S), in (0, 1]")]
RR = Annotated[float | None, typer.Option("--rho-r", help="rho_R = exp(-H_R), in (0, 1]")]
RF = Annotated[float | None, typer.Option("--rho-f", help="rho_F = exp(-H_F), in (0, 1]")]
KAPPA = Annotated[float | None, typer.Option("--kappa", help="draft alignment constant kappa >= 0")]
DELTA = Annotated[float | None, typer.Option("--delta", help="verify overhead per extra candidate (x c_T)")]
D = Annotated[float | None, typer.Option("--d", help="drafter cost per drafted token (x c_T)")]
GAMMA = Annotated[int | None, typer.Option("--gamma", help="draft length gamma >= 1")]
GAMMA_MAX = Annotated[int, typer.Option("--gamma-max", help="largest gamma searched for the optimum")]


def _fail(err: Exception) -> typer.Exit:
    typer.echo(f"Error: {err}", err=True)
    return typer.Exit(2)


def _build(values: dict) -> tuple[LawParams, ClassMix, int]:
    missing = [f"--{k.replace('_', '-')}" for k, v in values.items() if v is None]
    if missing:
        raise LawInputError(f"missing option(s): {', '.join(missing)}")
    if values["gamma"] < 1:
        raise LawInputError(f"gamma must be an integer >= 1, got {values['gamma']}")
    params = LawParams(values["kappa"], values["delta"], values["d"])
    mix = ClassMix.from_shares(values["w_s"], values["w_r"], values["rho_s"], values["rho_r"],
                               values["rho_f"])
    return params, mix, int(values["gamma"])


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _text(report: dict) -> str:
    tbc = report["tau_by_class"]
    lines = [
        f"tau (mixed)        {_fmt(report['tau'])}   at gamma={report['gamma']}, "
        f"eps_bar={_fmt(report['eps_bar'])}",
        f"tau_S/tau_R/tau_F  {_fmt(tbc['S'])} / {_fmt(tbc['R'])} / {_fmt(tbc['F'])}",
        f"net saving s       {_fmt(report['saving'])}",
        f"net speedup        {_fmt(report['speedup'])}x",
        f"eps*               {_fmt(report['eps_star'])}   (exact root {_fmt(report['eps_star_exact'])})",
        f"w_S* approx        {_fmt(report['w_s_star_approx'])}   ({report['w_s_star_approx_reason']})",
        f"w_S* exact         {_fmt(report['w_s_star_exact'])}   ({report['w_s_star_exact_reason']})",
        f"rho_bar / rho_n    {_fmt(report['rho_bar'])} / {_fmt(report['rho_n'])}",
        f"optimal gamma      {report['gamma_opt']} of 1..{report['gamma_max']}"
        f"   (speedup {_fmt(report['speedup_at_gamma_opt'])}x)",
    ]
    if report["speedup_at_gamma_opt"] is not None and report["speedup_at_gamma_opt"] <= 1.0:
        lines.append("no gamma pays here: leave speculation off")
    return "\n".join(lines)


@app.callback()
def law(ctx: typer.Context, w_s: WS = None, w_r: WR = None, rho_s: RS = None, rho_r: RR = None,
        rho_f: RF = None, kappa: KAPPA = None, delta: DELTA = None, d: D = None, gamma: GAMMA = None,
        gamma_max: GAMMA_MAX = DEFAULT_GAMMA_MAX,
        as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False) -> None:
    if ctx.invoked_subcommand is not None:
        return
    values = {"w_s": w_s, "w_r": w_r, "rho_s": rho_s, "rho_r": rho_r, "rho_f": rho_f, "kappa": kappa,
              "delta": delta, "d": d, "gamma": gamma}
    try:
        params, mix, g = _build(values)
        report = evaluate(params, mix, g, gamma_max).to_dict()
    except LawInputError as err:
        raise _fail(err) from None
    typer.echo(json.dumps(report) if as_json else _text(report))


@app.command("plot")
def plot(out: Annotated[Path, typer.Option("--out", help="folder for the PNG files")] = Path("law-plots"),
         measured: Annotated[Path | None, typer.Option(
             "--measured",
             help="report JSON with 'law', 'measured' and 'tau_by_class' (docs/law.md)")] = None,
         w_s: WS = None, w_r: WR = None, rho_s: RS = None, rho_r: RR = None, rho_f: RF = None,
         kappa: KAPPA = None, delta: DELTA = None, d: D = None, gamma: GAMMA = None,
         gamma_max: GAMMA_MAX = DEFAULT_GAMMA_MAX) -> None:
    """Write tau_by_class.png and saving_vs_schema_share.png (parameters: options, else the report's 'law'
    section, else the paper's illustrative example w_S=0.5, w_R=0.3, rho=0.95/0.6/0.4, kappa=0.8, delta=0.05,
    d=0.02, gamma=8)."""
    from agentspec_sdk.law.plots import read_report, write_plots

    try:
        report = read_report(measured) if measured is not None else {}
        given = {"w_s": w_s, "w_r": w_r, "rho_s": rho_s, "rho_r": rho_r, "rho_f": rho_f, "kappa": kappa,
                 "delta": delta, "d": d, "gamma": gamma}
        values = {k: given[k] if given[k] is not None else report.get("law", {}).get(k, EXAMPLE[k])
                  for k in given}
        params, mix, g = _build(values)
        paths = write_plots(out, params, mix, g, gamma_max, report)
    except LawInputError as err:
        raise _fail(err) from None
    for p in paths:
        typer.echo(str(p))


if __name__ == "__main__":
    app(prog_name="agentspec law")
