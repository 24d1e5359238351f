"""The peer replica with real processes: two "pods" of one gloo rank each, or two each in the kill
test (tests/trainer_ckpt/peer_saver.py), each pod's replica server a process of its own (`python -m
rtj_trainer.peer_replica serve`), memory-backed directories (tmpfs) and a persisted tier.

- A pod is lost (its rank and server SIGKILLed, its memory deleted) while the persisted tier is
  unreadable (the directory replaced by a file: chmod does not stop root): the replacement fetches
  its shard from the peer and both ranks resume at the newest snapshot every rank can get.
- Kills: again and again, ranks and replica servers are SIGKILLed at random moments (mid-stream:
  the replicas' partial directories left behind are counted), sometimes a whole pod's memory is
  deleted and the persisted tier made unreadable; every resume must load exactly the state of the
  newest step every rank could get (own memory, peer replica or persisted), never a torn or
  mixed-step one. RTJ_PEER_KILLS sets the number of kills (default 30; the issue asks >= 100:
  `RTJ_PEER_KILLS=120 pytest tests/trainer_ckpt/test_peer_replica.py -k kills`).
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from peer_saver import pod_root
from rtj_local.procs import free_port, free_port_run
from rtj_local.wait import wait_for
from rtj_trainer.checkpoint_format import latest_valid, local_rank_dir, local_snapshots, read_local_meta
from rtj_trainer.peer_replica import replicas_root
from test_snapshot_kills import PEER_LOST
from tmpfs import mounted_tmpfs

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(1800)]

KILLS = int(os.environ.get("RTJ_PEER_KILLS", "30"))


class Pods:
    """The zygote forking the ranks, and the two pods' replica servers."""

    def __init__(
        self, ram: Path, mem_every: int, persist_every: int, step_s: float, per_pod: int = 1
    ) -> None:
        self.ram = ram
        self.per_pod = per_pod
        self.world = 2 * per_pod
        (ram / "work").mkdir()
        self.ports = [free_port(), free_port()]
        self.servers: list[subprocess.Popen[str] | None] = [None, None]
        self.zygote = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("peer_saver.py")), "zygote", str(ram),
             *map(str, self.ports), str(mem_every), str(persist_every), str(step_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", "RTJ_PEER_RANKS_PER_POD": str(per_pod)},
        )  # fmt: skip
        for pod in (0, 1):
            self.start_server(pod)

    def start_server(self, pod: int) -> None:
        root = pod_root(str(self.ram), pod)
        os.makedirs(root, exist_ok=True)
        proc = subprocess.Popen(
            [sys.executable, "-m", "rtj_trainer.peer_replica", "serve", root, str(self.ports[pod])],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready and proc.stdout.readline().startswith("serving"), f"replica server {pod} did not start"
        self.servers[pod] = proc

    def kill_server(self, pod: int) -> None:
        proc = self.servers[pod]
        if proc is not None:
            proc.kill()
            proc.wait(10)
            self.servers[pod] = None

    def ask(self, cmd: str, timeout: float = 60.0) -> list[int]:
        assert self.zygote.stdin and self.zygote.stdout
        self.zygote.stdin.write(cmd + "\n")
        self.zygote.stdin.flush()
        ready, _, _ = select.select([self.zygote.stdout], [], [], timeout)
        assert ready, f"zygote did not answer {cmd!r} within {timeout} s"
        return [int(x) for x in self.zygote.stdout.readline().split()]

    def reap(self, pids: list[int]) -> None:
        for pid, status in zip(pids, self.ask("reap"), strict=True):
            killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
            peer_lost = os.WIFEXITED(status) and os.WEXITSTATUS(status) == PEER_LOST
            assert killed or peer_lost, (
                f"rank {pid} ended with status {status} (3: wrong state loaded, 5: ranks loaded "
                "different steps, 4: an error)"
            )

    def close(self) -> None:
        for pod in (0, 1):
            self.kill_server(pod)
        self.zygote.kill()
        self.zygote.wait(10)

    # --- what the files say ------------------------------------------------------------------------
    def resumes(self) -> list[dict]:
        path = self.ram / "work" / "resumes.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def wait_resumed(self, n: int, timeout: float = 120.0) -> list[dict]:
        def every_rank() -> list[dict] | None:
            recs = [r for r in self.resumes() if r["n"] == n]
            return recs if len(recs) >= self.world else None

        return wait_for(every_rank, timeout, 0.02, f"incarnation {n} to resume on every rank")

    def step_reached(self) -> int:
        steps = []
        for rank in range(self.world):
            with open(self.ram / "work" / f"step-{rank}") as f:
                steps.append(int(f.read() or 0))
        return max(steps)

    def newest_gettable(self) -> tuple[int, bool]:
        """(the newest step every rank can get: in its own memory, from its replica on the other pod
        (same save, same nonce), or persisted; 0 if none — the same rule as load_latest, from the
        files; whether that step needs a replica)."""
        gettable, own_sets = [], []
        for rank in range(self.world):
            pod = rank // self.per_pod
            own_dir = local_rank_dir(pod_root(str(self.ram), pod), rank)
            own = set(local_snapshots(own_dir))
            for s, n in own:
                read_local_meta(os.path.join(own_dir, f"step-{s:010d}.{n:x}"))  # committed: metadata there
            peer_dir = local_rank_dir(replicas_root(pod_root(str(self.ram), 1 - pod)), rank)
            gettable.append(own | set(local_snapshots(peer_dir)))
            own_sets.append(own)
        common = set.intersection(*gettable)
        memory = max(common, default=(0, 0))
        persisted = latest_valid(str(self.ram / "persist")) or 0
        needs_peer = memory[0] > persisted and any(memory not in own for own in own_sets)
        return max(memory[0], persisted), needs_peer

    def replica_partials(self) -> int:
        n = 0
        for pod in (0, 1):
            root = replicas_root(pod_root(str(self.ram), pod))
            for rank_dir in os.listdir(root) if os.path.isdir(root) else ():
                n += sum(x.endswith(".partial") for x in os.listdir(os.path.join(root, rank_dir)))
        return n

    def lose_pod(self, pod: int) -> None:
        """The pod's node is gone: its memory with it."""
        shutil.rmtree(self.ram / f"pod-{pod}")

    def persisted_unreadable(self) -> None:
        """The checkpoint volume fails while the pods recover (a file where the directory was)."""
        os.rename(self.ram / "persist", self.ram / "persist.away")
        (self.ram / "persist").write_text("the volume is gone\n")

    def persisted_back(self) -> None:
        if (self.ram / "persist.away").exists():
            (self.ram / "persist").unlink()
            os.rename(self.ram / "persist.away", self.ram / "persist")


@pytest.fixture
def ram_fs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs, like the pods' /dev/shm (and a fast persisted tier)."""
    with mounted_tmpfs(tmp_path / "ram", "512m") as mnt:
        yield mnt


MEMORY_INTERVAL = 2


def test_a_lost_pod_resumes_from_its_peer_replica_with_the_volume_unreadable(ram_fs: Path) -> None:
    pods = Pods(ram_fs, mem_every=MEMORY_INTERVAL, persist_every=10, step_s=0.1)
    try:
        pids = pods.ask("fork 0")
        pods.wait_resumed(0)
        time.sleep(random.uniform(3.0, 4.0))  # ~30 steps: snapshots every 2, persisted at 10, 20, ...
        # Pod 1's node dies (its rank and its replica server); ft_launcher stops the other rank.
        os.kill(pids[1], signal.SIGKILL)
        pods.kill_server(1)
        os.kill(pids[0], signal.SIGKILL)
        pods.reap(pids)
        reached = pods.step_reached()
        pods.lose_pod(1)
        pods.persisted_unreadable()
        expected, needs_peer = pods.newest_gettable()
        # The replacement pod: an empty memory volume, a new replica server.
        pods.start_server(1)
        t0 = time.time()
        pids = pods.ask("fork 1")
        recs = pods.wait_resumed(1)
        resumed_s = max(r["t"] for r in recs) - t0
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        pods.reap(pids)
    finally:
        pods.close()
    steps = {r["step"] for r in recs}
    print(
        f"step reached {reached}, resumed at {sorted(steps)} from {[r['source'] for r in recs]} "
        f"in {resumed_s:.2f} s (ranks forked -> both resumed), {reached - min(steps)} steps lost"
    )
    assert needs_peer and len(steps) == 1 and steps == {expected}, (recs, expected)
    assert {r["source"] for r in recs} == {"peer"}
    # Every rank resumed at its newest memory snapshot or the one before (the replica of a snapshot
    # may still be in flight when the node dies): <= 1 snapshot interval more than the memory tier.
    assert reached - expected < 2 * MEMORY_INTERVAL, (reached, expected)


@pytest.mark.parametrize("per_pod", [1, 2], ids=["one-rank-per-pod", "two-ranks-per-pod"])
def test_kills_of_ranks_and_replica_servers_never_load_a_torn_or_mixed_state(
    ram_fs: Path, per_pod: int
) -> None:
    pods = Pods(ram_fs, mem_every=1, persist_every=3, step_s=0.0, per_pod=per_pod)
    seed = 20261201
    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    expected: dict[int, tuple[int, bool]] = {}
    try:
        for n in range(KILLS + 1):
            pids = pods.ask(f"fork {n}")
            if n == KILLS:  # the last incarnation only resumes (and is checked), then stops
                pods.wait_resumed(n)
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                pods.reap(pids)
                break
            time.sleep(rng.uniform(0.05, 1.5))
            scenario = rng.choice(["ranks", "receiver", "pod"])
            victim = rng.randrange(2)  # a pod
            if scenario == "receiver":  # the receiver dies mid-stream, the ranks a moment later
                pods.kill_server(victim)
                time.sleep(rng.uniform(0.0, 0.2))
            first = pids[victim * per_pod : (victim + 1) * per_pod]
            for pid in first:  # the victim pod's ranks, then (as ft_launcher stops them) the others
                os.kill(pid, signal.SIGKILL)
            time.sleep(rng.uniform(0.0, 0.03))
            for pid in pids:
                if pid not in first:
                    os.kill(pid, signal.SIGKILL)
            pods.kill_server(0)
            pods.kill_server(1)
            pods.reap(pids)
            outcomes[f"kill: {scenario}"] += 1
            outcomes["replica partial left (a stream cut)"] += pods.replica_partials() > 0
            pods.persisted_back()
            if scenario == "pod":
                pods.lose_pod(victim)
                if rng.random() < 0.5:
                    pods.persisted_unreadable()
            expected[n + 1] = pods.newest_gettable()
            pods.start_server(0)
            pods.start_server(1)
    finally:
        pods.close()

    by_n: dict[int, list[dict]] = {}
    for r in pods.resumes():
        by_n.setdefault(r["n"], []).append(r)
    checked = 0
    for n, recs in sorted(by_n.items()):
        if len(recs) < pods.world or n not in expected:
            continue  # killed before every rank had resumed (or the first start)
        assert len({r["step"] for r in recs}) == 1, recs
        assert recs[0]["step"] == expected[n][0], f"incarnation {n} resumed at {recs}, expected {expected[n]}"
        checked += 1
        outcomes[f"resumed from {recs[0]['source']}"] += 1
        outcomes["needed a replica"] += expected[n][1]
    assert len(by_n.get(KILLS, [])) == pods.world, "the final incarnation did not resume on every rank"
    print(f"{KILLS} kills, {checked} resumes checked, final step {by_n[KILLS][0]['step']}: {dict(outcomes)}")
    assert outcomes["resumed from peer"] > 0 and outcomes["replica partial left (a stream cut)"] > 0, outcomes


def test_the_entrypoint_serves_replicas_on_its_slots_port_and_tells_its_ranks(tmp_path: Path) -> None:
    """`rtj-trainer launch`'s part: the replica server on peerReplicaPort + slot, and the status
    dir's file naming it and the next slot's, which the ranks read (RankEnv.peer_replica)."""
    from rtj.contract import TrainerConfig, replica_endpoints
    from rtj_trainer.entrypoint import start_peer_replica
    from rtj_trainer.peer_replica import list_held
    from rtj_trainer.runtime_env import RankEnv

    base = free_port_run(4)  # slot s serves on base + s
    cfg = TrainerConfig.model_validate(
        {
            "jobName": "train",
            "command": ["python"],
            "args": [],
            "nnodes": 3,
            "nprocPerNode": 1,
            "rdzvEndpoint": "train-rdzv.ml.svc:29400",
            "rdzvId": "x",
            "maxInJobRestarts": 1,
            "heartbeatIntervalSeconds": 1,
            "rankHangTimeoutSeconds": 10,
            "rankInitialTimeoutSeconds": 10,
            "inProcess": {
                "enabled": False,
                "softTimeoutSeconds": 1,
                "hardTimeoutSeconds": 2,
                "maxRestarts": 0,
            },
            "checkpointDir": str(tmp_path / "ckpt"),
            "checkpointIntervalSteps": 10,
            "checkpointsToKeep": 2,
            "memorySnapshotIntervalSteps": 2,
            "memorySnapshotDir": str(tmp_path / "shm"),
            "maxNoProgressCycles": 3,
            "doNotRestartExitCodes": [93],
            "peerReplicaPort": base,
        }
    )
    status = tmp_path / "status"
    status.mkdir()
    server = start_peer_replica(cfg, "ml", 2, str(status))
    assert server is not None
    try:
        assert server.port == base + 2
        assert list_held(f"127.0.0.1:{base + 2}") == {}
        env = RankEnv.from_env({"RTJ_STATUS_DIR": str(status), "RTJ_JOB_NAME": "train"})
        assert env.peer_replica() == replica_endpoints("train", "ml", 2, 3, base)
        assert server.root == str(tmp_path / "shm" / "train" / "replicas")
    finally:
        server.stop()
    # Off (no port, or one node): no server and no file, the ranks do not replicate.
    off = cfg.model_copy(update={"peer_replica_port": 0})
    assert start_peer_replica(off, "ml", 2, str(status)) is None
    assert RankEnv.from_env({"RTJ_STATUS_DIR": str(status)}).peer_replica() is None


def test_a_pod_serves_the_memory_snapshots_of_a_rank_that_ran_in_it_before(tmp_path: Path) -> None:
    """After a replacement the rendezvous may give a surviving pod other ranks: the snapshots its
    earlier rank left (memory tier: no CRC32 stored) are served with a CRC32 computed on the way,
    and the fetched copy loads with it checked."""
    from ckpt_saver import State, content_hash, expected_hash
    from rtj_trainer.checkpoint import CheckpointManager
    from rtj_trainer.peer_replica import ReplicaServer, fetch_snapshot, held_replicas

    survivor, replacement = tmp_path / "pod-0", tmp_path / "pod-1"
    mgr = CheckpointManager(
        str(tmp_path / "persist"), rank=1, world_size=1, interval_steps=100,
        local_root=str(survivor), local_interval_steps=2,
    )  # fmt: skip
    state = State()
    for step in range(1, 6):
        state.fill(step)
        mgr.maybe_save(step, state)
        assert mgr.wait_local(30)
    assert held_replicas(str(survivor)) == {1: local_snapshots(local_rank_dir(str(survivor), 1))}
    (step, nonce), _ = local_snapshots(local_rank_dir(str(survivor), 1))
    server = ReplicaServer(str(survivor), host="127.0.0.1").start()
    try:
        fetch_snapshot(f"127.0.0.1:{server.port}", 1, step, nonce, local_rank_dir(str(replacement), 1))
    finally:
        server.stop()
    fetched = read_local_meta(
        os.path.join(local_rank_dir(str(replacement), 1), f"step-{step:010d}.{nonce:x}")
    )
    assert all(f["crc32"] is not None for f in fetched["files"].values())
    fresh = State()
    resumed = CheckpointManager(
        str(tmp_path / "persist"), rank=1, world_size=1, interval_steps=100,
        local_root=str(replacement), local_interval_steps=2,
    ).load_latest(fresh)  # fmt: skip
    assert resumed is not None and resumed.step == step == 4 and content_hash(fresh) == expected_hash(4)


def test_a_rank_sends_its_snapshot_without_mapping_it(tmp_path: Path) -> None:
    """The replicator streams from the page cache (`sendfile`) and reads for the CRC32 beside it: the
    snapshot is never mapped in the rank (an unmap of 13.7 GB stalls its training thread's
    allocations, and a rank killed mid-stream would tear the mapping down before its GPU memory is
    freed). The replica arrives whole, its CRC32s checked by the server."""
    import threading

    import torch
    from rtj_trainer.checkpoint import CheckpointManager
    from rtj_trainer.peer_replica import ReplicaServer, send_snapshot

    mgr = CheckpointManager(
        str(tmp_path / "persist"), rank=0, world_size=1, interval_steps=100,
        local_root=str(tmp_path / "sender"), local_interval_steps=1,
    )  # fmt: skip
    model = torch.nn.Linear(4096, 4096)  # 64 MiB of weights
    assert mgr.maybe_save(1, model) and mgr.wait(timeout=60)
    (step, nonce), *_ = local_snapshots(local_rank_dir(str(tmp_path / "sender"), 0))
    snap_dir = os.path.join(local_rank_dir(str(tmp_path / "sender"), 0), f"step-{step:010d}.{nonce:x}")
    shard = next(str(p) for p in Path(snap_dir).iterdir() if p.name.endswith(".bin"))
    server = ReplicaServer(str(tmp_path / "holder"), host="127.0.0.1").start()
    ring_maps = Path("/proc/self/maps").read_text().count(shard)  # the memory tier's own mapping
    done, seen = threading.Event(), []

    def look() -> None:
        while not done.is_set():
            seen.append(Path("/proc/self/maps").read_text())

    looker = threading.Thread(target=look)
    looker.start()
    try:
        for _ in range(3):
            send_snapshot(f"127.0.0.1:{server.port}", snap_dir, 0)
    finally:
        done.set()
        looker.join()
        server.stop()
    assert len(seen) > 10 and all(m.count(shard) == ring_maps for m in seen)
    held = local_rank_dir(replicas_root(str(tmp_path / "holder")), 0)
    assert local_snapshots(held) == [(step, nonce)]
    got = Path(held, f"step-{step:010d}.{nonce:x}", Path(shard).name).read_bytes()
    assert got == Path(shard).read_bytes()
