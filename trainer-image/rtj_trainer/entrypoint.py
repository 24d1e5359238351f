"""`rtj-trainer`: the process a worker pod (and the rendezvous pod) runs.

    rtj-trainer launch       # worker pod: heartbeat agent + ft_launcher + exit-code mapping
    rtj-trainer rendezvous   # <job>-rdzv pod: hosts the job's rendezvous store

Both read the operator's `TrainerConfig` (JSON) from env RTJ_TRAINER_CONFIG, and the pod's
identity from the downward-API variables of `rtj.contract`.

A hot spare (`TrainerConfig.standby`) heartbeats in state Standby with ft_launcher imported
but not started (`warm_launcher`), and starts it, joining the rendezvous like any worker, once the
operator's ASSIGNED_SLOT_ANNOTATION appears on its Lease: until then it is no rendezvous
participant, so the job's nnodes never changes.

`launch` exit codes (read by the operator's ladder, see `rtj.contract.ExitCode`):
0 training finished; 93 NVRx decided the job must not restart (no progress across restart cycles),
or a rank reported a permanent error (`rtj_trainer.permanent`: the launcher is stopped before it
restarts the workers into the same error); 70 the launcher's in-job restart budget is spent
(replace the pod); 76 the same on a pod that may restart in place (ENV_MAX_IN_PLACE_RESTARTS,
counted by `pod_incarnation`) and whose last fault is no evidence against its node: the kubelet
restarts its containers on the same node and the ranks resume from its memory snapshots;
78 invalid config; 143 stopped by SIGTERM after a graceful stop.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rtj.contract import (
    ENV_GRACEFUL_STOP_SECONDS,
    ENV_NAMESPACE,
    ENV_NODE_NAME,
    ENV_POD_IP,
    ENV_POD_NAME,
    ENV_POD_UID,
    ENV_STATUS_DIR,
    ENV_TERMINATION_GRACE_SECONDS,
    ENV_TRAINER_CONFIG,
    PEER_REPLICA_FILE,
    RANK_FILE_PREFIX,
    ExitCode,
    Fault,
    FaultReason,
    FaultSeverity,
    PodState,
    TrainerConfig,
    parse_worker_pod_name,
    replica_endpoints,
)

from .checkpoint_format import write_file_atomic
from .cpu_cgroup import usable_cpus
from .heartbeat import HeartbeatAgent, PodIdentity, load_api_client
from .launcher_supervision import (
    ExitWatch,
    await_promotion,
    become_subreaper,
    kill_group,
    signal_launcher,
    supervise,
)
from .launcher_supervision import reported_permanent_fault as reported_permanent_fault
from .log_filter import NoiseFilter
from .memory_cgroup import kills_since, oom_kills
from .peer_replica import ReplicaServer
from .pids import stop_process
from .pod_exit import LauncherEnd, pod_exit
from .pod_exit import map_exit_code as map_exit_code
from .pod_incarnation import pod_starts
from .rank_forkserver import enabled as rank_forkserver_enabled
from .rank_forkserver import rank_command
from .rank_forkserver import start_server as start_rank_forkserver
from .reach import start_responder
from .rendezvous_host import serve_rendezvous
from .rendezvous_loss import WAIT_SECONDS as RENDEZVOUS_WAIT_SECONDS
from .rendezvous_loss import LostStoreWatch, max_relaunches, wait_for_rendezvous
from .report import record_persisted
from .runtime_env import (
    GRACEFUL_STOP_EXIT_MARGIN_S,
    GRACEFUL_STOP_FILE,
    HANDOFF_FILE_PREFIX,
    PERMANENT_FILE_PREFIX,
    memory_tier_root,
    rank_env_vars,
    write_graceful_stop,
)
from .slot_copier import COPY_THREADS, CopierProcess, socket_path
from .warm_launcher import ENV_PREWARM_MODULE, prewarm_module

log = logging.getLogger("rtj_trainer")

#: Seconds between SIGTERM and SIGKILL for the launcher's process group on a graceful stop,
#: when the pod does not set ENV_GRACEFUL_STOP_SECONDS.
DEFAULT_GRACEFUL_STOP_SECONDS = 30.0
#: Seconds of the graceful stop kept back from ft_launcher's term timeout (its SIGTERM -> SIGKILL
#: of the ranks), for the launcher's own exit before the entrypoint kills its process group.
LAUNCHER_EXIT_SECONDS = 5
#: Seconds before the kubelet's SIGKILL (the pod's grace period after its SIGTERM) by which the
#: entrypoint stops persisting its ranks' handed-off snapshots: the aborted copies' cleanup, the
#: last heartbeat and the exit.
HANDOFF_EXIT_SECONDS = 2.0
#: Seconds ft_launcher waits between SIGTERM and SIGKILL when it stops ranks to restart them.
WORKERS_STOP_TIMEOUT_SECONDS = 10
GPU_MEMORY_POLL_SECONDS = 0.1
#: ft_launcher checks its ranks, and (one store read) whether another launcher opened a restart,
#: once per monitor interval: a dead rank is seen on average half an interval late, on its own
#: launcher and then on the others. The shortest and longest interval, and the store reads per
#: second the job's launchers together make at most between the two (the rendezvous host's load:
#: bench/rendezvous_scale.py measured 8 to 512 launchers at 0.5 s).
MONITOR_INTERVAL_FLOOR_SECONDS = 0.1
MONITOR_INTERVAL_CEILING_SECONDS = 0.5
MONITOR_STORE_READS_PER_SECOND = 1000.0
PROGRESS_FILE_NAME = "checkpoint-iteration"
#: Seconds ft_launcher may linger after every rank finished before it is killed. Its exit barrier
#: waits up to 300 s for the other pods' workers, so the default stays above that.
ENV_LAUNCHER_EXIT_TIMEOUT = "RTJ_LAUNCHER_EXIT_TIMEOUT_SECONDS"
DEFAULT_LAUNCHER_EXIT_TIMEOUT = 360.0


class ConfigError(Exception):
    pass


def load_config(environ: dict[str, str] | os._Environ[str] = os.environ) -> TrainerConfig:
    raw = environ.get(ENV_TRAINER_CONFIG)
    if not raw:
        raise ConfigError(f"{ENV_TRAINER_CONFIG} is not set: it must hold the TrainerConfig JSON")
    try:
        cfg = TrainerConfig.from_env(raw)
    except ValueError as exc:  # json.JSONDecodeError and pydantic's ValidationError
        if isinstance(exc, ValidationError):
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()
            )
        else:
            problems = f"not valid JSON ({exc})"
        raise ConfigError(f"{ENV_TRAINER_CONFIG} is invalid: {problems}") from None
    return cfg


def pod_identity(environ: dict[str, str] | os._Environ[str] = os.environ) -> PodIdentity:
    return PodIdentity(
        name=environ.get(ENV_POD_NAME) or socket.gethostname(),
        namespace=environ.get(ENV_NAMESPACE) or "default",
        uid=environ.get(ENV_POD_UID) or None,
        node_name=environ.get(ENV_NODE_NAME) or None,
        pod_ip=environ.get(ENV_POD_IP) or None,
    )


def launcher_command(standby: bool = False) -> list[str]:
    """ft_launcher of the running interpreter's environment (a hot spare's waits pre-warmed)."""
    if standby:
        return [sys.executable, "-m", "rtj_trainer.warm_launcher"]
    return [sys.executable, "-m", "rtj_trainer.launcher_main"]


def is_launcher(cmdline: Sequence[str]) -> bool:
    """Whether a process's command line is the ft_launcher this entrypoint starts (worker or hot
    spare): how tools outside the pod (tests, the demo, benchmarks) find the ranks' parent."""
    return any(launcher_command(standby)[-1] in cmdline for standby in (False, True))


def nvrx_version() -> str:
    """The installed NVRx version, for logs (the image pins it; see pyproject.toml)."""
    try:
        return importlib.metadata.version("nvidia-resiliency-ext")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def launcher_term_timeout(graceful_stop_seconds: float) -> int:
    """ft_launcher's --term-timeout (whole seconds) on a graceful stop of `graceful_stop_seconds`."""
    return max(1, int(graceful_stop_seconds - LAUNCHER_EXIT_SECONDS))


def handoff_deadline(
    signalled: float, graceful_stop_seconds: float, termination_grace: float | None
) -> float:
    """The wall-clock time until which the entrypoint persists its ranks' handed-off snapshots after
    the pod's SIGTERM at `signalled`: just before the kubelet's SIGKILL (the pod's grace period), or,
    not knowing it, before the entrypoint's own (pure; unit-tested)."""
    grace = max(termination_grace or 0.0, graceful_stop_seconds)
    return signalled + grace - HANDOFF_EXIT_SECONDS


def ranks_deadline(signalled: float, graceful_stop_seconds: float) -> float:
    """The wall-clock time by which the ranks must have exited after the pod's SIGTERM at `signalled`
    (`time.time()`): the launcher's SIGKILL less the ranks' exit margin (pure; unit-tested)."""
    return signalled + launcher_term_timeout(graceful_stop_seconds) - GRACEFUL_STOP_EXIT_MARGIN_S


def monitor_interval_seconds(nnodes: int) -> float:
    """ft_launcher's monitor interval for a job of `nnodes` pods (pure): the floor, or longer where
    the launchers' store reads would pass `MONITOR_STORE_READS_PER_SECOND`, up to the ceiling
    (0.1 s up to 100 pods, 0.25 s at 250, 0.5 s from 500 on)."""
    interval = round(nnodes / MONITOR_STORE_READS_PER_SECOND, 3)
    return min(MONITOR_INTERVAL_CEILING_SECONDS, max(MONITOR_INTERVAL_FLOOR_SECONDS, interval))


def build_launcher_argv(
    cfg: TrainerConfig,
    *,
    launcher: Sequence[str],
    local_addr: str | None,
    progress_file: str,
    term_timeout_seconds: float,
    rank_forkserver: str | None = None,
) -> list[str]:
    """The ft_launcher command line for one worker pod (pure; unit-tested). `rank_forkserver`: the
    socket of the pod's pre-warmed rank server (`rank_forkserver`), None to start ranks plainly."""
    argv = [
        *launcher,
        f"--nnodes={cfg.nnodes}",
        f"--nproc-per-node={cfg.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={cfg.rdzv_endpoint}",
        f"--rdzv-id={cfg.rdzv_id}",
        # The store lives in the job's rendezvous pod (nvrx-control): no training pod is special.
        "--rdzv-conf=is_host=false",
        f"--max-restarts={cfg.max_in_job_restarts}",
        f"--term-timeout={max(1, int(term_timeout_seconds))}",
        f"--workers-stop-timeout={WORKERS_STOP_TIMEOUT_SECONDS}",
        f"--monitor-interval={monitor_interval_seconds(cfg.nnodes):g}",
        # Hang detection: a rank silent past these is killed and the workers restarted.
        f"--ft-initial-rank-heartbeat-timeout={cfg.rank_initial_timeout_seconds:g}",
        f"--ft-rank-heartbeat-timeout={cfg.rank_hang_timeout_seconds:g}",
        # NVRx's progress tracker: N restart cycles without a newer committed checkpoint (the
        # iteration our checkpoints write to this file) stop every launcher with this exit code.
        f"--ft-checkpoint-iteration-file={progress_file}",
        f"--ft-max-no-progress-cycles={cfg.max_no_progress_cycles}",
        f"--ft-no-restart-exit-code={ExitCode.DO_NOT_RESTART}",
        # After stopping the ranks it waits for their GPU memory to be freed, polling every 2 s by
        # default: most of a restart's "stopping workers" phase on 2xH200 (issue 14).
        f"--ft-gpu-memory-poll-interval={GPU_MEMORY_POLL_SECONDS:g}",
    ]
    if local_addr:
        # MASTER_ADDR for the ranks: the pod IP, reachable from other pods (a pod's hostname is not).
        argv.append(f"--local-addr={local_addr}")
    # The command runs as given (`python train.py ...`, a console script, ...), a Python one
    # forked from the pod's pre-warmed server when there is one.
    command = [*cfg.command, *cfg.args]
    argv += ["--no-python", *(rank_command(rank_forkserver, command) if rank_forkserver else command)]
    return argv


def start_peer_replica(
    cfg: TrainerConfig, namespace: str, slot: int | None, status_dir: str
) -> ReplicaServer | None:
    """The pod's replica server (port + slot) and, for its ranks, PEER_REPLICA_FILE naming it and
    the peer's; None (and no file) when the peer replica is off or the server cannot listen: the
    ranks then snapshot into memory without replicating."""
    path = os.path.join(status_dir, PEER_REPLICA_FILE)
    Path(path).unlink(missing_ok=True)
    mem_dir = cfg.memory_snapshot_dir if cfg.memory_snapshot_interval_steps else None
    if not cfg.peer_replica_port or mem_dir is None or cfg.nnodes < 2 or slot is None:
        return None
    own, peer = replica_endpoints(cfg.job_name, namespace, slot, cfg.nnodes, cfg.peer_replica_port)
    try:
        server = ReplicaServer(
            memory_tier_root(mem_dir, cfg.job_name), port=cfg.peer_replica_port + slot
        ).start()
    except OSError as e:
        log.warning("peer replica off: its server cannot listen on %s: %r", own, e)
        return None
    write_file_atomic(path, json.dumps({"replicaEndpoint": own, "peerEndpoint": peer}).encode())
    log.info("peer replica: serving replicas at %s, replicating to %s", own, peer)
    return server


def start_slot_copier(cfg: TrainerConfig) -> CopierProcess | None:
    """The pod's slot copier (`rtj_trainer.slot_copier`) when the memory tier is on; None when it
    is off or the copier does not start (the ranks then copy their snapshots themselves)."""
    if not cfg.memory_snapshot_interval_steps or not cfg.memory_snapshot_dir:
        return None
    path = socket_path(memory_tier_root(cfg.memory_snapshot_dir, cfg.job_name))
    # Each local rank's copies as fast as one rank's alone, within the pod's CPUs.
    threads = min(usable_cpus(), COPY_THREADS * max(1, cfg.nproc_per_node))
    try:
        copier = CopierProcess(path, threads=max(1, threads)).start()
    except OSError as e:
        log.warning("slot copier off: %r", e)
        return None
    log.info("slot copier: serving the ranks' memory snapshot copies at %s", path)
    return copier


def _final_state(code: int) -> PodState | None:
    """The state of the pod's last heartbeat for its exit code; None: as its ranks left it."""
    if code == ExitCode.SUCCEEDED:
        return PodState.FINISHED
    if code == ExitCode.TERMINATED:  # stopped gracefully: its ranks are gone, none is restarting
        return PodState.STOPPED
    return None


#: Where the ranks' status files go unless RTJ_STATUS_DIR says: the pod's memory-backed /dev/shm
#: (every pod the operator makes mounts one). A rank rewrites its file from the training thread every
#: 0.5 s; on a disk, its rename waits behind the file system's journal while a persist writes
#: gigabytes to the same disk (`bench/status_write_stalls.py`, 2-core machine, a 2 GiB persist to
#: /tmp, writes every 20 ms: those over 10 ms summed 0.6-0.85 s per persist with the files in /tmp,
#: 0.17-0.20 s in /dev/shm, beside a CI run; 0.69-3.66 s against 0-0.22 s in an earlier run).
STATUS_DIR_BASES = ("/dev/shm",)


def status_dir_base(bases: tuple[str, ...] = STATUS_DIR_BASES) -> str:
    """The first of `bases` this process can write, else the temporary directory."""
    for base in bases:
        if os.path.isdir(base) and os.access(base, os.W_OK | os.X_OK):
            return base
    return tempfile.gettempdir()


def _prepare_status_dir(pod: PodIdentity) -> str:
    status_dir = os.environ.get(ENV_STATUS_DIR) or os.path.join(status_dir_base(), f"rtj-status-{pod.name}")
    os.makedirs(status_dir, exist_ok=True)
    for name in os.listdir(status_dir):  # stale files of an earlier run in the same pod
        if name.startswith((RANK_FILE_PREFIX, HANDOFF_FILE_PREFIX, PERMANENT_FILE_PREFIX)) or name in (
            PROGRESS_FILE_NAME,
            GRACEFUL_STOP_FILE,
        ):
            Path(status_dir, name).unlink(missing_ok=True)
    return status_dir


def launch(graceful_stop_seconds: float) -> int:
    try:
        cfg = load_config()
    except ConfigError as exc:
        print(f"rtj-trainer: {exc}", file=sys.stderr, flush=True)
        return ExitCode.CONFIG_ERROR
    pod = replace(pod_identity(), job_name=cfg.job_name, job_uid=cfg.job_uid)
    status_dir = _prepare_status_dir(pod)
    starts = pod_starts(cfg, status_dir, os.environ)
    log.info("container start %d of this pod; in-place restarts left: %d", starts.start, starts.left)
    api_client = load_api_client()
    if cfg.standby and api_client is None:
        print("rtj-trainer: a standby pod needs the Kubernetes API (its Lease carries the promotion)",
              file=sys.stderr, flush=True)  # fmt: skip
        return ExitCode.CONFIG_ERROR
    # Peers probe it when the operator suspects a partition (rtj_trainer.reach); no pod IP: none. A
    # daemon thread: it ends with the process.
    responder = start_responder(pod.pod_ip)
    agent = HeartbeatAgent(
        status_dir,
        pod,
        cfg.heartbeat_interval_seconds,
        api_client,
        standby=cfg.standby,
        rank_hang_timeout_seconds=cfg.rank_hang_timeout_seconds,
        reach_endpoint=responder.endpoint(pod.pod_ip) if responder and pod.pod_ip else None,
    )
    agent.start()
    end = replace(_LauncherRuns(cfg, pod, status_dir, agent, graceful_stop_seconds).run(), starts=starts)
    if agent.fenced.is_set():
        # Not this slot's pod any more: no last heartbeat, no save; the replacement has the slot.
        log.error("fenced (%s): ranks stopped, exiting %s", agent.fence_reason, ExitCode.FENCED)
        return ExitCode.FENCED
    code, fault = pod_exit(
        end,
        do_not_restart=cfg.do_not_restart_exit_codes,
        max_no_progress_cycles=cfg.max_no_progress_cycles,
        now=datetime.now(UTC),
    )
    final = agent.stop(_final_state(code), fault)
    log.info(
        "ft_launcher exited with %s; pod exit code %s; last heartbeat %s", end.rc, code, final.to_annotation()
    )
    return code


class _PodPersist:
    """The entrypoint's part of a graceful stop: persisting the snapshots its ranks handed off
    (`checkpoint.handoff`). Started from the SIGTERM handler; the import (torch) runs in a thread,
    meanwhile the ranks make their memory snapshots."""

    def __init__(self, status_dir: str, stop_deadline: float | None, deadline: float) -> None:
        self.status_dir, self.stop_deadline, self.deadline = status_dir, stop_deadline, deadline
        self._persister: Any = None
        self._thread = threading.Thread(target=self._start, name="rtj-handoff-start", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        from .checkpoint.handoff import HandoffPersister

        self._persister = HandoffPersister(self.status_dir, self.stop_deadline, self.deadline).start()

    def finish(self) -> list[Any]:
        """Once the ranks are gone: what became of each handed-off snapshot by the deadline
        (`handoff.Persisted`); each rank's status file says what was committed, for the last heartbeat."""
        try:  # no rank left a record (the entrypoint removed older ones at its start): nothing to wait for
            if not any(n.startswith(HANDOFF_FILE_PREFIX) for n in os.listdir(self.status_dir)):
                return []
        except OSError:
            return []
        self._thread.join(max(0.0, self.deadline - time.time()))
        if self._persister is None:
            return []
        self._persister.ranks_gone()
        results = self._persister.wait()
        for r in results:
            if r.committed:
                record_persisted(self.status_dir, r.handoff.local_rank, r.step, r.seconds)
            outcome = "committed" if r.committed else f"not committed ({r.error or 'not every rank in time'})"
            log.info(
                "graceful stop: rank %d's snapshot of step %s persisted by the pod in %.2f s: %s",
                r.handoff.rank, r.step, r.seconds, outcome,
            )  # fmt: skip
        return results


class _LauncherRuns:
    """ft_launcher in this pod, started again in place while the job's rendezvous comes back after
    it was lost; the pod's peer replica server, rank fork server and stop signals around it."""

    def __init__(
        self,
        cfg: TrainerConfig,
        pod: PodIdentity,
        status_dir: str,
        agent: HeartbeatAgent,
        graceful_stop_seconds: float,
    ) -> None:
        self.cfg, self.pod, self.status_dir, self.agent = cfg, pod, status_dir, agent
        self.graceful_stop_seconds = graceful_stop_seconds
        self.progress_file = os.path.join(status_dir, PROGRESS_FILE_NAME)
        slot = parse_worker_pod_name(pod.name)
        if not cfg.standby:  # a hot spare starts it once it learns its slot
            start_peer_replica(cfg, pod.namespace, slot[0] if slot else None, status_dir)
        self.slot_copier = start_slot_copier(cfg)
        self.env = {
            **os.environ,
            **rank_env_vars(cfg, status_dir=status_dir, progress_file=self.progress_file),
        }
        # Ranks forked from a pre-warmed interpreter; it imports while ft_launcher starts.
        self.forkserver_path = os.path.join(tempfile.gettempdir(), f"rtj-ranks-{os.getpid()}.sock")
        self.forkserver = (
            start_rank_forkserver(self.forkserver_path, [*cfg.command, *cfg.args], self.env)
            if rank_forkserver_enabled()
            else None
        )
        if cfg.standby:
            self.env[ENV_PREWARM_MODULE] = prewarm_module(cfg.command) or ""
        self.terminate = threading.Event()
        self.pod_persist: _PodPersist | None = None  # from the pod's graceful stop on
        grace = os.environ.get(ENV_TERMINATION_GRACE_SECONDS)
        self.termination_grace = float(grace) if grace else None
        self.proc: subprocess.Popen[bytes] | None = None  # the launcher running now
        self.ended = datetime.now(UTC)  # when the last launcher ended
        self.exit_watch = ExitWatch(
            float(os.environ.get(ENV_LAUNCHER_EXIT_TIMEOUT, DEFAULT_LAUNCHER_EXIT_TIMEOUT))
        )

    def _start_peer_replica(self, slot: int | None) -> None:
        start_peer_replica(self.cfg, self.pod.namespace, slot, self.status_dir)

    def argv(self, standby: bool) -> list[str]:
        return build_launcher_argv(
            self.cfg,
            launcher=launcher_command(standby),
            local_addr=self.pod.pod_ip,
            progress_file=self.progress_file,
            term_timeout_seconds=launcher_term_timeout(self.graceful_stop_seconds),
            rank_forkserver=self.forkserver_path if self.forkserver else None,
        )

    def _on_signal(self, signum: int, _frame: object) -> None:
        if not self.terminate.is_set():
            log.info("received %s: stopping training gracefully", signal.Signals(signum).name)
            self.terminate.set()
            # The ranks save before they exit (rtj_trainer.graceful), by this deadline.
            now = time.time()
            deadline = ranks_deadline(now, self.graceful_stop_seconds)
            marked: float | None = deadline
            try:
                write_graceful_stop(self.status_dir, deadline)
            except OSError:
                marked = None
                with contextlib.suppress(OSError):  # a graceful stop all the same, without a deadline
                    Path(self.status_dir, GRACEFUL_STOP_FILE).touch()
            # The ranks hand their snapshots' persist to this process: ready to take them.
            until = handoff_deadline(now, self.graceful_stop_seconds, self.termination_grace)
            self.pod_persist = _PodPersist(self.status_dir, marked, until)
            if self.proc is not None:
                signal_launcher(self.proc, signal.SIGTERM)

    def run(self) -> LauncherEnd:
        cfg = self.cfg
        argv = self.argv(cfg.standby)
        what = "standby: pre-warming" if cfg.standby else "starting"
        log.info("%s ft_launcher (NVRx %s): %s", what, nvrx_version(), " ".join(argv))
        become_subreaper()
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        relaunches, budget = 0, max_relaunches()
        oom_before = oom_kills()
        while True:
            rc, permanent, lost = self._run_once(argv, first=relaunches == 0)
            if (
                rc == 0
                or self.terminate.is_set()
                or self.agent.fenced.is_set()
                or permanent is not None
                or not lost
            ):
                break
            if not self._rendezvous_back(relaunches, budget):
                break
            relaunches += 1
            argv = self.argv(False)  # a promoted spare relaunches as the worker it has become
        # The ranks are gone: the copier stops (unmapping the whole memory tier takes it about a
        # second) beside the pod's persist, which reads the snapshots without it.
        closing: threading.Thread | None = None
        if self.slot_copier is not None:
            closing = threading.Thread(target=self.slot_copier.close, name="rtj-slot-copier-close")
            closing.start()
        if self.pod_persist is not None:
            self.pod_persist.finish()
        if closing is not None:
            closing.join()
        if self.forkserver is not None:
            stop_process(self.forkserver, grace_s=5)  # SIGTERM first: it removes its socket (in /tmp)
        if self.exit_watch.fired:
            rc = 0  # the training itself completed on every rank
        return LauncherEnd(
            rc=rc,
            terminated=self.terminate.is_set(),
            permanent=permanent,
            in_job_restarts=self.agent.aggregator.in_job_restarts,
            progress=_read_progress(self.progress_file),
            last_fault=self.agent.current_fault(),
            oom_kills=kills_since(oom_before),
        )

    def _run_once(self, argv: list[str], *, first: bool) -> tuple[int, Fault | None, bool]:
        """(its exit status, a rank's permanent error, whether it lost the rendezvous) of one launcher."""
        cfg = self.cfg
        lost_store = LostStoreWatch()
        self.proc = proc = subprocess.Popen(
            argv,
            env=self.env,
            start_new_session=True,
            stdin=subprocess.PIPE if cfg.standby and first else None,
            # The launcher's and every rank's stderr, minus the store-poll noise (see log_filter).
            stderr=subprocess.PIPE,
        )
        assert proc.stderr is not None
        log_filter = NoiseFilter(proc.stderr, sys.stderr.buffer, observe=lost_store).start()
        if cfg.standby and first:
            await_promotion(self.agent, proc, self.terminate, on_promoted=self._start_peer_replica)
        rc, permanent = supervise(
            proc, self.agent, self.exit_watch, self.terminate, self.status_dir, self.graceful_stop_seconds
        )
        self.ended = datetime.now(UTC)
        # Workers the launcher left behind (e.g. it was SIGKILLed) must not outlive it.
        kill_group(proc, keep=self.forkserver.pid if self.forkserver else None)
        log_filter.join(timeout=5)
        return rc, permanent, lost_store.lost

    def _rendezvous_back(self, relaunches: int, budget: int) -> bool:
        """After a lost rendezvous: whether to start the launcher again (the store is back, within
        the pod's relaunch budget), recorded as a Soft fault the operator counts as an in-job restart."""
        if relaunches >= budget:
            log.warning("rendezvous lost again: %d relaunches in this pod already, giving up", relaunches)
            return False
        log.warning("rendezvous lost (the job's store went away): waiting for it to come back")
        if not wait_for_rendezvous(self.cfg.rdzv_endpoint, self.terminate):
            log.warning("the rendezvous did not come back within %.0f s", RENDEZVOUS_WAIT_SECONDS)
            return False
        # Soft: the pod is healthy. The operator times its recovery from the launcher's end.
        self.agent.record_fault(
            Fault(
                severity=FaultSeverity.SOFT,
                reason=FaultReason.RENDEZVOUS_LOST,
                message=f"ft_launcher lost the job's rendezvous; started again in this pod ({relaunches + 1}/"
                f"{budget})",
                time=self.ended,
            )
        )
        log.warning("rendezvous lost: starting ft_launcher again in this pod (%d/%d)", relaunches + 1, budget)
        return True


def _read_progress(progress_file: str) -> str:
    try:
        return Path(progress_file).read_text().strip() or "none"
    except OSError:
        return "none"


def rendezvous(host: str, port: int | None) -> int:
    try:
        cfg = load_config()
    except ConfigError as exc:
        print(f"rtj-trainer: {exc}", file=sys.stderr, flush=True)
        return ExitCode.CONFIG_ERROR
    if port is None:
        port = cfg.rdzv_port

    stop = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    return serve_rendezvous(cfg, host=host, port=port, stop=stop)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rtj-trainer", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_launch = sub.add_parser("launch", help="run ft_launcher for this worker pod")
    p_launch.add_argument(
        "--graceful-stop-seconds",
        type=float,
        default=float(os.environ.get(ENV_GRACEFUL_STOP_SECONDS, DEFAULT_GRACEFUL_STOP_SECONDS)),
        help="seconds between SIGTERM and SIGKILL of the launcher on a graceful stop",
    )
    p_rdzv = sub.add_parser("rendezvous", help="host the job's rendezvous store")
    p_rdzv.add_argument("--host", default="0.0.0.0", help="address to listen on")
    p_rdzv.add_argument("--port", type=int, default=None, help="port (default: the port of rdzvEndpoint)")
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    if args.cmd == "launch":
        return launch(args.graceful_stop_seconds)
    return rendezvous(args.host, args.port)


if __name__ == "__main__":
    sys.exit(main())
