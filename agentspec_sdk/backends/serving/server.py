"""Build and launch `vllm serve` with the AgentSpec structure proposer inside it.

The proposer is a vLLM `custom_class` speculator; it reads its plan (formats, tools, law parameters,
records path) from the JSON file named in `AGENTSPEC_PLAN`. `ServerSpec.command()` and `.env()` are
the whole contract: operators who run vLLM themselves (systemd, Kubernetes) copy `shell_line()`.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from agentspec_sdk.backends.engine_config import (
    CPU_BLOCK_SIZE,
    MODEL_DRAFTERS,
    check_block_size,
    running_on_cpu,
    speculative_config,
)
from agentspec_sdk.backends.inside_vllm.capture_hook import (
    CAPTURE_DIR_ENV,
    CAPTURE_MAX_BYTES_ENV,
    CAPTURE_MAX_FILES_ENV,
    CAPTURE_SAMPLE_ENV,
    ENTRY_POINT,
)
from agentspec_sdk.backends.inside_vllm.vllm_grammar import EXACT_MASKS_ENV
from agentspec_sdk.backends.inside_vllm.vllm_hybrid import MODE_ENV
from agentspec_sdk.drafting.plan import PLAN_ENV
from agentspec_sdk.errors import AgentSpecError, BackendError

Speculation = Literal["structure", "ngram", "suffix", "off", "draft_model", "draft_model+cut",
                      "structure+draft_model"]
SERVER_SPECULATION = ("structure", "ngram", "suffix", "off", *MODEL_DRAFTERS)
# the modes that read the draft plan (the structure drafter, alone or weighed against a model's drafts)
PLAN_MODES = ("structure", "structure+draft_model")
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
ENTRY_MODULE = "vllm.entrypoints.launchers.api_server.entry"
# The `agentspec` tool parser (plain OpenAI tool calling), loaded by vLLM from this file's path (the
# in-vLLM room's module, named by path: importing it here would import vLLM's API server).
TOOL_PARSER_FILE = Path(__file__).parents[1] / "inside_vllm" / "tool_parser.py"
TOOL_FORMAT_ENV = "AGENTSPEC_TOOL_FORMAT"


@dataclass
class ServerSpec:
    """Everything `vllm serve` needs to host a model with our proposer."""

    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    speculation: Speculation = "structure"
    gamma_max: int = 8
    plan_path: Path | None = None
    served_model_name: str | None = None  # None: the model folder's or id's last part (`model_names`)
    max_model_len: int = 4096
    seed: int = 0
    dtype: str | None = None  # None: float32 on CPU (no bf16 units on AVX2), auto on GPU
    block_size: int | None = None  # None: CPU_BLOCK_SIZE on CPU, vLLM's default elsewhere
    # None: 1 GiB on CPU (vLLM-CPU otherwise reserves 92% of RAM and refuses to start beside other
    # processes), vLLM's own sizing on GPU.
    kv_cache_bytes: int | None = None
    extra_args: list[str] = field(default_factory=list)
    # The proposer's Prometheus metrics on the server's /metrics (structure only): vLLM's multiprocess
    # collection over this directory, emptied before every start (backends/inside_vllm/prom_metrics.py).
    metrics: bool = True
    metrics_dir: Path | None = None  # None: <tmp>/agentspec-prom-<port>
    # Plain OpenAI clients (`tools=[...]`): the `agentspec` tool parser builds each request's turn grammar
    # in `tool_format` (a built-in name or a format dict) and returns `tool_calls`; `chat_template`
    # (`tool_parser.write_chat_template`) renders their tools and calls as our own client's prompt does.
    tool_parser: bool = True
    tool_format: str | dict = "tool_calls"
    chat_template: Path | None = None
    # suffix: vLLM's suffix_decoding_max_spec_factor / _min_token_prob (None: vLLM's defaults)
    suffix_max_spec_factor: float | None = None
    suffix_min_token_prob: float | None = None
    ngram_min: int = 2  # ngram: shortest and longest match (the embedded engine's defaults)
    ngram_max: int = 5
    # speculation in MODEL_DRAFTERS: the draft model (a folder or id, as vLLM takes it)
    draft_model: str | None = None
    # every finished turn into this capture directory (inside_vllm.capture_hook, docs/capture.md)
    capture_dir: Path | None = None
    capture_sample: float = 1.0  # the share of episodes kept
    capture_max_bytes: int = 64 << 20  # per file, then the next file
    capture_max_files: int = 8  # the oldest removed beyond it

    def model_names(self) -> list[str]:
        """The names clients send as `model`: a short one first (`served_model_name`, else the model's
        last path part, e.g. `smollm2-135m-instruct`: the same on every replica whatever its cache
        path), then the model as given, so a client that sends the path still works."""
        short = self.served_model_name or Path(str(self.model).rstrip("/")).name or str(self.model)
        return [short] if short == str(self.model) else [short, str(self.model)]

    def __post_init__(self) -> None:
        if self.speculation not in SERVER_SPECULATION:
            raise BackendError(f"speculation must be one of {SERVER_SPECULATION}, got {self.speculation!r}")
        if not 1 <= self.gamma_max <= 64:
            raise BackendError(f"gamma_max must be in 1..64, got {self.gamma_max}")
        if not 0 < self.port < 65536:
            raise BackendError(f"port must be in 1..65535, got {self.port}")
        check_block_size(self.block_size)
        if self.speculation in PLAN_MODES and self.plan_path is None:
            raise BackendError(f"speculation={self.speculation!r} needs a plan file (plan_path)")
        if self.speculation in MODEL_DRAFTERS and not self.draft_model:
            raise BackendError(f"speculation={self.speculation!r} needs draft_model=<folder or id>")
        if self.draft_model and self.speculation not in MODEL_DRAFTERS:
            raise BackendError(f"draft_model applies to speculation {sorted(MODEL_DRAFTERS)} only, not "
                               f"{self.speculation!r}")
        if self.capture_dir is not None:
            check_capture_settings(self.capture_sample, self.capture_max_bytes, self.capture_max_files)

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def speculative_config(self) -> dict | None:
        """The embedded engine's builder (`engine_config.speculative_config`) over this spec's settings."""
        return speculative_config(self.speculation, self.gamma_max, ngram_min=self.ngram_min,
                                  ngram_max=self.ngram_max,
                                  suffix_max_spec_factor=self.suffix_max_spec_factor,
                                  suffix_min_token_prob=self.suffix_min_token_prob,
                                  draft_model=self.draft_model)

    def args(self) -> list[str]:
        """Arguments after `vllm serve`."""
        dtype = self.dtype or ("float32" if running_on_cpu() else "auto")
        args = [
            "--model", self.model,
            "--host", self.host, "--port", str(self.port),
            "--dtype", dtype,
            "--max-model-len", str(self.max_model_len),
            "--seed", str(self.seed),
            "--enable-prefix-caching",
            # Per-turn grammars are Lark for llguidance (structure.turn_grammar).
            "--structured-outputs-config", json.dumps({"backend": "guidance"}, separators=(",", ":")),
            # queue / first-token / decode times in every response (TurnResult.timings)
            "--enable-per-request-metrics",
        ]
        block = self.block_size or (CPU_BLOCK_SIZE if running_on_cpu() else None)
        if block:
            args += ["--block-size", str(block)]
        kv_bytes = self.kv_cache_bytes or (1 << 30 if running_on_cpu() else None)
        if kv_bytes:
            args += ["--kv-cache-memory-bytes", str(kv_bytes)]
        args += ["--served-model-name", *self.model_names()]
        if self.tool_parser:
            args += ["--enable-auto-tool-choice", "--tool-call-parser", "agentspec",
                     "--tool-parser-plugin", str(TOOL_PARSER_FILE)]
        if self.chat_template:
            args += ["--chat-template", str(Path(self.chat_template).resolve()),
                     "--chat-template-content-format", "string"]
        # /tokenizer_info: the served chat template and special tokens, from which `RemoteEngine`
        # makes the embedded engine's prompt decision (backends/remote/remote_template.py)
        args += ["--enable-tokenizer-info-endpoint"]
        spec = self.speculative_config()
        if spec is not None:
            args += ["--speculative-config", json.dumps(spec, separators=(",", ":")),
                     # drafted/accepted per verify step in every response (metrics.speculative_decoding)
                     "--per-request-spec-decode-metrics", "detailed"]
        if self.speculation in MODEL_DRAFTERS:
            # our layer reads the CPU token histories, which async scheduling fills with placeholders
            # (as the embedded engine's start, embedded/vllm_start.py)
            args += ["--no-async-scheduling"]
        return args + list(self.extra_args)

    def command(self) -> list[str]:
        """The argv that starts the server with this Python's vLLM.

        The `vllm` console script of vllm-cpu 0.32 crashes on start (it asks importlib for the version
        of a distribution called `vllm`, which vllm-cpu is not), so where that distribution is
        missing we run the server's own entry point, which takes the same arguments.
        """
        try:
            importlib.metadata.distribution("vllm")
        except importlib.metadata.PackageNotFoundError:
            count = _flag_value(self.extra_args, "--api-server-count")
            if count is not None and count != "1":
                raise BackendError(
                    f"--api-server-count {count}: vllm-cpu's server entry point ({ENTRY_MODULE}, run "
                    "because its `vllm` console script crashes) starts one API server whatever the "
                    "count; run several replicas behind a router instead (docs/deployment.md)") from None
            return [sys.executable, "-m", ENTRY_MODULE, *self.args()]
        script = Path(sys.executable).with_name("vllm")
        return [str(script) if script.is_file() else "vllm", "serve", *self.args()]

    def env(self) -> dict[str, str]:
        """Environment variables the server needs on top of the caller's."""
        env = {PLAN_ENV: str(Path(self.plan_path).resolve())} if self.plan_path else {}
        # exact llguidance masks under speculation (backends.inside_vllm.vllm_grammar)
        env[EXACT_MASKS_ENV] = "1"
        if self.multiproc_dir() is not None:
            env[MULTIPROC_ENV] = str(self.multiproc_dir())
        if self.tool_parser and self.tool_format != "tool_calls":
            fmt = self.tool_format
            env[TOOL_FORMAT_ENV] = fmt if isinstance(fmt, str) else json.dumps(fmt, separators=(",", ":"))
        if self.speculation in MODEL_DRAFTERS:
            # the model-drafter layer's entry point (inside_vllm/vllm_hybrid.py) patches the V1 runner
            env[MODE_ENV] = MODEL_DRAFTERS[self.speculation]
            env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        if self.capture_dir is not None:
            env.update({CAPTURE_DIR_ENV: str(Path(self.capture_dir).resolve()),
                        CAPTURE_SAMPLE_ENV: repr(float(self.capture_sample)),
                        CAPTURE_MAX_BYTES_ENV: str(self.capture_max_bytes),
                        CAPTURE_MAX_FILES_ENV: str(self.capture_max_files)})
        return env

    def multiproc_dir(self) -> Path | None:
        """PROMETHEUS_MULTIPROC_DIR for this server, or None without the proposer's metrics."""
        if not (self.metrics and self.speculation == "structure"):
            return None
        return Path(self.metrics_dir or Path(tempfile.gettempdir()) / f"agentspec-prom-{self.port}").resolve()

    def shell_line(self) -> str:
        """The command an operator pastes into a shell, unit file or container spec."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env().items())
        line = shlex.join(self.command())
        return f"{env} {line}" if env else line


def check_capture_settings(sample: float, max_bytes: int, max_files: int) -> None:
    """The capture's bounds, checked before vLLM starts (the writer inside it checks them again), and
    the entry point that installs the capture in `vllm serve`: a package installed before it existed
    (`pip install -e .` again) would serve without capturing."""
    from agentspec_sdk.backends.capture import CaptureWriter  # its checks, on a writer never opened

    try:
        CaptureWriter.check_settings(max_bytes=max_bytes, max_files=max_files, sample=sample)
    except AgentSpecError as exc:
        raise BackendError(f"capture: {exc}") from None
    plugins = importlib.metadata.entry_points(group="vllm.general_plugins")
    if ENTRY_POINT not in {ep.name for ep in plugins}:
        raise BackendError(f"capture needs the vllm.general_plugins entry point {ENTRY_POINT!r}, which the "
                           "installed agentspec-sdk lacks (installed before it existed): reinstall it "
                           "(pip install -e . in the repository, or pip install -U agentspec-sdk)")


def check_port_free(host: str, port: int) -> None:
    """The server's port (its API and its /metrics) must be free before vLLM spends a minute starting."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as vLLM binds it
            sock.bind((host or "0.0.0.0", port))
    except OSError as exc:
        raise BackendError(f"port {port} on {host or '0.0.0.0'} is already in use (the server's API and its "
                           f"/metrics would listen there): {exc.strerror or exc}; "
                           "choose another --port") from None


def fresh_metrics_dir(path: Path | None) -> None:
    """vLLM: the multiprocess directory 'must be wiped between vLLM runs or you will find inaccurate
    metrics' (a restarted server would add the dead one's counts)."""
    if path is None:
        return
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):  # prometheus_client's per-process files, nothing else
        stale.unlink()


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


class ServerProcess:
    """A `vllm serve` subprocess: start, wait until /health answers, kill, restart.

    Output goes to `log_path` (appended across restarts) so a failed start can be explained, or to
    this process's own stdout/stderr when `log_path` is None.
    """

    def __init__(self, spec: ServerSpec, log_path: str | os.PathLike | None = None):
        self.spec = spec
        self.log_path = Path(log_path) if log_path else None
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return self.spec.base_url

    def start(self) -> ServerProcess:
        if self.proc is not None and self.proc.poll() is None:
            raise BackendError(f"server already running (pid {self.proc.pid})")
        if http_ok(self.base_url + "/health"):
            raise BackendError(f"port {self.spec.port} on {self.spec.host} already serves something")
        check_port_free(self.spec.host, self.spec.port)
        fresh_metrics_dir(self.spec.multiproc_dir())
        env = {**os.environ, **self.spec.env()}
        out = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115
        try:
            # A new session so that kill() takes vLLM's engine-core child process with it.
            self.proc = subprocess.Popen(self.spec.command(), env=env, stdout=out,
                                         stderr=subprocess.STDOUT if out else None, start_new_session=True)
        finally:
            if out is not None:
                out.close()
        return self

    def wait(self) -> int:
        """Block until the server exits; its exit code. SIGINT, SIGTERM and SIGHUP to this process
        stop the server first (it runs in its own session, so it would not get them otherwise)."""
        if self.proc is None:
            raise BackendError("server not started")

        requested: list[int] = []
        # The handler only records the signal: Popen.wait() is not re-entrant from a signal handler.
        previous = {sig: signal.signal(sig, lambda signum, _frame: requested.append(signum))
                    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            while self.proc.poll() is None and not requested:
                time.sleep(0.2)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.stop()
        if requested:
            raise SystemExit(128 + requested[0])
        return self.proc.returncode

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise BackendError(f"vllm serve exited with code {self.proc.returncode} before it was "
                                   f"ready; last output:\n{self.log_tail()}")
            if http_ok(self.base_url + "/health") and http_ok(self.base_url + "/v1/models"):
                return
            time.sleep(1.0)
        raise BackendError(f"vllm serve not ready at {self.base_url} after {timeout:.0f} s; "
                           f"last output:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path or not self.log_path.is_file():
            return "(see the output above)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        """Abrupt stop (SIGKILL to the whole process group): what a crash looks like to clients."""
        self._signal(signal.SIGKILL)

    def stop(self, grace: float = 20.0) -> None:
        self._signal(signal.SIGTERM, grace)

    def _signal(self, sig: int, grace: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def restart(self, timeout: float = 300.0) -> None:
        self.stop()
        self.start()
        self.wait_ready(timeout)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _flag_value(args: list[str], flag: str) -> str | None:
    """The value given to `flag` in `args` (`--flag V` or `--flag=V`; the last one wins), or None."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value
