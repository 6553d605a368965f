"""The `agentspec` command: demo, bench, record, replay, law, coverage, serve, draft, tune.

Sub-commands live beside the code they drive; vLLM is imported only when an engine is built."""

from __future__ import annotations

import typer

from agentspec_sdk.backends.serving.draft_cli import app as draft_app
from agentspec_sdk.backends.serving.serve_cli import serve
from agentspec_sdk.coverage.cli import coverage
from agentspec_sdk.law.cli import app as law_app
from agentspec_sdk.replay.cli import bench, demo, record, replay
from agentspec_sdk.tuning.cli import tune

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, help=__doc__)
for command in (demo, bench, record, replay, coverage, serve, tune):
    app.command(command.__name__)(command)
app.add_typer(law_app, name="law")
app.add_typer(draft_app, name="draft")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
