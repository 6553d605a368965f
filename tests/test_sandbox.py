"""The code sandbox: real processes, real limits, real namespaces (where the machine has them)."""

from __future__ import annotations

import socket
import subprocess
import threading
import time

import pytest

from agentspec_sdk.errors import SandboxError
from agentspec_sdk.sandbox import UID_BASE, UID_POOL, Sandbox, SandboxLimits, probe_isolation

# generous: the 2 cores here are shared with engines (a run starts in 0.12 s idle, ~2 s at load 12)
TIMEOUT = 5.0
ISOLATED = probe_isolation() != "none"
needs_isolation = pytest.mark.skipif(not ISOLATED, reason="no namespaces here (sandbox level 'none')")


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(SandboxLimits(timeout_s=TIMEOUT, cpu_s=30, output_bytes=4096))


def _sandbox_processes() -> list[str]:
    out = subprocess.run(["ps", "-eo", "uid=,pid=,args="], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines()
            if line.split() and UID_BASE <= int(line.split()[0]) < UID_BASE + UID_POOL]


def _timed(sandbox: Sandbox, code: str):
    start = time.perf_counter()
    result = sandbox.run(code)
    return result, time.perf_counter() - start


def test_runs_code_in_a_fresh_folder(sandbox):
    first = sandbox.run("import os\nopen('state.txt', 'w').write('x')\n"
                        "print(os.getcwd() == os.environ['HOME'])")
    assert first.ok, first.observation()
    assert first.output.strip() == "True"
    second = sandbox.run("import os\nprint(os.path.exists('state.txt'), sorted(os.listdir('.')))")
    assert second.ok and second.output.strip() == "False ['main.py']"


def test_failure_is_an_observation(sandbox):
    result = sandbox.run("def f():\n    raise ValueError('boom')\nf()")
    assert not result.ok and result.exit_code == 1
    assert "ValueError: boom" in result.observation() and result.observation().endswith("Error: exit code 1")


def test_infinite_loop_is_stopped_at_the_timeout(sandbox):
    result, wall = _timed(sandbox, "while True:\n    pass")
    assert not result.ok and result.timed_out
    assert "timed out" in result.observation()
    assert TIMEOUT <= wall < TIMEOUT + 2.0


def test_fork_bomb_is_contained_and_leaves_nothing(sandbox):
    result, wall = _timed(sandbox, "import os\nwhile True:\n    try:\n        os.fork()\n"
                                   "    except OSError:\n        pass")
    assert not result.ok and "Error:" in result.observation()
    assert wall < TIMEOUT + 2.0
    if ISOLATED:
        assert _sandbox_processes() == []


def test_memory_hog_fails_fast(sandbox):
    result, wall = _timed(sandbox, "blocks = []\nwhile True:\n    blocks.append(bytes(256 * 2**20))")
    assert not result.ok and not result.timed_out
    assert "MemoryError" in result.output and "memory limit" in result.error
    assert wall < TIMEOUT


@needs_isolation
def test_writes_outside_the_run_folder_do_not_land(sandbox, tmp_path):
    target = tmp_path / "escaped.txt"
    result = sandbox.run(f"open({str(target)!r}, 'w').write('x')")
    assert not result.ok and ("PermissionError" in result.output or "FileNotFoundError" in result.output)
    assert not target.exists()
    repo_file = tmp_path.parent / "agentspec-sandbox-probe.txt"
    assert not sandbox.run(f"open({str(repo_file)!r}, 'w').write('x')").ok
    assert not repo_file.exists()
    # /tmp inside the run is a private tmpfs: what the code writes there is gone afterwards
    name = f"/tmp/agentspec-sandbox-{time.time_ns()}"
    assert sandbox.run(f"open({name!r}, 'w').write('x')").ok
    assert not (tmp_path / name).exists() and not __import__("os").path.exists(name)


@needs_isolation
def test_network_is_unreachable(sandbox):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(3.0)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        try:
            conn, _ = server.accept()
            accepted.append(conn)
        except OSError:
            pass

    # the listener works from outside the sandbox ...
    t = threading.Thread(target=accept)
    t.start()
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    t.join()
    assert len(accepted) == 1
    # ... and is unreachable from inside
    t = threading.Thread(target=accept)
    t.start()
    result, wall = _timed(sandbox, "import socket\n"
                                   f"socket.create_connection(('127.0.0.1', {port}), timeout=1)")
    server.close()
    t.join()
    assert not result.ok and "OSError" in result.output
    assert len(accepted) == 1 and wall < TIMEOUT


def test_output_is_capped(sandbox):
    result = sandbox.run("print('x' * 10000)")
    assert result.ok and result.truncated and len(result.output) == 4096
    assert "[output truncated: 10001 bytes, 4096 kept]" in result.observation()
    flood, wall = _timed(sandbox, "while True:\n    print('y' * 1000)")
    assert not flood.ok and "output over" in flood.error and wall < TIMEOUT


def test_crash_and_background_processes(sandbox):
    crash = sandbox.run("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    assert not crash.ok and "SIGSEGV" in crash.error
    bg = sandbox.run("import subprocess\nsubprocess.Popen(['sleep', '30'])\nprint('started')")
    assert bg.ok and bg.output.strip() == "started"
    if ISOLATED:
        assert _sandbox_processes() == []


def test_concurrent_runs_are_independent(sandbox):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(sandbox.run, [f"print({i} * {i})" for i in range(8)]))
    assert [r.output.strip() for r in results] == [str(i * i) for i in range(8)]


def test_plain_level_runs_and_cleans_up(tmp_path):
    plain = Sandbox(SandboxLimits(timeout_s=TIMEOUT), isolation="none")
    result = plain.run("import os\nprint(os.getcwd())")
    assert result.ok and result.isolation == "none"
    assert not __import__("os").path.exists(result.output.strip())
    with pytest.raises(SandboxError, match="does not isolate the network"):
        Sandbox(isolation="none", require_isolation=True)


def test_bad_settings_are_refused():
    with pytest.raises(SandboxError, match="timeout_s must be a positive number"):
        SandboxLimits(timeout_s=0)
    with pytest.raises(SandboxError, match="memory_bytes must be at least 32 MiB"):
        SandboxLimits(memory_bytes=2**20)
    with pytest.raises(SandboxError, match="isolation must be one of"):
        Sandbox(isolation="chroot")
    with pytest.raises(SandboxError, match="is not an executable file"):
        Sandbox(python="/nonexistent/python3")
