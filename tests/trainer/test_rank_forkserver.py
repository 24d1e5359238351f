"""rtj_trainer.rank_forkserver with real processes: a server that pre-imported torch forks each
rank a client asks for; the client stands in for it (exit status, signals), and a client that dies
takes its rank with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from rtj_local.wait import wait_for
from rtj_trainer.rank_exit import read_exit
from rtj_trainer.rank_forkserver import ENV_SERVER_PID, MODULE, rank_command

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]

# The rank: reports what it was given, then does what RANK_ACTION says.
TARGET = textwrap.dedent(
    """
    import gc, json, os, signal, subprocess, sys, time
    out = os.environ["REPORT"]
    info = {
        "name": __name__, "argv": sys.argv, "cwd": os.getcwd(), "pid": os.getpid(),
        "marker": os.environ.get("MARKER"), "torch_preloaded": "torch" in sys.modules,
        "sid": os.getsid(0), "gc_walked": len(gc.get_objects()), "gc_frozen": gc.get_freeze_count(),
    }
    action = os.environ.get("RANK_ACTION", "exit:0")
    if action == "grandchild":  # a process of the rank's own, as async checkpoint workers are
        info["grandchild"] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid
    def on_term(signum, frame):
        print("rank got SIGTERM", flush=True)
        sys.exit(7)
    signal.signal(signal.SIGTERM, on_term)
    with open(out + ".tmp", "w") as f:
        json.dump(info, f)
    os.replace(out + ".tmp", out)
    print("hello from the rank", flush=True)
    print("and its stderr", file=sys.stderr, flush=True)
    if action.startswith("exit:"):
        sys.exit(int(action[5:]))
    if action == "raise":
        raise ValueError("boom")
    if action == "selfkill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)  # "wait" and "grandchild": until signalled
    """
)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("target")
    (d / "rank_target.py").write_text(TARGET)
    return d


def _env(target: Path, **extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(target), str(ROOT / "trainer-image"), str(ROOT / "operator")])
    return {**os.environ, "PYTHONPATH": path, **extra}


@pytest.fixture(scope="module")
def server(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    sock = str(tmp_path_factory.mktemp("sock") / "ranks.sock")
    command = [sys.executable, "-m", "rank_target"]
    proc = subprocess.Popen([sys.executable, "-m", MODULE, "serve", sock, "--", *command], env=_env(target))
    try:
        wait_for(lambda: os.path.exists(sock) or proc.poll() is not None, 120, message="server ready")
        assert proc.poll() is None, f"server exited with {proc.returncode}"
        yield sock, proc.pid
    finally:
        proc.kill()
        proc.wait()


def start_rank(
    server: tuple[str, int], target: Path, tmp_path: Path, action: str, module: bool = True, **env: str
) -> tuple[subprocess.Popen[str], Path]:
    sock, pid = server
    report = tmp_path / "report.json"
    command = (
        [sys.executable, "-m", "rank_target", "--flag", "x"]
        if module
        else [sys.executable, str(target / "rank_target.py"), "--flag", "x"]
    )
    client = subprocess.Popen(
        rank_command(sock, command),
        env=_env(
            target, REPORT=str(report), RANK_ACTION=action, MARKER="m-42", **{ENV_SERVER_PID: str(pid)}, **env
        ),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # as ft_launcher starts its ranks
    )
    return client, report


def read_report(report: Path, client: subprocess.Popen[str]) -> dict:
    wait_for(lambda: report.exists() or client.poll() is not None, 60, message="rank report")
    return json.loads(report.read_text())


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has exited
    except (FileNotFoundError, ProcessLookupError):  # reaped before or between open and read
        return True


@pytest.mark.parametrize("module", [True, False], ids=["python-m", "script"])
def test_the_rank_runs_with_the_clients_argv_env_cwd_and_stdio_in_a_prewarmed_fork(
    server: tuple[str, int], target: Path, tmp_path: Path, module: bool
) -> None:
    client, report = start_rank(server, target, tmp_path, "exit:3", module=module)
    out, err = client.communicate(timeout=60)
    assert client.returncode == 3
    info = read_report(report, client)
    assert info["name"] == "__main__"
    assert info["argv"][1:] == ["--flag", "x"]
    assert info["cwd"] == str(tmp_path)
    assert info["marker"] == "m-42"
    assert info["torch_preloaded"], "the rank should start with torch already imported"
    # ...and frozen out of the collector's walks (NVRx collects after every in-process abort).
    assert info["gc_frozen"] > 10 * info["gc_walked"], info
    assert info["pid"] != client.pid and info["sid"] == info["pid"]  # forked, in its own session
    assert "hello from the rank" in out and "and its stderr" in err
    assert "RuntimeWarning" not in err


def test_an_exception_exits_1_with_its_traceback(
    server: tuple[str, int], target: Path, tmp_path: Path
) -> None:
    client, _ = start_rank(server, target, tmp_path, "raise")
    _, err = client.communicate(timeout=60)
    assert client.returncode == 1
    assert "ValueError: boom" in err


def test_sigterm_to_the_client_reaches_the_rank(
    server: tuple[str, int], target: Path, tmp_path: Path
) -> None:
    client, report = start_rank(server, target, tmp_path, "wait")
    read_report(report, client)
    client.send_signal(signal.SIGTERM)
    out, _ = client.communicate(timeout=60)
    assert "rank got SIGTERM" in out
    assert client.returncode == 7


def test_a_rank_killed_by_a_signal_kills_its_client_with_it(
    server: tuple[str, int], target: Path, tmp_path: Path
) -> None:
    client, _ = start_rank(server, target, tmp_path, "selfkill")
    client.communicate(timeout=60)
    assert client.returncode == -signal.SIGKILL


@pytest.mark.parametrize(
    ("action", "how"), [("selfkill", "killed by SIGKILL"), ("exit:3", "exited with code 3")]
)
def test_how_a_rank_ended_is_recorded_for_the_heartbeat_agent(
    server: tuple[str, int], target: Path, tmp_path: Path, action: str, how: str
) -> None:
    status_dir = tmp_path / "status"
    status_dir.mkdir()
    client, report = start_rank(
        server, target, tmp_path, action, RTJ_STATUS_DIR=str(status_dir), LOCAL_RANK="1"
    )
    client.communicate(timeout=60)
    pid = read_report(report, client)["pid"]
    ended = read_exit(str(status_dir), 1, pid)  # the client returns only after the record
    assert ended is not None and ended.describe() == how
    assert read_exit(str(status_dir), 1, pid + 1) is None, "another pid's end is not this one's"


def test_a_client_sigkilled_takes_its_rank_and_the_ranks_processes_with_it(
    server: tuple[str, int], target: Path, tmp_path: Path
) -> None:
    client, report = start_rank(server, target, tmp_path, "grandchild")
    info = read_report(report, client)
    assert not gone(info["pid"]) and not gone(info["grandchild"])
    client.kill()
    client.communicate(timeout=60)
    wait_for(lambda: gone(info["pid"]) and gone(info["grandchild"]), 30, message="rank killed")


def test_without_a_server_the_client_runs_the_command_itself(target: Path, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    client = subprocess.run(
        rank_command(str(tmp_path / "no-such.sock"), [sys.executable, "-m", "rank_target", "--flag", "x"]),
        env=_env(target, REPORT=str(report), RANK_ACTION="exit:5"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert client.returncode == 5, client.stderr
    info = json.loads(report.read_text())
    assert not info["torch_preloaded"]  # a plain interpreter
    assert info["argv"][1:] == ["--flag", "x"]


def test_the_server_ends_with_its_parent(target: Path, tmp_path: Path) -> None:
    sock = tmp_path / "ranks.sock"
    # A parent that starts the server in the background, prints its pid and dies while the server
    # imports.
    parent = subprocess.run(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, "
            "stderr=subprocess.DEVNULL); print(p.pid, flush=True); time.sleep(1)",
            *[sys.executable, "-m", MODULE, "serve", str(sock), "--", sys.executable, "-m", "rank_target"],
        ],
        env=_env(target),
        capture_output=True,
        text=True,
        timeout=60,
    )
    server_pid = int(parent.stdout.split()[0])
    try:
        wait_for(lambda: gone(server_pid), 120, message="server gone after its parent")
    finally:
        if not gone(server_pid):
            os.kill(server_pid, signal.SIGKILL)
    assert not sock.exists()  # removed by the server before it exited
