"""`agentspec serve`: write the draft plan, print the exact `vllm serve` command, run it.

Registered by agentspec_sdk/cli.py as `app.command("serve")(serve)`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from agentspec_sdk.errors import AgentSpecError


def write_plan(model: str, plan_path: Path, *, tools_file: Path | None = None, formats: str | None = None,
               gamma_max: int = 8, records_path: Path | None = None) -> Path:
    """The plan the proposer inside the server reads (AGENTSPEC_PLAN)."""
    from agentspec_sdk.drafting.plan import DraftPlan
    from agentspec_sdk.structure.formats import format_names, get_format
    from agentspec_sdk.structure.tools import ToolRegistry

    tools = ToolRegistry()
    if tools_file is not None:
        try:
            tools = ToolRegistry.from_json(Path(tools_file).read_text(encoding="utf-8"))
        except OSError as exc:
            raise AgentSpecError(f"cannot read tools file {tools_file}: {exc}") from None
    plan = DraftPlan(formats=load_formats(formats) if formats else [get_format(n) for n in format_names()],
                     tools=tools.openai_tools(), tokenizer=model, gamma_max=gamma_max,
                     records_path=str(records_path.resolve()) if records_path else None)
    return plan.save(plan_path)


def load_formats(spec: str) -> list:
    """`--formats`: comma-separated built-in names, or a JSON file holding one format dict or a list."""
    from agentspec_sdk.structure.formats import AgentFormat, get_format

    path = Path(spec)
    if path.suffix == ".json" or path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise AgentSpecError(f"cannot read formats file {path}: {exc}") from None
        return [AgentFormat.from_dict(d) for d in (data if isinstance(data, list) else [data])]
    return [get_format(name.strip()) for name in spec.split(",") if name.strip()]


def serve(
    model: Annotated[str | None, typer.Option("--model", help="HF folder or id (default: bundled SmolLM2-135M)")] = None,
    tools: Annotated[Path | None, typer.Option("--tools", help="tools.json (OpenAI tool list) the agents use")] = None,
    formats: Annotated[str | None, typer.Option("--formats", help="format names, comma-separated, or a JSON file")] = None,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8000,
    speculation: Annotated[str, typer.Option("--speculation", help="structure | ngram | suffix | off")] = "structure",
    gamma_max: Annotated[int, typer.Option("--gamma-max", help="most draft tokens per row and step")] = 8,
    max_model_len: Annotated[int, typer.Option("--max-model-len")] = 4096,
    served_model_name: Annotated[str | None, typer.Option("--served-model-name")] = None,
    plan: Annotated[Path | None, typer.Option("--plan", help="where to write the plan (default: cache)")] = None,
    records: Annotated[Path | None, typer.Option("--records", help="proposer records JSONL (default: beside the plan)")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="write the plan, print the command, do not run it")] = False,
    vllm_args: Annotated[list[str] | None, typer.Argument(help="extra `vllm serve` arguments (after --)")] = None,
) -> None:
    """Start vLLM's OpenAI-compatible server with the AgentSpec structure proposer inside it."""
    from agentspec_sdk.backends.model_bundle import cache_dir, resolve_model
    from agentspec_sdk.backends.server import ServerProcess, ServerSpec

    try:
        model_path = resolve_model(model)
        plan_path = None
        if speculation == "structure":
            plan_path = (plan or cache_dir() / "serve" / f"plan-{port}.json").resolve()
            records_path = records or plan_path.with_name(plan_path.stem + ".records.jsonl")
            write_plan(model_path, plan_path, tools_file=tools, formats=formats, gamma_max=gamma_max,
                       records_path=records_path)
            typer.echo(f"# plan: {plan_path}\n# proposer records: {records_path.resolve()}", err=True)
        spec = ServerSpec(model=model_path, host=host, port=port, speculation=speculation, gamma_max=gamma_max,
                          plan_path=plan_path, served_model_name=served_model_name,
                          max_model_len=max_model_len, seed=seed, extra_args=list(vllm_args or []))
        typer.echo(spec.shell_line())
        if dry_run:
            return
        typer.echo(f"# serving on {spec.base_url}/v1 (Ctrl-C stops)", err=True)
        code = ServerProcess(spec).start().wait()
    except AgentSpecError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)
