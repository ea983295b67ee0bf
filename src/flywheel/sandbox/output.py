"""Bounded capture of a command's output: the first and last bytes are kept, the middle is counted.

A command may print gigabytes; the sandbox keeps `limit` bytes of it (half from the start, half from the
end) and replaces the rest by one marker line, `[... N bytes truncated ...]`, so that both the command
line that failed first and the summary printed last survive. Memory stays O(limit) whatever is printed.
"""

from __future__ import annotations


def marker(dropped: int) -> str:
    """The line that stands in for the bytes that were not kept."""
    return f"\n[... {dropped} bytes truncated ...]\n"


class OutputBuffer:
    """Accumulates a byte stream, keeping its head and its tail."""

    def __init__(self, limit: int):
        self.head_cap = max(0, limit) // 2
        self.tail_cap = max(0, limit) - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.tail_cap:
            self.tail += chunk
            if len(self.tail) > 2 * self.tail_cap:  # trim in batches: amortised O(1) per byte
                del self.tail[: -self.tail_cap]

    def render(self) -> tuple[str, bool]:
        """The kept text (UTF-8, undecodable bytes replaced) and whether anything was dropped."""
        tail = bytes(self.tail[-self.tail_cap :]) if self.tail_cap else b""
        dropped = self.total - len(self.head) - len(tail)
        head_text = self.head.decode("utf-8", "replace")
        tail_text = tail.decode("utf-8", "replace")
        if dropped <= 0:
            return (bytes(self.head) + tail).decode("utf-8", "replace"), False
        return head_text + marker(dropped) + tail_text, True


def truncate(data: bytes, limit: int) -> tuple[str, bool]:
    """`data` as the sandbox would report it under an output limit of `limit` bytes."""
    buf = OutputBuffer(limit)
    buf.feed(data)
    return buf.render()
