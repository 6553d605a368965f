"""`agentspec draft make --layers K [--model M] [--out DIR]`: a layer-truncated draft model folder.

Registered by agentspec_sdk/cli.py as the `draft` sub-command group.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from agentspec_sdk.errors import AgentSpecError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Draft models for speculation='draft_model' / 'structure+draft_model'.")


@app.command("make")
def make(layers: Annotated[int, typer.Option("--layers", help="decoder layers kept (the first K)")],
         model: Annotated[str | None, typer.Option(help="HF folder or bundled name; default: the "
                                                        "default bundle")] = None,
         out: Annotated[Path | None, typer.Option(
             help="folder to write; default: $AGENTSPEC_CACHE/drafts/<model>-L<K>")] = None) -> None:
    """Write the first K decoder layers of the target (same embeddings, norm, tied head, tokenizer)."""
    from agentspec_sdk.backends.serving.draft_models import make_truncated_draft

    try:
        folder = make_truncated_draft(layers, model, out)
    except AgentSpecError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(str(folder))
