"""Object storage for weight versions over fsspec: local files (the embedded default) and S3.

`FsspecStore` implements the `WeightStore` protocol (put, get, exists, list, delete) on any fsspec URL. Backends
load lazily: `file://` needs nothing extra, `s3://bucket/prefix` imports s3fs only when chosen. S3
endpoint and credentials come from the constructor or the usual environment variables
(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL or FLYWHEEL_S3_ENDPOINT, AWS_REGION).

Atomicity, from a reader's view. One `put` is atomic: S3 objects appear whole, and local files are
written to a temporary name in the same directory and renamed. The layout that `flywheel.sync.channel`
builds on top makes a version atomic: the payload is written first under its content key, then its
marker `versions/<v>.json`, then the `LATEST` pointer; readers follow only markers, so they never see a
half-published version.

Retries. Connection-level failures (refused, reset, timed out, endpoint unreachable) and the server's
"try again" answers (500 InternalError, 503 SlowDown/ServiceUnavailable, as a server that is still
starting gives them) are retried with exponential backoff, bounded by `Retry.attempts`; anything else
(missing key, permission) raises at once. Errors that survive the retries raise `StoreError`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from flywheel.errors import FlywheelError

T = TypeVar("T")


class StoreError(FlywheelError):
    """The object store could not be reached, or a key is missing."""


@dataclass(frozen=True)
class Retry:
    """Exponential backoff for connection errors."""

    attempts: int = 8  # tries in all, the first included
    base_s: float = 0.2  # delay after the first failure
    factor: float = 2.0  # growth of the delay per failure
    max_s: float = 5.0  # longest single delay

    def delays(self) -> list[float]:
        return [min(self.max_s, self.base_s * self.factor**i) for i in range(max(0, self.attempts - 1))]


NO_RETRY = Retry(attempts=1)


# s3fs turns S3's 500 InternalError into EREMOTEIO and 503 SlowDown/ServiceUnavailable into EBUSY.
RETRYABLE_ERRNOS = {getattr(errno, "EREMOTEIO", errno.EIO), errno.EBUSY}


def is_transient(exc: BaseException) -> bool:
    """Failures worth retrying: connection-level ones (by type, then by the names botocore/aiohttp use)
    and the server's own "try again" answers."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, OSError) and exc.errno in RETRYABLE_ERRNOS:
        return True
    names = {type(e).__name__ for e in chain_of(exc)}
    markers = ("Connect", "Timeout", "EndpointConnection", "ServerDisconnected", "ClientOSError")
    return any(m in n for n in names for m in markers)


def chain_of(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in seen:
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


def with_retry(
    fn: Callable[[], T], retry: Retry, what: str, on_retry: Callable[[int, BaseException], None] | None = None
) -> T:
    """Call `fn`, retrying transient failures with backoff; a lasting failure raises StoreError."""
    delays = retry.delays()
    for attempt in range(len(delays) + 1):
        try:
            return fn()
        except Exception as exc:
            if isinstance(exc, FileNotFoundError):
                raise StoreError(f"{what}: not found") from None
            if not is_transient(exc) or attempt == len(delays):
                raise StoreError(
                    f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                ) from exc
            if on_retry is not None:
                on_retry(attempt + 1, exc)
            time.sleep(delays[attempt])
    raise AssertionError("unreachable")


def s3_options(
    endpoint_url: str | None, key: str | None, secret: str | None, region: str | None
) -> dict[str, Any]:
    """s3fs constructor options from explicit values, falling back to the environment."""
    env = os.environ
    endpoint = endpoint_url or env.get("FLYWHEEL_S3_ENDPOINT") or env.get("AWS_ENDPOINT_URL")
    client: dict[str, Any] = {
        "region_name": region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
    }
    if endpoint:
        client["endpoint_url"] = endpoint
    return {
        "key": key or env.get("AWS_ACCESS_KEY_ID"),
        "secret": secret or env.get("AWS_SECRET_ACCESS_KEY"),
        "client_kwargs": client,
        # Our own retry loop owns backoff; botocore's would hide outages behind long silent waits.
        "config_kwargs": {
            "retries": {"max_attempts": 1, "mode": "standard"},
            "connect_timeout": 3,
            "read_timeout": 30,
        },
        "use_listings_cache": False,
        "skip_instance_cache": True,
    }


class FsspecStore:
    """A `WeightStore` on an fsspec URL (`file:///path`, a plain path, or `s3://bucket/prefix`)."""

    def __init__(
        self,
        url: str,
        *,
        endpoint_url: str | None = None,
        key: str | None = None,
        secret: str | None = None,
        region: str | None = None,
        retry: Retry = Retry(),
        read_retry: Retry = Retry(attempts=2, base_s=0.1),
        on_retry: Callable[[int, BaseException], None] | None = None,
    ) -> None:
        import fsspec

        protocol, _, rest = url.partition("://") if "://" in url else ("file", "", url)
        self.url, self.protocol = url, protocol
        self.retry, self.read_retry, self.on_retry = retry, read_retry, on_retry
        options = s3_options(endpoint_url, key, secret, region) if protocol in ("s3", "s3a") else {}
        self.fs = fsspec.filesystem(protocol, **options)
        self.root = rest.rstrip("/") if protocol != "file" else os.path.abspath(rest)
        self.local = protocol == "file"
        if self.local:
            os.makedirs(self.root, exist_ok=True)
        else:
            self.ensure_bucket()

    def path(self, key: str) -> str:
        if key.startswith("/") or ".." in key.split("/"):
            raise StoreError(f"invalid key {key!r}")
        return f"{self.root}/{key}"

    def ensure_bucket(self) -> None:
        bucket = self.root.split("/", 1)[0]

        def make() -> None:
            if not self.fs.exists(bucket):
                with contextlib.suppress(FileExistsError):  # another process made it meanwhile: as wanted
                    self.fs.mkdir(bucket)

        with_retry(make, self.retry, f"{self.url}: bucket {bucket}", self.on_retry)

    def put(self, key: str, data: bytes) -> None:
        """Write `data` under `key`, whole or not at all (retried on connection errors)."""
        with_retry(lambda: self._put(self.path(key), data), self.retry, f"put {key}", self.on_retry)

    def _put(self, path: str, data: bytes) -> None:
        if not self.local:
            self.fs.pipe_file(path, data)
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def get(self, key: str) -> bytes:
        return with_retry(lambda: self.fs.cat_file(self.path(key)), self.read_retry, f"get {key}")

    def exists(self, key: str) -> bool:
        return with_retry(lambda: self.fs.exists(self.path(key)), self.read_retry, f"exists {key}")

    def delete(self, key: str) -> None:
        """Remove `key` (retried like a put); a missing key is not an error. Locally, folders left empty
        are removed up to the store's root."""
        with_retry(lambda: self._delete(self.path(key)), self.retry, f"delete {key}", self.on_retry)

    def _delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(path)
        if self.local:
            parent = os.path.dirname(path)
            while parent != self.root and parent.startswith(self.root + os.sep):
                try:
                    os.rmdir(parent)
                except OSError:  # not empty, or gone
                    break
                parent = os.path.dirname(parent)

    def list(self, prefix: str) -> list[str]:
        """Keys under `prefix` (a folder-like prefix such as "versions/"), sorted."""
        base = self.path(prefix.rstrip("/")) if prefix.strip("/") else self.root

        def ls() -> list[str]:
            try:
                found = self.fs.find(base, detail=True)
            except FileNotFoundError:
                return []
            files = [
                p for p, info in found.items() if info.get("type") != "directory"
            ]  # S3 keeps emptied folders
            strip = self.root.rstrip("/") + "/"
            return sorted(p[len(strip) :] if p.startswith(strip) else p for p in files if ".tmp-" not in p)

        return with_retry(ls, self.read_retry, f"list {prefix}")


def open_store(url: str, **options: Any) -> FsspecStore:
    """The store for `url`; options go to `FsspecStore` (endpoint, credentials, retry policies)."""
    return FsspecStore(url, **options)
