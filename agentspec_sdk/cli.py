"""The `agentspec` command. Sub-commands live beside the code they drive and are imported lazily
where they pull heavy dependencies (vllm, matplotlib)."""

from __future__ import annotations

import typer

from agentspec_sdk.law.cli import app as law_app
from agentspec_sdk.structure.cli import coverage

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
app.add_typer(law_app, name="law")
app.command("coverage")(coverage)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
