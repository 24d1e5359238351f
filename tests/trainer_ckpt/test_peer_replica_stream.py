"""The peer replica's streams on real sockets and files (`rtj_trainer.peer_replica`): a file arrives
byte for byte with its CRC32 whatever its size, also into a spare file larger than it; a replica
the newest one replaced leaves its shard file as the rank's spare, and the next put writes into
that file's pages; a replica being fetched is never recycled under its reader."""

from __future__ import annotations

import os
import socket
import threading
import zlib
from pathlib import Path

import pytest
import torch
from rtj_local.wait import wait_for
from rtj_trainer.checkpoint import CheckpointManager
from rtj_trainer.checkpoint_format import CHUNK_BYTES, local_name, local_rank_dir, local_snapshots, shard_bin
from rtj_trainer.peer_replica import (
    SPARE_BIN,
    STREAM_BYTES,
    ReplicaError,
    ReplicaServer,
    _recv_doc,
    _recv_file,
    _send_doc,
    _send_file,
    _TrailingCrc,
    fetch_snapshot,
    replicas_root,
    send_snapshot,
)

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(120)]


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.settimeout(30)
    b.settimeout(30)
    return a, b


@pytest.mark.parametrize("size", [0, 1, 4096 + 3, STREAM_BYTES, 2 * STREAM_BYTES + 12345])
def test_a_file_arrives_byte_for_byte_with_its_crc32(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    dst = tmp_path / "dst.bin"
    dst.write_bytes(os.urandom(size + 3 * 4096))  # a spare longer than the file: cut to its size
    a, b = _pair()
    got: list[int] = []
    receiver = threading.Thread(target=lambda: got.append(_recv_file(b, str(dst), size)))
    receiver.start()
    with open(src, "rb") as f:
        sent = _send_file(a, f, size)
    receiver.join(30)
    assert sent == got[0] == zlib.crc32(data)
    assert dst.read_bytes() == data


def test_a_stream_cut_short_or_aborted_raises(tmp_path: Path) -> None:
    size = 3 * STREAM_BYTES
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(size))
    a, b = _pair()
    with open(src, "rb") as f:
        a.sendall(f.read(65536))  # within the socket pair's buffer
    a.close()
    with pytest.raises(ReplicaError, match="closed mid-file"):
        _recv_file(b, str(tmp_path / "dst.bin"), size)
    abort = threading.Event()
    abort.set()
    a, b = _pair()
    with open(src, "rb") as f, pytest.raises(ReplicaError, match="aborted"):
        _send_file(a, f, size, abort)
    with open(src, "rb") as f, pytest.raises(ReplicaError, match="shorter than"):
        _send_file(a, f, size + 1)


def _snapshots(root: Path, steps: range, features: int = 512) -> list[str]:
    """Committed memory snapshots of rank 0 (`features` x 1024 fp32 weights), one per step; their
    directories."""
    mgr = CheckpointManager(
        str(root / "persist"), rank=0, world_size=1, interval_steps=10**9,
        local_root=str(root / "mine"), local_interval_steps=1, local_keep=len(steps),
    )  # fmt: skip
    model = torch.nn.Linear(features, 1024)
    for step in steps:
        with torch.no_grad():
            model.weight.fill_(step)
        assert mgr.maybe_save(step, model) in ("saved", "snapshot") and mgr.wait(timeout=30)
    mgr.close(timeout=30)
    rank_dir = local_rank_dir(str(root / "mine"), 0)
    return [os.path.join(rank_dir, local_name(s, n)) for s, n in sorted(local_snapshots(rank_dir))]


def test_a_replaced_replica_becomes_the_spare_the_next_put_writes_into(tmp_path: Path) -> None:
    snaps = _snapshots(tmp_path, range(1, 4))
    server = ReplicaServer(str(tmp_path / "peer"), host="127.0.0.1").start()
    try:
        endpoint = f"127.0.0.1:{server.port}"
        rank_dir = Path(local_rank_dir(replicas_root(str(tmp_path / "peer")), 0))
        send_snapshot(endpoint, snaps[0], 0)
        assert not (rank_dir / SPARE_BIN).exists()
        send_snapshot(endpoint, snaps[1], 0)
        spare = (rank_dir / SPARE_BIN).stat().st_ino
        send_snapshot(endpoint, snaps[2], 0)
        (step, nonce), = local_snapshots(str(rank_dir))  # fmt: skip
        assert step == 3
        newest = rank_dir / local_name(step, nonce) / shard_bin(0)
        assert newest.stat().st_ino == spare  # written in place into the spare's pages
        assert newest.read_bytes() == (Path(snaps[2]) / shard_bin(0)).read_bytes()
        fetched = fetch_snapshot(endpoint, 0, step, nonce, str(tmp_path / "fetched"))
        assert (Path(fetched) / shard_bin(0)).read_bytes() == newest.read_bytes()
    finally:
        server.stop()


def test_a_replica_being_fetched_is_not_recycled_under_its_reader(tmp_path: Path) -> None:
    snaps = _snapshots(tmp_path, range(1, 5), features=16384)  # 64 MB: more than the sockets buffer
    server = ReplicaServer(str(tmp_path / "peer"), host="127.0.0.1").start()
    try:
        endpoint = f"127.0.0.1:{server.port}"
        rank_dir = Path(local_rank_dir(replicas_root(str(tmp_path / "peer")), 0))
        send_snapshot(endpoint, snaps[0], 0)
        (step, nonce), = local_snapshots(str(rank_dir))  # fmt: skip
        want = (Path(snaps[0]) / shard_bin(0)).read_bytes()
        # A slow reader: the get's header read, its bytes not yet (the server blocks in its send).
        reader = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        _send_doc(reader, {"op": "get", "rank": 0, "step": step, "nonce": nonce})
        head = _recv_doc(reader)
        assert head["ok"]
        for snap in snaps[1:]:  # step 1 replaced, then the spare reused twice while step 1 streams
            send_snapshot(endpoint, snap, 0)
        got = bytearray()
        for name, size, stored in head["files"]:
            data = b""
            while len(data) < size:
                data += reader.recv(size - len(data))
            crc = zlib.crc32(data)
            assert stored is not None and crc == int(stored)
            if name == shard_bin(0):
                got += data
        assert _recv_doc(reader)["crc32"][shard_bin(0)] == zlib.crc32(want)
        reader.close()
        assert bytes(got) == want  # what was fetched is step 1's, whole
    finally:
        server.stop()


def test_an_abandoned_crc32_stops_between_chunks_a_finished_one_covers_every_byte() -> None:
    """An aborted send (an emergency save cancels the stream in flight within a second) must not
    wait for the CRC32 of the rest of a large file."""
    data = memoryview(bytearray(16 * CHUNK_BYTES))  # 1 GiB: 16 chunks of the CRC thread
    crc = _TrailingCrc(data)
    crc.ready(len(data))
    # under way (the CRC32 of a chunk of zeros is not 0)
    wait_for(lambda: crc.crc != 0, timeout=30, interval=0.001, message="the CRC32 thread under way")
    crc.close()
    assert crc.crc != zlib.crc32(data)  # stopped after the chunk in hand
    small = memoryview(os.urandom(3 * 4096))
    crc = _TrailingCrc(small)
    crc.ready(4096)
    crc.ready(len(small))
    assert crc.result() == zlib.crc32(small)
