"""A real, local Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and KWOK (fake nodes), each a background process of ours.

    python -m rtj_local.cluster up [--nodes N] [--fresh]   # start (or reuse a healthy one)
    python -m rtj_local.cluster status | env | down
    python -m rtj_local.cluster stop|start|logs COMPONENT   # e.g. stop kube-apiserver (outage tests)

Everything lives under the run dir (default <repo>/.run/cluster, or $RTJ_RUN_DIR): kubeconfig (admin,
system:masters), env (shell exports), logs/<component>.log, pids/<component>.pid, pki/, etcd/.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from rtj_local import nodes as nodes_mod
from rtj_local.components import (
    ADMIN_USER,
    COMPONENTS,
    ClusterOptions,
    argv,
    component_kubeconfig,
    probe,
    real_node_token_users,
)
from rtj_local.kubeconfig import build_kubeconfig, write_kubeconfig
from rtj_local.pki import make_pki
from rtj_local.procs import free_port, log_tail, read_pidfile, spawn, stop, write_pidfile
from rtj_local.rawapi import RawApi
from rtj_local.versions import BUILD_SCRIPT, REPO_ROOT, bin_path, missing_binaries, versions
from rtj_local.wait import WaitTimeout, wait_for


class ClusterError(RuntimeError):
    """A component failed to start or become healthy; the message carries its log tail."""


def default_run_dir() -> Path:
    return Path(os.environ.get("RTJ_RUN_DIR", REPO_ROOT / ".run" / "cluster"))


class LocalCluster:
    """Handle on the cluster in `run_dir`. Cheap to construct; `up()` starts it, `down()` stops it.
    Any process can operate on a cluster another process started (state is on disk)."""

    def __init__(self, run_dir: Path | None = None, options: ClusterOptions | None = None) -> None:
        self.run_dir = (run_dir or default_run_dir()).resolve()
        self.options = options or ClusterOptions()
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._real_nodes = False

    # ---- paths and state -------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (token of a system:masters user)."""
        return self.run_dir / "kubeconfig"

    @property
    def env_file(self) -> Path:
        return self.run_dir / "env"

    @property
    def pki(self) -> Path:
        return self.run_dir / "pki"

    @property
    def ca_file(self) -> Path:
        return self.pki / "ca.crt"

    def log_file(self, component: str) -> Path:
        return self.run_dir / "logs" / f"{component}.log"

    def _pidfile(self, component: str) -> Path:
        return self.run_dir / "pids" / f"{component}.pid"

    def _state(self) -> dict:
        try:
            return json.loads((self.run_dir / "state.json").read_text())
        except FileNotFoundError:
            raise ClusterError(f"no cluster state in {self.run_dir}: run `up` first") from None

    @property
    def ports(self) -> dict[str, int]:
        return self._state()["ports"]

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"

    @property
    def admin_token(self) -> str:
        return self._state()["tokens"][ADMIN_USER]

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """Serialises up/down between processes (e.g. two pytest sessions)."""
        self.run_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir.parent / f".{self.run_dir.name}.lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    # ---- lifecycle --------------------------------------------------------------------------------
    def up(self, nodes: int = 4, fresh: bool = False, real_nodes: bool = False) -> LocalCluster:
        """Starts the cluster with `nodes` fake p5 nodes, or reuses a healthy one (unless `fresh`).
        `real_nodes`: the API server is reachable from pods (rtj_local.kubelet_nodes); a healthy cluster
        started without it is restarted. A cluster started this way is never stopped by test sessions."""
        with self._lock():
            reusable = self.is_healthy() and (not real_nodes or self._state().get("real_nodes", False))
            if fresh or not reusable:
                self._up_locked(nodes, owner="cli", real_nodes=real_nodes)
        return self

    def _up_locked(self, nodes: int, owner: str, real_nodes: bool = False) -> None:
        self._down_locked()
        self._ensure_binaries()
        self._real_nodes = real_nodes
        t0 = time.monotonic()
        timings: dict[str, float] = {}

        def mark(step: str) -> None:
            timings[step] = round(time.monotonic() - t0, 1)

        try:
            self._prepare_run_dir()
            for component in COMPONENTS:
                self._spawn(component)
                if component in ("etcd", "kube-apiserver"):  # the rest start in parallel
                    self._wait_healthy(component)
                    mark(component)
            # Nodes are created right away; KWOK marks them Ready once it is up.
            node_names = self._create_nodes(nodes_mod.p5_nodes(nodes))
            for component in COMPONENTS[2:]:
                self._wait_healthy(component)
                mark(component)
            self._wait_default_service_account()
            mark("default-service-account")
            self._wait_nodes_ready(node_names, timeout=60)
            mark("nodes-ready")
        except BaseException:
            self._down_locked()
            raise
        self._write_env_file()
        state = self._state()
        state["started_seconds"] = timings
        state["owner"] = owner
        (self.run_dir / "state.json").write_text(json.dumps(state, indent=2))

    def acquire(self, nodes: int = 4, real_nodes: bool = False) -> bool:
        """For test sessions: reuses a healthy cluster or starts one, and registers this process as a
        user. Returns True if this call started it. Pair with `release()`. `real_nodes` as in `up`."""
        with self._lock():
            started = False
            if self._users():
                # In use by another session, which may be in the middle of an outage drill: wait for
                # it to heal rather than wipe it.
                wait_for(
                    self.is_healthy, self.options.start_timeout, 1.0, f"shared cluster in {self.run_dir}"
                )
                if real_nodes and not self._state().get("real_nodes", False):
                    raise ClusterError(
                        f"the cluster in {self.run_dir} is in use by another session and was started "
                        "without real_nodes: run this session in another RTJ_RUN_DIR"
                    )
            elif not self.is_healthy() or (real_nodes and not self._state().get("real_nodes", False)):
                self._up_locked(nodes, owner="session", real_nodes=real_nodes)
                started = True
            write_pidfile(self.run_dir / "users" / str(os.getpid()), os.getpid())
        return started

    def release(self) -> None:
        """Unregisters this process; the last user stops a cluster that a session started (one started
        with `up`, e.g. `make cluster-up`, keeps running)."""
        with self._lock():
            (self.run_dir / "users" / str(os.getpid())).unlink(missing_ok=True)
            if not self._users() and self._state().get("owner") == "session":
                self._down_locked()

    def _users(self) -> list[int]:
        """Live processes registered by `acquire` (other than this one)."""
        users = self.run_dir / "users"
        pids = [read_pidfile(u) for u in users.glob("*")] if users.exists() else []
        return [p for p in pids if p is not None and p != os.getpid()]

    def down(self) -> None:
        """Stops every component (SIGTERM, then SIGKILL) and leaves the run dir (logs) in place."""
        with self._lock():
            self._down_locked()

    def _down_locked(self) -> None:
        for component in reversed(COMPONENTS):
            stop(self._pidfile(component), children=self._children)

    def stop_component(self, component: str, grace: float = 10.0) -> None:
        """Stops one component, e.g. "kube-apiserver" or "etcd" for outage tests; state is kept.
        SIGTERM, then SIGKILL after `grace` seconds; `grace=0` is a crash."""
        self._check_component(component)
        stop(self._pidfile(component), grace=grace, children=self._children)

    def start_component(self, component: str, wait: bool = True) -> None:
        """(Re)starts one component with the same ports, certificates and data; waits until healthy."""
        self._check_component(component)
        if self.running(component):
            return
        self._spawn(component)
        if wait:
            self._wait_healthy(component)

    def running(self, component: str) -> bool:
        return read_pidfile(self._pidfile(component)) is not None

    def healthy(self, component: str) -> bool:
        return self.running(component) and self._probe(component)

    def status(self) -> dict[str, bool]:
        """Component -> healthy."""
        if not (self.run_dir / "state.json").exists():
            return dict.fromkeys(COMPONENTS, False)
        return {c: self.healthy(c) for c in COMPONENTS}

    def is_healthy(self) -> bool:
        return all(self.status().values())

    def logs(self, component: str, lines: int = 50) -> str:
        return log_tail(self.log_file(component), lines)

    @staticmethod
    def _check_component(component: str) -> None:
        if component not in COMPONENTS:
            raise ValueError(f"unknown component {component!r}; one of {', '.join(COMPONENTS)}")

    def _ensure_binaries(self) -> None:
        if missing_binaries():
            subprocess.run(["bash", str(BUILD_SCRIPT)], check=True)
            if missing := missing_binaries():
                raise ClusterError(f"{BUILD_SCRIPT} did not produce: {', '.join(missing)}")

    def _prepare_run_dir(self) -> None:
        # A fresh start: empty etcd, new tokens and logs. Keys and certificates are kept (they take
        # seconds to make on a busy machine and nothing depends on them being new).
        if self.run_dir.exists():
            for child in self.run_dir.iterdir():
                if child.name != "pki":
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
        for sub in ("logs", "pids", "kubeconfigs"):
            (self.run_dir / sub).mkdir(parents=True)
        (self.run_dir / "etcd").mkdir(mode=0o700)
        make_pki(self.pki)
        ports: dict[str, int] = {}
        for name in (*COMPONENTS, "etcd-peer"):
            while (port := free_port()) in ports.values():
                pass
            ports[name] = port
        tokens = {
            ADMIN_USER: secrets.token_hex(16),
            "system:kube-controller-manager": secrets.token_hex(16),
            "system:kube-scheduler": secrets.token_hex(16),
            "kwok": secrets.token_hex(16),
        }
        tokens.update({user: secrets.token_hex(16) for user in real_node_token_users()})
        # token,user,uid,"groups". KWOK acts for many nodes (status, leases, pods): system:masters.
        groups = {ADMIN_USER: "system:masters", "kwok": "system:masters", **real_node_token_users()}
        (self.pki / "tokens.csv").write_text(
            "".join(f'{tok},{user},{user},"{groups.get(user, "")}"\n' for user, tok in tokens.items())
        )
        (self.pki / "tokens.csv").chmod(0o600)
        state = {"ports": ports, "tokens": tokens, "versions": versions(), "real_nodes": self._real_nodes}
        (self.run_dir / "state.json").write_text(json.dumps(state, indent=2))
        write_kubeconfig(self.kubeconfig, self._kubeconfig_dict(tokens[ADMIN_USER], ADMIN_USER))
        for user in ("system:kube-controller-manager", "system:kube-scheduler", "kwok"):
            write_kubeconfig(
                component_kubeconfig(self.run_dir, user), self._kubeconfig_dict(tokens[user], user)
            )

    def _kubeconfig_dict(self, token: str, user: str, namespace: str | None = None) -> dict:
        return build_kubeconfig(self.server, self.ca_file.read_bytes(), token, user, namespace)

    # ---- processes --------------------------------------------------------------------------------
    def _spawn(self, component: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env["HOME"] = str(self.run_dir)  # kwok reads ~/.kwok; keep components off the user's home
        real_nodes = self._state().get("real_nodes", False)
        proc = spawn(
            argv(component, self.run_dir, self.ports, self.options, real_nodes=real_nodes),
            self.log_file(component),
            self._pidfile(component),
            env=env,
        )
        self._children[proc.pid] = proc

    def _probe(self, component: str) -> bool:
        return probe(component, self.ports[component], self.ca_file, self.admin_token)

    def _wait_healthy(self, component: str) -> None:
        def check() -> bool:
            if not self.running(component):
                raise ClusterError(self._failure(component, "exited"))
            return self._probe(component)

        try:
            wait_for(check, self.options.start_timeout, 0.2, f"{component} to become healthy")
        except WaitTimeout:
            raise ClusterError(self._failure(component, "did not become healthy")) from None

    def _failure(self, component: str, what: str) -> str:
        log = self.log_file(component)
        return f"{component} {what}; last lines of {log}:\n{log_tail(log, 40)}"

    def raw(self) -> RawApi:
        """Plain-JSON requests as admin (see rtj_local.rawapi)."""
        return RawApi.for_kubeconfig(self.kubeconfig)

    def _wait_default_service_account(self) -> None:
        # Pods cannot be created in a namespace before its "default" ServiceAccount exists: a cheap
        # end-to-end check that the controller-manager works.
        raw = self.raw()
        wait_for(
            lambda: raw.get("/api/v1/namespaces/default/serviceaccounts/default"),
            60,
            0.2,
            "ServiceAccount default/default (created by kube-controller-manager)",
        )

    def _create_nodes(self, node_objects: Sequence[dict]) -> list[str]:
        raw = self.raw()
        for node in node_objects:
            raw.create("/api/v1/nodes", node)
        return [n["metadata"]["name"] for n in node_objects]

    def _wait_nodes_ready(self, names: Sequence[str], timeout: float) -> None:
        raw = self.raw()

        def not_ready() -> list[str]:
            out = []
            for name in names:
                node = raw.get(f"/api/v1/nodes/{name}") or {}
                conditions = node.get("status", {}).get("conditions", [])
                if not any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                    out.append(name)
            return out

        wait_for(lambda: not not_ready(), timeout, 0.2, lambda: f"nodes to be Ready: {not_ready()}")

    # ---- client helpers ---------------------------------------------------------------------------
    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Runs the cached kubectl against this cluster as admin."""
        proc = subprocess.run(
            [str(bin_path("kubectl")), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def apply(self, objects: Sequence[dict]) -> None:
        items = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
        self.kubectl("apply", "-f", "-", input=json.dumps(items))

    def create_nodes(self, node_objects: Sequence[dict], ready_timeout: float = 60) -> list[str]:
        """Creates nodes (e.g. `nodes.p5_nodes(n)`; existing ones are left as they are) and waits until
        the KWOK-managed ones are Ready. Returns all their names."""
        names = self._create_nodes(node_objects)
        kwok = [
            n["metadata"]["name"]
            for n in node_objects
            if n["metadata"].get("annotations", {}).get(nodes_mod.KWOK_ANNOTATION_KEY)
            == nodes_mod.KWOK_ANNOTATION_VALUE
            and n["metadata"].get("labels", {}).get(nodes_mod.KWOK_HEARTBEAT_LABEL) == "true"
        ]
        self._wait_nodes_ready(kwok, ready_timeout)
        return names

    def stop_node_heartbeat(self, node: str) -> None:
        """KWOK stops renewing `node`'s Lease and status: after --node-monitor-grace-period (20s) the
        node lifecycle controller marks it Ready=Unknown and taints it unreachable. Its pods stay as
        they are (a deleted pod stays Terminating), as on a machine that died."""
        self.kubectl("label", "node", node, f"{nodes_mod.KWOK_HEARTBEAT_LABEL}-")

    def resume_node_heartbeat(self, node: str) -> None:
        """KWOK manages `node` again: Ready within seconds, its Lease renewed."""
        self.kubectl("label", "--overwrite", "node", node, f"{nodes_mod.KWOK_HEARTBEAT_LABEL}=true")

    def token_kubeconfig(
        self, token: str, path: Path, user: str = "user", namespace: str | None = None
    ) -> Path:
        """Writes a kubeconfig for this cluster authenticating with `token`."""
        return write_kubeconfig(path, self._kubeconfig_dict(token, user, namespace))

    def service_account_kubeconfig(
        self, namespace: str, service_account: str, path: Path | None = None, duration: str = "24h"
    ) -> Path:
        """Kubeconfig acting as a ServiceAccount (token from the TokenRequest API, like a pod's)."""
        token = self.kubectl("create", "token", service_account, "-n", namespace, f"--duration={duration}")
        path = path or self.run_dir / "kubeconfigs" / f"sa-{namespace}-{service_account}.kubeconfig"
        return self.token_kubeconfig(token.stdout.strip(), path, f"{namespace}:{service_account}", namespace)

    def env(self) -> dict[str, str]:
        bin_dir = REPO_ROOT / ".run" / "bin"
        return {
            "KUBECONFIG": str(self.kubeconfig),
            "RTJ_KUBECONFIG": str(self.kubeconfig),
            "RTJ_RUN_DIR": str(self.run_dir),
            "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
        }

    def _write_env_file(self) -> None:
        bin_dir = REPO_ROOT / ".run" / "bin"
        lines = [f"export {k}={v}" for k, v in self.env().items() if k != "PATH"]
        lines.append(f'export PATH="{bin_dir}:$PATH"')
        self.env_file.write_text("\n".join(lines) + "\n")


# ---- CLI ------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rtj_local.cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, default=None, help="default: .run/cluster or $RTJ_RUN_DIR")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the cluster, or reuse a healthy one")
    up.add_argument("--nodes", type=int, default=4, help="fake p5.48xlarge nodes managed by KWOK")
    up.add_argument("--fresh", action="store_true", help="stop and wipe any existing cluster first")
    up.add_argument(
        "--real-nodes", action="store_true", help="make the API server reachable from pods (kubelet_nodes)"
    )
    sub.add_parser("down", help="stop every component")
    sub.add_parser("status", help="component health; exit 1 unless all are healthy")
    sub.add_parser("env", help='print shell exports: eval "$(python -m rtj_local.cluster env)"')
    for name in ("stop", "start", "logs"):
        p = sub.add_parser(name, help=f"{name} one component")
        p.add_argument("component", choices=COMPONENTS)
    args = parser.parse_args(argv)
    cluster = LocalCluster(args.run_dir)

    if args.command == "up":
        t0 = time.monotonic()
        try:
            cluster.up(nodes=args.nodes, fresh=args.fresh, real_nodes=args.real_nodes)
        except ClusterError as e:
            print(f"cluster up failed: {e}", file=sys.stderr)
            return 1
        print(f"cluster ready in {time.monotonic() - t0:.1f}s: {cluster.server}", file=sys.stderr)
        print(f"  export KUBECONFIG={cluster.kubeconfig}   # or: source {cluster.env_file}", file=sys.stderr)
    elif args.command == "down":
        cluster.down()
    elif args.command == "status":
        st = cluster.status()
        for component, ok in st.items():
            print(f"{component:25} {'healthy' if ok else 'DOWN'}")
        return 0 if all(st.values()) else 1
    elif args.command == "env":
        if not cluster.env_file.exists():
            print("no cluster: run `python -m rtj_local.cluster up`", file=sys.stderr)
            return 1
        print(cluster.env_file.read_text(), end="")
    elif args.command == "stop":
        cluster.stop_component(args.component)
    elif args.command == "start":
        cluster.start_component(args.component)
    elif args.command == "logs":
        print(cluster.logs(args.component, 200))
    return 0


if __name__ == "__main__":
    sys.exit(main())
