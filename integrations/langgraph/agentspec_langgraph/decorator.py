"""`@agentspec`: adapt an existing LangGraph agent builder without editing its body.

Supported shapes (the decorated function is a plain `def` that builds and returns the agent):

A. It calls `create_agent(model, tools, ...)` from `langchain.agents` (imported at module level,
   inside the function, or called as `langchain.agents.create_agent`). Each such call gets our
   `ChatAgentSpec` as its model (whatever model it named: an object, a string, the function's own
   argument), its tools registered with the engine, and an `AgentSpecMiddleware` put first in
   `middleware` (unless one is already there).
B. It builds a `StateGraph` whose model node uses the function's `model` (or `llm`, `chat_model`)
   parameter, e.g. `model.bind_tools(tools)`, and whose tool node is `ToolNode(tools)` from
   `langgraph.prebuilt`. The parameter receives our `ChatAgentSpec`; each `ToolNode` built while the
   function runs gets the middleware's tool wrapper (timeouts, errors → ToolMessage, idle/active).

In both shapes a `tools` parameter, when passed, is registered with the engine before the body runs,
and the function must return the graph (compiled, or the `StateGraph` builder). The returned graph
carries `graph.agentspec` (an `AgentSpecBinding`: model, middleware, records, acceptance); the
decorated function keeps the latest one in `fn.agentspec`.

Anything else raises `AgentSpecError` naming what was found: an `async def` builder; shape B without
a model parameter; no `create_agent` call and no `ToolNode` built; a return value that is not a graph.
While the builder runs, `create_agent` / `ToolNode` are swapped in its module globals and in
`langchain.agents` / `langgraph.prebuilt` under a process-wide lock, and restored afterwards.
"""

from __future__ import annotations

import functools
import inspect
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import langchain.agents
import langgraph.prebuilt
from langgraph.graph import StateGraph
from langgraph.prebuilt import ToolNode
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
_PATCH_LOCK = threading.RLock()
_ORIGINAL_CREATE_AGENT = langchain.agents.create_agent
_ORIGINAL_TOOL_NODE = ToolNode


@dataclass
class AgentSpecBinding:
    """What `@agentspec` put into one built agent."""

    model: ChatAgentSpec
    middleware: AgentSpecMiddleware
    create_agent_calls: int = 0
    tool_nodes: int = 0
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
    """Decorate an agent builder (see the module doc for the supported shapes).

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
    if inspect.iscoroutinefunction(fn):
        raise AgentSpecError(
            f"@agentspec: {fn.__qualname__} is an async def; decorate the plain def that builds the graph "
            "(run the graph with ainvoke/astream as usual)"
        )
    signature = inspect.signature(fn)
    model_param = next((p for p in MODEL_PARAMS if p in signature.parameters), None)
    shared: dict[str, Any] = {}

    def make_model() -> ChatAgentSpec:
        if model is not None:
            return model
        if "engine" not in shared:
            shared["engine"] = engine if engine is not None else _sdk.new_engine(**engine_kwargs)
        return ChatAgentSpec(engine=shared["engine"], fmt=fmt, max_tokens=max_tokens, reasoning=reasoning)

    @functools.wraps(fn)
    def build(*args: Any, **kwargs: Any) -> Any:
        base = make_model()
        mw = AgentSpecMiddleware(
            agent_id=agent_id or base.agent_id or f"agent-{uuid.uuid4().hex[:8]}",
            tool_timeout_s=tool_timeout_s,
            tool_timeouts=tool_timeouts,
            engine=base.engine,
            first_tool_choice=first_tool_choice,
            later_tool_choice=later_tool_choice,
        )
        chat = base.model_copy(update={"agent_id": mw.agent_id, "recorder": mw.log})
        binding = AgentSpecBinding(model=chat, middleware=mw)
        bound = signature.bind(*args, **kwargs)
        if model_param is not None:
            bound.arguments[model_param] = chat
        if bound.arguments.get("tools"):
            _register(binding, bound.arguments["tools"])
        with _PATCH_LOCK, _patched(fn, binding):
            result = fn(*bound.args, **bound.kwargs)
        _check_shape(fn, result, binding, model_param)
        try:
            result.agentspec = binding
        except AttributeError:  # a graph class with __slots__: the binding stays on the function
            pass
        build.agentspec = binding
        return result

    build.agentspec = None
    return build


def _register(binding: AgentSpecBinding, tools: Any) -> None:
    registry = registry_from_tools(tools)
    names = [t.name for t in registry.tools]
    binding.tools.extend(n for n in names if n not in binding.tools)
    register = getattr(binding.engine, "register_tools", None)
    if register is not None:
        register(registry)


class _patched:
    """Swap `create_agent` and `ToolNode` for the builder's run, in its globals and the source modules."""

    def __init__(self, fn: Callable[..., Any], binding: AgentSpecBinding) -> None:
        self.binding = binding
        self.targets: list[tuple[Any, str, Any]] = []
        replacements = {
            id(_ORIGINAL_CREATE_AGENT): _create_agent_for(binding),
            id(_ORIGINAL_TOOL_NODE): _tool_node_for(binding),
        }
        namespace = fn.__globals__
        for name, value in list(namespace.items()):
            if id(value) in replacements:
                self.targets.append((namespace, name, replacements[id(value)]))
        self.targets.append((vars(langchain.agents), "create_agent",
                             replacements[id(_ORIGINAL_CREATE_AGENT)]))
        self.targets.append((vars(langgraph.prebuilt), "ToolNode", replacements[id(_ORIGINAL_TOOL_NODE)]))

    def __enter__(self) -> None:
        self.saved = [(ns, name, ns[name]) for ns, name, _ in self.targets]
        for ns, name, new in self.targets:
            ns[name] = new

    def __exit__(self, *exc: Any) -> None:
        for ns, name, old in reversed(self.saved):
            ns[name] = old


def _create_agent_for(binding: AgentSpecBinding) -> Callable[..., Any]:
    @functools.wraps(_ORIGINAL_CREATE_AGENT)
    def create_agent(model: Any = None, tools: Any = None, *args: Any, middleware: Any = (),
                     **kwargs: Any) -> Any:
        binding.create_agent_calls += 1
        if tools:
            _register(binding, tools)
        middleware = list(middleware or ())
        if not any(isinstance(m, AgentSpecMiddleware) for m in middleware):
            middleware.insert(0, binding.middleware)
        return _ORIGINAL_CREATE_AGENT(binding.model, tools, *args, middleware=middleware, **kwargs)

    return create_agent


def _tool_node_for(binding: AgentSpecBinding) -> type:
    mw = binding.middleware

    class AgentSpecToolNode(_ORIGINAL_TOOL_NODE):
        """A ToolNode whose calls go through AgentSpecMiddleware's tool wrapper first."""

        def __init__(self, tools: Any, *args: Any, wrap_tool_call: Any = None, awrap_tool_call: Any = None,
                     **kw: Any):
            binding.tool_nodes += 1
            _register(binding, tools)
            sync_inner, async_inner = wrap_tool_call, awrap_tool_call

            def wrap(request: Any, execute: Any) -> Any:
                inner = (lambda r: sync_inner(r, execute)) if sync_inner else execute
                return mw.wrap_tool_call(request, inner)

            async def awrap(request: Any, execute: Any) -> Any:
                inner = (lambda r: async_inner(r, execute)) if async_inner else execute
                return await mw.awrap_tool_call(request, inner)

            super().__init__(tools, *args, wrap_tool_call=wrap, awrap_tool_call=awrap, **kw)

    AgentSpecToolNode.__name__ = AgentSpecToolNode.__qualname__ = "ToolNode"
    return AgentSpecToolNode


def _check_shape(fn: Callable[..., Any], result: Any, binding: AgentSpecBinding,
                 model_param: str | None) -> None:
    where = f"@agentspec: {fn.__qualname__}"
    found = (
        f"found {binding.create_agent_calls} create_agent call(s), {binding.tool_nodes} ToolNode(s), "
        f"model parameter: {model_param or 'none'}, returned {type(result).__name__}"
    )
    if binding.create_agent_calls == 0 and binding.tool_nodes == 0:
        raise AgentSpecError(
            f"{where} built no agent it can adapt ({found}). Supported: a builder that calls "
            "langchain.agents.create_agent(model, tools, ...), or one that builds a StateGraph with "
            "langgraph.prebuilt.ToolNode(tools) and calls bind_tools on its 'model'/'llm' parameter"
        )
    if binding.create_agent_calls == 0 and model_param is None:
        raise AgentSpecError(
            f"{where} builds a StateGraph with a ToolNode but has no parameter named one of "
            f"{list(MODEL_PARAMS)}, so its model cannot be swapped ({found})"
        )
    if not isinstance(result, Pregel | StateGraph):
        raise AgentSpecError(
            f"{where} must return the agent graph (create_agent's result or a StateGraph / compiled "
            f"graph), not {type(result).__name__} ({found})"
        )
