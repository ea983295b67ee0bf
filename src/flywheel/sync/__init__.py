"""Weight sync: bf16 deltas and anchors (`codec`), LoRA adapter payloads (`adapters`), object storage
(`store`), publish/follow (`channel`).

The trainer publishes each new version as a sparse, zstd-compressed delta against the previous one (and a
full anchor every few versions); inference workers follow LATEST, apply the deltas in place and verify
every tensor against the trainer's checksums. See each module's docstring for the format and guarantees.
"""

from flywheel.sync.adapters import AdapterWeights, apply_adapters, encode_adapters
from flywheel.sync.channel import AdapterPublisher, Publisher, PublishStats, Subscriber, latest_version
from flywheel.sync.codec import (
    DeltaError,
    apply_delta,
    decode_anchor,
    decode_delta,
    digest_of,
    encode_anchor,
    encode_delta,
    load_anchor_into,
    read_manifest,
)
from flywheel.sync.store import FsspecStore, Retry, StoreError, open_store

__all__ = [
    "AdapterPublisher",
    "AdapterWeights",
    "DeltaError",
    "FsspecStore",
    "PublishStats",
    "Publisher",
    "Retry",
    "StoreError",
    "Subscriber",
    "apply_adapters",
    "apply_delta",
    "decode_anchor",
    "decode_delta",
    "digest_of",
    "encode_adapters",
    "encode_anchor",
    "encode_delta",
    "latest_version",
    "load_anchor_into",
    "open_store",
    "read_manifest",
]
