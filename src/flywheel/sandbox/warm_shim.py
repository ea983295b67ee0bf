#!/run/flywheel/python -IS
"""The sandbox's `python` in an episode with a warm pytest parent (`flywheel.sandbox.warm`).

Mounted over the runtime's interpreter, so the kernel runs it for `python`, `python3` and every script
whose shebang names them (the `pytest` script): argv is [the interpreter's path as executed, its
arguments...]. `python -m pytest ...` and the `pytest` script are sent, with this process's descriptors,
environment, working directory, umask and rlimits, to the warm parent, which forks their run; the shim
forwards the signals it gets and ends as the run did (its exit code, or killed by the same signal).
Everything else, and every request the parent declines, execs the real interpreter with the same argv, as
if the shim had not been there.
"""

import os
import sys

REAL = "/run/flywheel/python"
SOCKET = "/run/flywheel/warm.sock"
SCRIPTS = ("pytest", "py.test")
FORWARDED = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGCONT", "SIGWINCH")
MAX_FDS = 64


def cold():
    os.execv(REAL, sys.argv)  # argv[0] as executed: sys.executable and the venv come out as cold


def wanted(args):
    return args[:2] == ["-m", "pytest"] or (
        bool(args)
        and os.path.basename(args[0]) in SCRIPTS
        and os.path.dirname(args[0]) == os.path.dirname(sys.argv[0])
    )


def request():
    import json
    import resource

    fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    fds = [fd for fd in fds if _open(fd)]
    if len(fds) > MAX_FDS:
        return None
    limits = {
        name: resource.getrlimit(getattr(resource, name))
        for name in dir(resource)
        if name.startswith("RLIMIT_")
    }
    body = {
        "argv0": sys.argv[0],
        "args": sys.argv[1:],
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "umask": _umask(),
        "rlimits": limits,
        "fds": fds,
    }
    return json.dumps(body).encode(), fds


def _open(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def warm(body, fds):
    """Run through the warm parent; None if it declined before anything ran (then the shim goes cold)."""
    import signal
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        sock.connect(SOCKET)
        socket.send_fds(sock, [body], fds)
        first = sock.recv(256)
    except OSError:
        return None
    if first != b"warm":
        return None  # "cold ...", or the parent is gone
    for name in FORWARDED:
        signal.signal(getattr(signal, name), lambda num, _: _forward(sock, num))
    while True:
        try:
            msg = sock.recv(256)
            break
        except InterruptedError:
            continue
    kind, _, value = msg.decode().partition(" ")
    if kind == "exit":
        return int(value)
    if kind == "signal":
        num = int(value)
        signal.signal(num, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [num])
        os.kill(os.getpid(), num)
    return 1  # the parent went away mid-run


def _forward(sock, num):
    try:  # noqa: SIM105  (contextlib is one more import in every `python` of the sandbox)
        sock.send(f"sig {num}".encode())
    except OSError:
        pass


def main():
    if wanted(sys.argv[1:]) and os.path.exists(SOCKET):
        try:
            made = request()
        except (OSError, ValueError, TypeError):
            made = None
        if made is not None:
            code = warm(*made)
            if code is not None:
                os._exit(code)
    cold()


main()
