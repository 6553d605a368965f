"""`Engine(capture=DIR)`: each finished turn of the embedded engine into a capture directory
(`backends.capture`, format v1, docs/capture.md): the prompt and output token ids vLLM reports, the
temperature, the grammar as sent (the turn's Lark grammar), the format, the tool set the prompt
showed and the request's `agent_id` as the episode. One writer per process and directory
(`capture.writer_for`), so several engines in one process share its files."""

from __future__ import annotations

import time

from agentspec_sdk.backends.capture import CaptureWriter, Grammar, writer_for
from agentspec_sdk.backends.types import TurnRequest, TurnResult, as_registry
from agentspec_sdk.structure.formats import AgentFormat
from agentspec_sdk.structure.tools import ToolRegistry

__all__ = ["TurnCapture"]


class TurnCapture:
    def __init__(self, writer: CaptureWriter, registry: ToolRegistry):
        self.writer = writer
        self.registry = registry  # the engine's: the tools a turn without its own tool set is shown

    @classmethod
    def open(cls, directory, model: str, registry: ToolRegistry, sample: float = 1.0) -> TurnCapture | None:
        """The engine's capture into `directory` (None: no directory, nothing captured)."""
        if directory is None:
            return None
        return cls(writer_for(directory, writer="engine", model=str(model), sample=sample), registry)

    def record(self, req: TurnRequest, fmt: AgentFormat, sampling, result: TurnResult) -> None:
        structured = getattr(sampling, "structured_outputs", None)
        grammar = getattr(structured, "grammar", None)
        tools = (as_registry(req.tools) if req.tools is not None else self.registry).openai_tools()
        finished = time.time()
        self.writer.write_turn(
            id=result.request_id, episode=req.agent_id, prompt=result.prompt_token_ids, out=result.token_ids,
            temperature=float(sampling.temperature), grammar=Grammar("lark", grammar) if grammar else None,
            format=fmt.name, tools=tools or None, started=finished - result.timings.get("e2e_s", 0.0),
            finished=finished, finish_reason=result.finish_reason)
