"""Transport of the server client (`RemoteEngine`): retries, idempotency, stream replay, response fields.

Failures that a retry can cure (connection refused or reset, timeouts, 5xx, 429) are retried with
exponential backoff by tenacity, up to `max_retries` and `retry_deadline_s`, each attempt logged.
`Ledger` is the idempotency window: a request id that is committed or in flight maps to its one
future. `StreamReplay` checks a restarted stream against the text already delivered and hands on
only the rest. `field` / `int_list` read a response and name the path of a bad field.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import httpx
import openai
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from agentspec_sdk.errors import BackendError, MalformedResponse

log = logging.getLogger("agentspec.remote")


class _StreamBroken(Exception):
    """A stream ended without its final chunk (the server went away mid-answer)."""


def retryable(exc: BaseException) -> bool:
    if isinstance(exc, openai.APIConnectionError | openai.APITimeoutError | httpx.TransportError):
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code >= 500 or exc.status_code == 429
    return isinstance(exc, _StreamBroken)


def field(obj: Any, path: str, kind: type | tuple[type, ...], *, optional: bool = False) -> Any:
    """obj at a dotted path ("choices.0.message.content"), type-checked; MalformedResponse names the path."""
    cur = obj
    for part in path.split("."):
        if isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        elif isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            cur = None
            break
    if cur is None:
        if optional:
            return None
        raise MalformedResponse(f"malformed response: field '{path}' is missing")
    if not isinstance(cur, kind):
        raise MalformedResponse(f"malformed response: field '{path}' should be "
                                f"{getattr(kind, '__name__', kind)}, got {type(cur).__name__}")
    return cur


def int_list(obj: Any, path: str, *, optional: bool = False) -> list[int] | None:
    value = field(obj, path, list, optional=optional)
    if value is not None and not all(isinstance(v, int) for v in value):
        raise MalformedResponse(f"malformed response: field '{path}' should hold integers")
    return value


def seed_for(request_id: str) -> int:
    """The sampling seed of a turn: the same on every attempt, so a retry draws the same sample."""
    return int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:4], "little")


class Transport:
    """The OpenAI client and an httpx client for `root`, with our retries (logged, bounded in time)."""

    def __init__(self, root: str, api_key: str, *, timeout: float, max_retries: int, retry_deadline_s: float,
                 backoff_s: float, max_backoff_s: float):
        self.root = root
        self.timeout = timeout
        self.max_retries = max_retries
        self.retry_deadline_s = retry_deadline_s
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        # Our retries, not the client's: they are logged, bounded in time, and keep the request id.
        self.client = openai.OpenAI(base_url=root + "/v1", api_key=api_key, timeout=timeout, max_retries=0)
        self.http = httpx.Client(timeout=min(timeout, 10.0))
        self.counts = {"attempts": 0, "retries": 0}
        self._lock = threading.Lock()

    def _retrying(self, request_id: str) -> Retrying:
        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            with self._lock:
                self.counts["retries"] += 1
            log.warning("agentspec remote: %s attempt %d failed (%s: %s); retrying in %.1f s",
                        _label(request_id), state.attempt_number, type(exc).__name__, _short(exc),
                        state.next_action.sleep if state.next_action else 0.0)

        return Retrying(retry=retry_if_exception(retryable), reraise=True, before_sleep=before_sleep,
                        stop=(stop_after_attempt(self.max_retries + 1)
                              | stop_after_delay(self.retry_deadline_s)),
                        wait=wait_exponential(multiplier=self.backoff_s, max=self.max_backoff_s))

    def call(self, fn: Callable[[int], Any], request_id: str, counted: bool = True) -> Any:
        """`fn(attempt)` until it succeeds or a failure is not retryable; out of retries: BackendError.
        counted=False: a look-up on a turn's behalf, not one of its attempts (`counts` unchanged)."""
        started = time.monotonic()
        attempt = 0

        def once():
            nonlocal attempt
            attempt += 1
            with self._lock:
                self.counts["attempts"] += counted
            return fn(attempt)

        try:
            return self._retrying(request_id)(once)
        except Exception as exc:
            if retryable(exc):
                raise BackendError(
                    f"server {self.root} failed {_label(request_id)} after {attempt} attempt(s) over "
                    f"{time.monotonic() - started:.1f} s: {type(exc).__name__}: {_short(exc)}") from exc
            raise

    def get(self, url: str, retry: bool = True) -> httpx.Response:
        if not retry:
            return self.http.get(url)
        try:
            return self.call(lambda _n: _raise_5xx(self.http.get(url)), f"GET {url}")
        except BackendError:
            raise
        except httpx.HTTPError as exc:
            raise BackendError(f"GET {url} failed: {exc}") from exc

    def lookup(self, url: str, request_id: str) -> httpx.Response:
        """GET `url` on a turn's behalf: retried as the turn's attempts are, not counted among them."""
        return self.call(lambda _n: _raise_5xx(self.http.get(url)), request_id, counted=False)

    def get_json(self, path: str, retry: bool = True) -> Any:
        resp = self.get(self.root + path, retry)
        if resp.status_code != 200:
            raise BackendError(f"GET {self.root}{path} answered HTTP {resp.status_code}")
        try:
            return resp.json()
        except ValueError:
            raise MalformedResponse(f"malformed response: {path} is not JSON") from None

    def close(self) -> None:
        self.client.close()
        self.http.close()


class Ledger:
    """The idempotency window: request id -> its future, the newest `size` kept (never one in flight)."""

    def __init__(self, size: int):
        self.size = size
        self._futures: OrderedDict[str, Future] = OrderedDict()
        self._lock = threading.Lock()

    def claim(self, request_id: str, start: Callable[[], Future]) -> Future:
        """The future of a committed or in-flight turn; else `start()`'s, remembered."""
        with self._lock:
            fut = self._futures.get(request_id)
            if fut is not None and not (fut.done() and fut.exception() is not None):
                return fut  # committed or in flight: never generate the same turn twice
            fut = start()
            self._remember(request_id, fut)
        return fut

    def committed(self, request_id: str) -> Any:
        """The result of a turn already committed without error, else None."""
        with self._lock:
            fut = self._futures.get(request_id)
        if fut is not None and fut.done() and fut.exception() is None:
            return fut.result()
        return None

    def commit(self, request_id: str, result: Any) -> None:
        fut: Future = Future()
        fut.set_result(result)
        with self._lock:
            self._remember(request_id, fut)

    def __len__(self) -> int:
        return len(self._futures)

    def _remember(self, request_id: str, fut: Future) -> None:
        self._futures[request_id] = fut
        self._futures.move_to_end(request_id)
        while len(self._futures) > self.size:
            oldest = next(iter(self._futures))
            if not self._futures[oldest].done():
                break
            del self._futures[oldest]


class StreamReplay:
    """What a stream has delivered so far; a restarted attempt must agree with it."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.delivered = ""

    def fresh(self, text: str) -> str:
        """The part of `text` (the attempt's text so far) not yet delivered; it is delivered now."""
        if len(text) <= len(self.delivered):
            if not self.delivered.startswith(text):
                raise self._diverged()
            return ""
        if not text.startswith(self.delivered):
            raise self._diverged()
        new = text[len(self.delivered):]
        self.delivered = text
        return new

    def read(self, stream: Any, on_fresh: Callable[[str], None]) -> dict:
        """One attempt's chunks: `on_fresh` gets each undelivered piece of text; returns the turn's
        text, ids, prompt_ids, finish and metrics. A stream without its final usage chunk is cut:
        `_StreamBroken` (retryable)."""
        text, ids, prompt_ids, finish, metrics, done = "", [], None, None, None, False
        with stream:
            for chunk in stream:
                data = chunk.model_dump()
                if data.get("prompt_token_ids") is not None:
                    prompt_ids = int_list(data, "prompt_token_ids")
                if data.get("usage") is not None and not data.get("choices"):
                    metrics, done = data.get("metrics"), True
                for choice in data.get("choices") or []:
                    text += field(choice, "delta.content", str, optional=True) or ""
                    ids += int_list(choice, "token_ids", optional=True) or []
                    finish = choice.get("finish_reason") or finish
                    new = self.fresh(text)
                    if new:
                        on_fresh(new)
        if not done:
            raise _StreamBroken(f"stream of turn {self.request_id} ended without its final usage chunk")
        return {"text": text, "ids": ids, "prompt_ids": prompt_ids or [], "finish": finish,
                "metrics": metrics}

    def _diverged(self) -> BackendError:
        return BackendError(f"turn {self.request_id}: the retried stream diverged from the text already "
                            "delivered (use temperature 0 or a seed)")


def _raise_5xx(resp: httpx.Response) -> httpx.Response:
    if resp.status_code >= 500:
        raise openai.InternalServerError(f"HTTP {resp.status_code}", response=resp, body=None)
    return resp


def _label(request_id: str) -> str:
    return request_id if request_id.startswith("GET ") else f"turn {request_id}"


def _short(exc: BaseException | None) -> str:
    return str(exc).splitlines()[0][:200] if exc else ""
