"""`@agentspec`: adapt an existing LangGraph agent builder through its own parameters.

The decorator hands its pieces to the builder through parameters the builder declares, by the names
of LangChain's own extension points, and the builder passes them on where LangChain takes them:

- `model` (or `llm`, `chat_model`): our `ChatAgentSpec`, whatever model the caller passed (required);
- `tools`: registered with the engine before the body runs (passed on as given);
- `middleware`: a list with the `AgentSpecMiddleware` first, then the middleware the caller passed
  (an `AgentSpecMiddleware` the caller passed is used instead of a new one), for
  `create_agent(model, tools, middleware=middleware)` (shape A);
- `wrap_tool_call` / `awrap_tool_call`: the middleware's tool wrappers (timeouts, errors → ToolMessage,
  idle/active), composed outside a wrapper the caller passed, for
  `ToolNode(tools, wrap_tool_call=wrap_tool_call, awrap_tool_call=awrap_tool_call)` (shape B:
  a `StateGraph` whose model node uses the `model` parameter, e.g. `model.bind_tools(tools)`).

Nothing is replaced in any module: the builder's body decides where each piece goes, so builders that
run at once in several threads each see only their own pieces. The builder must return the graph
(compiled, or the `StateGraph` builder); it carries `graph.agentspec` (an `AgentSpecBinding`: model,
middleware, records, acceptance); the decorated function keeps the latest one in `fn.agentspec`.

Refused with `AgentSpecError`: an `async def` builder, a builder without a model parameter or without
a parameter for the middleware or the tool wrappers (at decoration), a return value that is not a graph.
"""

from __future__ import annotations

import functools
import inspect
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from langgraph.graph import StateGraph
from langgraph.pregel import Pregel

from agentspec_langgraph import _sdk
from agentspec_langgraph._sdk import AgentSpecError
from agentspec_langgraph.chat_model import ChatAgentSpec
from agentspec_langgraph.middleware import AgentSpecMiddleware

if TYPE_CHECKING:
    from agentspec_sdk import AgentEngine
from agentspec_langgraph.records import TurnRecord
from agentspec_langgraph.tools import registry_from_tools

MODEL_PARAMS = ("model", "llm", "chat_model")
MIDDLEWARE_PARAM = "middleware"
WRAPPER_PARAMS = ("wrap_tool_call", "awrap_tool_call")


@dataclass
class AgentSpecBinding:
    """What `@agentspec` handed one build of the agent."""

    model: ChatAgentSpec
    middleware: AgentSpecMiddleware
    handed: tuple[str, ...] = ()  # the builder's parameters that received our pieces
    tools: list[str] = field(default_factory=list)

    @property
    def engine(self) -> AgentEngine:
        return self.model.engine

    @property
    def records(self) -> list[TurnRecord]:
        return self.middleware.records

    def acceptance(self) -> dict[str, dict[str, Any]]:
        return self.middleware.acceptance()


def agentspec(
    fn: Callable[..., Any] | None = None,
    *,
    engine: AgentEngine | None = None,
    model: ChatAgentSpec | None = None,
    fmt: str = "auto",
    max_tokens: int = 256,
    agent_id: str | None = None,
    reasoning: bool = True,
    tool_timeout_s: float | None = 30.0,
    tool_timeouts: dict[str, float | None] | None = None,
    first_tool_choice: str | None = None,
    later_tool_choice: str | None = None,
    **engine_kwargs: Any,
) -> Any:
    """Decorate an agent builder (see the module doc for the parameters it receives).

    `model`: a ready `ChatAgentSpec`; else one is made on `engine` (default: an embedded `Engine`
    created on first use with `engine_kwargs`, shared by every call of this builder) with `fmt`,
    `max_tokens`, `agent_id` and `reasoning`. `tool_timeout_s`, `tool_timeouts`, `first_tool_choice` and
    `later_tool_choice` configure the `AgentSpecMiddleware` (see there).
    """
    if fn is None:
        return lambda f: agentspec(
            f, engine=engine, model=model, fmt=fmt, max_tokens=max_tokens, agent_id=agent_id,
            reasoning=reasoning,
            tool_timeout_s=tool_timeout_s, tool_timeouts=tool_timeouts, first_tool_choice=first_tool_choice,
            later_tool_choice=later_tool_choice, **engine_kwargs,
        )  # fmt: skip
    signature = inspect.signature(fn)
    model_param = _check_builder(fn, signature)
    handed = (model_param, *(p for p in (MIDDLEWARE_PARAM, *WRAPPER_PARAMS) if p in signature.parameters))
    pieces = _Pieces(engine, model, engine_kwargs, dict(fmt=fmt, max_tokens=max_tokens, reasoning=reasoning),
                     dict(agent_id=agent_id, tool_timeout_s=tool_timeout_s, tool_timeouts=tool_timeouts,
                          first_tool_choice=first_tool_choice, later_tool_choice=later_tool_choice))

    @functools.wraps(fn)
    def build(*args: Any, **kwargs: Any) -> Any:
        result, build.agentspec = _build(fn, signature, model_param, handed, pieces, args, kwargs)
        return result

    build.agentspec = None
    return build


class _Pieces:
    """The model and middleware each build of one decorated builder gets: a ready model, or one made
    on an engine shared by every build (made on first use, once even when builds run in several
    threads); a middleware the caller passed, or a new one with the decorator's settings."""

    def __init__(self, engine: AgentEngine | None, model: ChatAgentSpec | None, engine_kwargs: dict[str, Any],
                 model_settings: dict[str, Any], middleware_settings: dict[str, Any]):
        self._engine, self._model, self._engine_kwargs = engine, model, engine_kwargs
        self._model_settings, self._middleware_settings = model_settings, middleware_settings
        self._lock = threading.Lock()

    def model(self) -> ChatAgentSpec:
        if self._model is not None:
            return self._model
        with self._lock:  # builds in several threads share one engine
            if self._engine is None:
                self._engine = _sdk.new_engine(**self._engine_kwargs)
        return ChatAgentSpec(engine=self._engine, **self._model_settings)

    def middleware(self, base: ChatAgentSpec, given: list[Any]) -> AgentSpecMiddleware:
        own = next((m for m in given if isinstance(m, AgentSpecMiddleware)), None)
        if own is not None:
            return own
        settings = dict(self._middleware_settings)
        agent_id = settings.pop("agent_id") or base.agent_id or f"agent-{uuid.uuid4().hex[:8]}"
        return AgentSpecMiddleware(agent_id=agent_id, engine=base.engine, **settings)


def _build(fn: Callable[..., Any], signature: inspect.Signature, model_param: str, handed: tuple[str, ...],
           pieces: _Pieces, args: tuple, kwargs: dict[str, Any]) -> tuple[Any, AgentSpecBinding]:
    """One build: the builder called with our pieces in its parameters; the graph and its binding."""
    bound = signature.bind_partial(*args, **kwargs)
    given = list(bound.arguments.get(MIDDLEWARE_PARAM) or ())
    base = pieces.model()
    mw = pieces.middleware(base, given)
    chat = base.model_copy(update={"agent_id": mw.agent_id, "recorder": mw.log})
    binding = AgentSpecBinding(model=chat, middleware=mw, handed=handed)
    bound.arguments[model_param] = chat
    if MIDDLEWARE_PARAM in signature.parameters:
        bound.arguments[MIDDLEWARE_PARAM] = given if mw in given else [mw, *given]
    for name in WRAPPER_PARAMS:
        if name in signature.parameters:
            bound.arguments[name] = _tool_wrapper(name, mw, bound.arguments.get(name))
    if bound.arguments.get("tools"):
        _register(binding, bound.arguments["tools"])
    result = fn(*bound.args, **bound.kwargs)
    _check_result(fn, result, binding)
    try:
        result.agentspec = binding
    except AttributeError:  # a graph class with __slots__: the binding stays on the function
        pass
    return result, binding


def _check_builder(fn: Callable[..., Any], signature: inspect.Signature) -> str:
    """The builder's model parameter; `AgentSpecError` for a builder the decorator cannot hand its pieces."""
    where = f"@agentspec: {fn.__qualname__}"
    if inspect.iscoroutinefunction(fn):
        raise AgentSpecError(
            f"{where} is an async def; decorate the plain def that builds the graph "
            "(run the graph with ainvoke/astream as usual)"
        )
    found = f"its parameters: {list(signature.parameters)}"
    model_param = next((p for p in MODEL_PARAMS if p in signature.parameters), None)
    if model_param is None:
        raise AgentSpecError(
            f"{where} has no parameter named one of {list(MODEL_PARAMS)}, so it cannot receive the "
            f"ChatAgentSpec ({found}); take the model as a parameter and build the agent with it"
        )
    if not any(p in signature.parameters for p in (MIDDLEWARE_PARAM, *WRAPPER_PARAMS)):
        raise AgentSpecError(
            f"{where} has no parameter to receive the AgentSpecMiddleware ({found}): add "
            f"'{MIDDLEWARE_PARAM}=()' and pass it on, create_agent(model, tools, middleware=middleware), "
            "or 'wrap_tool_call=None, awrap_tool_call=None' for "
            "ToolNode(tools, wrap_tool_call=wrap_tool_call, awrap_tool_call=awrap_tool_call)"
        )
    return model_param


def _register(binding: AgentSpecBinding, tools: Any) -> None:
    registry = registry_from_tools(tools)
    names = [t.name for t in registry.tools]
    binding.tools.extend(n for n in names if n not in binding.tools)
    register = getattr(binding.engine, "register_tools", None)
    if register is not None:
        register(registry)


def _tool_wrapper(name: str, mw: AgentSpecMiddleware, inner: Any) -> Callable[..., Any]:
    """The middleware's tool wrapper for ToolNode's `wrap_tool_call` / `awrap_tool_call`, outside `inner`."""
    if name == "wrap_tool_call":
        if inner is None:
            return mw.wrap_tool_call

        def wrap(request: Any, execute: Any) -> Any:
            return mw.wrap_tool_call(request, lambda r: inner(r, execute))

        return wrap
    if inner is None:
        return mw.awrap_tool_call

    async def awrap(request: Any, execute: Any) -> Any:
        return await mw.awrap_tool_call(request, lambda r: inner(r, execute))

    return awrap


def _check_result(fn: Callable[..., Any], result: Any, binding: AgentSpecBinding) -> None:
    if not isinstance(result, Pregel | StateGraph):
        raise AgentSpecError(
            f"@agentspec: {fn.__qualname__} must return the agent graph (create_agent's result or a "
            f"StateGraph / compiled graph), not {type(result).__name__} (handed: {list(binding.handed)})"
        )
