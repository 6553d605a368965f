"""A sandbox for model-written code: one separate process per execution (stdlib only).

Every run gets a wall-clock timeout, `resource` rlimits (CPU seconds, address space, processes,
file size, open files, no core dumps), a fresh temporary directory as its working directory, HOME
and TMPDIR, stdin from /dev/null, and its output (stdout and stderr together) capped. A run that
fails, crashes, hits a limit or is killed becomes an error observation (`SandboxResult.observation`);
only a sandbox that cannot be set up at all raises `SandboxError`.

Isolation levels (`Sandbox.isolation`, probed once; docs/replay.md, "Sandbox"):

- ``namespace`` (root with util-linux `unshare`, the case here): the run is PID 1's child in new
  PID, mount and network namespaces. The network namespace has only a loopback interface that is
  down, so every connection fails. Fresh tmpfs mounts cover the world-writable folders (/tmp,
  /var/tmp, /dev/shm, /run/lock) and a directory of the interpreter's path that others may not
  enter (e.g. /root) is covered by a tmpfs holding only the interpreter; the code runs as an unused
  uid of its own (no supplementary groups), so it can write nowhere but its tmpfs folders. When the
  run ends (or is killed) PID 1 of the namespace exits, the kernel kills every process left in it,
  and the tmpfs mounts vanish with the mount namespace: nothing the code did survives the run.
- ``userns`` (an unprivileged user with user namespaces): the same namespaces inside a new user
  namespace (root mapped to the caller); the code runs as the caller, so files the caller owns
  outside the tmpfs folders stay writable.
- ``none`` (neither works): rlimits, a new session killed after the run, a private temporary
  directory that is removed afterwards. The network is NOT isolated; `Sandbox(require_isolation=True)`
  refuses to run at this level.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from agentspec_sdk.errors import SandboxError

ISOLATIONS = ("namespace", "userns", "none")
UID_BASE = 61000  # a pool of unused uids, one per concurrent run (RLIMIT_NPROC counts per uid)
UID_POOL = 512
SETUP_FAILED = 125  # exit code of the sandbox's PID 1 when it could not set the run up
OUTPUT_FLOOD = 64  # output beyond this many times `output_bytes` kills the run

_SIGNALS = {signal.SIGKILL: "killed (SIGKILL)", signal.SIGXCPU: "CPU time limit exceeded (SIGXCPU)",
            signal.SIGXFSZ: "file size limit exceeded (SIGXFSZ)", signal.SIGSEGV: "crashed (SIGSEGV)",
            signal.SIGABRT: "aborted (SIGABRT)"}


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits. `memory_bytes` is the address-space limit (RLIMIT_AS), `processes` the
    processes and threads the run's uid may have (RLIMIT_NPROC), `file_bytes` the largest file it
    may write (RLIMIT_FSIZE), `disk_bytes` the size of each tmpfs, `output_bytes` what is kept of
    stdout+stderr."""

    timeout_s: float = 10.0
    cpu_s: int = 10
    memory_bytes: int = 512 * 2**20
    processes: int = 32
    file_bytes: int = 16 * 2**20
    disk_bytes: int = 64 * 2**20
    open_files: int = 64
    output_bytes: int = 16 * 2**10

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_s", "memory_bytes", "processes", "file_bytes", "disk_bytes",
                     "open_files", "output_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise SandboxError(f"sandbox limit {name} must be a positive number, got {value!r}")
        if self.memory_bytes < 32 * 2**20:
            raise SandboxError(f"sandbox limit memory_bytes must be at least 32 MiB (the interpreter "
                               f"needs it), got {self.memory_bytes}")


@dataclass
class SandboxResult:
    """One run. `ok`: exited 0 within every limit. `error`: why not (None when ok)."""

    ok: bool
    exit_code: int | None
    output: str
    error: str | None
    wall_s: float
    timed_out: bool = False
    truncated: bool = False
    isolation: str = "none"
    output_bytes: int = 0
    extra: dict = field(default_factory=dict)

    def observation(self) -> str:
        """What the agent is shown: the output, and on failure an error line."""
        text = self.output.rstrip("\n")
        if self.truncated:
            text += f"\n[output truncated: {self.output_bytes} bytes, {len(self.output.encode())} kept]"
        if self.ok:
            return text
        return (text + "\n" if text else "") + f"Error: {self.error}"


# PID 1 of the sandbox (namespace/userns) or its parent (none): reads the code on stdin, sets up the
# folders, forks the run with its limits and identity, waits, and exits with the run's status.
# stdlib only, run with `python -I -S`.
_INIT = (r'''
import ctypes, json, os, resource, shutil, sys, tempfile
p = json.loads(sys.argv[1])
code = sys.stdin.buffer.read()
def fail(msg):
    sys.stderr.write("sandbox setup failed: %s\n" % msg); sys.stderr.flush(); os._exit(125)
libc = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
def mount(src, dst, fstype, flags, data=None):
    if libc.mount(src.encode(), dst.encode(), fstype.encode() if fstype else None, flags,
                  data.encode() if data else None) != 0:
        fail("mount %s on %s: %s" % (src, dst, os.strerror(ctypes.get_errno())))
def tmpfs(dst, mode="1777"):
    mount("tmpfs", dst, "tmpfs", MS_NOSUID | MS_NODEV, "size=%d,mode=%s" % (p["disk_bytes"], mode))
work = None
if p["isolation"] != "none":
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    for hide, keep in p["expose"]:  # a folder others may not enter: cover it, keep one child visible
        stage = "/proc/self/fd/%d" % os.open(keep, os.O_RDONLY | os.O_DIRECTORY)
        tmpfs(hide, "0755")
        target = os.path.join(hide, os.path.relpath(keep, hide))
        os.makedirs(target, exist_ok=True)
        mount(stage, target, None, MS_BIND | MS_REC)
        mount("none", target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    for d in p["writable"]:
        if os.path.isdir(d) and not os.path.islink(d):
            tmpfs(d)
    work = "/tmp/agentspec-run"
    os.mkdir(work, 0o700)
    if p["uid"] is not None:
        os.chown(work, p["uid"], p["uid"])
else:
    work = tempfile.mkdtemp(prefix="agentspec-run-")
with open(os.path.join(work, "main.py"), "wb") as f:
    f.write(code)
if p["uid"] is not None:
    os.chown(os.path.join(work, "main.py"), p["uid"], p["uid"])
env = {"HOME": work, "TMPDIR": work, "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
       "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
pid = os.fork()
if pid == 0:
    try:
        null = os.open(os.devnull, os.O_RDONLY); os.dup2(null, 0)
        lim = [(resource.RLIMIT_CPU, p["cpu_s"], p["cpu_s"] + 1), '''
r'''(resource.RLIMIT_AS, p["memory_bytes"], None),
               (resource.RLIMIT_NPROC, p["processes"], None), (resource.RLIMIT_FSIZE, p["file_bytes"], None),
               (resource.RLIMIT_NOFILE, p["open_files"], None), (resource.RLIMIT_CORE, 0, None)]
        for what, soft, hard in lim:
            resource.setrlimit(what, (soft, soft if hard is None else hard))
        os.chdir(work)
        if p["uid"] is not None:
            os.setgroups([]); os.setgid(p["uid"]); os.setuid(p["uid"])
        os.execve(p["python"], [p["python"], "-I", "-B", "main.py"], env)
    except BaseException as exc:
        sys.stderr.write("sandbox setup failed: %s\n" % exc); sys.stderr.flush()
    os._exit(125)
while True:
    try:
        done, status = os.waitpid(pid, 0)
        break
    except ChildProcessError:
        status = 0; break
    except InterruptedError:
        continue
if p["isolation"] == "none":
    shutil.rmtree(work, ignore_errors=True)
os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
''')

_probe_lock = threading.Lock()
_probed: dict[str, str] = {}
_uid_lock = threading.Lock()
_uids_in_use: set[int] = set()


def _unshare_prefix(isolation: str) -> list[str]:
    base = ["unshare", "--net", "--mount", "--pid", "--fork", "--kill-child"]
    return base if isolation == "namespace" else ["unshare", "--user", "--map-root-user", *base[1:]]


def probe_isolation() -> str:
    """The strongest isolation level that works on this machine (cached)."""
    with _probe_lock:
        if "level" not in _probed:
            _probed["level"] = _probe()
        return _probed["level"]


def _probe() -> str:
    if shutil.which("unshare") is None:
        return "none"
    levels = (["namespace"] if os.geteuid() == 0 else []) + ["userns"]
    for level in levels:
        try:
            done = subprocess.run([*_unshare_prefix(level), "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return level
    return "none"


def uid_processes(uid: int) -> list[int]:
    """Pids of the processes whose real uid is `uid` (from /proc)."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", encoding="ascii", errors="replace") as status:
                for line in status:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            pids.append(int(entry.name))
                        break
        except OSError:  # gone meanwhile
            continue
    return pids


def _wait_uid_gone(uid: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while uid_processes(uid) and time.monotonic() < deadline:
        time.sleep(0.02)


def _hidden_ancestor(path: Path) -> tuple[str, str] | None:
    """(the first ancestor of `path` that others may not enter, its child on the way to `path`)."""
    parts = path.parts
    for i in range(2, len(parts)):
        folder = Path(*parts[:i])
        try:
            mode = folder.stat().st_mode
        except OSError:
            return None
        if not mode & 0o001:
            return str(folder), str(Path(*parts[: i + 1]))
    return None


class Sandbox:
    """Runs Python source in a fresh sandboxed process; thread-safe (one process per `run`)."""

    def __init__(self, limits: SandboxLimits | None = None, *, isolation: str | None = None,
                 python: str | None = None, require_isolation: bool = False):
        self.limits = limits or SandboxLimits()
        if isolation is None:
            isolation = os.environ.get("AGENTSPEC_SANDBOX") or probe_isolation()
        if isolation not in ISOLATIONS:
            raise SandboxError(f"sandbox isolation must be one of {list(ISOLATIONS)}, got {isolation!r}")
        if require_isolation and isolation == "none":
            raise SandboxError("no isolated sandbox here (util-linux unshare with root or user namespaces "
                               "is needed); the 'none' level does not isolate the network")
        self.isolation = isolation
        # the base interpreter (a venv's python is a link to it; the run needs only the stdlib)
        exe = python or str(Path(sys.base_prefix) / "bin" / Path(sys.executable).name)
        real = Path(exe).resolve()
        if not real.is_file() or not os.access(real, os.X_OK):
            raise SandboxError(f"sandbox interpreter {exe!r} is not an executable file")
        self.python = str(real)
        self._expose: list[tuple[str, str]] = []
        if isolation == "namespace":
            hidden = _hidden_ancestor(real.parent.parent)  # the install prefix (bin/, lib/)
            if hidden is not None:
                self._expose.append(hidden)

    def _take_uid(self) -> int | None:
        if self.isolation != "namespace":
            return None
        with _uid_lock:
            for uid in range(UID_BASE, UID_BASE + UID_POOL):
                if uid not in _uids_in_use:
                    _uids_in_use.add(uid)
                    return uid
        raise SandboxError(f"more than {UID_POOL} sandbox runs at once")

    def run(self, code: str) -> SandboxResult:
        """Run `code` (Python source) as a script; never raises for what the code does."""
        lim = self.limits
        uid = self._take_uid()
        params = {"isolation": self.isolation, "uid": uid, "python": self.python, "expose": self._expose,
                  "writable": ["/tmp", "/var/tmp", "/dev/shm", "/run/lock"],
                  "cpu_s": int(lim.cpu_s), "memory_bytes": int(lim.memory_bytes),
                  "processes": int(lim.processes),
                  "file_bytes": int(lim.file_bytes), "disk_bytes": int(lim.disk_bytes),
                  "open_files": int(lim.open_files)}
        init = [self.python, "-I", "-S", "-c", _INIT, json.dumps(params)]
        cmd = init if self.isolation == "none" else [*_unshare_prefix(self.isolation), *init]
        start = time.perf_counter()
        try:
            return self._run(cmd, code, start)
        finally:
            if uid is not None:
                _wait_uid_gone(uid)  # a killed fork bomb's processes exit a moment after their PID 1
                with _uid_lock:
                    _uids_in_use.discard(uid)

    def _run(self, cmd: list[str], code: str, start: float) -> SandboxResult:
        lim = self.limits
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT,
                                    start_new_session=True,
                                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                                    cwd=tempfile.gettempdir())
        except OSError as err:
            raise SandboxError(f"cannot start the sandbox ({cmd[0]}): {err.strerror}") from None
        kept = bytearray()
        total = [0]
        flooded = threading.Event()

        def drain() -> None:
            while True:
                chunk = proc.stdout.read1(65536)
                if not chunk:
                    return
                total[0] += len(chunk)
                room = lim.output_bytes - len(kept)
                if room > 0:
                    kept.extend(chunk[:room])
                if total[0] > OUTPUT_FLOOD * lim.output_bytes and not flooded.is_set():
                    flooded.set()  # a print loop: stop it now rather than at the timeout
                    self._kill(proc)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        try:
            proc.stdin.write(code.encode("utf-8", "surrogateescape"))
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        timed_out = False
        try:
            proc.wait(timeout=lim.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        self._kill(proc)
        proc.wait()
        reader.join(timeout=5.0)
        wall = time.perf_counter() - start
        output = bytes(kept).decode("utf-8", "replace")
        code_ = proc.returncode
        if timed_out:
            ok, error, exit_code = (False, f"timed out after {lim.timeout_s:g} s wall clock (process killed)",
                                    None)
        elif flooded.is_set():
            ok, error, exit_code = False, (f"output over {OUTPUT_FLOOD * lim.output_bytes} bytes "
                                           "(process killed)"), None
        elif code_ == 0:
            ok, error, exit_code = True, None, 0
        elif code_ == SETUP_FAILED and "sandbox setup failed" in output:
            ok, error, exit_code = False, "the sandbox could not start the run", code_
        elif code_ > 128 and (code_ - 128) in _SIGNALS:
            ok, error, exit_code = False, _SIGNALS[signal.Signals(code_ - 128)], code_
        elif code_ > 128:
            ok, error, exit_code = False, f"terminated by signal {code_ - 128}", code_
        elif code_ < 0:
            ok, error, exit_code = False, f"terminated by signal {-code_}", code_
        else:
            ok, error, exit_code = False, f"exit code {code_}", code_
        if not ok and not timed_out and "MemoryError" in output:
            error = f"{error} (memory limit {lim.memory_bytes // 2**20} MiB)"
        return SandboxResult(ok=ok, exit_code=exit_code, output=output, error=error, wall_s=wall,
                             timed_out=timed_out, truncated=total[0] > len(kept), isolation=self.isolation,
                             output_bytes=total[0])

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        """Kill the run's session (in a namespace, killing its PID 1 kills everything in it)."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

