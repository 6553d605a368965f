"""Where the engine's own output goes while a command runs.

vLLM, torch and Triton write to the process's file descriptors 1 and 2: vLLM's logging, Python
warnings (`FutureWarning`s from vLLM's modules), C++ warnings (NUMA binding), the weight loader's
progress bars. vLLM's engine-core processes (and the replay runner's engine processes) inherit those
descriptors, so configuring Python's logging in this process cannot catch their output.
`engine_log(path)` points descriptors 1 and 2 at `path` while the engine lives, for this process and
every process it starts meanwhile, and hands back a stream on the terminal's stderr for what the user
should see (the progress bar).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

ENGINE_LOG = "vllm.log"  # the file's name beside a command's report


@contextmanager
def engine_log(path: Path | None) -> Iterator[TextIO]:
    """Inside: whatever this process or a process it starts writes to stdout or stderr goes to `path`
    (created or emptied); yields a line-buffered stream on the original stderr. `path` None: nothing
    is redirected and the stream is `sys.stderr`."""
    if path is None:
        yield sys.stderr
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    _flush()
    # O_APPEND: several processes write to the file at once, each write lands at its end
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    saved = (os.dup(1), os.dup(2))
    terminal = os.fdopen(os.dup(saved[1]), "w", buffering=1, encoding="utf-8", errors="replace")
    try:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        yield terminal
    finally:
        _flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log_fd):
            os.close(fd)
        terminal.close()


def _flush() -> None:
    """Python's buffered stdout/stderr written out to the descriptor they belong to now."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed or broken stream has nothing left to write
                pass


def tail(path: Path, lines: int = 20) -> list[str]:
    """The last `lines` lines of the log (progress bars' carriage-return updates as lines too)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [ln for ln in text.replace("\r", "\n").splitlines() if ln.strip()][-lines:]
