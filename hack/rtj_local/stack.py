"""The rest of the local stack on top of a LocalCluster and a NodeAgent (for `make demo` and e2e):

- `install_chart()`: `helm install` of charts/resilient-training-operator with the operator Deployment
  scaled to 0 (the CRD, RBAC, trainer ServiceAccount and Services come from the chart);
- `OperatorProcess`: the operator as a local process, started exactly as the chart's Deployment
  would start it (its args and env), but authenticated as the chart's operator ServiceAccount through
  a TokenRequest token in a kubeconfig, so it has the chart's RBAC and nothing more.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from rtj_local.cluster import LocalCluster
from rtj_local.procs import log_tail
from rtj_local.rawapi import RawApi
from rtj_local.versions import REPO_ROOT, bin_path
from rtj_local.wait import wait_for

CHART = REPO_ROOT / "charts" / "resilient-training-operator"
RELEASE = "rtj"
OPERATOR_NAMESPACE = "rtj-system"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def install_chart(
    cluster: LocalCluster,
    trainer_namespaces: list[str],
    namespace: str = OPERATOR_NAMESPACE,
    release: str = RELEASE,
    timeout: float = 120,
) -> None:
    """`helm upgrade --install` with operator.replicas=0 and the trainer ServiceAccount in
    `trainer_namespaces` (which must exist)."""
    cmd = [
        str(bin_path("helm")), "upgrade", "--install", release, str(CHART),
        f"--kubeconfig={cluster.kubeconfig}", f"--namespace={namespace}", "--create-namespace",
        "--set", "operator.replicas=0",
        "--set-json", f"trainer.namespaces={json.dumps(trainer_namespaces)}",
        "--wait", f"--timeout={int(timeout)}s",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30)
    if proc.returncode != 0:
        raise RuntimeError(f"helm install failed ({proc.returncode}): {proc.stderr.strip()}")


def _resolve_env(env: list[dict[str, Any]], namespace: str, pod_name: str) -> dict[str, str]:
    out: dict[str, str] = {}
    fields = {"metadata.namespace": namespace, "metadata.name": pod_name}
    for var in env:
        if "value" in var:
            out[var["name"]] = str(var["value"])
        elif path := (var.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath"):
            out[var["name"]] = fields[path]
    return out


class OperatorProcess:
    """The operator, run locally as the chart's Deployment would run it, with the chart's RBAC."""

    POD_NAME = "local-operator"

    def __init__(
        self,
        cluster: LocalCluster,
        run_dir: Path,
        namespace: str = OPERATOR_NAMESPACE,
        release: str = RELEASE,
    ) -> None:
        self.cluster = cluster
        self.run_dir = Path(run_dir)
        self.namespace = namespace
        self.release = release
        self.log_path = self.run_dir / "operator.log"
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def _deployment(self, raw: RawApi) -> dict[str, Any]:
        items = raw.request(
            "GET",
            f"/apis/apps/v1/namespaces/{self.namespace}/deployments",
            labelSelector=f"app.kubernetes.io/instance={self.release}",
        )["items"]
        if len(items) != 1:
            raise RuntimeError(
                f"expected one operator Deployment of release {self.release}, found {len(items)}"
            )
        return items[0]

    def start(self, raw: RawApi) -> OperatorProcess:
        deployment = self._deployment(raw)
        pod_spec = deployment["spec"]["template"]["spec"]
        container = pod_spec["containers"][0]
        service_account = pod_spec["serviceAccountName"]
        kubeconfig = self.cluster.service_account_kubeconfig(
            self.namespace, service_account, self.run_dir / "operator.kubeconfig"
        )
        env = _resolve_env(container.get("env") or [], self.namespace, self.POD_NAME)
        if "RTJ_METRICS_PORT" in env:
            env["RTJ_METRICS_PORT"] = str(self.metrics_port)
        health = f"http://127.0.0.1:{free_port()}/healthz"
        args = [
            f"--liveness={health}" if a.startswith("--liveness=") else a for a in container.get("args") or []
        ]
        args = [a for a in args if not a.startswith("--log-format")] + ["--log-format=plain"]
        self.run_dir.mkdir(parents=True, exist_ok=True)
        venv_bin = REPO_ROOT / ".venv" / "bin"
        full_env = {
            "PATH": f"{venv_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(self.run_dir),
            "KUBECONFIG": str(kubeconfig),
            "PYTHONUNBUFFERED": "1",
            # A worktree sharing another checkout's editable venv points PYTHONPATH at its own code.
            **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
            **env,
        }
        with self.log_path.open("ab") as log:
            # The image's entrypoint is `kopf run`; the Deployment passes only args.
            self.proc = subprocess.Popen(
                [str(venv_bin / "kopf"), "run", *args], env=full_env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.run_dir,
            )  # fmt: skip
        self._health = health
        wait_for(self._healthy, timeout=60, interval=0.3, message=lambda: f"operator health\n{self.tail()}")
        return self

    def _healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"operator exited ({self.proc and self.proc.returncode}):\n{self.tail()}")
        try:
            with urllib.request.urlopen(self._health, timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False

    def tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def stop(self, grace: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
