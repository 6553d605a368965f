"""N `vllm serve` replicas behind vLLM's router (`vllm-router`, the `router` extra), as one deployment.

`agentspec serve --replicas N --router POLICY` runs it on one machine: replica i listens on the given
port + i (i = 1..N), every replica reads the same plan file and serves the same short model name, and
the router listens on the given port itself, so clients see one server. The router's policy decides
where a request goes: `consistent_hash` keeps an episode on one replica by the `x-session-id` header
that `RemoteEngine` sends (the proposer's suffix trees and learned acceptance, like the prefix cache,
live in each replica's own process), `cache_aware` (the router's default) by the longest prompt
prefix it has sent to a replica before, `round_robin` and `power_of_two` by load alone.
"""

from __future__ import annotations

import dataclasses
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from agentspec_sdk.backends.engine_config import running_on_cpu
from agentspec_sdk.backends.serving.server import ServerProcess, ServerSpec, check_port_free, http_ok
from agentspec_sdk.errors import BackendError

__all__ = ["ROUTER_POLICIES", "ReplicaSet", "RouterProcess", "RouterSpec", "router_binary", "split_cores"]

ROUTER_POLICIES = ("cache_aware", "consistent_hash", "round_robin", "power_of_two", "random")
ROUTER_EXTRA = "router"
# a dead replica is taken out of rotation after one failed health check, every few seconds
ROUTER_HEALTH_ARGS = ("--health-check-interval-secs", "3", "--health-failure-threshold", "1",
                      "--worker-startup-check-interval", "1")


def router_binary() -> str:
    """The `vllm-router` executable beside this Python, else on PATH."""
    beside = Path(sys.executable).with_name("vllm-router")
    if beside.is_file():
        return str(beside)
    found = shutil.which("vllm-router")
    if found:
        return found
    raise BackendError(f"vllm-router is not installed: it comes with the `{ROUTER_EXTRA}` extra "
                       f"(pip install 'agentspec-sdk[{ROUTER_EXTRA}]', or pip install vllm-router)")


def split_cores(replicas: int, cores: list[int] | None = None) -> list[str | None]:
    """The machine's cores (this process's affinity) cut into one contiguous share per replica, as
    VLLM_CPU_OMP_THREADS_BIND lists ("0", "2,3"); vLLM would otherwise bind every replica to the same
    cores. Fewer cores than replicas: shares wrap around (replicas share cores); unknown: None each."""
    import os

    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    if not cores:
        return [None] * replicas
    if len(cores) < replicas:
        return [str(cores[i % len(cores)]) for i in range(replicas)]
    size = len(cores) // replicas
    return [",".join(str(c) for c in cores[i * size:(i + 1) * size]) for i in range(replicas)]


@dataclass
class RouterSpec:
    """`vllm-router` in front of the given workers."""

    worker_urls: list[str]
    host: str = "127.0.0.1"
    port: int = 8000
    policy: str = "cache_aware"
    # the router's own Prometheus page (its default, 29000, would clash between two deployments)
    metrics_port: int | None = None
    extra_args: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.policy not in ROUTER_POLICIES:
            raise BackendError(f"--router {self.policy!r}: not a vllm-router policy; one of "
                               f"{', '.join(ROUTER_POLICIES)}")
        if not self.worker_urls:
            raise BackendError("the router needs at least one worker URL")
        if not 0 < self.port < 65536:
            raise BackendError(f"port must be in 1..65535, got {self.port}")

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def command(self) -> list[str]:
        cmd = [router_binary(), "--host", self.host, "--port", str(self.port), "--policy", self.policy,
               "--worker-urls", *self.worker_urls, *ROUTER_HEALTH_ARGS]
        if self.metrics_port is not None:
            cmd += ["--prometheus-port", str(self.metrics_port)]
        return cmd + list(self.extra_args)


class RouterProcess:
    """The router subprocess: start, wait until it answers for a model, stop."""

    def __init__(self, spec: RouterSpec, log_path: str | Path | None = None):
        self.spec = spec
        self.log_path = Path(log_path) if log_path else None
        self.proc: subprocess.Popen | None = None

    def start(self) -> RouterProcess:
        command = self.spec.command()  # a missing binary is named before anything runs
        check_port_free(self.spec.host, self.spec.port)
        out = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT if out else None,
                                         start_new_session=True)
        finally:
            if out is not None:
                out.close()
        return self

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise BackendError(f"vllm-router exited with code {self.proc.returncode} before it was "
                                   f"ready; {self._log_hint()}")
            if http_ok(self.spec.base_url + "/health") and http_ok(self.spec.base_url + "/v1/models"):
                return
            time.sleep(0.5)
        raise BackendError(f"vllm-router not ready at {self.spec.base_url} after {timeout:.0f} s; "
                           f"{self._log_hint()}")

    def _log_hint(self) -> str:
        if not self.log_path or not self.log_path.is_file():
            return "see its output above"
        return "last output:\n" + "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])

    def stop(self, grace: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ReplicaSet:
    """`replicas` copies of one `ServerSpec` (ports `spec.port + 1 ..`) and a router on `spec.port`."""

    def __init__(self, spec: ServerSpec, replicas: int, policy: str = "cache_aware",
                 log_dir: str | Path | None = None, router_args: list[str] | None = None):
        if replicas < 1:
            raise BackendError(f"--replicas must be at least 1, got {replicas}")
        if spec.port + replicas + 1 > 65535:
            raise BackendError(f"--port {spec.port}: replicas would listen on {spec.port + 1}.."
                               f"{spec.port + replicas}, past 65535")
        self.log_dir = Path(log_dir) if log_dir else None
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        cores = split_cores(replicas) if running_on_cpu() and spec.cpu_cores is None else [None] * replicas
        self.replicas = [ServerProcess(self.replica_spec(spec, i, cores[i - 1]),
                                       log_path=self._log(f"replica-{i}.log"))
                         for i in range(1, replicas + 1)]
        # the router's own metrics on the port after the last replica's
        self.router = RouterProcess(RouterSpec([r.base_url for r in self.replicas], host=spec.host,
                                               port=spec.port, policy=policy,
                                               metrics_port=spec.port + replicas + 1,
                                               extra_args=list(router_args or [])),
                                    log_path=self._log("router.log"))

    @staticmethod
    def replica_spec(spec: ServerSpec, index: int, cpu_cores: str | None = None) -> ServerSpec:
        """Replica `index` (1-based): the same spec on port + index (its own metrics directory)."""
        metrics_dir = spec.metrics_dir / f"replica-{index}" if spec.metrics_dir else None
        return dataclasses.replace(spec, port=spec.port + index, metrics_dir=metrics_dir,
                                   cpu_cores=cpu_cores or spec.cpu_cores)

    def _log(self, name: str) -> Path | None:
        return self.log_dir / name if self.log_dir else None

    @property
    def base_url(self) -> str:
        return self.router.spec.base_url

    def commands(self) -> list[str]:
        """The shell lines of the replicas and of the router, in start order."""
        return [r.spec.shell_line() for r in self.replicas] + [shlex.join(self.router.spec.command())]

    def start(self, timeout: float = 900.0) -> ReplicaSet:
        """Start every replica, wait until each answers, then the router; on any failure stop all."""
        self.router.spec.command()  # vllm-router missing: said before a replica spends a minute starting
        check_port_free(self.router.spec.host, self.router.spec.port)
        try:
            for replica in self.replicas:
                replica.start()
            deadline = time.monotonic() + timeout
            for replica in self.replicas:
                replica.wait_ready(max(deadline - time.monotonic(), 1.0))
            self.router.start().wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def plans(self) -> dict[str, dict | None]:
        """Each replica's plan as its /metrics shows it (`prom_metrics.plan_identity`; None: no gauges)."""
        import httpx

        from agentspec_sdk.backends.inside_vllm.prom_metrics import plan_identity

        out: dict[str, dict | None] = {}
        for replica in self.replicas:
            try:
                page = httpx.get(replica.base_url + "/metrics", timeout=10).text
            except httpx.HTTPError as exc:
                raise BackendError(f"cannot read {replica.base_url}/metrics: {exc}") from None
            out[replica.base_url] = plan_identity(page)
        return out

    def check_plans(self) -> None:
        """Refuse a deployment whose replicas draft with different plans (another file, an old copy)."""
        plans = self.plans()
        digests = {p["digest"] for p in plans.values() if p is not None}
        if len(digests) > 1:
            raise BackendError("replicas draft with different plans: " + "; ".join(
                f"{url} digest {p['digest']} version {p['version']}" if p else f"{url} none"
                for url, p in plans.items()))

    def wait(self) -> int:
        """Block until a process of the set exits or this process gets SIGINT/SIGTERM/SIGHUP; stop all.
        The exit code of the first process that ended (0 on a signal's stop is not claimed: 128+sig)."""
        requested: list[int] = []
        previous = {sig: signal.signal(sig, lambda signum, _frame: requested.append(signum))
                    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        procs = [self.router.proc, *(r.proc for r in self.replicas)]
        try:
            while not requested and all(p is not None and p.poll() is None for p in procs):
                time.sleep(0.2)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            ended = [p.returncode for p in procs if p is not None and p.poll() is not None]
            self.stop()
        if requested:
            raise SystemExit(128 + requested[0])
        return ended[0] if ended else 1

    def stop(self) -> None:
        self.router.stop()
        for replica in self.replicas:
            replica.stop()

    def __enter__(self) -> ReplicaSet:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
