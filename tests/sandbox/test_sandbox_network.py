"""Guarantee 1: no network at all, not even the host's loopback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from flywheel.sandbox.fallback import unshare_net

PROBE = """
import json, socket, sys
port = int(sys.argv[1])
res = {}
try:
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    res["loopback"] = "connected"
except OSError as e:
    res["loopback"] = type(e).__name__
if sys.argv[2] == "all":
    res["interfaces"] = sorted(name for _, name in socket.if_nameindex())
    try:
        socket.getaddrinfo("example.com", 80)
        res["dns"] = "resolved"
    except OSError:
        res["dns"] = "failed"
    try:
        socket.create_connection(("1.1.1.1", 53), timeout=2).close()
        res["outbound"] = "connected"
    except OSError:
        res["outbound"] = "failed"
print(json.dumps(res))
"""


@pytest.fixture
def server():
    """A TCP server on the host's 127.0.0.1 (connections complete in its backlog, no accept needed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield s.getsockname()[1]
    s.close()


def test_host_server_is_reachable_from_the_host(server):
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(server), "loopback"], capture_output=True, text=True
    )
    assert json.loads(out.stdout)["loopback"] == "connected"  # the probe can see a reachable server


def test_no_network_inside(sandbox, ws, py, server):
    if sandbox.name == "fallback" and not unshare_net():
        pytest.skip("this host refuses `unshare -n`: the fallback backend cannot isolate the network")
    result = sandbox.run(ws, py(PROBE, str(server), "all"))
    assert result.exit_code == 0, result.output
    res = json.loads(result.output)
    assert res["loopback"] != "connected"
    assert set(res["interfaces"]) <= {"lo"}
    assert res["dns"] == "failed"
    assert res["outbound"] == "failed"
