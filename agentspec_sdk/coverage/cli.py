"""`agentspec coverage [DIR]`: per dataset, how many JSON Schemas compile, whether their grammars
compile under the three judges (python lark; llguidance, Lark rendering; xgrammar, EBNF rendering;
the default model's tokenizer) and whether each grammar is exact (`exactness.py`: completeness
against hypothesis-jsonschema instances, soundness of random walks over llguidance's masks, and
the texts on which the judges disagree). DIR holds one sub-folder of `*.json` schemas per dataset;
without it, the repository's sample `tests/data/jsonschemabench` (100 evenly spaced schemas of each of
five JSONSchemaBench datasets, tests/data/README.md)."""

from __future__ import annotations

import importlib.util
import json
import time
from collections import Counter
from pathlib import Path

import typer

from agentspec_sdk.errors import SchemaNotSupported
from agentspec_sdk.structure.schema.compiler import schema_rules

SAMPLE = Path(__file__).resolve().parents[2] / "tests" / "data" / "jsonschemabench"  # in a source checkout
EXACTNESS_KEYS = ("exact", "completeness_failures", "soundness_failures", "completeness_unchecked",
                  "soundness_unchecked", "disagreements")


def coverage_report(root: Path, checker, *, limit: int = 0, relax=(),
                    seconds: float = 2.0) -> tuple[dict, Counter]:
    """Per dataset {"total", "compiled", "lark_ok", "llguidance_ok", "xgrammar_ok", "exact",
    "completeness_failures", "soundness_failures", "completeness_unchecked", "soundness_unchecked",
    "disagreements", "examples", "seconds"} and failure reasons. `seconds`: time for the exactness
    checks per schema (0: no checks, their counts are None); the report's "seconds" is the
    dataset's wall time. `examples` holds one schema and text per kind of failure."""
    from agentspec_sdk.coverage.exactness import check_exactness

    datasets: dict[str, dict] = {}
    reasons: Counter = Counter()
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    if not folders:
        raise typer.BadParameter(f"{root} has no dataset sub-folders")
    for folder in folders:
        began = time.monotonic()
        counts: dict = {"total": 0, "compiled": 0, "lark_ok": 0, "llguidance_ok": 0, "xgrammar_ok": 0}
        counts.update(dict.fromkeys(EXACTNESS_KEYS, 0 if seconds > 0 else None))
        examples: dict[str, dict] = {}
        for path in evenly_spaced(sorted(folder.glob("*.json")), limit):
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
            judges = checker.judges(f"start: {rules.root}\n{rules.lark}",
                                    f"root ::= {rules.root}\n{rules.gbnf}")
            for name, error in judges.errors.items():
                if error is None:
                    counts[f"{name}_ok"] += 1
                else:
                    reasons[f"{folder.name}: {name}: {error.splitlines()[0][:100]}"] += 1
            if seconds <= 0:
                continue
            result = check_exactness(schema, judges, seconds=seconds, relax=relax)
            counts["exact"] += result.exact
            for key, found in (("completeness_failures", result.completeness_failure),
                               ("soundness_failures", result.soundness_failure),
                               ("disagreements", result.disagreement),
                               ("completeness_unchecked", result.completeness_unchecked)):
                if found is not None:
                    counts[key] += 1
                    examples.setdefault(key, {"schema": path.name, "text": found})
            if result.soundness_walks == 0:  # no walk finished in time: soundness did not run
                counts["soundness_unchecked"] += 1
            if result.completeness_unchecked:
                reasons[f"{folder.name}: completeness unchecked: {result.completeness_unchecked[:80]}"] += 1
        counts["examples"] = examples
        counts["seconds"] = round(time.monotonic() - began, 1)
        datasets[folder.name] = counts
    return datasets, reasons


def evenly_spaced(files: list, limit: int) -> list:
    """At most `limit` of the sorted `files`, every k-th one (a sample, not a prefix; 0: all). The
    in-repo sample `tests/data/jsonschemabench` is this rule with 100 over each full dataset."""
    if not limit or limit >= len(files):
        return list(files)
    return [files[i * len(files) // limit] for i in range(limit)]


def _reason(exc: SchemaNotSupported) -> str:
    message = str(exc)
    message = message.rsplit(" (at ", 1)[0]
    return message.split(" at offset ")[0][:100]


def coverage(
    dir: Path | None = typer.Argument(None, exists=True, file_okay=False,
                                      help="one sub-folder of *.json schemas per dataset (default: the "
                                           "repository's sample, tests/data/jsonschemabench)"),
    json_: bool = typer.Option(False, "--json", help="print only the JSON summary"),
    limit: int = typer.Option(0, "--limit",
                              help="at most this many schemas per dataset, evenly spaced (0: all)"),
    relax: list[str] = typer.Option([], "--relax", help="opt-in relaxation (see docs/schema_coverage.md)"),
    seconds: float = typer.Option(2.0, "--seconds",
                                  help="time per schema for the exactness checks (0: skip them)"),
) -> None:
    """Per dataset: schemas that compile, compile under lark, llguidance and xgrammar, and are exact."""
    if seconds < 0:
        raise typer.BadParameter(f"--seconds must be 0 or more, not {seconds}")
    if dir is None:
        if not SAMPLE.is_dir():
            raise typer.BadParameter(f"no DIR given, and the repository's sample is not at {SAMPLE} "
                                     "(it comes with a source checkout, not with the wheel): pass DIR")
        dir = SAMPLE
    needed = {"transformers": "cpu"} | ({"hypothesis_jsonschema": "dev"} if seconds > 0 else {})
    missing = {module: extra for module, extra in needed.items() if importlib.util.find_spec(module) is None}
    if missing:
        extras = ",".join(sorted(set(missing.values())))
        hint = ", or --seconds 0 (no exactness checks)" if set(missing) == {"hypothesis_jsonschema"} else ""
        raise typer.BadParameter(f"agentspec coverage needs {', '.join(missing)}: pip install "
                                 f"'agentspec-sdk[{extras}]'{hint}")
    from transformers import AutoTokenizer  # the command loads the tokenizer; the checker does not

    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.coverage.grammar_checks import GrammarChecker

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model()))
    datasets, reasons = coverage_report(dir, GrammarChecker(tokenizer), limit=limit, relax=tuple(relax),
                                        seconds=seconds)
    if json_:
        typer.echo(json.dumps({"datasets": datasets}, ensure_ascii=False))
        return
    columns = ["total", "compiled", "lark_ok", "llguidance_ok", "xgrammar_ok", *EXACTNESS_KEYS]
    widths = [len(k) + 2 for k in columns]
    typer.echo(f"{'dataset':<16}" + "".join(f"{k:>{w}}" for k, w in zip(columns, widths, strict=True)))
    for name, c in datasets.items():
        share = (c["exact"] or 0) / c["total"] if c["total"] else 0.0
        cells = "".join(f"{'-' if c[k] is None else c[k]:>{w}}" for k, w in zip(columns, widths, strict=True))
        exact = "exactness not checked" if c["exact"] is None else f"{share:.1%} exact"
        typer.echo(f"{name:<16}{cells}   ({exact}, {c['seconds']} s)")
    for name, c in datasets.items():
        for kind, example in c["examples"].items():
            typer.echo(f"{name}: {kind}: {example['schema']}: {example['text'][:160]}")
    if reasons:
        typer.echo("\nmost frequent failures:")
        for reason, n in reasons.most_common(25):
            typer.echo(f"{n:>5}  {reason}")
