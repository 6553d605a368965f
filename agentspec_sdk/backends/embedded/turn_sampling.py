"""A turn's sampling parameters for vLLM: its grammar (the turn grammar of its format, tools and
tool choice, or the caller's own), checked once with llguidance so that a bad grammar fails the
turn with the reason instead of failing inside vLLM."""

from __future__ import annotations

from agentspec_sdk.backends.types import TurnRequest
from agentspec_sdk.errors import BackendError
from agentspec_sdk.structure.formats import AgentFormat
from agentspec_sdk.structure.tools import ToolRegistry
from agentspec_sdk.structure.turn_grammar import turn_grammar

__all__ = ["TurnSampling"]

MAX_CHECKED = 512  # grammars whose check result is kept (a turn grammar is rebuilt per tool set)


class TurnSampling:
    def __init__(self) -> None:
        self._errors: dict[str, str] = {}

    def params(self, req: TurnRequest, fmt: AgentFormat, registry: ToolRegistry):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        grammar = req.grammar
        if grammar is None:
            grammar = turn_grammar(fmt, registry, tool_choice=req.tool_choice)
        structured = None
        if grammar:
            error = self.check(grammar)
            if error:
                raise BackendError(f"grammar failed to compile: {error}")
            structured = StructuredOutputsParams(grammar=grammar)
        return SamplingParams(temperature=req.temperature, max_tokens=req.max_tokens,
                              stop=list(fmt.stop) or None, structured_outputs=structured,
                              logprobs=req.logprobs, output_kind=RequestOutputKind.CUMULATIVE)

    def check(self, grammar: str) -> str:
        """llguidance's complaint about `grammar` ('' when it compiles); cached."""
        if grammar not in self._errors:
            import llguidance

            try:
                error = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(grammar))
            except Exception as exc:  # llguidance raises on some malformed inputs instead of reporting
                error = str(exc)
            if len(self._errors) > MAX_CHECKED:
                self._errors.clear()
            self._errors[grammar] = error.strip()
        return self._errors[grammar]
