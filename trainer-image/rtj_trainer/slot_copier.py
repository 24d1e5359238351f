"""The pod's slot copier: the memory tier's bulk host copies done outside the rank process.

A rank whose snapshots are staged on the GPU drains them through a few pinned chunks into the
memory tier's slot files (`checkpoint.device_stage.ChunkPipe`). Copied by the rank itself, every
page of every slot (keep + 1 files of the whole state, 41 GB for the 1.14 B-parameter example) is
mapped in the rank for its whole life, and when the rank is killed the kernel tears those page
tables down before the process's files close and its GPU memory is freed: NVRx's launcher waits
for that memory before it starts the next rank (0.91 s of a 4.59 s SIGKILL restart on an H100
host; with no slot mapped the new rank started 0.6 s sooner). The host copies also ran on the
rank's own threads, beside its training thread's GIL.

Here they run in a process the pod's entrypoint (`rtj-trainer launch`) starts and keeps running
(`CopierProcess`), which outlives the ranks:

- a rank's chunks are memfds (shared memory, registered with CUDA by the rank, so pinned), handed to
  the copier once over a Unix socket (SCM_RIGHTS);
- each request names a chunk and passes the slot file's descriptor: `put` copies the chunk into the
  slot at an offset (a drain), `get` the slot into the chunk (a load), `reserve` maps a slot file,
  reserves its space and makes its pages present ahead of the first copy (`reserve_pages`);
- the copier maps each slot file once (by inode, across the renames that commit and recycle it) and
  drops a mapping once its file is deleted (looked at on every request) or its size changes. A rank
  keeps only a mapping nothing populates: the few pages it writes itself (an optimizer's step
  counts).

A request in flight when its rank is killed still completes (a chunk's copy: milliseconds), long
before a restarted rank (seconds later) claims and writes that slot again; the commit is the rank's
own rename, so a slot the dead rank did not commit is never loaded
(`tests/trainer_ckpt/test_snapshot_kills.py`: ranks SIGKILLed while the copier drains for them).

A rank that cannot reach the copier (none running: tests, a plain launch; its socket path too long;
it died) copies in-process as before: the copier saves time, it is never needed for correctness.
The socket lives in the job's directory of the memory volume (`socket_path`), where every rank of
the pod finds it without configuration. Stdlib only: neither the copier nor the entrypoint imports
torch.

Hand-written: no library copies between two processes' shared mappings on request.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import logging
import mmap
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from .pids import die_with_parent, stop_process

log = logging.getLogger(__name__)

MODULE = "rtj_trainer.slot_copier"
SOCKET_NAME = "slot-copier.sock"
#: The most threads the copier splits one request over, per local rank: a memory copy is about
#: 10 GB/s per thread on an H100 host (bench/snapshot_paths.py: 13.7 GB in 2.72 s with 1 thread,
#: 0.92 s with 4, 0.61 s with 8), and here no training thread waits for the GIL behind them. A
#: request names its own (`ChunkPipe`: a drain its `snapshot_write_threads`, a load 8).
COPY_THREADS = 8
#: Bytes one madvise(MADV_POPULATE_WRITE) call of the copier makes present: each holds the copier's
#: mmap lock, which a request mapping a new slot meanwhile waits for.
COPIER_POPULATE_BYTES = 64 << 20
#: Bytes of a slot file reserved (posix_fallocate) at a time while other threads make the pieces
#: reserved before present: tmpfs reserves a file's pages under its inode lock, one thread at a
#: time, while making them present goes on in parallel. Done one after the other on one thread, a
#: 2 GB file took 0.21 s and 0.56 s on the 2-core CI machine, and 13.7 GB about 3.3 s to make present
#: on an H100 host; pieced and spread, a 13.7 GB slot was ready in 3.06-3.27 s there
#: (bench/slot_prepare.py). Write faults alone (no posix_fallocate, several threads on one file)
#: made a 13.7 GB slot ready in 2.27 s on 4 threads and 2.98 s on 8 on another H100 host, against
#: 2.88 s and 3.34 s this way in the same call, but the faults on one file did not scale with
#: threads: the ring of three, one slot after the other, took 7.2-8.5 s against 3.0-3.6 s for the
#: files side by side (2026-12-07).
RESERVE_PIECE_BYTES = 512 << 20
#: The largest request or reply (JSON), and the most descriptors one request passes.
MAX_MESSAGE = 4096
MAX_FDS = 16
#: Longest path a Unix socket takes (sun_path less its terminating NUL).
MAX_SOCKET_PATH = 107
#: Seconds a rank waits for the copier's reply before it copies itself: a chunk's copy takes
#: milliseconds, making a whole memory tier's pages present seconds (first reserved: 3 s per 13.7 GB).
CHUNK_REPLY_TIMEOUT = 60.0
POPULATE_REPLY_TIMEOUT = 600.0
#: Seconds a rank waits for a copier it SIGKILLed to be dead.
KILL_WAIT_SECONDS = 60.0

_PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
#: <linux/mman.h>; the mmap module names it only where Python was built against such headers.
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
_MADV_DONTFORK = getattr(mmap, "MADV_DONTFORK", 10)
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, *[ctypes.c_int] * 3, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def socket_path(memory_root: str) -> str:
    """Where the copier of the pod whose memory tier has this job directory listens."""
    return os.path.join(memory_root, SOCKET_NAME)


def populate_pages(addr: int, size: int, chunk_bytes: int) -> int:
    """Make the `size` bytes mapped at `addr` present and writable now, `chunk_bytes` per
    madvise(MADV_POPULATE_WRITE) (Linux 5.14); how many bytes it did (fewer where the kernel
    refused it: the rest come in with the first copy, or the caller writes them)."""
    for start in range(0, size, chunk_bytes):
        if _libc.madvise(addr + start, min(chunk_bytes, size - start), MADV_POPULATE_WRITE) != 0:
            return start
    return size


def reserve_pages(
    fd: int,
    addr: int,
    size: int,
    submit: Callable[..., Future[int]],
    threads: int,
    piece: int = RESERVE_PIECE_BYTES,
    chunk_bytes: int = COPIER_POPULATE_BYTES,
) -> int:
    """Reserve the first `size` bytes of the file open as `fd` (posix_fallocate: a full /dev/shm is
    an OSError here, never a SIGBUS inside a later copy) a piece at a time, and make each piece's
    pages, mapped at `addr`, present (`populate_pages`, `chunk_bytes` per call) on `threads` tasks
    of `submit` (an executor's) while the next piece is reserved. How many leading bytes were made
    present (fewer where the kernel refused: the rest come in with the first copy, or the caller
    writes them)."""
    page = mmap.PAGESIZE
    part = max(page, -(-piece // max(1, threads) // page) * page)
    pieces: list[tuple[int, int, Future[int]]] = []
    try:
        for start in range(0, size, piece):
            end = min(start + piece, size)
            os.posix_fallocate(fd, start, end - start)
            for at in range(start, end, part):
                n = min(part, end - at)
                pieces.append((at, n, submit(populate_pages, addr + at, n, chunk_bytes)))
    finally:  # nothing of this call still runs once it returns or raises
        present = [(at, n, f.result()) for at, n, f in pieces]
    return next((at + done for at, n, done in present if done < n), size)


def _map(fd: int, size: int) -> int:
    """`fd`'s first `size` bytes mapped shared, read-write, not inherited by a fork; its address."""
    addr = _libc.mmap(None, size, _PROT_RW, mmap.MAP_SHARED, fd, 0)
    if addr in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, f"mmap: {os.strerror(err)}")
    _libc.madvise(addr, size, _MADV_DONTFORK)  # a subprocess started meanwhile maps none of it
    return int(addr)


def _new_mapping(fd: int, size: int) -> _Mapping:
    """A mapping of `size` bytes of the file open as `fd`, on a descriptor of its own, in use once."""
    kept = os.dup(fd)
    try:
        return _Mapping(kept, _map(kept, size), size, users=1)
    except OSError:
        os.close(kept)
        raise


@dataclass(eq=False)
class _Mapping:
    fd: int  # kept open: its link count says when the file is gone
    addr: int
    size: int
    users: int = 0


class _Mappings:
    """The copier's shared mappings of slot files, by inode; one unmapped only when no request is
    using it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._maps: dict[tuple[int, int], _Mapping] = {}

    def acquire(self, fd: int) -> _Mapping:
        """The mapping of the file open as `fd` (mapped now if it is new or was resized), in use
        until `release`."""
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        with self._lock:
            m = self._maps.get(key)
            if m is not None and m.size == st.st_size:
                m.users += 1
                return m
            if m is not None:
                del self._maps[key]
                self._drop_later(m)
        if st.st_size == 0:
            raise OSError(f"inode {st.st_ino}: an empty file")
        new = _new_mapping(fd, st.st_size)
        with self._lock:
            old = self._maps.get(key)
            if old is not None and old.size == new.size:  # another request mapped it meanwhile
                old.users += 1
                _unmap(new)
                return old
            self._maps[key] = new
            return new

    def release(self, m: _Mapping) -> None:
        with self._lock:
            m.users -= 1
            if m.users == 0 and all(v is not m for v in self._maps.values()):
                _unmap(m)

    def sweep(self) -> None:
        """Unmap the files deleted since (a slot the tier removed): their pages are freed only then."""
        with self._lock:
            for key, m in list(self._maps.items()):
                try:
                    gone = os.fstat(m.fd).st_nlink == 0
                except OSError:
                    gone = True
                if gone:
                    del self._maps[key]
                    self._drop_later(m)

    def clear(self) -> None:
        with self._lock:
            maps, self._maps = list(self._maps.values()), {}
            for m in maps:
                self._drop_later(m)

    def _drop_later(self, m: _Mapping) -> None:
        """`m` leaves the table (lock held): unmapped now unless a request still uses it."""
        if m.users == 0:
            _unmap(m)


def _unmap(m: _Mapping) -> None:
    _libc.munmap(m.addr, m.size)
    os.close(m.fd)


def _map_chunk(fd: int) -> _Mapping:
    """A rank's chunk (a memfd) mapped for as long as the rank is connected."""
    size = os.fstat(fd).st_size
    if size == 0:
        raise OSError("an empty chunk")
    return _new_mapping(fd, size)


class SlotCopier:
    """The server: a thread accepting ranks on a Unix socket, a thread per connected rank serving its
    requests in turn, and a pool of copy threads shared by all."""

    def __init__(self, path: str, threads: int = COPY_THREADS) -> None:
        self.path = path
        self.threads = max(1, threads)
        self.maps = _Mappings()
        self._pool = ThreadPoolExecutor(self.threads, "rtj-slot-copy")
        self._reserve_pool = ThreadPoolExecutor(self.threads, "rtj-slot-reserve")
        self._sock: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def start(self) -> SlotCopier:
        """Listen (raises OSError: a path too long, a directory that cannot be written)."""
        if len(os.fsencode(self.path)) > MAX_SOCKET_PATH:
            raise OSError(f"{self.path}: too long for a Unix socket")
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a stale socket of an earlier container of this pod
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.bind(self.path)
            os.chmod(self.path, 0o600)
            sock.listen(64)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        threading.Thread(target=self._accept, name="rtj-slot-copier", daemon=True).start()
        return self

    def close(self) -> None:
        """Stop serving and unmap everything (the ranks are gone: a pod stopping, or the tests)."""
        self._closed.set()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._pool.shutdown(wait=True)
        self._reserve_pool.shutdown(wait=True)
        self.maps.clear()

    def _accept(self) -> None:
        assert self._sock is not None
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns.add(conn)
            name = "rtj-slot-copier-rank"
            threading.Thread(target=self._serve, args=(conn,), name=name, daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        chunks: list[_Mapping] = []
        try:
            while not self._closed.is_set():
                try:
                    data, fds, _flags, _addr = socket.recv_fds(conn, MAX_MESSAGE, MAX_FDS)
                except OSError:
                    return
                if not data:
                    return  # the rank is gone (exited, or killed)
                try:
                    reply = self._handle(json.loads(data), fds, chunks)
                except (OSError, ValueError, KeyError, IndexError, TypeError, RuntimeError) as e:
                    reply = {"error": repr(e)}  # RuntimeError: the pool shut down (closing)
                finally:
                    for fd in fds:
                        os.close(fd)
                try:
                    conn.send(json.dumps(reply).encode())
                except OSError:
                    return
        finally:
            for m in chunks:
                _unmap(m)
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _handle(self, req: dict[str, object], fds: list[int], chunks: list[_Mapping]) -> dict[str, object]:
        op = req["op"]
        self.maps.sweep()
        if op == "attach":  # the rank's chunks, once
            if chunks:
                raise ValueError("chunks attached already")
            for fd in fds:
                chunks.append(_map_chunk(fd))
            return {"ok": True}
        if op == "reserve":  # its own pool: a drain's copies meanwhile do not queue behind it
            (fd,) = fds
            slot = self.maps.acquire(fd)
            try:
                # Pages the kernel refused to make present come in with the first copy.
                reserve_pages(slot.fd, slot.addr, slot.size, self._reserve_pool.submit, self.threads)
            finally:
                self.maps.release(slot)
            return {"ok": True}
        if op in ("put", "get"):
            chunk = chunks[int(req["chunk"])]  # type: ignore[call-overload]
            n, offset = int(req["n"]), int(req["offset"])  # type: ignore[call-overload]
            (fd,) = fds
            slot = self.maps.acquire(fd)
            try:
                if n < 0 or offset < 0 or n > chunk.size or offset + n > slot.size:
                    raise ValueError(f"{n} bytes at {offset}: outside a {slot.size}-byte slot or its chunk")
                at = slot.addr + offset
                src, dst = (chunk.addr, at) if op == "put" else (at, chunk.addr)
                self._copy(dst, src, n, int(req.get("threads", self.threads)))  # type: ignore[call-overload]
            finally:
                self.maps.release(slot)
            return {"ok": True}
        raise ValueError(f"unknown request {op!r}")

    def _copy(self, dst: int, src: int, n: int, threads: int) -> None:
        threads = max(1, min(threads, self.threads))
        part = -(-n // threads)
        part = -(-part // mmap.PAGESIZE) * mmap.PAGESIZE
        if threads == 1 or n <= part:
            ctypes.memmove(dst, src, n)  # ctypes releases the GIL for the call
            return
        futures = []
        try:
            for i in range(0, n, part):
                futures.append(self._pool.submit(ctypes.memmove, dst + i, src + i, min(part, n - i)))
        finally:  # no reply, not even an error, while a piece of the request may still be written
            for f in futures:
                f.result()


class CopierClient:
    """A rank's connection to its pod's copier (one request at a time; thread-safe).

    A copier that does not reply in time is SIGKILLed (through a pidfd of the process that
    accepted the connection) and waited for before the caller hears of it: a copier that went on
    later with the request the rank gave up would write a chunk's bytes, by then others, into a
    slot, or into a chunk the rank is using again. Dead, it writes nothing more, and the rank
    redoes the copy itself. Without a pidfd (Linux before 5.3) there is no copier."""

    def __init__(self, sock: socket.socket, pidfd: int) -> None:
        self._sock = sock
        self._pidfd = pidfd
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, path: str) -> CopierClient | None:
        """The copier listening at `path`, or None when there is none (logged at debug: a rank
        then copies in-process)."""
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(path)
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pidfd = os.pidfd_open(struct.unpack("3i", creds)[0])
        except (OSError, AttributeError) as e:  # AttributeError: no os.pidfd_open here
            sock.close()
            log.debug("no slot copier at %s: %r", path, e)
            return None
        return cls(sock, pidfd)

    def attach(self, chunk_fds: list[int]) -> None:
        """The memfds of this rank's chunks, by index (the copier keeps its own descriptors)."""
        self._call({"op": "attach"}, chunk_fds, CHUNK_REPLY_TIMEOUT)

    def reserve(self, slot_fd: int) -> None:
        """Map this slot file in the copier, reserve its space and make its pages present
        (`reserve_pages`; raises OSError for a full /dev/shm, as the rank's own reserve would)."""
        self._call({"op": "reserve"}, [slot_fd], POPULATE_REPLY_TIMEOUT)

    def put(self, chunk: int, n: int, slot_fd: int, offset: int, threads: int = COPY_THREADS) -> None:
        """chunk[:n] -> slot[offset:offset + n]; returns once the bytes are there."""
        req = {"op": "put", "chunk": chunk, "n": n, "offset": offset, "threads": threads}
        self._call(req, [slot_fd], CHUNK_REPLY_TIMEOUT)

    def get(self, chunk: int, n: int, slot_fd: int, offset: int, threads: int = COPY_THREADS) -> None:
        """slot[offset:offset + n] -> chunk[:n]; returns once the bytes are there."""
        req = {"op": "get", "chunk": chunk, "n": n, "offset": offset, "threads": threads}
        self._call(req, [slot_fd], CHUNK_REPLY_TIMEOUT)

    def close(self) -> None:
        """Idempotent: a descriptor closed twice could be another file's by then."""
        self._sock.close()
        pidfd, self._pidfd = self._pidfd, -1
        if pidfd >= 0:
            os.close(pidfd)

    def _call(self, req: dict[str, object], fds: list[int], timeout: float) -> None:
        """Raises OSError when the copier refused the request, is gone, or has not replied within
        `timeout` (then it is killed first; the caller gives this client up)."""
        with self._lock:
            self._sock.settimeout(timeout)
            try:
                socket.send_fds(self._sock, [json.dumps(req).encode()], fds)
                data = self._sock.recv(MAX_MESSAGE)
            except TimeoutError:
                self._kill()
                raise
        if not data:
            raise ConnectionError("the slot copier closed the connection")
        reply = json.loads(data)
        if "error" in reply:
            raise OSError(f"slot copier: {reply['error']}")

    def _kill(self) -> None:
        """SIGKILL the copier and wait until it is dead (raises RuntimeError if it is not: the
        caller must then not touch what the request named)."""
        log.error("the slot copier did not reply in time: killing it (the rank copies itself from now on)")
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        if not select.select([self._pidfd], [], [], KILL_WAIT_SECONDS)[0]:
            raise RuntimeError(f"the slot copier did not die within {KILL_WAIT_SECONDS:.0f} s of SIGKILL")


class CopierProcess:
    """The copier as the entrypoint runs it: a process of its own (`python -m rtj_trainer.slot_copier`),
    started again when it dies. Its own process because it maps the whole memory tier: the kernel's
    OOM killer ranks processes by what they map, and a copier killed loses nothing (ranks copy
    in-process meanwhile; the slots' pages stay in the volume), where the entrypoint killed would
    end the pod."""

    #: Seconds before starting a copier that died again: doubled per death, up to the last.
    BACKOFF = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 60.0)

    def __init__(self, path: str, threads: int = COPY_THREADS, ready_timeout: float = 30.0) -> None:
        self.path = path
        self.threads = threads
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> CopierProcess:
        """Start it and wait until it listens (raises OSError when it does not). Call it from a
        thread that lives as long as the copier should: the copier stops when its parent thread
        ends (PR_SET_PDEATHSIG is per thread; copiers started again are the watcher's)."""
        self._spawn()
        threading.Thread(target=self._watch, name="rtj-slot-copier-watch", daemon=True).start()
        return self

    def close(self, grace_s: float = 10.0) -> None:
        """Stop it (SIGTERM: it unmaps the tier and removes its socket) and do not start it again."""
        self._stop.set()
        with self._lock:
            proc = self.proc
        if proc is not None and proc.poll() is None:
            stop_process(proc, grace_s=grace_s)

    def _spawn(self) -> None:
        argv = [sys.executable, "-m", MODULE, self.path, "--threads", str(self.threads)]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        assert proc.stdout is not None
        ready = select.select([proc.stdout], [], [], self.ready_timeout)[0] and proc.stdout.readline()
        if ready != b"ready\n":
            stop_process(proc, grace_s=1)
            raise OSError(f"the slot copier at {self.path} did not start (exit code {proc.poll()})")
        with self._lock:
            self.proc = proc
            self.starts += 1

    def _watch(self) -> None:
        deaths = 0
        while not self._stop.is_set():
            with self._lock:
                proc = self.proc
            assert proc is not None
            code = proc.wait()
            if self._stop.is_set():
                return
            delay = self.BACKOFF[min(deaths, len(self.BACKOFF) - 1)]
            deaths += 1
            log.warning(
                "the slot copier exited (code %s): the ranks copy their snapshots themselves; "
                "starting it again in %.0f s", code, delay,
            )  # fmt: skip
            while not self._stop.wait(delay):
                try:
                    self._spawn()
                    break
                except OSError as e:
                    log.warning("%s; trying again in %.0f s", e, delay)


def main(argv: list[str] | None = None) -> None:
    """`python -m rtj_trainer.slot_copier SOCKET [--threads N]`: serve until SIGTERM or SIGINT (or
    the parent's death); prints "ready" once it listens."""
    parser = argparse.ArgumentParser(prog="python -m rtj_trainer.slot_copier")
    parser.add_argument("socket")
    parser.add_argument("--threads", type=int, default=COPY_THREADS)
    args = parser.parse_args(argv)
    parent = os.getppid()
    stop = {signal.SIGTERM, signal.SIGINT}
    # Blocked before any thread starts (they inherit the mask): `sigwait` takes them here, whichever
    # thread the kernel would have given them to.
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    if not die_with_parent(signal.SIGTERM, parent):  # no copier outlives its entrypoint
        return
    copier = SlotCopier(args.socket, threads=args.threads).start()
    print("ready", flush=True)
    signal.sigwait(stop)
    copier.close()


if __name__ == "__main__":
    main()
