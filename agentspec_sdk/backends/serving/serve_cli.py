"""`agentspec serve`: write the draft plan, print the exact `vllm serve` command, run it.

Registered by agentspec_sdk/cli.py as `app.command("serve")(serve)`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from agentspec_sdk.backends.chat_template import AUTO
from agentspec_sdk.errors import AgentSpecError


def write_plan(model: str, plan_path: Path, *, tools_file: Path | None = None, formats: str | None = None,
               gamma_max: int = 8, records_path: Path | None = None,
               records_max_bytes: int | None = None) -> Path:
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
                     records_path=str(Path(records_path).resolve()) if records_path else None,
                     records_max_bytes=records_max_bytes)
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


def tool_format_of(name: str, formats: str | None = None) -> dict:
    """`--tool-format`: one of `--formats` (which may come from a JSON file) or a built-in, as a dict;
    its layout must carry tool calls (tool_calls or react)."""
    from agentspec_sdk.backends.inside_vllm.tool_prompt import LAYOUTS
    from agentspec_sdk.structure.formats import get_format

    known = {f.name: f for f in load_formats(formats)} if formats else {}
    fmt = known.get(name) or get_format(name)
    if fmt.layout not in LAYOUTS:
        raise AgentSpecError(f"--tool-format {name!r}: layout {fmt.layout!r} has no OpenAI tool calls "
                             f"(use a {', '.join(LAYOUTS)} format, or --no-tool-parser)")
    return fmt.to_dict()


def write_tool_chat_template(model: str, fmt: dict, path: Path, template: Any = None) -> Path | None:
    """The chat template for plain clients (`tool_prompt.chat_template` over the model's own; `template`:
    the model's `ChatTemplate` when already read, for the decision)."""
    from agentspec_sdk.backends.inside_vllm.tool_prompt import write_chat_template
    from agentspec_sdk.structure.formats import AgentFormat

    path = write_chat_template(model, AgentFormat.from_dict(fmt), path, template)
    return path.resolve() if path else None


def _builtin(fmt: dict) -> bool:
    from agentspec_sdk.structure.formats import format_names, get_format

    return fmt["name"] in format_names() and get_format(fmt["name"]).to_dict() == fmt


def serve(
    model: Annotated[str | None,
                     typer.Option("--model", help="HF folder or id (default: bundled SmolLM2-135M)")] = None,
    tools: Annotated[Path | None,
                     typer.Option("--tools", help="tools.json (OpenAI tool list) the agents use")] = None,
    formats: Annotated[str | None,
                       typer.Option("--formats",
                                    help="format names, comma-separated, or a JSON file")] = None,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8000,
    speculation: Annotated[str,
                           typer.Option("--speculation",
                                        help="structure | ngram | suffix | off")] = "structure",
    gamma_max: Annotated[int, typer.Option("--gamma-max", help="most draft tokens per row and step")] = 8,
    max_model_len: Annotated[int, typer.Option("--max-model-len")] = 4096,
    served_model_name: Annotated[str | None, typer.Option("--served-model-name")] = None,
    plan: Annotated[Path | None,
                    typer.Option("--plan", help="where to write the plan (default: cache)")] = None,
    records: Annotated[Path | None,
                       typer.Option("--records", help="proposer records JSONL (default: none with "
                                                 "--metrics, else beside the plan)")] = None,
    records_max_mb: Annotated[float,
                              typer.Option("--records-max-mb", help="rotate the records file past this "
                                                  "size (one old file kept)")] = 64.0,
    metrics: Annotated[bool,
                       typer.Option("--metrics/--no-metrics", help="agentspec:* Prometheus metrics on the "
                                          "server's /metrics")] = True,
    status: Annotated[str | None,
                      typer.Option("--status", help="print a running server's acceptance from its "
                                               "/metrics (URL) and exit")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    tool_parser: Annotated[bool,
                           typer.Option("--tool-parser/--no-tool-parser",
                                        help="plain OpenAI tool calling (`tools=[...]` -> `tool_calls`) "
                                             "through the `agentspec` tool parser")] = True,
    tool_format: Annotated[str,
                           typer.Option("--tool-format",
                                        help="the format of plain clients' turns (a built-in name, "
                                             "one of --formats, or auto: the one the model's chat "
                                             "template writes, tool_calls where it declares no tool "
                                             "syntax)")] = "auto",
    capture: Annotated[Path | None,
                       typer.Option("--capture", help="write every finished turn (token ids, "
                                                 "grammar, tools, episode) into this directory")] = None,
    capture_sample: Annotated[float,
                              typer.Option("--capture-sample", help="the share of episodes captured")] = 1.0,
    capture_max_mb: Annotated[float,
                              typer.Option("--capture-max-mb", help="start a new capture file past this "
                                                 "size")] = 64.0,
    capture_max_files: Annotated[int,
                                 typer.Option("--capture-max-files", help="capture files kept (the oldest "
                                                    "removed)")] = 8,
    dry_run: Annotated[bool,
                       typer.Option("--dry-run",
                                    help="write the plan, print the command, do not run it")] = False,
    vllm_args: Annotated[list[str] | None,
                         typer.Argument(help="extra `vllm serve` arguments (after --)")] = None,
) -> None:
    """Start vLLM's OpenAI-compatible server with the AgentSpec structure proposer inside it."""
    from agentspec_sdk.backends.model_bundle import cache_dir, resolve_model
    from agentspec_sdk.backends.serving.server import ServerSpec

    try:
        if status is not None:
            typer.echo(server_status(status))
            return
        if not 0.004 <= records_max_mb:
            raise AgentSpecError(f"--records-max-mb must be at least 0.004 (4 KiB), got {records_max_mb:g}")
        model_path = resolve_model(model)
        plan_path = None
        if speculation == "structure":
            plan_path = (plan or cache_dir() / "serve" / f"plan-{port}.json").resolve()
            _serve_plan(model_path, plan_path, tools, formats, gamma_max, records, metrics, records_max_mb)
        chat_template, fmt = None, tool_format
        if tool_parser:
            where = plan_path.parent if plan_path else cache_dir() / "serve"
            chat_template, fmt = _serve_tool_parser(model_path, tool_format, formats,
                                                    where / f"chat-template-{port}.jinja")
        spec = ServerSpec(model=model_path, host=host, port=port, speculation=speculation,
                          gamma_max=gamma_max,
                          plan_path=plan_path, served_model_name=served_model_name,
                          max_model_len=max_model_len, seed=seed, extra_args=list(vllm_args or []),
                          metrics=metrics, tool_parser=tool_parser, tool_format=fmt,
                          chat_template=chat_template, capture_dir=capture, capture_sample=capture_sample,
                          capture_max_bytes=int(capture_max_mb * (1 << 20)),
                          capture_max_files=capture_max_files)
        if capture is not None:
            typer.echo(f"# capture: every finished turn into {capture.resolve()} (sample {capture_sample:g}, "
                       f"{capture_max_files} files of {capture_max_mb:g} MiB at most)", err=True)
        typer.echo(spec.shell_line())
        if dry_run:
            return
        code = _run_server(spec)
    except AgentSpecError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


def _run_server(spec) -> int:
    from agentspec_sdk.backends.serving.server import ServerProcess

    proc = ServerProcess(spec).start()  # a port in use is refused here, before vLLM runs
    if spec.multiproc_dir() is not None:
        typer.echo(f"# metrics: {spec.base_url}/metrics (agentspec:* beside vllm:*; "
                   f"{spec.multiproc_dir()} is emptied at every start)", err=True)
    typer.echo(f"# serving on {spec.base_url}/v1 (Ctrl-C stops)", err=True)
    return proc.wait()


def _serve_plan(model_path: str, plan_path: Path, tools: Path | None, formats: str | None, gamma_max: int,
                records: Path | None, metrics: bool, records_max_mb: float) -> None:
    """Write the structure proposer's plan (and say where its records go)."""
    records_path = records or (None if metrics else plan_path.with_name(plan_path.stem + ".records.jsonl"))
    write_plan(model_path, plan_path, tools_file=tools, formats=formats, gamma_max=gamma_max,
               records_path=records_path, records_max_bytes=int(records_max_mb * (1 << 20)))
    where = (f"{records_path.resolve()} (rotated at {records_max_mb:g} MiB)" if records_path else
             "off (--records PATH to keep them)")
    typer.echo(f"# plan: {plan_path}\n# proposer records: {where}", err=True)


def _serve_tool_parser(model_path: str, tool_format: str, formats: str | None,
                       template_path: Path) -> tuple[Path | None, str | dict]:
    """The plain clients' chat template and the format the tool parser is told (a name for a built-in);
    `--tool-format auto`: the format the model's own template writes (`chat_template.auto_format`)."""
    from agentspec_sdk.backends.chat_template import ChatTemplate
    from agentspec_sdk.backends.model_bundle import load_tokenizer

    # the model's template with its tokens: the decision, and what a wrapper tells RemoteEngine of it
    # (without a loadable tokenizer, the template's text alone, and `auto` falls back to tool_calls)
    try:
        template = ChatTemplate.of(load_tokenizer(model_path))
    except (OSError, ValueError) as exc:
        typer.echo(f"# tokenizer of {model_path} not loaded ({type(exc).__name__}): the chat template "
                   "decision reads the template's text alone", err=True)
        template = None
    if tool_format == AUTO and template is None:  # no template to read: the format of one without tools
        typer.echo("# --tool-format auto: no chat template to read, tool_calls (name the format to choose "
                   "another)", err=True)
        tool_format = "tool_calls"
    if tool_format == AUTO:
        tool_format = template.native
        typer.echo(f"# --tool-format auto: the model's chat template writes {tool_format}", err=True)
    fmt = tool_format_of(tool_format, formats)
    chat_template = write_tool_chat_template(model_path, fmt, template_path, template)
    typer.echo(f"# plain OpenAI clients: tool parser 'agentspec', format {fmt['name']}, chat "
               f"template {chat_template or 'the model’s own (it has none to wrap)'}", err=True)
    return chat_template, fmt["name"] if _builtin(fmt) else fmt


def server_status(url: str) -> str:
    """A running server's speculation, from its /metrics: vLLM's counters and the proposer's per class."""
    import re

    import httpx

    from agentspec_sdk.backends.inside_vllm.prom_metrics import parse_agentspec, summarize
    from agentspec_sdk.backends.remote.remote_inspect import parse_prometheus

    if not re.match(r"^https?://[^/\s]+", url or ""):
        raise AgentSpecError(f"--status needs the server's URL (http://host:port), got {url!r}")
    root = re.sub(r"/v1/?$", "", url.rstrip("/"))
    try:
        resp = httpx.get(root + "/metrics", timeout=10.0)
    except httpx.HTTPError as exc:
        raise AgentSpecError(f"cannot read {root}/metrics: {exc}") from None
    if resp.status_code != 200:
        raise AgentSpecError(f"{root}/metrics answered HTTP {resp.status_code}")
    vllm = parse_prometheus(resp.text)
    ours = parse_agentspec(resp.text)
    lines = [f"server {root}"]
    if vllm:
        d, a = int(vllm["num_draft_tokens"]), int(vllm["num_accepted_tokens"])
        lines.append(f"vLLM speculation: {a} of {d} draft tokens accepted ({_pct(a, d)}) over "
                     f"{int(vllm['num_drafts'])} verify steps")
    else:
        lines.append("vLLM speculation: off (no vllm:spec_decode_* counters)")
    if not ours:
        lines.append("AgentSpec proposer: no agentspec:* metrics (not our proposer, or started without "
                     "PROMETHEUS_MULTIPROC_DIR: use `agentspec serve`)")
        return "\n".join(lines)
    s = summarize(ours)
    lines.append(f"AgentSpec proposer: {s['steps']} steps, {s['rows']} rows, {s['proposer_s']:.3f} s "
                 f"({100 * s['proposer_share']:.1f} % of busy step time), errors {s['errors']}")
    lines.append(f"{'class':<8}{'rounds':>8}{'drafted':>10}{'accepted':>10}{'alpha':>8}")
    for cls, row in s["by_class"].items():
        lines.append(f"{cls:<8}{row['rounds']:>8}{row['drafted']:>10}{row['accepted']:>10}{row['alpha']:>8.3f}")
    lines.append("by source: "
                 + ", ".join(f"{k} {v['accepted']}/{v['drafted']}" for k, v in s["by_source"].items()))
    lines.append("budget withheld tokens: " + (", ".join(f"{k} {v}" for k, v in s["withheld"].items()) or "0")
                 + "; gated rows: " + (", ".join(f"{k} {v}" for k, v in s["gated"].items()) or "0"))
    return "\n".join(lines)


def _pct(a: int, d: int) -> str:
    return f"{100 * a / d:.1f} %" if d else "n/a"
