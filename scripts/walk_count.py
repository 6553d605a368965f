"""The walk of one request through agentspec_sdk: the modules `Engine.submit` enters, in order, and
where it comes back into a module it has left, or climbs back into a module that imports the caller.

    flock /tmp/agentspec-engine.lock python scripts/walk_count.py [--model M] [--fmt auto] [--all]

It starts the embedded engine (vLLM on CPU, speculation off, ≈ 40-70 s), submits one turn with a tool
and waits for it (on a fresh engine the turn grammar is built then), then traces a second submit of
the same turn with the same tools (the walk the target is about). `sys.setprofile` traces the calling thread
only, so a walk ends where `submit` hands the turn to the engine's own thread (`Engine._inbox`); vLLM's
stepping is not counted.

- a stop: a call into a module of `agentspec_sdk` from another module (a call inside a module is that
  module's own business; comprehensions, generator expressions and lambdas are their function's);
- modules: the distinct modules stopped at; stops − modules of them are re-entries (a stop at a
  module entered before);
- a climb: a stop whose module imports the caller's module (the import graph, `grimp`, the one
  import-linter reads, `if TYPE_CHECKING:` imports included): a callback from a lower room.

Target of issue 47: at most 15 stops in at most 8 modules, no module re-entered from a lower room
(no climb into a module entered before). `--all` prints every call into our code, indented by depth,
stops marked. Exit status 1 when the target is missed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "agentspec_sdk"
MAX_STOPS, MAX_MODULES = 15, 8
ANONYMOUS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>", "<lambda>")
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                   "unit": {"type": "string", "enum": ["C", "F"]}},
                   "required": ["city"]}}}


@dataclass
class Call:
    module: str
    function: str
    depth: int
    stop: bool  # entered from another module (or from outside our code)
    reentry: bool = False  # a stop at a module stopped at before
    climb: bool = False  # a stop whose module imports the caller's


@dataclass
class Walk:
    calls: list[Call] = field(default_factory=list)

    @property
    def stops(self) -> list[Call]:
        return [c for c in self.calls if c.stop]

    @property
    def modules(self) -> list[str]:
        return list(dict.fromkeys(c.module for c in self.stops))

    @property
    def reentries(self) -> int:
        return sum(c.reentry for c in self.stops)

    @property
    def climbs(self) -> int:
        return sum(c.climb for c in self.stops)

    @property
    def climbing_reentries(self) -> int:
        return sum(c.climb and c.reentry for c in self.stops)

    def meets_target(self) -> bool:
        return (len(self.stops) <= MAX_STOPS and len(self.modules) <= MAX_MODULES
                and self.climbing_reentries == 0)


def _module_of(frame) -> str | None:
    name = frame.f_globals.get("__name__", "")
    return name if name == PACKAGE or name.startswith(PACKAGE + ".") else None


def trace(call: Callable[[], object], imports: Callable[[str, str], bool]) -> tuple[Walk, object]:
    """`call()` under `sys.setprofile` (this thread): every call into our code, as a `Walk`.
    `imports(a, b)`: whether module `a` imports module `b`, directly or not."""
    walk = Walk()
    stack: list[str | None] = []  # the module of each open frame (None: not ours, or anonymous)
    seen: set[str] = set()

    def profile(frame, event, arg):
        if event == "call":
            module = _module_of(frame)
            if module is None or frame.f_code.co_name in ANONYMOUS:
                stack.append(None)
                return
            ours = [m for m in stack if m]
            caller = ours[-1] if ours else None
            c = Call(module, frame.f_code.co_qualname, len(ours), stop=module != caller)
            if c.stop:
                c.reentry = module in seen
                c.climb = caller is not None and imports(module, caller)
                seen.add(module)
            walk.calls.append(c)
            stack.append(module)
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(profile)
    try:
        result = call()
    finally:
        sys.setprofile(None)
    return walk, result


def import_graph() -> Callable[[str, str], bool]:
    import grimp

    graph = grimp.build_graph(PACKAGE, exclude_type_checking_imports=False)
    memo: dict[tuple[str, str], bool] = {}

    def imports(a: str, b: str) -> bool:
        if (a, b) not in memo:
            memo[a, b] = graph.chain_exists(importer=a, imported=b)
        return memo[a, b]

    return imports


def _short(module: str) -> str:
    return module.removeprefix(PACKAGE + ".")


def report(title: str, walk: Walk, show_all: bool, target: bool = True) -> str:
    lines = [f"== {title}"]
    if show_all:
        for c in walk.calls:
            mark = ("  <- stop" if c.stop else "") + (" re-entry" if c.reentry else "") + \
                   (" climb" if c.climb else "")
            lines.append(f"{'  ' * c.depth}{_short(c.module)}.{c.function}{mark}")
    lines.append(f"calls into our code: {len(walk.calls)}")
    lines.append(f"stops:      {len(walk.stops)} (target ≤ {MAX_STOPS}): "
                 + " → ".join(_short(c.module) for c in walk.stops))
    lines.append(f"modules:    {len(walk.modules)} (target ≤ {MAX_MODULES}): "
                 + ", ".join(_short(m) for m in walk.modules))
    lines.append(f"re-entries: {walk.reentries}")
    lines.append(f"climbs:     {walk.climbs}, {walk.climbing_reentries} of them re-entries (target 0)")
    if target:
        lines.append(f"target met: {walk.meets_target()}")
    return "\n".join(lines)


def measure(engine, fmt: str = "auto") -> list[tuple[str, Walk]]:
    """The walks of two submits of the same turn with the same tools on `engine` (each waited for)."""
    from agentspec_sdk.backends.types import TurnRequest

    imports = import_graph()
    walks = []
    for title in ("the first submit", "the second submit, the same tools (the target)"):
        req = TurnRequest(messages=[{"role": "user", "content": "Weather in Paris?"}], fmt=fmt,
                          tools=[TOOL], max_tokens=8)
        walk, future = trace(lambda r=req: engine.submit(r), imports)
        result = future.result()
        if not result.ok:
            raise RuntimeError(f"{title}: the turn failed: {result.error}")
        walks.append((title, walk))
    return walks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model (default: the engine's default model)")
    parser.add_argument("--fmt", default="auto", help="the turn's format (default: auto)")
    parser.add_argument("--all", action="store_true", help="print every call into our code")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

    from agentspec_sdk.backends.embedded.vllm_engine import Engine

    with Engine(model=args.model, speculation="off", max_model_len=2048, kv_cache_gb=1.0, seed=0) as engine:
        walks = measure(engine, args.fmt)
    for i, (title, walk) in enumerate(walks):
        print(report(title, walk, args.all, target=i == len(walks) - 1))
    return 0 if walks[-1][1].meets_target() else 1


if __name__ == "__main__":
    sys.exit(main())
