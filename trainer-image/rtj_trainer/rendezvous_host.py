"""`rtj-trainer rendezvous`: the job's rendezvous pod hosts NVRx's own store host, `nvrx-control`.

NVRx's barrier rendezvous needs a store host that closes rounds (a bare TCPStore server does not).
With `nvrx-control` in its own pod and `--rdzv-conf=is_host=false` on every training launcher, the
loss of any training pod (rank 0 included) leaves the rendezvous intact.
"""

from __future__ import annotations

import errno
import logging
import runpy
import socket
import subprocess
import sys
import threading
import time

from rtj.contract import TrainerConfig

from . import nvrx_patches
from .nvrx_patches import CONTROL_PLANE_MODULE
from .pids import stop_process

log = logging.getLogger(__name__)

#: How long the rendezvous host waits for a port that is still taken (a predecessor pod in its
#: grace period, on a node where pods share the host network).
BIND_RETRY_SECONDS = 90.0


def port_is_free(host: str, port: int) -> bool:
    """Whether a listening socket could bind `host:port` now (SO_REUSEADDR, as servers bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def wait_for_free_port(
    host: str, port: int, stop: threading.Event, timeout: float = BIND_RETRY_SECONDS
) -> bool:
    """Wait until `host:port` can be bound; False if `stop` is set or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while not port_is_free(host, port):
        if stop.is_set() or time.monotonic() > deadline:
            return False
        log.warning("rendezvous port %d is not free yet; waiting", port)
        stop.wait(1.0)
    return not stop.is_set()


#: The store host's longest poll between rounds (NVRx: 1 s; it alone polls, against its own store).
HOST_POLL_SECONDS = 0.1


def control_plane_command(cfg: TrainerConfig, *, host: str, port: int) -> list[str]:
    """The `nvrx-control` command line for the job (pure; unit-tested): NVRx's control plane, run by
    `run_control_plane` in this module."""
    return [
        sys.executable,
        "-m",
        "rtj_trainer.rendezvous_host",
        f"--nnodes={cfg.nnodes}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={host}:{port}",
        f"--rdzv-id={cfg.rdzv_id}",
        # No log funnel: pod logs go to the container runtime.
        "--ft-enable-log-server=false",
    ]


def run_control_plane(argv: list[str]) -> None:
    """NVRx's `nvrx-control` in this interpreter, its store host polling for a new round every
    HOST_POLL_SECONDS (`nvrx_patches.apply_store_host_poll`: NVRx's host waits between rounds in 1 s
    sleeps, so each in-job restart waited up to a second more for its round to be closed)."""
    nvrx_patches.apply_store_host_poll(HOST_POLL_SECONDS)
    sys.argv = [sys.argv[0], *argv]
    runpy.run_module(CONTROL_PLANE_MODULE, run_name="__main__", alter_sys=True)


def serve_rendezvous(cfg: TrainerConfig, *, host: str, port: int, stop: threading.Event) -> int:
    """Host the job's rendezvous until `stop` is set; returns the process exit code."""
    if not wait_for_free_port(host, port, stop):
        if stop.is_set():
            return 0
        log.error("rendezvous port %d stayed taken for %.0f s", port, BIND_RETRY_SECONDS)
        return 1
    cmd = control_plane_command(cfg, host=host, port=port)
    log.info("starting %s", " ".join(cmd))
    proc = subprocess.Popen(cmd)
    while proc.poll() is None:
        if stop.wait(0.5):
            stop_process(proc, grace_s=30)
            return 0
    log.error("nvrx-control exited with %s", proc.returncode)
    return proc.returncode or 1


if __name__ == "__main__":
    run_control_plane(sys.argv[1:])
