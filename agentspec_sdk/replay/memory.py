"""How many measuring engines fit in memory at once (Linux `/proc`; elsewhere unknown).

The runner starts a plan's engines one after another; before each further one it compares the
largest footprint measured so far (the resident memory of a started, warmed-up engine's process and
its children) with the memory the machine still has available. An engine's size depends on the model
far more than on the mode: SmolLM2-135M ≈ 3–4 GB here, Gemma 3 270M (a 262k-token vocabulary) ≈ 6–7 GB,
so a fixed number of live engines either wastes the interleaving on a small model or exhausts memory
on a larger one.
"""

from __future__ import annotations

from pathlib import Path

# A further engine starts only where the memory available stays above this many times the largest
# footprint measured: an engine grows past what its warm-up touched (KV blocks, activations of a
# batch, grammar caches), and other work on a shared machine moves.
MEMORY_MARGIN = 1.5
_PROC = Path("/proc")


def mem_available() -> int | None:
    """Bytes the kernel reports available (MemAvailable), None where /proc/meminfo is unreadable."""
    try:
        for line in (_PROC / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def tree_rss(pid: int) -> int | None:
    """Resident bytes of process `pid` and its descendants, None where /proc cannot tell."""
    total, seen, todo = 0, set(), [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            status = (_PROC / str(p) / "status").read_text()
        except OSError:
            if p == pid:
                return None
            continue  # a child that has just exited
        rss = next((line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")), "0")
        total += int(rss) * 1024
        for task in (_PROC / str(p) / "task").glob("*/children"):
            try:
                todo.extend(int(c) for c in task.read_text().split())
            except (OSError, ValueError):
                continue
    return total


def room_for_another(footprint: int | None, available: int | None, margin: float = MEMORY_MARGIN) -> bool:
    """Whether one more engine of `footprint` bytes fits in `available` bytes with `margin` to spare;
    unknown sizes (no /proc) count as room, the caller's cap on live engines then decides alone."""
    if footprint is None or available is None:
        return True
    return available >= margin * footprint
