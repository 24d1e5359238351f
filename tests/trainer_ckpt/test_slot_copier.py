"""The pod's slot copier (rtj_trainer.slot_copier) with real processes and real files: a copier
process (`python -m rtj_trainer.slot_copier`, as the entrypoint runs it) and a rank's
`CheckpointManager` on the CPU stand-in of the GPU (`host_device.HostOps`). A snapshot staged on the
"GPU" drains into the memory tier's slot and a restarted rank loads it back, bit for bit, while the
rank's own mappings of the slots hold (almost) no page: what a SIGKILLed rank's kernel must tear
down before its GPU memory is freed. A copier that is absent or dies leaves the rank copying
in-process, losing nothing; the copier unmaps what a rank or the tier gave up."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from host_device import HostOps, stage_on_host
from rtj.contract import TrainerConfig
from rtj_local.wait import wait_for
from rtj_trainer.checkpoint import CheckpointManager
from rtj_trainer.slot_copier import CopierClient, CopierProcess, socket_path

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(120)]

#: Enough state for the slots to span many pages (and chunks): a 512 x 512 layer and its AdamW state.
WIDTH = 512
CHUNK = 256 << 10
FEW_PAGES = 4 * 4096


@pytest.fixture
def root() -> Iterator[Path]:
    """The job's directory in a memory volume: a tmpfs, and a path short enough for a Unix socket."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    path = Path(tempfile.mkdtemp(prefix="rtj-sc-", dir=base))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _start_copier(root: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rtj_trainer.slot_copier", socket_path(str(root))],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


@pytest.fixture
def copier(root: Path) -> Iterator[subprocess.Popen[str]]:
    proc = _start_copier(root)
    yield proc
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


def _manager(root: Path) -> CheckpointManager:
    return CheckpointManager(
        str(root / "persist"), rank=0, world_size=1, interval_steps=1000,
        local_root=str(root), local_interval_steps=5,
    )  # fmt: skip


def _model() -> tuple[torch.nn.Linear, torch.optim.Optimizer]:
    model = torch.nn.Linear(WIDTH, WIDTH)
    return model, torch.optim.AdamW(model.parameters())


def _train(model: torch.nn.Linear, optim: torch.optim.Optimizer) -> None:
    model(torch.randn(8, WIDTH)).square().mean().backward()
    optim.step()
    optim.zero_grad()


def _state(model: torch.nn.Module, optim: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [*model.parameters(), *optim.state_dict()["state"][0].values()]


def _slot_rss(mgr: CheckpointManager, pid: int | str = "self") -> dict[int, tuple[int, int]]:
    """{inode: (bytes present in process `pid`, size)} of the mappings of the rank's slot files."""
    ring = mgr._p.ring
    assert ring is not None
    sizes = {os.fstat(m.fd).st_ino: m.size for m in ring._maps.values()}
    present: dict[int, int] = {}
    with open(f"/proc/{pid}/smaps") as f:
        inode = None
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and fields[0][0] in "0123456789abcdef":
                inode = int(fields[4])
            elif fields[0] == "Rss:" and inode in sizes:
                present[inode] = present.get(inode, 0) + int(fields[1]) * 1024
    return {ino: (present.get(ino, 0), size) for ino, size in sizes.items()}


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class _Rank:
    """A rank staged on the stand-in GPU, snapshotting every 5 steps; each snapshot's state."""

    def __init__(self, root: Path) -> None:
        torch.manual_seed(0)
        self.model, self.optim = _model()
        self.mgr = _manager(root)
        self.ops = HostOps()
        self.stage = stage_on_host(self.mgr, self.ops, chunk_bytes=CHUNK)
        self.states: dict[int, list[torch.Tensor]] = {}
        _train(self.model, self.optim)
        self.mgr.prepare(self.model, self.optim)
        wait_for(lambda: not self.mgr.preparing, timeout=60, interval=0.01, message="the slots prepared")

    def run(self, steps: range) -> None:
        for step in steps:
            _train(self.model, self.optim)
            if self.mgr.maybe_save(step, self.model, self.optim):
                assert self.mgr.wait(timeout=60)
                self.states[step] = [t.clone() for t in _state(self.model, self.optim)]


def _resume(root: Path) -> tuple[CheckpointManager, int, list[torch.Tensor]]:
    mgr = _manager(root)
    stage_on_host(mgr, HostOps(), chunk_bytes=CHUNK)
    model, optim = _model()
    resumed = mgr.load_latest(model, optim)
    assert resumed is not None and resumed.source == "local"
    return mgr, resumed.step, _state(model, optim)


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_snapshots_drained_by_the_copier_land_whole_while_the_rank_holds_no_slot_page(
    root: Path, copier: subprocess.Popen[str]
) -> None:
    rank = _Rank(root)
    rank.run(range(2, 6))
    fds = _open_fds()
    rank.run(range(6, 26))
    mgr, states = rank.mgr, rank.states
    assert sorted(states) == [5, 10, 15, 20, 25]
    assert _open_fds() == fds  # each drain's descriptor of its slot file closed again
    pipe = rank.stage.pipe
    assert pipe is not None and pipe.copier is not None  # it drained through the copier throughout
    rss = _slot_rss(mgr)
    assert len(rss) >= 2 and sum(size for _, size in rss.values()) > 4 * (WIDTH * WIDTH * 4)
    # The rank wrote only the optimizer's step count itself (a page or two of each slot it drained
    # into), of 773 pages each.
    assert all(present <= FEW_PAGES for present, _ in rss.values()), rss
    assert rank.ops.calls["register"] == 2 and rank.ops.calls["unregister"] == 0  # the 2 chunks, pinned
    mgr.close()
    assert rank.ops.calls["unregister"] == 2  # unpinned before they are unmapped

    restarted, step, got = _resume(root)
    assert step == 25 and _equal(got, states[25])
    assert all(present <= FEW_PAGES for present, _ in _slot_rss(restarted).values())  # the copier loaded
    restarted.close()


def test_the_copier_reserves_each_slot_and_makes_its_pages_present_in_its_own_mappings(
    root: Path, copier: subprocess.Popen[str]
) -> None:
    """`prepare` has the copier reserve each of the keep + 1 slots (its space allocated: a full
    /dev/shm fails there, not in a drain) and make every page present in the copier's mapping,
    while the rank's mappings hold none."""
    rank = _Rank(root)
    assert rank.mgr._preparer is not None
    rank.mgr._preparer.join(60)  # every slot, not only the first
    ring = rank.mgr._p.ring
    assert ring is not None
    stats = [os.fstat(m.fd) for m in ring._maps.values()]
    assert len(stats) == 3 and all(st.st_blocks * 512 >= st.st_size > 0 for st in stats)
    in_copier = _slot_rss(rank.mgr, copier.pid)
    assert all(present == size for present, size in in_copier.values()), in_copier
    assert all(present == 0 for present, _ in _slot_rss(rank.mgr).values())
    rank.mgr.close()


def test_without_a_copier_the_rank_copies_itself_and_holds_every_slot_page(root: Path) -> None:
    """The baseline the copier is for (and the path of a rank with no copier in its pod)."""
    rank = _Rank(root)
    rank.run(range(2, 11))
    mgr, states = rank.mgr, rank.states
    assert rank.stage.pipe is not None and rank.stage.pipe.copier is None
    rss = _slot_rss(mgr)
    assert sum(present for present, _ in rss.values()) >= sum(size for _, size in rss.values()) // 2
    mgr.close()
    restarted, step, got = _resume(root)
    assert step == 10 and _equal(got, states[10])
    restarted.close()


def test_a_copier_that_dies_leaves_the_rank_copying_itself_and_loses_nothing(root: Path) -> None:
    proc = _start_copier(root)
    rank = _Rank(root)
    rank.run(range(2, 7))
    stage, saved = rank.stage, rank.states
    assert stage.pipe is not None and stage.pipe.copier is not None  # step 5's went through it
    proc.kill()
    proc.wait(timeout=30)
    rank.run(range(7, 16))
    assert sorted(saved) == [5, 10, 15] and stage.pipe is not None and stage.pipe.copier is None
    rank.mgr.close()
    restarted, step, got = _resume(root)
    assert step == 15 and _equal(got, saved[15])
    restarted.close()


def test_a_copier_that_hangs_is_given_up_after_its_timeout_and_nothing_is_lost(
    root: Path, copier: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rank = _Rank(root)
    rank.run(range(2, 7))
    stage = rank.stage
    assert stage.pipe is not None and stage.pipe.copier is not None
    monkeypatch.setattr("rtj_trainer.slot_copier.CHUNK_REPLY_TIMEOUT", 1.0)
    os.kill(copier.pid, signal.SIGSTOP)  # hung: it never replies
    try:
        rank.run(range(7, 11))
    finally:
        os.kill(copier.pid, signal.SIGCONT)
    assert sorted(rank.states) == [5, 10] and stage.pipe.copier is None
    # Given up only once dead: a copier resumed later would write chunk bytes the rank has reused.
    assert copier.wait(timeout=10) == -signal.SIGKILL
    rank.mgr.close()
    restarted, step, got = _resume(root)
    assert step == 10 and _equal(got, rank.states[10])
    restarted.close()


def _copier_maps(proc: subprocess.Popen[str]) -> str:
    return Path(f"/proc/{proc.pid}/maps").read_text()


def test_the_copier_unmaps_a_deleted_slot_and_a_gone_ranks_chunks(
    root: Path, copier: subprocess.Popen[str]
) -> None:
    rank = _Rank(root)
    rank.run(range(2, 11))
    mgr = rank.mgr
    maps = _copier_maps(copier)
    assert "rtj-ckpt-chunk" in maps and str(root) in maps
    ring = mgr._p.ring
    assert ring is not None
    slot = next(iter(ring._maps.values()))
    slot_path = os.readlink(f"/proc/self/fd/{slot.fd}")
    mgr.close()  # the rank is gone: its chunks' connection closed
    wait_for(lambda: "rtj-ckpt-chunk" not in _copier_maps(copier), timeout=30, message="chunks unmapped")

    os.unlink(slot_path)  # the tier removes a slot: the copier drops it at its next request
    client = CopierClient.connect(socket_path(str(root)))
    assert client is not None
    other = next(p for p in root.rglob("*.bin") if str(p) != slot_path)
    fd = os.open(other, os.O_RDWR)
    try:
        client.reserve(fd)
    finally:
        os.close(fd)
        client.close()
    assert "(deleted)" not in _copier_maps(copier)


def test_a_request_outside_its_slot_is_refused_and_the_copier_goes_on(
    root: Path, copier: subprocess.Popen[str]
) -> None:
    slot = root / "slot.bin"
    slot.write_bytes(b"\0" * 8192)
    chunk = os.memfd_create("rtj-ckpt-chunk")
    os.ftruncate(chunk, 4096)
    os.pwrite(chunk, b"x" * 4096, 0)
    client = CopierClient.connect(socket_path(str(root)))
    assert client is not None
    fd = os.open(slot, os.O_RDWR)
    try:
        client.attach([chunk])
        with pytest.raises(OSError, match="outside"):
            client.put(0, 4096, fd, 8000)
        client.put(0, 4096, fd, 4096)
        os.pwrite(chunk, b"\0" * 4096, 0)
        client.get(0, 4096, fd, 4096)
    finally:
        os.close(fd)
        client.close()
    assert slot.read_bytes() == b"\0" * 4096 + b"x" * 4096
    assert os.pread(chunk, 4096, 0) == b"x" * 4096
    os.close(chunk)


def test_no_copier_where_its_socket_cannot_be_reached(root: Path) -> None:
    assert CopierClient.connect(socket_path(str(root))) is None  # none listening
    (root / "slot-copier.sock").write_text("")  # a stale file, no socket
    assert CopierClient.connect(socket_path(str(root))) is None
    assert CopierClient.connect("/" + "x" * 120) is None  # too long for a Unix socket


def _trainer_config(memory_dir: Path, interval: int) -> TrainerConfig:
    return TrainerConfig.model_validate(
        {
            "jobName": "train", "command": ["python"], "args": [], "nnodes": 1, "nprocPerNode": 1,
            "rdzvEndpoint": "train-rdzv.ml.svc:29400", "rdzvId": "x", "maxInJobRestarts": 1,
            "heartbeatIntervalSeconds": 1, "rankHangTimeoutSeconds": 10, "rankInitialTimeoutSeconds": 10,
            "inProcess": {
                "enabled": False, "softTimeoutSeconds": 1, "hardTimeoutSeconds": 2, "maxRestarts": 0
            },
            "checkpointDir": str(memory_dir / "ckpt"), "checkpointIntervalSteps": 10, "checkpointsToKeep": 2,
            "memorySnapshotIntervalSteps": interval, "memorySnapshotDir": str(memory_dir),
            "maxNoProgressCycles": 3, "doNotRestartExitCodes": [93],
        }
    )  # fmt: skip


def test_the_entrypoint_serves_a_copier_where_its_ranks_look_only_with_the_memory_tier(root: Path) -> None:
    """`rtj-trainer launch`'s part: the copier listens in the job's directory of the memory volume,
    where a rank's `CheckpointManager` of that job connects; none with the memory tier off."""
    from rtj_trainer.entrypoint import start_slot_copier

    cfg = _trainer_config(root, interval=2)
    copier = start_slot_copier(cfg)
    assert copier is not None
    try:
        mgr = CheckpointManager(
            str(root / "persist"), rank=0, world_size=1, interval_steps=10,
            local_root=str(root / "train"), local_interval_steps=2,
        )  # fmt: skip
        assert mgr._p.ring is not None and mgr._p.ring.copier is not None
        client = mgr._p.ring.copier()
        assert client is not None  # the rank found the entrypoint's copier
        client.close()
    finally:
        copier.close()
    assert not os.path.exists(copier.path)  # it removed its socket on the way out
    assert start_slot_copier(_trainer_config(root, interval=0)) is None


def test_a_copier_that_dies_is_started_again_and_none_outlives_its_entrypoint(root: Path) -> None:
    path = socket_path(str(root))
    copier = CopierProcess(path).start()
    try:
        assert copier.proc is not None
        copier.proc.kill()  # the OOM killer's pick: it maps the whole memory tier
        wait_for(lambda: copier.starts == 2, timeout=30, message="the copier started again")
        client = CopierClient.connect(path)
        assert client is not None
        client.close()
    finally:
        copier.close()
    assert copier.proc.poll() is not None

    # An entrypoint SIGKILLed: its copier goes with it (PR_SET_PDEATHSIG).
    code = (
        "import sys; from rtj_trainer.slot_copier import CopierProcess; "
        "c = CopierProcess(sys.argv[1]).start(); print(c.proc.pid, flush=True); sys.stdin.read()"
    )
    entry = subprocess.Popen(
        [sys.executable, "-c", code, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert entry.stdout is not None
    pid = int(entry.stdout.readline())
    entry.kill()
    entry.wait(timeout=30)
    wait_for(lambda: _gone(pid), timeout=30, message="the orphaned copier gone")


def _gone(pid: int) -> bool:
    """No process `pid`, or only its zombie (an orphan's is reaped by whoever adopted it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
