"""Stable seeds: the same parts give the same seed in every process (unlike `hash`, which is salted)."""

import hashlib


def stable_seed(*parts: object) -> int:
    """A non-negative 63-bit seed from `parts` (their repr)."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little") >> 1
