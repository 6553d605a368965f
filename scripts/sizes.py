"""The house's size rule, checked on the source: no class over 300 lines, no function over 80
(`def` line to last line, decorators and docstring included), in `agentspec_sdk` and the LangGraph
integration.

    python scripts/sizes.py [--max-class 300] [--max-function 80] [PATH ...]

Prints each class or function over its limit as `path:line kind name lines`; exit status 1 when any is.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PATHS = (ROOT / "agentspec_sdk", ROOT / "integrations" / "langgraph" / "agentspec_langgraph")


def sizes(path: Path) -> Iterator[tuple[int, str, str, int]]:
    """(line, "class" | "function", qualified name, lines) of every class and function in `path`."""
    tree = ast.parse(path.read_text(), filename=str(path))

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[int, str, str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                name = f"{prefix}{child.name}"
                yield start, kind, name, child.end_lineno - start + 1
                yield from walk(child, f"{name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def oversized(paths, max_class: int, max_function: int) -> list[str]:
    limits = {"class": max_class, "function": max_function}
    found = []
    for root in paths:
        files = [root] if root.is_file() else sorted(root.rglob("*.py"))
        for path in files:
            for line, kind, name, lines in sizes(path):
                if lines > limits[kind]:
                    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                    found.append(f"{where}:{line} {kind} {name} {lines}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, default=list(DEFAULT_PATHS))
    parser.add_argument("--max-class", type=int, default=300)
    parser.add_argument("--max-function", type=int, default=80)
    args = parser.parse_args()
    found = oversized([p.resolve() for p in args.paths], args.max_class, args.max_function)
    print("\n".join(found) if found else f"no class over {args.max_class} lines, no function over "
          f"{args.max_function}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
