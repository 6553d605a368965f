"""`AgentSpecMiddleware` for LangChain v1 `create_agent(model, tools, middleware=[...])`.

Model calls: when the agent's model is a `ChatAgentSpec`, the middleware derives the turn grammar from
`request.tools` and the tool choice, and hands it to the model call through `request.model_settings`
(create_agent passes model settings to `model.bind_tools(tools, **model_settings)`), together with
the agent id and its record log. Other models pass through untouched.

Tool calls: the agent's sequence is marked idle in the engine while its tools run and active again
after (overlapping tool calls of one agent are counted), each tool runs under a timeout, and a tool
that raises, times out or rejects its arguments becomes a `ToolMessage` with `status="error"` that
goes back to the model: the agent loop never crashes on a tool.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from agentspec_langgraph.chat_model import AGENT_ID, GRAMMAR, RECORDER, ChatAgentSpec
from agentspec_langgraph.records import RecordLog, TurnRecord, agent_key, current_config
from agentspec_langgraph.tools import openai_tool

ToolResult = ToolMessage | Command


class AgentSpecMiddleware(AgentMiddleware):
    """Grammar injection, idle/active marking, acceptance records and safe tool execution.

    - `agent_id`: names this agent's sequence in the engine. With a LangGraph `thread_id` in the run's
      config the id is `"{agent_id}:{thread_id}"` (just the thread id when `agent_id` is None), so one
      compiled agent serving several threads keeps them apart; with neither, a random `agent-…` id.
    - `tool_timeout_s`: seconds a tool may run (None: no limit); `tool_timeouts` per tool name.
    - `engine`: where to mark idle/active; by default the engine of the `ChatAgentSpec` it has seen.
    - `first_tool_choice` / `later_tool_choice`: the tool choice of the first model call after a user
      message / of the calls after tool results, when the agent sets none (e.g. "required" then
      "none": one round of tool calls, then an answer — a short leash for a small model).
    """

    def __init__(
        self,
        *,
        agent_id: str | None = None,
        tool_timeout_s: float | None = 30.0,
        tool_timeouts: Mapping[str, float | None] | None = None,
        engine: Any = None,
        first_tool_choice: str | None = None,
        later_tool_choice: str | None = None,
    ) -> None:
        super().__init__()
        self.agent_id = agent_id
        self.tool_timeout_s = tool_timeout_s
        self.tool_timeouts = dict(tool_timeouts or {})
        self.engine = engine
        self.first_tool_choice = first_tool_choice
        self.later_tool_choice = later_tool_choice
        self.log = RecordLog()
        self.grammars: dict[str, str] = {}
        self._lock = threading.Lock()
        self._pending: dict[str, set[str]] = {}  # agent → tool call ids of its round not yet done
        self._default_id = f"agent-{uuid.uuid4().hex[:8]}"

    # -- records -------------------------------------------------------------------------------

    @property
    def records(self) -> list[TurnRecord]:
        """One record per model call, in call order: agent id, tool calls, acceptance per class."""
        return self.log.records

    def acceptance(self) -> dict[str, dict[str, Any]]:
        """Drafted / accepted / rate per law class (S, R, F) over all recorded turns."""
        return self.log.totals()

    # -- model calls ---------------------------------------------------------------------------

    def wrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]
    ) -> ModelResponse:
        return handler(self._prepare(request))

    async def awrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]]
    ) -> ModelResponse:
        return await handler(self._prepare(request))

    def _prepare(self, request: ModelRequest) -> ModelRequest:
        model = request.model
        agent = self._agent_id(current_config())
        if self.engine is None and isinstance(model, ChatAgentSpec):
            self.engine = model.engine
        self._model_turn(agent)
        if not isinstance(model, ChatAgentSpec):
            return request
        if request.tool_choice is None:
            choice = self.later_tool_choice if _after_tools(request.messages) else self.first_tool_choice
            if choice is not None:
                request = request.override(tool_choice=choice)
        tools = [openai_tool(t) for t in request.tools]
        grammar = model.grammar_for(tools, request.tool_choice)
        self.grammars[agent] = grammar
        settings = {**request.model_settings, GRAMMAR: grammar, AGENT_ID: agent, RECORDER: self.log}
        return request.override(model_settings=settings)

    # -- tool calls ----------------------------------------------------------------------------

    def wrap_tool_call(self, request: ToolCallRequest,
                       handler: Callable[[ToolCallRequest], ToolResult]) -> ToolResult:
        agent = self._agent_id(getattr(request.runtime, "config", None))
        timeout = self._timeout(request)
        self._tool_started(agent, request)
        try:
            return _call_with_timeout(lambda: handler(request), timeout)
        except GraphBubbleUp:
            raise
        except _TimedOut:
            return _timeout_message(request, timeout)
        except Exception as exc:
            return _error_message(request, exc)
        finally:
            self._tool_finished(agent, request.tool_call["id"])

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[ToolResult]]
    ) -> ToolResult:
        agent = self._agent_id(getattr(request.runtime, "config", None))
        timeout = self._timeout(request)
        self._tool_started(agent, request)
        try:
            task = asyncio.ensure_future(handler(request))
            done, _ = await asyncio.wait({task}, timeout=timeout)
            if not done:
                task.cancel()
                return _timeout_message(request, timeout)
            return task.result()
        except GraphBubbleUp:
            raise
        except Exception as exc:
            return _error_message(request, exc)
        finally:
            self._tool_finished(agent, request.tool_call["id"])

    def _timeout(self, request: ToolCallRequest) -> float | None:
        return self.tool_timeouts.get(request.tool_call["name"], self.tool_timeout_s)

    def _tool_started(self, agent: str, request: ToolCallRequest) -> None:
        """The first tool of a round marks the agent idle; the round is the calls of its last AI turn."""
        with self._lock:
            pending = self._pending.get(agent)
            first = pending is None
            if first:
                pending = self._pending[agent] = _round_call_ids(request.state)
            pending.add(request.tool_call["id"])
        if first:
            self._mark("mark_idle", agent)

    def _tool_finished(self, agent: str, call_id: str) -> None:
        """The agent is active again when every call of its round is done (parallel calls may not
        overlap in time: counting running tools would flap idle/active between them)."""
        with self._lock:
            pending = self._pending.get(agent)
            if pending is None:
                return
            pending.discard(call_id)
            done = not pending
            if done:
                del self._pending[agent]
        if done:
            self._mark("mark_active", agent)

    def _model_turn(self, agent: str) -> None:
        """A model call ends any round still open (a call some other middleware never let run)."""
        with self._lock:
            open_round = self._pending.pop(agent, None) is not None
        if open_round:
            self._mark("mark_active", agent)

    def _mark(self, verb: str, agent: str) -> None:
        mark = getattr(self.engine, verb, None) if self.engine is not None else None
        if mark is not None:
            mark(agent)

    def _agent_id(self, config: Mapping[str, Any] | None) -> str:
        return agent_key(self.agent_id, config) or self._default_id


def _round_call_ids(state: Any) -> set[str]:
    """Ids of the tool calls of the last AI message in the agent state (empty when unknown)."""
    messages = state.get("messages") if isinstance(state, dict) else getattr(state, "messages", state)
    if not isinstance(messages, list):
        return set()
    for m in reversed(messages):
        if isinstance(m, AIMessage):
            return {c["id"] for c in m.tool_calls if c.get("id")}
    return set()


def _after_tools(messages: list[Any]) -> bool:
    """True when tool results came in since the last user message."""
    for m in reversed(messages):
        if isinstance(m, ToolMessage):
            return True
        if isinstance(m, HumanMessage):
            return False
    return False


class _TimedOut(Exception):
    """The tool ran past its timeout (distinct from a TimeoutError the tool raises itself)."""


def _call_with_timeout(fn: Callable[[], ToolResult], timeout: float | None) -> ToolResult:
    """Run `fn` on a daemon thread; `_TimedOut` if it has not returned after `timeout` seconds.

    A Python thread cannot be killed: a tool that hangs keeps its thread until it returns, but the
    agent goes on without it.
    """
    if timeout is None:
        return fn()
    box: dict[str, Any] = {}
    finished = threading.Event()
    context = contextvars.copy_context()

    def run() -> None:
        try:
            box["value"] = context.run(fn)
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc
        finally:
            finished.set()

    threading.Thread(target=run, name="agentspec-tool", daemon=True).start()
    if not finished.wait(timeout):
        raise _TimedOut
    if "error" in box:
        raise box["error"]
    return box["value"]


def _error_message(request: ToolCallRequest, exc: BaseException) -> ToolMessage:
    call = request.tool_call
    return ToolMessage(
        content=f"Error: tool {call['name']!r} failed with {type(exc).__name__}: {exc}",
        name=call["name"],
        tool_call_id=call["id"],
        status="error",
    )


def _timeout_message(request: ToolCallRequest, timeout: float | None) -> ToolMessage:
    call = request.tool_call
    return ToolMessage(
        content=f"Error: tool {call['name']!r} did not finish within {timeout:g} s (timed out)",
        name=call["name"],
        tool_call_id=call["id"],
        status="error",
    )
