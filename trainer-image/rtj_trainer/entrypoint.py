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
(replace the pod); 78 invalid config; 143 stopped by SIGTERM after a graceful stop.
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import psutil
from pydantic import ValidationError
from rtj.contract import (
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
    Heartbeat,
    PodState,
    RankReport,
    TrainerConfig,
    parse_worker_pod_name,
    replica_endpoints,
)

from .checkpoint_format import write_file_atomic
from .heartbeat import HeartbeatAgent, PodIdentity, load_api_client, read_rank_files
from .log_filter import NoiseFilter
from .peer_replica import ReplicaServer
from .pids import stop_process
from .rank_forkserver import enabled as rank_forkserver_enabled
from .rank_forkserver import rank_command
from .rank_forkserver import start_server as start_rank_forkserver
from .rendezvous_host import serve_rendezvous
from .rendezvous_loss import WAIT_SECONDS as RENDEZVOUS_WAIT_SECONDS
from .rendezvous_loss import LostStoreWatch, max_relaunches, wait_for_rendezvous
from .runtime_env import GRACEFUL_STOP_FILE, memory_tier_root, rank_env_vars
from .warm_launcher import ENV_PREWARM_MODULE, GO, prewarm_module

log = logging.getLogger("rtj_trainer")

#: Seconds between SIGTERM and SIGKILL for the launcher's process group on a graceful stop,
#: when the pod does not set ENV_TERMINATION_GRACE_SECONDS.
DEFAULT_GRACE_SECONDS = 30.0
#: Seconds ft_launcher waits between SIGTERM and SIGKILL when it stops ranks to restart them.
WORKERS_STOP_TIMEOUT_SECONDS = 10
GPU_MEMORY_POLL_SECONDS = 0.1
PROGRESS_FILE_NAME = "checkpoint-iteration"
#: Seconds ft_launcher may linger after every rank finished before it is killed. Its exit barrier
#: waits up to 300 s for the other pods' workers, so the default stays above that.
ENV_LAUNCHER_EXIT_TIMEOUT = "RTJ_LAUNCHER_EXIT_TIMEOUT_SECONDS"
DEFAULT_LAUNCHER_EXIT_TIMEOUT = 360.0


class ExitWatch:
    """Notices a launcher that does not exit although all of its ranks finished.

    A launcher waiting on its rank-monitor subprocesses (seen under heavy CPU load) would otherwise
    keep a finished pod from ever completing.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.fired = False
        self._since: float | None = None

    def launcher_stuck(self, hb: Heartbeat | None, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        if hb is None or hb.state != PodState.FINISHED:
            self._since = None
            return False
        self._since = self._since if self._since is not None else now
        if not self.fired and now - self._since >= self.timeout:
            self.fired = True
            return True
        return False


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
        "--monitor-interval=0.5",
        # Hang detection: a rank silent past these is killed and the workers restarted.
        f"--ft-initial-rank-heartbeat-timeout={cfg.rank_initial_timeout_seconds:g}",
        f"--ft-rank-heartbeat-timeout={cfg.rank_heartbeat_timeout_seconds:g}",
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


def map_exit_code(launcher_rc: int, *, terminated: bool, do_not_restart: Sequence[int]) -> int:
    """The pod's exit code from how the launcher ended (pure; unit-tested)."""
    if launcher_rc == 0 and not terminated:
        return ExitCode.SUCCEEDED
    if terminated:
        return ExitCode.TERMINATED
    if launcher_rc == ExitCode.DO_NOT_RESTART or launcher_rc in do_not_restart:
        return ExitCode.DO_NOT_RESTART
    return ExitCode.LAUNCHER_BUDGET_EXHAUSTED


def reported_permanent_fault(reports: Iterable[RankReport]) -> Fault | None:
    """A Permanent fault some rank reported in its rank file, else None (pure; unit-tested)."""
    return next(
        (r.fault for r in reports if r.fault is not None and r.fault.severity is FaultSeverity.PERMANENT),
        None,
    )


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


def _prepare_status_dir(pod: PodIdentity) -> str:
    status_dir = os.environ.get(ENV_STATUS_DIR) or os.path.join(
        tempfile.gettempdir(), f"rtj-status-{pod.name}"
    )
    os.makedirs(status_dir, exist_ok=True)
    for name in os.listdir(status_dir):  # stale files of an earlier run in the same pod
        if name.startswith(RANK_FILE_PREFIX) or name in (PROGRESS_FILE_NAME, GRACEFUL_STOP_FILE):
            Path(status_dir, name).unlink(missing_ok=True)
    return status_dir


def launch(grace_seconds: float) -> int:
    try:
        cfg = load_config()
    except ConfigError as exc:
        print(f"rtj-trainer: {exc}", file=sys.stderr, flush=True)
        return ExitCode.CONFIG_ERROR
    pod = replace(pod_identity(), job_name=cfg.job_name)
    status_dir = _prepare_status_dir(pod)
    progress_file = os.path.join(status_dir, PROGRESS_FILE_NAME)

    api_client = load_api_client()
    if cfg.standby and api_client is None:
        print("rtj-trainer: a standby pod needs the Kubernetes API (its Lease carries the promotion)",
              file=sys.stderr, flush=True)  # fmt: skip
        return ExitCode.CONFIG_ERROR
    agent = HeartbeatAgent(
        status_dir,
        pod,
        cfg.heartbeat_interval_seconds,
        api_client,
        standby=cfg.standby,
        hang_after_seconds=cfg.rank_heartbeat_timeout_seconds,
    )
    agent.start()
    slot = parse_worker_pod_name(pod.name)
    if not cfg.standby:  # a hot spare starts it once it learns its slot
        start_peer_replica(cfg, pod.namespace, slot[0] if slot else None, status_dir)

    env = {**os.environ, **rank_env_vars(cfg, status_dir=status_dir, progress_file=progress_file)}
    # Ranks forked from a pre-warmed interpreter; it imports while ft_launcher starts.
    forkserver_path = os.path.join(tempfile.gettempdir(), f"rtj-ranks-{os.getpid()}.sock")
    forkserver = (
        start_rank_forkserver(forkserver_path, [*cfg.command, *cfg.args], env)
        if rank_forkserver_enabled()
        else None
    )

    def argv_for(standby: bool) -> list[str]:
        return build_launcher_argv(
            cfg,
            launcher=launcher_command(standby),
            local_addr=pod.pod_ip,
            progress_file=progress_file,
            term_timeout_seconds=max(1.0, grace_seconds - 5),
            rank_forkserver=forkserver_path if forkserver else None,
        )

    argv = argv_for(cfg.standby)
    if cfg.standby:
        env[ENV_PREWARM_MODULE] = prewarm_module(cfg.command) or ""
    log.info(
        "%s ft_launcher (NVRx %s): %s",
        "standby: pre-warming" if cfg.standby else "starting",
        nvrx_version(),
        " ".join(argv),
    )
    _become_subreaper()
    terminate = threading.Event()
    proc: subprocess.Popen[bytes] | None = None  # the launcher running now (a relaunch replaces it)

    def _on_signal(signum: int, _frame: object) -> None:
        if not terminate.is_set():
            log.info("received %s: stopping training gracefully", signal.Signals(signum).name)
            terminate.set()
            with contextlib.suppress(OSError):  # the ranks save before they exit (rtj_trainer.graceful)
                Path(status_dir, GRACEFUL_STOP_FILE).touch()
            if proc is not None:
                _signal_launcher(proc, signal.SIGTERM)

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    exit_watch = ExitWatch(float(os.environ.get(ENV_LAUNCHER_EXIT_TIMEOUT, DEFAULT_LAUNCHER_EXIT_TIMEOUT)))
    relaunches, relaunch_budget = 0, max_relaunches()
    while True:
        lost_store = LostStoreWatch()
        proc = subprocess.Popen(
            argv,
            env=env,
            start_new_session=True,
            stdin=subprocess.PIPE if cfg.standby and relaunches == 0 else None,
            # The launcher's and every rank's stderr, minus the store-poll noise (see log_filter).
            stderr=subprocess.PIPE,
        )
        assert proc.stderr is not None
        log_filter = NoiseFilter(proc.stderr, sys.stderr.buffer, observe=lost_store).start()
        if cfg.standby and relaunches == 0:
            _await_promotion(
                agent,
                proc,
                terminate,
                on_promoted=lambda s: start_peer_replica(cfg, pod.namespace, s, status_dir),
            )
        rc, permanent = _supervise(proc, agent, exit_watch, terminate, status_dir, grace_seconds)
        ended = datetime.now(UTC)
        # Workers the launcher left behind (e.g. it was SIGKILLed) must not outlive it.
        _kill_group(proc, keep=forkserver.pid if forkserver else None)
        log_filter.join(timeout=5)
        if rc == 0 or terminate.is_set() or permanent is not None or not lost_store.lost:
            break
        if relaunches >= relaunch_budget:
            log.warning("rendezvous lost again: %d relaunches in this pod already, giving up", relaunches)
            break
        log.warning("rendezvous lost (the job's store went away): waiting for it to come back")
        if not wait_for_rendezvous(cfg.rdzv_endpoint, terminate):
            log.warning("the rendezvous did not come back within %.0f s", RENDEZVOUS_WAIT_SECONDS)
            break
        relaunches += 1
        # Soft: the pod is healthy. The operator counts the relaunched workers as an in-job restart
        # and times its recovery from here.
        agent.record_fault(
            Fault(
                severity=FaultSeverity.SOFT,
                reason=FaultReason.RENDEZVOUS_LOST,
                message=f"ft_launcher lost the job's rendezvous; started again in this pod ({relaunches}/"
                f"{relaunch_budget})",
                time=ended,
            )
        )
        log.warning(
            "rendezvous lost: starting ft_launcher again in this pod (%d/%d)", relaunches, relaunch_budget
        )
        argv = argv_for(False)  # a promoted spare relaunches as the worker it has become
    if forkserver is not None:
        stop_process(forkserver, grace_s=5)  # SIGTERM first: it removes its socket (in /tmp) as it exits
    if exit_watch.fired:
        rc = 0  # the training itself completed on every rank

    code = map_exit_code(rc, terminated=terminate.is_set(), do_not_restart=cfg.do_not_restart_exit_codes)
    fault = None
    now = datetime.now(UTC)
    if permanent is not None and not terminate.is_set():
        code, fault = ExitCode.DO_NOT_RESTART, permanent
    elif code == ExitCode.LAUNCHER_BUDGET_EXHAUSTED:
        fault = Fault(
            severity=FaultSeverity.HARD,
            reason=FaultReason.LAUNCHER_BUDGET_EXHAUSTED,
            message=f"ft_launcher exited with {rc} after {agent.aggregator.in_job_restarts} in-job restarts",
            time=now,
        )
    elif code == ExitCode.DO_NOT_RESTART:
        # Not a pod fault: a new pod would not make progress either. The exit code (93) is what
        # fails the job; a Hard fault here would make the operator replace the pod first.
        fault = Fault(
            severity=FaultSeverity.SOFT,
            reason=FaultReason.NO_PROGRESS,
            message=(
                f"ft_launcher exited with {rc}: NVRx saw no progress past checkpoint iteration "
                f"{_read_progress(progress_file)} in {cfg.max_no_progress_cycles} restart cycles"
                if rc == ExitCode.DO_NOT_RESTART
                else f"ft_launcher exited with {rc}, one of the job's doNotRestartExitCodes"
            ),
            time=now,
        )
    final = agent.stop(PodState.FINISHED if code == ExitCode.SUCCEEDED else None, fault)
    log.info(
        "ft_launcher exited with %s; pod exit code %s; last heartbeat %s", rc, code, final.to_annotation()
    )
    return code


def _supervise(
    proc: subprocess.Popen[bytes],
    agent: HeartbeatAgent,
    exit_watch: ExitWatch,
    terminate: threading.Event,
    status_dir: str,
    grace_seconds: float,
) -> tuple[int, Fault | None]:
    """Wait for the launcher to exit; kill it on an overdue graceful stop, a rank's permanent error
    (returned) or a launcher that lingers after every rank finished."""
    kill_deadline: float | None = None
    permanent: Fault | None = None
    while True:
        try:
            return proc.wait(timeout=0.5), permanent
        except subprocess.TimeoutExpired:
            pass
        if terminate.is_set():
            kill_deadline = kill_deadline or time.monotonic() + grace_seconds
            if time.monotonic() >= kill_deadline:
                log.warning("graceful stop took longer than %.0f s: killing the launcher", grace_seconds)
                _kill_group(proc)
        if permanent is None and not terminate.is_set():
            # Read each poll, not at the heartbeat interval: ft_launcher restarts the workers within
            # a second or two, and every restart would meet the same error.
            permanent = reported_permanent_fault(read_rank_files(status_dir))
            if permanent is not None:
                log.error(
                    "a rank reported a permanent error (%s: %s): stopping ft_launcher, no restart can fix it",
                    permanent.reason,
                    permanent.message,
                )
                _kill_group(proc)
        if exit_watch.launcher_stuck(agent.last):
            log.warning(
                "every rank finished %.0f s ago but ft_launcher has not exited: killing it",
                exit_watch.timeout,
            )
            _kill_group(proc)


def _read_progress(progress_file: str) -> str:
    try:
        return Path(progress_file).read_text().strip() or "none"
    except OSError:
        return "none"


def _await_promotion(
    agent: HeartbeatAgent,
    proc: subprocess.Popen[bytes],
    terminate: threading.Event,
    on_promoted: Callable[[int | None], object] | None = None,
) -> None:
    """Block until the operator assigns a slot, then (`on_promoted(slot)` first) let the warm
    launcher go. A stop (or the warm launcher's death) first: it ends without launching, and the
    caller's loop sees it exit."""
    assert proc.stdin is not None
    waited = time.monotonic()
    while not agent.promoted.wait(0.1):
        if terminate.is_set() or proc.poll() is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
            return
    if on_promoted is not None:
        slot = agent.assigned_slot
        on_promoted(int(slot) if slot is not None and slot.isdigit() else None)
    with contextlib.suppress(OSError):  # BrokenPipe: it died just now; the caller's loop sees that
        proc.stdin.write(f"{GO}\n".encode())
        proc.stdin.close()
    log.info(
        "standby: node slot %s assigned after %.1f s: ft_launcher joins the rendezvous",
        agent.assigned_slot,
        time.monotonic() - waited,
    )


def _signal_launcher(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)


def _kill_group(proc: subprocess.Popen[bytes], keep: int | None = None) -> None:
    """SIGKILL the launcher and everything below it, and every other descendant but `keep` (the
    rank fork server, which serves the next launcher; the ranks it forked are killed).

    ft_launcher starts each rank in its own session, so the launcher's process group is not
    enough; as a child subreaper this process also inherits ranks orphaned by a dead launcher.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        children = psutil.Process(os.getpid()).children(recursive=True)
    except psutil.Error:
        return
    children = [c for c in children if c.pid != keep]
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(children, timeout=5)


def _become_subreaper() -> None:
    """Orphaned ranks are re-parented to this process instead of init (Linux only)."""
    with contextlib.suppress(Exception):
        import ctypes

        PR_SET_CHILD_SUBREAPER = 36
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


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
        "--grace-seconds",
        type=float,
        default=float(os.environ.get(ENV_TERMINATION_GRACE_SECONDS, DEFAULT_GRACE_SECONDS)),
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
        return launch(args.grace_seconds)
    return rendezvous(args.host, args.port)


if __name__ == "__main__":
    sys.exit(main())
