"""Peer replica of the memory tier: each rank's committed memory snapshot, copied to another pod.

Hand-written on the standard library (sockets, threads), not NVRx 0.7 `checkpointing.local`
(docs/peer-replica.md gives the reasons: CUDA-only state dicts, replication inside the training
call, a second file format).

    pod of slot s                                     pod of slot s+1 (its `peerEndpoint`)
    rank r's writer commits <local>/rank-r/step-N.X   ReplicaServer (a thread of `rtj-trainer launch`)
      -> Replicator thread streams its 3 files   -->    <local>/replicas/rank-r/step-N.X.<id>.partial
         (CRC32 of each computed on the way)            CRC32 checked, snapshot.json (with the CRC32s)
                                                        written, renamed to step-N.X: committed; the
                                                        rank's older replicas are deleted

The replica has the memory tier's own layout (`checkpoint_format`: a rank directory of
`step-<N>.<nonce>` snapshots with `snapshot.json`), keyed by rank, not by the sender's slot: a
replacement pod may be given other ranks by the rendezvous, so a shard is found by what a pod
holds. A replica directory is complete or absent (one rename); a stream cut by a kill leaves a
`.partial` that is never listed and is removed when the server starts.

Coalescing: a rank streams one snapshot at a time; a snapshot committed meanwhile replaces the
pending one (the newest wins). The server keeps one replica per rank, the last one committed
(arrival order, not step order: after a resume the same step comes again with a new nonce), and
the shard file of the one it replaced as the rank's `SPARE_BIN`, which the next put overwrites in
place (tmpfs allocates its pages once), unless a get was streaming it then.

Streams: each file is sent by the kernel from the page cache (`sendfile`: never mapped by the
sender, a rank, whose training thread an unmap would stall) with its CRC32 computed by a thread that
reads it beside the send (`_FileCrc`), and received straight into the destination's mapping (the
replica server, or a replacement rank fetching before it trains), its CRC32 computed beside the
socket's copy (`_TrailingCrc`): no copy into fresh memory per chunk (on the project's 2-core machine
that copy took 3 times the read itself). bench/replica_stream.py measures put and get next to a
loopback floor.

Fetch: a rank that lacks a snapshot asks the holder's server for (rank, step, nonce) and writes
what comes back into its own memory-tier directory (partial -> rename), with the CRC32s the
server checked, so the normal local load validates it (`CheckpointManager.load_latest`).

Wire format (one request per TCP connection): frames of a 4-byte big-endian length and a JSON
document; file contents follow their header raw.
  put:  {"op": "put", "rank", "step", "nonce", "meta": {...snapshot.json}, "files": [[name, size]...]}
        file bytes ..., {"crc32": {name: crc}}            -> {"ok": true} | {"ok": false, "error"}
  get:  {"op": "get", "rank", "step", "nonce"}
        -> {"ok": true, "meta": {...}, "files": [[name, size, stored crc or null]...]}, file bytes ...,
           {"crc32": {name: crc}}
  list: {"op": "list"}                                    -> {"ok": true, "held": {rank: [[step, nonce]...]}}
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import shutil
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

from .checkpoint_format import (
    CHUNK_BYTES,
    CheckpointError,
    crc32_of,
    local_name,
    local_rank_dir,
    local_snapshots,
    read_local_meta,
    remove_local,
    shard_bin,
    shard_idx,
    write_local_meta,
)
from .reach import split_endpoint

log = logging.getLogger(__name__)

#: Under a pod's memory-tier root (`<memorySnapshotDir>/<job>`): the replicas its server holds.
REPLICAS_DIR = "replicas"
_MAX_HEADER = 1 << 20
#: Seconds a connection may stay silent before it is given up (a dead peer, a cut network).
IO_TIMEOUT_S = 30.0
#: In a replica rank directory: the shard file of the replica the last one replaced, written into
#: in place by the next put (tmpfs allocates no page for it again).
SPARE_BIN = "spare.bin"


class ReplicaError(RuntimeError):
    """A replica could not be sent, received or fetched."""


def replicas_root(local_root: str) -> str:
    return os.path.join(local_root, REPLICAS_DIR)


def held_replicas(local_root: str) -> dict[int, list[tuple[int, int]]]:
    """{rank: [(step, nonce), ...]} of the committed snapshots this pod can serve: the replicas its
    server holds, and the memory snapshots of ranks that ran in this pod (after a replacement the
    rendezvous may give the pod other ranks: what an earlier rank left is still that rank's)."""
    held: dict[int, set[tuple[int, int]]] = {}
    for root in (replicas_root(local_root), local_root):
        try:
            names = os.listdir(root)
        except OSError:
            continue
        for name in names:
            if name.startswith("rank-") and name[5:].isdigit():
                held.setdefault(int(name[5:]), set()).update(local_snapshots(os.path.join(root, name)))
    return {r: sorted(snaps, reverse=True) for r, snaps in held.items() if snaps}


# --- frames -----------------------------------------------------------------------------------------
def _send_doc(sock: socket.socket, doc: dict[str, Any]) -> None:
    data = json.dumps(doc, separators=(",", ":")).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), CHUNK_BYTES))
        if not chunk:
            raise ReplicaError("connection closed mid-message")
        buf += chunk
    return bytes(buf)


def _recv_doc(sock: socket.socket) -> dict[str, Any]:
    (n,) = struct.unpack(">I", _recv_exact(sock, 4))
    if n > _MAX_HEADER:
        raise ReplicaError(f"header of {n} bytes refused")
    doc = json.loads(_recv_exact(sock, n))
    if not isinstance(doc, dict):
        raise ReplicaError("header is not an object")
    return doc


class _TrailingCrc:
    """The CRC32 of a mapped file's bytes, computed by a thread of its own as far as they are
    `ready` (zlib releases the GIL): it overlaps the socket's copy instead of following it.
    `result` waits for the last byte made ready; `close` abandons it (an aborted or failed stream
    does not wait for the rest of a large file's CRC32)."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._ready = 0
        self._finishing = False  # no more bytes will be made ready
        self._abandoned = False
        self._cv = threading.Condition()
        self.crc = 0
        self._thread = threading.Thread(target=self._run, name="rtj-replica-crc", daemon=True)
        self._thread.start()

    def ready(self, upto: int) -> None:
        with self._cv:
            self._ready = upto
            self._cv.notify()

    def _run(self) -> None:
        done = 0
        while True:
            with self._cv:
                while self._ready == done and not (self._finishing or self._abandoned):
                    self._cv.wait()
                if self._abandoned or self._ready == done:
                    return
                upto = self._ready
            while done < upto and not self._abandoned:
                n = min(upto - done, CHUNK_BYTES)
                self.crc = crc32_of(self._view[done : done + n], self.crc)
                done += n

    def result(self) -> int:
        """Once every byte was made `ready`: their CRC32."""
        with self._cv:
            self._finishing = True
            self._cv.notify()
        self._thread.join()
        return self.crc

    def close(self) -> None:
        with self._cv:
            self._abandoned = True
            self._cv.notify()
        self._thread.join()


#: Bytes per socket call of a file's stream (the CRC thread follows at this granularity).
STREAM_BYTES = 8 << 20


class _FileCrc:
    """The CRC32 of a file's first `size` bytes, read by a thread of its own into one reused buffer
    (`preadv`; zlib releases the GIL) while the file is sent: beside the send, never mapped."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd, self._size = fd, size
        self._abandoned = threading.Event()
        self._error: OSError | None = None
        self.crc = 0
        self._thread = threading.Thread(target=self._run, name="rtj-replica-crc", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        buf = bytearray(min(CHUNK_BYTES, self._size))
        view = memoryview(buf)
        done = 0
        try:
            while done < self._size and not self._abandoned.is_set():
                n = os.preadv(self._fd, [view[: min(len(buf), self._size - done)]], done)
                if n == 0:
                    raise OSError(f"end of file at {done} of {self._size} bytes")
                self.crc = crc32_of(view[:n], self.crc)
                done += n
        except OSError as e:
            self._error = e

    def result(self) -> int:
        self._thread.join()
        if self._error is not None:
            raise ReplicaError(f"reading for the CRC32: {self._error}")
        return self.crc

    def close(self) -> None:
        self._abandoned.set()
        self._thread.join()


def _send_file(sock: socket.socket, f: BinaryIO, size: int, abort: threading.Event | None = None) -> int:
    """Send `size` bytes of `f`; their CRC32. The kernel sends them from the page cache
    (`sendfile`) and a thread reads them for the CRC32 beside it: the file is never mapped here. A
    rank sends its snapshots this way, and mapping one of 13.7 GB made its training thread's
    allocations wait on the mmap lock, and a rank killed meanwhile tear its page tables down before
    its GPU memory was freed (as the persisted copy did: `checkpoint_copy.copy_shard`)."""
    if size == 0:
        return 0
    if os.fstat(f.fileno()).st_size < size:
        raise ReplicaError(f"{f.name}: shorter than {size} bytes")
    crc = _FileCrc(f.fileno(), size)
    try:
        for start in range(0, size, STREAM_BYTES):
            if abort is not None and abort.is_set():
                raise ReplicaError("aborted")
            count = min(STREAM_BYTES, size - start)
            if sock.sendfile(f, start, count) != count:
                raise ReplicaError(f"{f.name}: shorter than {size} bytes")
        return crc.result()
    finally:
        crc.close()


def _recv_file(sock: socket.socket, path: str, size: int) -> int:
    """Receive `size` bytes into the file at `path` (new, or a spare file whose pages are reused:
    overwritten in place, cut to `size`); their CRC32. The bytes land in the mapped file straight
    from the socket, and their CRC32 is computed as they arrive."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, size)
        if size == 0:
            return 0
        with contextlib.suppress(OSError):  # pages at once, not one fault per page (tmpfs)
            os.posix_fallocate(fd, 0, size)
        with mmap.mmap(fd, size) as mm, memoryview(mm) as view:
            crc = _TrailingCrc(view)
            try:
                got = 0
                while got < size:
                    n = sock.recv_into(view[got : min(size, got + STREAM_BYTES)])
                    if not n:
                        raise ReplicaError("connection closed mid-file")
                    got += n
                    crc.ready(got)
                return crc.result()
            finally:
                crc.close()
    finally:
        os.close(fd)


def _connect(endpoint: str, timeout: float) -> socket.socket:
    host, port = split_endpoint(endpoint)
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.settimeout(IO_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _snapshot_files(snap_dir: str, rank: int) -> tuple[dict[str, Any], list[tuple[str, int]]]:
    meta = read_local_meta(snap_dir)
    names = [shard_bin(rank), shard_idx(rank)]
    files = [(n, int(meta["files"][n]["size"])) for n in names]
    return meta, files


# --- the server (receiver and holder) ---------------------------------------------------------------
class ReplicaServer:
    """Holds replicas of other pods' ranks under `<local_root>/replicas/` and serves them back."""

    def __init__(self, local_root: str, host: str = "0.0.0.0", port: int = 0) -> None:
        self.local_root = local_root
        self.root = replicas_root(local_root)
        self._lock = threading.Lock()  # a commit (and its pruning) vs. a get opening files
        #: The replica files gets are streaming (path -> count): never recycled meanwhile.
        self._serving: dict[str, int] = {}
        self._sock = socket.create_server((host, port), reuse_port=False)
        self._sock.settimeout(0.5)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._clean()

    def _clean(self) -> None:
        """Partials and half-deleted replicas a killed predecessor left."""
        os.makedirs(self.root, exist_ok=True)
        for rank_dir in os.listdir(self.root):
            path = os.path.join(self.root, rank_dir)
            keep = {local_name(s, n) for s, n in local_snapshots(path)} | {SPARE_BIN}
            with contextlib.suppress(OSError):
                for name in os.listdir(path):
                    if name not in keep:
                        shutil.rmtree(os.path.join(path, name), ignore_errors=True)

    def start(self) -> ReplicaServer:
        self._thread = threading.Thread(target=self.serve_forever, name="rtj-replica-server", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError as e:  # e.g. out of file descriptors: keep serving, never die silently
                if self._stop.is_set():
                    return
                log.warning("replica server: accept failed: %r", e)
                self._stop.wait(0.5)
                continue
            threading.Thread(target=self._handle, args=(conn,), name="rtj-replica-conn", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._sock.close()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(IO_TIMEOUT_S)
            try:
                req = _recv_doc(conn)
                op = req.get("op")
                if op == "put":
                    self._put(conn, req)
                elif op == "get":
                    self._get(conn, req)
                elif op == "list":
                    held = held_replicas(self.local_root)
                    _send_doc(conn, {"ok": True, "held": {str(r): v for r, v in held.items()}})
                else:
                    _send_doc(conn, {"ok": False, "error": f"unknown op {op!r}"})
            except (OSError, ReplicaError, CheckpointError, ValueError, KeyError, TypeError) as e:
                log.warning("replica request failed: %r", e)
                with contextlib.suppress(OSError):
                    _send_doc(conn, {"ok": False, "error": repr(e)[:512]})

    def _put(self, conn: socket.socket, req: dict[str, Any]) -> None:
        rank, step, nonce = int(req["rank"]), int(req["step"]), int(req["nonce"])
        files = [(str(n), int(s)) for n, s in req["files"]]
        if sorted(n for n, _ in files) != sorted([shard_bin(rank), shard_idx(rank)]):
            raise ReplicaError(f"put of rank {rank} names files {files}")
        rank_dir = local_rank_dir(self.root, rank)
        os.makedirs(rank_dir, exist_ok=True)
        name = local_name(step, nonce)
        partial = os.path.join(rank_dir, f"{name}.{uuid.uuid4().hex[:8]}.partial")
        os.mkdir(partial)
        with self._lock, contextlib.suppress(OSError):  # the last replica's pages, overwritten in place
            os.rename(os.path.join(rank_dir, SPARE_BIN), os.path.join(partial, shard_bin(rank)))
        try:
            got = {n: _recv_file(conn, os.path.join(partial, n), size) for n, size in files}
            sent = _recv_doc(conn)["crc32"]
            if any(int(sent[n]) != crc for n, crc in got.items()):
                raise ReplicaError(f"replica of rank {rank} step {step}: a file fails its CRC32")
            meta = dict(req["meta"])
            if (int(meta["rank"]), int(meta["step"]), int(meta["nonce"])) != (rank, step, nonce):
                raise ReplicaError("replica metadata names another snapshot")
            meta["files"] = {n: {"size": size, "crc32": got[n]} for n, size in files}
            write_local_meta(partial, meta)
            with self._lock:
                final = os.path.join(rank_dir, name)
                if os.path.isdir(final):
                    remove_local(final)
                os.rename(partial, final)
                for s, n in local_snapshots(rank_dir):  # the newest arrival wins
                    if local_name(s, n) != name:
                        with contextlib.suppress(OSError):
                            self._retire(rank_dir, os.path.join(rank_dir, local_name(s, n)), rank)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        _send_doc(conn, {"ok": True})

    def _retire(self, rank_dir: str, old: str, rank: int) -> None:
        """Delete a replica the newest arrival replaced, its shard file kept as the rank's spare (the
        next put writes into its pages: no page allocation per replica) unless a get streams it.
        Under the lock. The rename uncommits it first: `remove_local`'s trash, then the file."""
        trash = f"{old}.trash"
        os.rename(old, trash)
        bin_path = os.path.join(trash, shard_bin(rank))
        spare = os.path.join(rank_dir, SPARE_BIN)
        if os.path.join(old, shard_bin(rank)) not in self._serving and not os.path.exists(spare):
            with contextlib.suppress(OSError):
                os.rename(bin_path, spare)
        remove_local(trash)

    def _get(self, conn: socket.socket, req: dict[str, Any]) -> None:
        rank, step, nonce = int(req["rank"]), int(req["step"]), int(req["nonce"])
        snap_dir = os.path.join(local_rank_dir(self.root, rank), local_name(step, nonce))
        if not os.path.isdir(snap_dir):  # a rank that ran in this pod before (held_replicas)
            snap_dir = os.path.join(local_rank_dir(self.local_root, rank), local_name(step, nonce))
        served = os.path.join(snap_dir, shard_bin(rank))
        with self._lock:  # open under the lock: a later prune unlinks (never recycles) the open files
            try:
                meta, files = _snapshot_files(snap_dir, rank)
                handles = [open(os.path.join(snap_dir, n), "rb") for n, _ in files]  # noqa: SIM115
            except (OSError, CheckpointError, KeyError) as e:
                _send_doc(conn, {"ok": False, "error": f"no replica of rank {rank} step {step}: {e}"})
                return
            self._serving[served] = self._serving.get(served, 0) + 1
        try:
            stored = {n: meta["files"][n].get("crc32") for n, _ in files}  # None: a memory-tier snapshot
            _send_doc(conn, {"ok": True, "meta": meta, "files": [[n, s, stored[n]] for n, s in files]})
            sent = {n: _send_file(conn, f, size) for f, (n, size) in zip(handles, files, strict=True)}
            _send_doc(conn, {"crc32": sent})
        finally:
            for f in handles:
                f.close()
            with self._lock:
                self._serving[served] -= 1
                if not self._serving[served]:
                    del self._serving[served]


# --- the client side (a rank) -----------------------------------------------------------------------
def send_snapshot(
    endpoint: str, snap_dir: str, rank: int, *, abort: threading.Event | None = None, timeout: float = 10.0
) -> None:
    """Stream this rank's committed memory snapshot `snap_dir` to the server at `endpoint`."""
    meta, files = _snapshot_files(snap_dir, rank)
    with _connect(endpoint, timeout) as sock:
        handles = [open(os.path.join(snap_dir, n), "rb") for n, _ in files]  # noqa: SIM115
        try:
            for f, (_, size) in zip(handles, files, strict=True):
                if os.fstat(f.fileno()).st_size != size:
                    raise ReplicaError(f"{snap_dir}: {f.name} does not have its committed size")
            req = {"op": "put", "rank": rank, "step": meta["step"], "nonce": meta["nonce"]}
            _send_doc(sock, {**req, "meta": {k: v for k, v in meta.items() if k != "files"}, "files": files})
            crcs = {n: _send_file(sock, f, size, abort) for f, (n, size) in zip(handles, files, strict=True)}
        finally:
            for f in handles:
                f.close()
        _send_doc(sock, {"crc32": crcs})
        reply = _recv_doc(sock)
    if not reply.get("ok"):
        raise ReplicaError(f"{endpoint} refused the replica of step {meta['step']}: {reply.get('error')}")


def fetch_snapshot(
    endpoint: str, rank: int, step: int, nonce: int, rank_dir: str, timeout: float = 10.0
) -> str:
    """Fetch rank's replica (step, nonce) from `endpoint` into `rank_dir` as a committed memory
    snapshot (partial -> rename, with the CRC32s the holder checked); its path."""
    name = local_name(step, nonce)
    partial = os.path.join(rank_dir, f"{name}.fetch.partial")
    final = os.path.join(rank_dir, name)
    os.makedirs(rank_dir, exist_ok=True)
    shutil.rmtree(partial, ignore_errors=True)
    os.mkdir(partial)
    try:
        with _connect(endpoint, timeout) as sock:
            _send_doc(sock, {"op": "get", "rank": rank, "step": step, "nonce": nonce})
            head = _recv_doc(sock)
            if not head.get("ok"):
                raise ReplicaError(str(head.get("error")))
            got = {n: _recv_file(sock, os.path.join(partial, n), int(size)) for n, size, _ in head["files"]}
            sent = _recv_doc(sock)["crc32"]
        for n, _, stored in head["files"]:  # what was sent arrived; and it is what was stored
            if got[n] != int(sent[n]) or (stored is not None and got[n] != int(stored)):
                raise ReplicaError(f"{n} of rank {rank} step {step} from {endpoint} fails its CRC32")
        meta = dict(head["meta"])
        meta["files"] = {n: {"size": int(size), "crc32": got[n]} for n, size, _ in head["files"]}
        if (int(meta["rank"]), int(meta["step"]), int(meta["nonce"])) != (rank, step, nonce):
            raise ReplicaError(f"{endpoint} sent another snapshot than rank {rank} step {step}")
        write_local_meta(partial, meta)
        if os.path.isdir(final):
            remove_local(final)
        os.rename(partial, final)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return final


def list_held(endpoint: str, timeout: float = 5.0) -> dict[int, list[tuple[int, int]]]:
    """What the server at `endpoint` holds: {rank: [(step, nonce)]}."""
    with _connect(endpoint, timeout) as sock:
        _send_doc(sock, {"op": "list"})
        reply = _recv_doc(sock)
    if not reply.get("ok"):
        raise ReplicaError(str(reply.get("error")))
    return {int(r): [(int(s), int(n)) for s, n in v] for r, v in reply["held"].items()}


@dataclass(frozen=True)
class Offer:
    step: int
    nonce: int
    path: str


class Replicator:
    """A rank's background sender: `offer` a committed snapshot, the newest pending one is sent
    once the current stream ends (coalesced), never in the caller's thread.

    `protect(path)` is called before a snapshot is opened and must return False when it is gone
    (pruned or recycled), `protect(None)` once it is sent (a failed one stays protected for its
    retry): the owner must not delete or overwrite the protected snapshot meanwhile.
    `on_done(offer, seconds, error)` reports each attempt, before the protection is released."""

    def __init__(
        self,
        endpoint: str,
        rank: int,
        protect: Callable[[str | None], bool],
        on_done: Callable[[Offer, float, BaseException | None], None],
        retry_s: float = 1.0,
    ) -> None:
        split_endpoint(endpoint)
        self.endpoint = endpoint
        self.rank = rank
        self._protect = protect
        self._on_done = on_done
        self._retry_s = retry_s
        self._cv = threading.Condition()
        self._pending: Offer | None = None
        self._thread: threading.Thread | None = None
        self.abort = threading.Event()
        self.coalesced = 0

    def offer(self, step: int, nonce: int, path: str) -> None:
        with self._cv:
            if self._pending is not None:
                self.coalesced += 1
            self._pending = Offer(step, nonce, path)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="rtj-replicator", daemon=True)
                self._thread.start()
            self._cv.notify()

    @property
    def busy(self) -> bool:
        with self._cv:
            return self._pending is not None or (self._thread is not None and self._thread.is_alive())

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending or in flight (tests, the end of training)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            t = self._thread
            if t is None or not t.is_alive():
                return True
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if deadline is not None and time.monotonic() >= deadline:
                return not t.is_alive()

    def cancel(self, timeout: float) -> bool:
        """Drop the pending offer and cut the stream in flight (the peer drops its partial and keeps
        the replica it committed last; neither counts as a failure); True once the sender has ended,
        within `timeout` seconds (it notices between two chunks)."""
        with self._cv:
            self._pending = None
            self.abort.set()
            self._cv.notify()  # a sender waiting to retry ends at once
            t = self._thread
        try:
            if t is not None:
                t.join(timeout)
            return t is None or not t.is_alive()
        finally:
            self.abort.clear()

    def _run(self) -> None:
        while True:
            with self._cv:
                offer, self._pending = self._pending, None
                if offer is None:
                    self._thread = None
                    return
            if self.abort.is_set():
                continue
            error: BaseException | None = None
            t0 = time.monotonic()
            if not self._protect(offer.path):
                continue  # pruned before its turn: a newer one is pending or will be
            try:
                send_snapshot(self.endpoint, offer.path, self.rank, abort=self.abort)
            except (OSError, ReplicaError, CheckpointError, ValueError, KeyError) as e:
                error = e
            if error is not None and self.abort.is_set():
                self._protect(None)  # cut by `cancel`: not retried
                continue
            self._on_done(offer, time.monotonic() - t0, error)
            if error is None:
                self._protect(None)
            else:
                with self._cv:  # retry the newest later (the peer may be restarting)
                    if self._pending is None and not self.abort.is_set():
                        self._pending = offer
                    self._cv.wait(self._retry_s)


def main(argv: list[str] | None = None) -> int:
    """`python -m rtj_trainer.peer_replica serve <local_root> <port>` (tests; pods run the server
    inside `rtj-trainer launch`)."""
    import argparse

    p = argparse.ArgumentParser(prog="rtj_trainer.peer_replica")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("local_root")
    s.add_argument("port", type=int)
    args = p.parse_args(argv)
    server = ReplicaServer(args.local_root, host="127.0.0.1", port=args.port)
    print(f"serving replicas of {args.local_root} on port {server.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
