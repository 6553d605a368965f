"""`agentspec coverage DIR`: how many JSON Schemas of each dataset compile, and whether their
grammars compile in llguidance (Lark rendering) and xgrammar (EBNF rendering) against the default
model's tokenizer. DIR holds one sub-folder of `*.json` schemas per dataset."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import typer

from agentspec_sdk.errors import SchemaNotSupported
from agentspec_sdk.structure.schema_compiler import schema_rules


def coverage_report(root: Path, checker, *, limit: int = 0, relax=()) -> tuple[dict, Counter]:
    """Per dataset {"total", "compiled", "llguidance_ok", "xgrammar_ok"}, and failure reasons."""
    datasets: dict[str, dict[str, int]] = {}
    reasons: Counter = Counter()
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    if not folders:
        raise typer.BadParameter(f"{root} has no dataset sub-folders")
    for folder in folders:
        counts = {"total": 0, "compiled": 0, "llguidance_ok": 0, "xgrammar_ok": 0}
        files = sorted(folder.glob("*.json"))
        for path in files[:limit] if limit else files:
            counts["total"] += 1
            try:
                schema = json.loads(path.read_text(encoding="utf-8"))
                rules = schema_rules(schema, "s", relax=relax)
            except SchemaNotSupported as exc:
                reasons[f"{folder.name}: {_reason(exc)}"] += 1
                continue
            except ValueError as exc:  # not JSON at all
                reasons[f"{folder.name}: unreadable: {exc}"] += 1
                continue
            counts["compiled"] += 1
            error = checker.llguidance_error(f"start: {rules.root}\n{rules.lark}")
            if error is None:
                counts["llguidance_ok"] += 1
            else:
                reasons[f"{folder.name}: llguidance: {error.splitlines()[0][:100]}"] += 1
            error = checker.xgrammar_error(f"root ::= {rules.root}\n{rules.gbnf}")
            if error is None:
                counts["xgrammar_ok"] += 1
            else:
                reasons[f"{folder.name}: xgrammar: {error.splitlines()[0][:100]}"] += 1
        datasets[folder.name] = counts
    return datasets, reasons


def _reason(exc: SchemaNotSupported) -> str:
    message = str(exc)
    message = message.rsplit(" (at ", 1)[0]
    return message.split(" at offset ")[0][:100]


def coverage(
    dir: Path = typer.Argument(..., exists=True, file_okay=False, help="one sub-folder of *.json schemas per dataset"),
    json_: bool = typer.Option(False, "--json", help="print only the JSON summary"),
    limit: int = typer.Option(0, "--limit", help="at most this many schemas per dataset (0: all)"),
    relax: list[str] = typer.Option([], "--relax", help="opt-in relaxation (see docs/schema_coverage.md)"),
) -> None:
    """Share of schemas per dataset that compile, and compile in llguidance and xgrammar."""
    from transformers import AutoTokenizer  # the command loads the tokenizer; the checker does not

    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.structure.grammar_checks import GrammarChecker

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model()))
    datasets, reasons = coverage_report(dir, GrammarChecker(tokenizer), limit=limit, relax=tuple(relax))
    if json_:
        typer.echo(json.dumps({"datasets": datasets}))
        return
    typer.echo(f"{'dataset':<16}{'total':>7}{'compiled':>10}{'llguidance':>12}{'xgrammar':>10}")
    for name, c in datasets.items():
        share = c["compiled"] / c["total"] if c["total"] else 0.0
        typer.echo(f"{name:<16}{c['total']:>7}{c['compiled']:>10}{c['llguidance_ok']:>12}{c['xgrammar_ok']:>10}   ({share:.1%} compiled)")
    if reasons:
        typer.echo("\nmost frequent failures:")
        for reason, n in reasons.most_common(25):
            typer.echo(f"{n:>5}  {reason}")
