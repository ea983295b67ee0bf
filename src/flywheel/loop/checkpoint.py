"""Trainer checkpoints: every step, atomically on local disk, replicated to a second store (the peer).

Layout, locally (`root`) and on the peer (`checkpoints/` in a `WeightStore`)::

    v00000007/trainer/...     what `trainer.save(dir)` wrote (model, optimizer, RNG, version)
    v00000007/loop.json       the loop's own state (next round, counters)
    v00000007/MANIFEST.json   version, and every file's size and blake2b; written last
    LATEST                    (peer only) {"version": 7}, written after the manifest

Saving writes into a hidden temporary directory and renames it into place, so a local checkpoint either
exists whole or not at all; a checkpoint is *complete* when its manifest is present and every file
matches it. Replication uploads the files, then the manifest, then LATEST, so the peer never holds a
manifest for files it does not have. The peer keeps the `keep` newest checkpoints, as the local disk
does: once LATEST names a new one, older ones are deleted, manifest first, so a deletion cut short leaves
nothing that restores; the next replication, or the next start, finishes it.

Restoring picks the newest complete checkpoint: the newest local one that verifies, unless the peer holds
a newer one (or no local one verifies: deleted disk, truncated file, flipped bit), in which case the peer's
is downloaded into a fresh local directory, verified the same way, and loaded. A local one newer than the
peer's (the trainer was killed before or while replicating it) is replicated again first, so the peer
holds no half-uploaded checkpoint and catches up.

Ordering in the loop, for every step: metrics line, checkpoint, replicate, publish. The published
version therefore never runs ahead of the peer's checkpoint, and a restarted trainer resumes at a
version at or after the one the pools serve.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Protocol

from flywheel.files import building
from flywheel.protocols import WeightStore
from flywheel.sync.store import StoreError

MANIFEST = "MANIFEST.json"
PEER_PREFIX = "checkpoints"


class Saveable(Protocol):
    version: int

    def save(self, dir: Path) -> None: ...

    def load(self, dir: Path) -> None: ...


def ckpt_name(version: int) -> str:
    return f"v{version:08d}"


def file_hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def manifest_of(root: Path, version: int) -> dict[str, Any]:
    files = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            data = p.read_bytes()
            files[p.relative_to(root).as_posix()] = {"size": len(data), "blake2b": file_hash(data)}
    return {"version": version, "files": files}


def verify(root: Path) -> dict[str, Any] | None:
    """The manifest when `root` is a complete checkpoint (every file present and matching), else None."""
    try:
        manifest = json.loads((root / MANIFEST).read_text())
        for rel, meta in manifest["files"].items():
            data = (root / rel).read_bytes()
            if len(data) != meta["size"] or file_hash(data) != meta["blake2b"]:
                return None
        return manifest
    except (OSError, ValueError, KeyError, TypeError):
        return None


class Checkpointer:
    """Local checkpoints under `root`, replicated to `peer`; see the module docstring."""

    def __init__(self, root: Path, peer: WeightStore | None = None, keep: int = 2) -> None:
        self.root, self.peer, self.keep = Path(root), peer, max(1, keep)
        self.root.mkdir(parents=True, exist_ok=True)
        self.source = ""  # where the last restore came from: "local", "peer" or "" (fresh start)
        self.skipped: list[str] = []  # local checkpoints refused at the last restore

    # -- saving

    def save(self, trainer: Saveable, state: dict[str, Any]) -> Path:
        """Write a complete checkpoint of `trainer` (and the loop's `state`) atomically; returns its dir."""
        version = int(trainer.version)
        final = self.root / ckpt_name(version)
        with building(final) as tmp:
            tmp.chmod(0o755)
            trainer.save(tmp / "trainer")
            (tmp / "loop.json").write_text(json.dumps(state, sort_keys=True))
            (tmp / MANIFEST).write_text(json.dumps(manifest_of(tmp, version)))
            fsync_tree(tmp)
        self.prune()
        return final

    def prune(self) -> None:
        for old in self.local_dirs()[self.keep :]:
            shutil.rmtree(old, ignore_errors=True)
        for tmp in self.root.glob(".v*.tmp-*"):
            shutil.rmtree(tmp, ignore_errors=True)

    def replicate(self, path: Path) -> None:
        """Upload a saved checkpoint to the peer: files, then the manifest, then LATEST."""
        if self.peer is None:
            return
        manifest = json.loads((path / MANIFEST).read_text())
        base = f"{PEER_PREFIX}/{path.name}"
        for rel in manifest["files"]:
            self.peer.put(f"{base}/{rel}", (path / rel).read_bytes())
        self.peer.put(f"{base}/{MANIFEST}", json.dumps(manifest).encode())
        self.peer.put(f"{PEER_PREFIX}/LATEST", json.dumps({"version": manifest["version"]}).encode())
        self.prune_peer(int(manifest["version"]))

    def prune_peer(self, latest: int) -> None:
        """Delete the peer's checkpoints older than the `keep` newest up to `latest` (a store that fails
        now is left as it is: the next call lists everything again)."""
        assert self.peer is not None
        try:
            keys = self.peer.list(f"{PEER_PREFIX}/")
            names = sorted({k.split("/")[1] for k in keys if k.count("/") >= 2}, reverse=True)
            kept = [n for n in names if n <= ckpt_name(latest)][: self.keep]
            for name in (n for n in names if kept and n < kept[-1]):
                files = [k for k in keys if k.startswith(f"{PEER_PREFIX}/{name}/")]
                for key in sorted(files, key=lambda k: not k.endswith(f"/{MANIFEST}")):
                    self.peer.delete(key)
        except StoreError:
            return

    # -- restoring

    def local_dirs(self) -> list[Path]:
        """Local checkpoint directories, newest first."""
        return sorted((p for p in self.root.glob("v*") if p.is_dir()), reverse=True)

    def newest_local(self) -> tuple[int, Path] | None:
        self.skipped = []
        for path in self.local_dirs():
            manifest = verify(path)
            if manifest is not None:
                return int(manifest["version"]), path
            self.skipped.append(path.name)
        return None

    def peer_version(self) -> int | None:
        if self.peer is None:
            return None
        try:
            if not self.peer.exists(f"{PEER_PREFIX}/LATEST"):
                return None
            return int(json.loads(self.peer.get(f"{PEER_PREFIX}/LATEST"))["version"])
        except (StoreError, ValueError, KeyError):
            return None

    def download(self, version: int) -> Path | None:
        """Fetch the peer's checkpoint `version` into a fresh local directory; None if it does not verify."""
        assert self.peer is not None
        name = ckpt_name(version)
        tmp = self.root / f".{name}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            manifest = json.loads(self.peer.get(f"{PEER_PREFIX}/{name}/{MANIFEST}"))
            for rel in manifest["files"]:
                dest = tmp / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(self.peer.get(f"{PEER_PREFIX}/{name}/{rel}"))
            (tmp / MANIFEST).write_text(json.dumps(manifest))
        except (StoreError, ValueError, KeyError, OSError):
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        if verify(tmp) is None:
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        final = self.root / name
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        return final

    def restore(self, trainer: Saveable) -> dict[str, Any] | None:
        """Load the newest complete checkpoint into `trainer`; returns the loop state (None: fresh start)."""
        local = self.newest_local()
        peer_v = self.peer_version()
        path, self.source = None, ""
        if peer_v is not None and (local is None or peer_v > local[0]):
            path = self.download(peer_v)
            self.source = "peer" if path is not None else ""
        if path is None and local is not None:
            path, self.source = local[1], "local"
            if self.peer is not None and (peer_v is None or peer_v < local[0]):
                # killed between saving and replicating: the peer may hold this version half-uploaded
                with contextlib.suppress(StoreError):  # unreachable now: the next step replicates
                    self.replicate(path)
        if path is None:
            return None
        if self.peer is not None and peer_v is not None:
            self.prune_peer(peer_v)  # finish a deletion that a kill cut short
        trainer.load(path / "trainer")
        return json.loads((path / "loop.json").read_text())


def fsync_tree(root: Path) -> None:
    """Flush every file under `root` to disk (a checkpoint must survive a crash right after the rename)."""
    for p in root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
