"""Ranks started from a pre-warmed interpreter: an in-job restart skips `import torch`.

    python -m rtj_trainer.rank_forkserver serve SOCKET -- python -m pkg.train ...   # one per pod
    python -m rtj_trainer.rank_forkserver run SOCKET -- python -m pkg.train ...     # what ft_launcher starts

ft_launcher starts every rank as a new process, so each in-job restart pays the interpreter start
and the imports of torch, NVRx and the training module again (7.2 s of a 33.5 s restart on
2xH200, issue 14). The pod's entrypoint starts one `serve` process that imports all of that once
(never initialising CUDA) and then waits on a Unix socket. Each rank ft_launcher starts is a small
`run` client (stdlib only): it hands its argv, environment, working directory and stdin/stdout/
stderr to the server, which forks a child that becomes the rank (`runpy`, as `python -m` or
`python script.py` would run it) in its own session, and the client stands in for it:

- the child's pid is the rank's pid (NVRx's rank monitor signals it directly); its parent is the
  server, so it finds its launcher's pid in RTJ_RANK_LAUNCHER_PID; tools that look for ranks by
  their environment (/proc/PID/environ) find the clients, and a client SIGKILLed is its rank killed;
- signals sent to the client (ft_launcher's SIGTERM on a restart or a stop) are forwarded;
- the client exits as the child did (its code, or the same signal);
- a client that dies (SIGKILLed by ft_launcher after its stop timeout) closes its connection,
  and the server kills the child's whole process group, as ft_launcher would have;
- with no server (not started, died, or its socket missing) the client runs the command itself
  (`exec`): the rank only starts as slowly as before;
- how each rank ended (its exit code or signal) is recorded before the rank is reaped, so the
  heartbeat agent, which sees the pid gone, can say why (`rank_exit`).

Hand-written: the stdlib's multiprocessing forkserver serves only its own parent's Process objects.
"""

from __future__ import annotations

import array
import contextlib
import gc
import io
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .pids import pid_alive

if TYPE_CHECKING:
    import selectors

MODULE = "rtj_trainer.rank_forkserver"
ENV_SERVER_PID = "RTJ_RANK_FORKSERVER_PID"
#: Set in a forked rank: the pid of the launcher that started its client (its parent is the server).
ENV_LAUNCHER_PID = "RTJ_RANK_LAUNCHER_PID"
#: "0" turns the server off: every rank starts as a plain process (the baseline of the benchmark).
ENV_ENABLED = "RTJ_RANK_FORKSERVER"
#: What every rank imports, some of it lazily on its first FSDP2 build (torch._dynamo pulls in triton:
#: 0.7 s of a 0.75 s first build on CPU): imported once here instead of once per rank start.
PREWARM_MODULES = (
    "torch.distributed",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    "torch.distributed.checkpoint",
    "torch._dynamo",
    "nvidia_resiliency_ext.inprocess",
    "nvidia_resiliency_ext.fault_tolerance.rank_monitor_client",
)
#: How long a client waits for a live server still importing (the pod's first start).
READY_WAIT_S = 120.0
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_STATUS = struct.Struct("!ii")  # (pid, 0) once forked; then (wait status, 1)


def runnable(command: Sequence[str]) -> tuple[str, str] | None:
    """("module", name) for `python -m name ...`, ("path", file) for `python file.py ...`; None for
    anything else, which the client runs itself (pure; unit-tested)."""
    if len(command) < 2 or not os.path.basename(command[0]).startswith("python"):
        return None
    if command[1] == "-m" and len(command) >= 3:
        return ("module", command[2])
    if command[1].endswith(".py"):
        return ("path", command[1])
    return None


def _runnable_or_fail(command: Sequence[str]) -> tuple[str, str]:
    """`runnable(command)` for a command the server was given (the client sends only runnable ones)."""
    found = runnable(command)
    if found is None:
        raise ValueError(f"not a Python module or file command: {command!r}")
    return found


# --- the client: what ft_launcher starts as a rank --------------------------------------------------
def _connect(path: str) -> socket.socket | None:
    """The server's socket, waiting while a live server is still importing; None without one."""
    server_pid = int(os.environ.get(ENV_SERVER_PID) or 0)
    deadline = time.monotonic() + READY_WAIT_S
    while True:
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            return sock
        except OSError:
            sock.close()
        if not server_pid or time.monotonic() > deadline or not pid_alive(server_pid):
            return None
        time.sleep(0.05)


def _recv_status(sock: socket.socket) -> tuple[int, int] | None:
    buf = b""
    while len(buf) < _STATUS.size:
        try:
            chunk = sock.recv(_STATUS.size - len(buf))
        except InterruptedError:
            continue
        if not chunk:
            return None
        buf += chunk
    return _STATUS.unpack(buf)


def run_client(path: str, command: list[str]) -> int:
    sock = _connect(path) if runnable(command) else None
    if sock is None:
        os.execvp(command[0], command)  # no server: run the rank as before
    env = {**os.environ, ENV_LAUNCHER_PID: str(os.getppid())}
    request = json.dumps({"argv": command, "env": env, "cwd": os.getcwd()}).encode()
    child, pending = 0, []  # a signal that comes before the fork is forwarded right after it

    def forward(signum: int, _frame: object) -> None:
        if not child:
            pending.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    fds = array.array("i", [0, 1, 2])
    sock.sendmsg([struct.pack("!I", len(request)), request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
    forked = _recv_status(sock)
    if forked is None:  # the server refused or died before forking: run the rank as before
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        os.execvp(command[0], command)
    child = forked[0]
    for signum in pending:
        forward(signum, None)
    done = _recv_status(sock)
    if done is None:  # the server died: the child was in its care; it is gone or orphaned
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child, signal.SIGKILL)
        return 1
    status = done[0]
    if os.WIFSIGNALED(status):  # die of the same signal (SIGKILL cannot be reset, nor caught)
        ended_by = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):
            signal.signal(ended_by, signal.SIG_DFL)
        os.kill(os.getpid(), ended_by)
    return os.waitstatus_to_exitcode(status)


# --- the server ----------------------------------------------------------------------------------------
def top_level_imports(source: str, package: str | None = None) -> list[str]:
    """The modules a file imports at its top level (pure; unit-tested). Only these are imported
    ahead: executing the training module itself could start training inside the server."""
    import ast
    import importlib.util

    names: list[str] = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module != "__future__":
            if node.level == 0:
                names.append(node.module)
            elif package:
                with contextlib.suppress(ImportError, ValueError):
                    names.append(importlib.util.resolve_name("." * node.level + node.module, package))
    return names


def _prewarm(command: list[str]) -> list[str]:
    """Import torch, NVRx's rank-side modules and what the command's file imports; returns the
    modules that could not be imported (they are imported again in the rank, and fail there)."""
    import importlib.util

    import torch

    kind, target = _runnable_or_fail(command)
    failed: list[str] = []
    for name in PREWARM_MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # e.g. a torch without one of them: the rank imports what it has
            failed.append(f"{name} ({exc!r})")
    try:
        if kind == "module":
            spec = importlib.util.find_spec(target)
            origin, package = (spec.origin, target.rpartition(".")[0] or None) if spec else (None, None)
        else:
            origin, package = target, None
        with open(origin or "", encoding="utf-8") as f:
            names = top_level_imports(f.read(), package)
    except (OSError, SyntaxError, ImportError, ValueError) as exc:
        names = []
        failed.append(f"{target} ({exc!r})")
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:
            failed.append(f"{name} ({exc!r})")
    if torch.cuda.is_initialized():
        raise RuntimeError("CUDA was initialised by an import: forked ranks could not use it")
    return failed


def _become_rank(request: dict, fds: list[int]) -> None:
    """In the forked child: take the client's stdio, environment and command, and run it."""
    os.setsid()
    for std_fd, fd in enumerate(fds):
        os.dup2(fd, std_fd)
        os.close(fd)
    for sig in (*FORWARDED, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):  # always, but for a replaced stream
            stream.reconfigure(line_buffering=True, write_through=unbuffered)
    import torch

    if os.environ.get("OMP_NUM_THREADS", "").isdigit():  # read at import in a fresh process
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    import runpy
    import traceback

    from .nvrx_patches import run_interpreter_exit

    argv = request["argv"]
    kind, target = _runnable_or_fail(argv)
    # sys.path as the client's interpreter would have it: its PYTHONPATH, and its cwd for `-m`.
    for entry in reversed(os.environ.get("PYTHONPATH", "").split(os.pathsep)):
        if entry and entry not in sys.path:
            sys.path.insert(1, entry)
    code = 0
    try:
        if kind == "module":
            sys.path[0] = os.getcwd()
            sys.argv = [target, *argv[3:]]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv[1:]
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    # What the interpreter does at exit, in its order: join threads, atexit, flush.
    run_interpreter_exit()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]] | None:
    fds = array.array("i")
    msg, anc, _flags, _addr = conn.recvmsg(4, socket.CMSG_LEN(3 * fds.itemsize))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    if len(msg) < 4 or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return None
    (size,) = struct.unpack("!I", msg)
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            return None
        body += chunk
    return json.loads(body), list(fds)


def serve(path: str, command: list[str]) -> int:
    parent = os.getppid()  # the pod's entrypoint: when it dies, so does its server
    failed = _prewarm(command)
    # The imports' objects, frozen once here: the ranks forked from this server inherit them out of
    # the collector's walks (and the collector's writes do not copy their pages), CPython's advice
    # for servers that fork.
    gc.collect()
    gc.freeze()
    if failed:
        print(f"rank_forkserver: not pre-imported: {', '.join(failed)}", file=sys.stderr, flush=True)
    with_threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    listener = _listen(path)
    print(f"rank_forkserver: ready at {path} ({with_threads} threads)", file=sys.stderr, flush=True)
    loop = _Loop(listener)
    try:
        while os.getppid() == parent:
            for key, _ in loop.sel.select(timeout=1.0):
                loop.handle(key)
        return 0
    finally:
        for pid in loop.children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _listen(path: str) -> socket.socket:
    """The server's socket, at `path` only once it listens (clients wait for the path to appear)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{path}.{os.getpid()}"
    listener.bind(tmp)
    os.chmod(tmp, 0o600)
    listener.listen(64)
    os.replace(tmp, path)  # appears only once the imports are done
    return listener


class _Loop:
    """The server's event loop: new clients on the listener, children exiting (SIGCHLD, through a
    wakeup pipe), and clients that died (their connection closed)."""

    def __init__(self, listener: socket.socket) -> None:
        import selectors

        from .rank_exit import exit_path, record_exit

        self.listener, self.exit_path, self.record_exit = listener, exit_path, record_exit
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "child")
        # child pid -> its client's connection and where its exit is recorded
        self.children: dict[int, tuple[socket.socket, str | None]] = {}

    def handle(self, key: selectors.SelectorKey) -> None:
        if key.data == "accept":
            self.accept()
        elif key.data == "child":
            os.read(self.wake_r, 4096)
            _reap(self.children, self.sel, self.record_exit)
        else:  # a client's connection: readable only when it closed (the client died)
            pid = key.data
            self.sel.unregister(key.fileobj)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)

    def accept(self) -> None:
        """Fork a child for a client's request; the client learns its pid, and later its status."""
        import selectors

        conn, _ = self.listener.accept()
        got = _recv_request(conn)
        if got is None:
            conn.close()
            return
        request, fds = got
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self.close_in_child(conn)
            _become_rank(request, fds)
        for fd in fds:
            os.close(fd)
        conn.sendall(_STATUS.pack(pid, 0))
        self.children[pid] = (conn, self.exit_path(request["env"]))
        self.sel.register(conn, selectors.EVENT_READ, pid)

    def close_in_child(self, conn: socket.socket) -> None:
        """In a forked child: close everything of the server's, so the rank holds none of it."""
        self.sel.close()
        self.listener.close()
        for c, _ in self.children.values():
            c.close()
        signal.set_wakeup_fd(-1)
        os.close(self.wake_r)
        os.close(self.wake_w)
        conn.close()


def _reap(
    children: dict[int, tuple[socket.socket, str | None]],
    sel: selectors.BaseSelector,
    record_exit: Callable[[str | None, os.waitid_result], None],
) -> None:
    while children:
        try:
            # Look before reaping: the exit is recorded while the pid still exists (a zombie), so
            # whoever sees the pid gone finds the record.
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None:
            return
        child = children.pop(info.si_pid, None)
        if child is not None:
            record_exit(child[1], info)
        _, status = os.waitpid(info.si_pid, 0)
        if child is None:
            continue
        conn = child[0]
        with contextlib.suppress(KeyError, ValueError):  # already unregistered: the client had gone
            sel.unregister(conn)
        with contextlib.suppress(OSError):
            conn.sendall(_STATUS.pack(status, 1))
        conn.close()


# --- wiring, for the pod's entrypoint ------------------------------------------------------------------
def enabled(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    return environ.get(ENV_ENABLED, "1") != "0"


def rank_command(path: str, command: list[str]) -> list[str]:
    """What ft_launcher runs per rank: the client for a Python command, else the command itself."""
    if runnable(command) is None:
        return command
    return [sys.executable, "-m", MODULE, "run", path, "--", *command]


def start_server(path: str, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes] | None:
    """Start the pod's server (it pre-warms while ft_launcher starts); None when it cannot run
    `command` (the ranks then start as plain processes). Its pid goes into `env` for the clients."""
    if runnable(command) is None:
        return None
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    proc = subprocess.Popen(
        [sys.executable, "-m", MODULE, "serve", path, "--", *command], env=env, start_new_session=True
    )
    env[ENV_SERVER_PID] = str(proc.pid)
    return proc


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] not in ("serve", "run") or argv[2] != "--":
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    role, path, command = argv[0], argv[1], argv[3:]
    return serve(path, command) if role == "serve" else run_client(path, command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
