"""The delta codec: lossless round trips, in-place apply, refusals that leave the weights untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sync_helpers import bitwise, clone, make_weights, ulp_step

from flywheel.sync.codec import (
    DeltaError,
    apply_delta,
    decode_anchor,
    decode_gaps,
    encode_anchor,
    encode_delta,
    encode_gaps,
    load_anchor_into,
    read_manifest,
    summarize,
)


def roundtrip(old, new, **kw) -> dict[str, torch.Tensor]:
    blob = encode_delta(old, new, version=5, base_version=4, **kw)
    recv = clone(old)
    assert apply_delta(recv, blob, expect_base=4) == 5
    return recv


@pytest.mark.parametrize("mode", ["auto", "raw", "xor", "diff"])
@pytest.mark.parametrize("frac", [0.0, 0.01, 0.3, 1.0])
def test_ulp_changes_round_trip(mode, frac):
    old = make_weights()
    new = ulp_step(old, frac)
    assert bitwise(roundtrip(old, new, value_mode=mode), new)


def test_dense_random_changes_round_trip():
    old, new = make_weights(0), make_weights(1)  # nearly every position differs, arbitrary bits
    assert bitwise(roundtrip(old, new), new)
    assert summarize(encode_delta(old, new, version=1, base_version=0))["changed_fraction"] > 0.99


def test_empty_delta_is_small_and_applies():
    old = make_weights()
    blob = encode_delta(old, clone(old), version=1, base_version=0)
    assert summarize(blob)["changed"] == 0
    assert bitwise(roundtrip(old, clone(old)), old)


def test_special_bit_patterns_are_exact():
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40, -3.0]).bfloat16()
    old = {"s": torch.zeros(7, dtype=torch.bfloat16), "t": specials.clone()}
    weird = torch.tensor(
        [0x7FC1, 0xFFC0 - 65536, 0x8000 - 65536, 0x0001, 0x7F80, 0xFF80 - 65536, 0], dtype=torch.int16
    )
    new = {"s": weird.view(torch.bfloat16), "t": specials.flip(0).contiguous()}
    for mode in ("raw", "xor", "diff"):
        assert bitwise(roundtrip(old, new, value_mode=mode), new)


def test_auto_picks_the_smaller_value_coding():
    old = make_weights()
    new = ulp_step(old, 0.05)
    sizes = {m: len(encode_delta(old, new, version=1, base_version=0, value_mode=m)) for m in ("xor", "diff")}
    auto = encode_delta(old, new, version=1, base_version=0)
    assert len(auto) == min(sizes.values())
    assert read_manifest(auto)["value_mode"] == min(sizes, key=sizes.get)


def test_gap_code_round_trips_long_gaps():
    idx = np.array([0, 1, 254, 255, 256, 510, 511, 100_000, 100_254, 3_000_000], np.int64)
    stream = encode_gaps(idx)
    assert np.array_equal(decode_gaps(stream), idx)
    assert encode_gaps(np.array([254])).tolist() == [254]
    assert encode_gaps(np.array([255])).tolist() == [255, 0]


def test_apply_is_in_place():
    old = make_weights()
    new = ulp_step(old, 0.1)
    recv = clone(old)
    ptrs = {n: t.data_ptr() for n, t in recv.items()}
    tensors = dict(recv)
    apply_delta(recv, encode_delta(old, new, version=1, base_version=0), expect_base=0)
    assert {n: t.data_ptr() for n, t in recv.items()} == ptrs
    assert all(recv[n] is tensors[n] for n in recv)
    assert bitwise(recv, new)


def test_wrong_base_version_is_refused_untouched():
    old = make_weights()
    blob = encode_delta(old, ulp_step(old, 0.1), version=3, base_version=2)
    recv = clone(old)
    with pytest.raises(DeltaError, match="based on version 2"):
        apply_delta(recv, blob, expect_base=1)
    assert bitwise(recv, old)


def test_wrong_base_weights_are_refused_untouched():
    old = make_weights()
    new = ulp_step(old, 0.1)
    other = ulp_step(old, 0.001, seed=9)  # same version number, slightly different bits
    recv = clone(other)
    with pytest.raises(DeltaError, match="does not reproduce"):
        apply_delta(recv, encode_delta(old, new, version=1, base_version=0), expect_base=0)
    assert bitwise(recv, other)


def test_known_base_digest_mismatch_is_refused_before_writing():
    old = make_weights()
    blob = encode_delta(old, ulp_step(old, 0.1), version=1, base_version=0)
    recv = clone(old)
    with pytest.raises(DeltaError, match="base digest"):
        apply_delta(recv, blob, expect_base=0, base_digest="0" * 32)
    assert bitwise(recv, old)


def test_corrupted_payload_is_refused_untouched():
    old = make_weights()
    blob = bytearray(encode_delta(old, ulp_step(old, 0.2), version=1, base_version=0))
    for pos in (10, len(blob) // 2, len(blob) - 3):  # header, manifest or payload
        bad = bytearray(blob)
        bad[pos] ^= 0x40
        recv = clone(old)
        with pytest.raises(DeltaError):
            apply_delta(recv, bytes(bad), expect_base=0)
        assert bitwise(recv, old)
    with pytest.raises(DeltaError):
        apply_delta(clone(old), bytes(blob[:-20]), expect_base=0)


def test_mismatched_tensors_are_refused():
    old = make_weights()
    new = dict(old)
    new["layer.b"] = torch.zeros(49, dtype=torch.bfloat16)
    with pytest.raises(DeltaError, match="shape"):
        encode_delta(old, new, version=1, base_version=0)
    blob = encode_delta(old, ulp_step(old, 0.1), version=1, base_version=0)
    recv = clone(old)
    del recv["norm"]
    with pytest.raises(DeltaError, match="does not fit"):
        apply_delta(recv, blob, expect_base=0)


def test_anchor_round_trip_and_load_in_place():
    w = make_weights()
    blob = encode_anchor(w, 7)
    version, fresh = decode_anchor(blob)
    assert version == 7 and bitwise(fresh, w)
    recv = make_weights(3)
    ptr = recv["emb"].data_ptr()
    assert load_anchor_into(recv, blob) == 7
    assert bitwise(recv, w) and recv["emb"].data_ptr() == ptr
    bad = bytearray(blob)
    bad[-5] ^= 1
    keep = make_weights(3)
    with pytest.raises(DeltaError):
        load_anchor_into(keep, bytes(bad))
    assert bitwise(keep, make_weights(3))
