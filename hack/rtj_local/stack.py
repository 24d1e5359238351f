"""The rest of the local stack on top of a LocalCluster and its nodes (for `make demo` and e2e):

- `install_chart()`: `helm install` of charts/resilient-training-operator, with the operator Deployment
  scaled to 0 on the node agent's nodes (the CRD, RBAC, trainer ServiceAccount and Services come from
  the chart), or as users run it on kubelet nodes (KUBELET_VALUES: the operator pod, `OperatorPod`);
- `OperatorProcess`: the operator as a local process. `from_chart` starts it exactly as the chart's
  Deployment would (its args and env), but authenticated as the chart's operator ServiceAccount
  through a TokenRequest token in a kubeconfig, so it has the chart's RBAC and nothing more;
  `for_namespace` runs `python -m rtj` on one namespace with the admin kubeconfig (the tests).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rtj_local.cluster import LocalCluster
from rtj_local.procs import free_port, log_tail
from rtj_local.rawapi import RawApi
from rtj_local.versions import REPO_ROOT, bin_path
from rtj_local.wait import wait_for

CHART = REPO_ROOT / "charts" / "resilient-training-operator"
#: The operator pod from the local image on kubelet nodes (rtj_local.kubelet_nodes).
KUBELET_VALUES = CHART / "ci" / "kubelet-values.yaml"
RELEASE = "rtj"
OPERATOR_NAMESPACE = "rtj-system"


def install_chart(
    cluster: LocalCluster,
    trainer_namespaces: list[str],
    namespace: str = OPERATOR_NAMESPACE,
    release: str = RELEASE,
    timeout: float = 120,
    values: Sequence[Path] = (),
) -> None:
    """`helm upgrade --install` with the trainer ServiceAccount in `trainer_namespaces` (which must
    exist). Without `values`, operator.replicas=0 (the operator runs as an OperatorProcess) and no
    uninstall hook; with values files (e.g. KUBELET_VALUES on kubelet nodes), as they say: the operator
    runs as its pod, and `helm uninstall` runs the uninstall hook."""
    cmd = [
        str(bin_path("helm")), "upgrade", "--install", release, str(CHART),
        f"--kubeconfig={cluster.kubeconfig}", f"--namespace={namespace}", "--create-namespace",
        "--set-json", f"trainer.namespaces={json.dumps(trainer_namespaces)}",
        "--wait", f"--timeout={int(timeout)}s",
    ]  # fmt: skip
    for path in values:
        cmd += ["-f", str(path)]
    if not values:
        # No pod of the chart runs: the operator is a process, and the uninstall hook's Job (which needs
        # the GPU toleration on these nodes) is off; tests/e2e/test_helm_uninstall_hook.py turns it on.
        cmd += ["--set", "operator.replicas=0", "--set", "uninstallCleanup.enabled=false"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30)
    if proc.returncode != 0:
        raise RuntimeError(f"helm install failed ({proc.returncode}): {proc.stderr.strip()}")


class OperatorPod:
    """The operator as users run it: the chart's Deployment, its pod on a kubelet node."""

    def __init__(self, cluster: LocalCluster, namespace: str = OPERATOR_NAMESPACE, release: str = RELEASE):
        self.cluster, self.namespace, self.release = cluster, namespace, release

    def log_tail(self, lines: int = 60) -> str:
        """The last lines of its pod's log (through the API server and the kubelet)."""
        proc = self.cluster.kubectl(
            "logs", f"--namespace={self.namespace}", f"--tail={lines}", "--all-containers",
            f"--selector=app.kubernetes.io/instance={self.release}", check=False,
        )  # fmt: skip
        return proc.stdout + proc.stderr


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
    """The operator as a local process in its own session, its output appended to `log_path`.

    Two ways to make one: `for_namespace` (`python -m rtj` watching one namespace, admin kubeconfig,
    test-friendly intervals: the integration and reliability tiers) and `from_chart` (the chart's
    Deployment args and env, authenticated as the chart's ServiceAccount: e2e, demo, benchmarks).
    """

    def __init__(
        self, argv: list[str], env: dict[str, str], log_path: Path, health_port: int, metrics_port: int | None
    ) -> None:
        self.argv, self.env, self.log_path = argv, env, Path(log_path)
        self.health_port, self.metrics_port = health_port, metrics_port
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @classmethod
    def for_namespace(
        cls, kubeconfig: Path, namespace: str, log_path: Path, also: Sequence[str] = (), **env: str
    ) -> OperatorProcess:
        """`python -m rtj --namespace=<namespace>`, and each namespace of `also` (RTJ_* settings from
        `env` override the defaults)."""
        health, metrics = free_port(), free_port()
        argv = [sys.executable, "-m", "rtj", *(f"--namespace={ns}" for ns in (namespace, *also)),
                f"--liveness=http://127.0.0.1:{health}/healthz", "--log-format=plain"]  # fmt: skip
        settings = {
            "KUBECONFIG": str(kubeconfig),
            "RTJ_METRICS_PORT": str(metrics),
            "RTJ_RECONCILE_INTERVAL_SECONDS": "0.5",
            "RTJ_FAULT_GRACE_SECONDS": "0",
            "RTJ_TERMINATION_GRACE_SECONDS": "5",
            **env,
        }
        return cls(argv, {**os.environ, **settings}, log_path, health, metrics)

    @classmethod
    def from_chart(
        cls,
        cluster: LocalCluster,
        raw: RawApi,
        run_dir: Path,
        namespace: str = OPERATOR_NAMESPACE,
        release: str = RELEASE,
    ) -> OperatorProcess:
        """`kopf run` (the image's entrypoint) with the args and env of the release's Deployment."""
        items = raw.request(
            "GET",
            f"/apis/apps/v1/namespaces/{namespace}/deployments",
            labelSelector=f"app.kubernetes.io/instance={release}",
        )["items"]
        if len(items) != 1:
            raise RuntimeError(f"expected one operator Deployment of release {release}, found {len(items)}")
        pod_spec = items[0]["spec"]["template"]["spec"]
        container = pod_spec["containers"][0]
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        kubeconfig = cluster.service_account_kubeconfig(
            namespace, pod_spec["serviceAccountName"], run_dir / "operator.kubeconfig"
        )
        env = _resolve_env(container.get("env") or [], namespace, "local-operator")
        metrics = None
        if "RTJ_METRICS_PORT" in env:
            metrics = free_port()
            env["RTJ_METRICS_PORT"] = str(metrics)
        health = free_port()
        args = [
            f"--liveness=http://127.0.0.1:{health}/healthz" if a.startswith("--liveness=") else a
            for a in container.get("args") or []
        ]
        args = [a for a in args if not a.startswith("--log-format")] + ["--log-format=plain"]
        venv_bin = REPO_ROOT / ".venv" / "bin"
        full_env = {
            "PATH": f"{venv_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(run_dir),
            "KUBECONFIG": str(kubeconfig),
            "PYTHONUNBUFFERED": "1",
            # A worktree sharing another checkout's editable venv points PYTHONPATH at its own code.
            **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
            **env,
        }
        # The image's entrypoint is `kopf run`; the Deployment passes args, and its command when it runs
        # `python -m rtj` (the leader election first): both from the venv, as the image's PATH has them.
        command = container.get("command") or ["kopf", "run"]
        argv = [str(venv_bin / command[0]), *command[1:], *args]
        return cls(argv, full_env, run_dir / "operator.log", health, metrics)

    def start(self, tick: Callable[[], None] | None = None) -> OperatorProcess:
        """Start and wait for liveness; `tick` runs on every poll (e.g. the trainers' heartbeats,
        which keep going while the operator restarts)."""
        self.starts += 1
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n===== operator start #{self.starts}: {' '.join(self.argv)} =====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.log_path.parent,
            )  # fmt: skip

        def healthy() -> bool:
            if tick is not None:
                tick()
            return self._healthy()

        wait_for(healthy, timeout=60, interval=0.2, message=lambda: f"operator liveness\n{self.log_tail()}")
        return self

    def _healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"operator exited ({self.proc and self.proc.returncode}):\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False

    def metrics(self) -> str:
        if self.metrics_port is None:
            raise RuntimeError("this operator serves no metrics (RTJ_METRICS_PORT not set)")
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines)

    def stop(self, kill: bool = False, grace: float = 30.0) -> None:
        """SIGTERM to its process group (a clean shutdown), SIGKILL after `grace`; or SIGKILL at once
        (`kill`: a crash)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
