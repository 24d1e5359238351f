"""Pod spec -> local process plan, for the local node agent (LOCAL USE ONLY: a kubelet stand-in).

Pure functions: what a pod's container becomes as a process (argv, env, working directory, mounts,
user) and the shell launcher that sets up its mount namespace. No API calls, no processes here;
`rtj_local.node_agent` fetches what a plan needs (volume directories, ConfigMaps, Secrets) first.

What stands in for the container image: images are not pulled. Every pod runs with the project's
virtualenv first on PATH, HOME and the working directory at the pod's private /tmp, and an explicit
`command` is required (there is no image ENTRYPOINT to fall back on).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from math import ceil
from pathlib import Path
from typing import Any

from kubernetes.utils import parse_quantity

POD_IP = "127.0.0.1"  # host network: every local pod shares the host's loopback
HOST_IP = "127.0.0.1"
SA_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
#: /dev/shm of a container without a memory volume there (containerd's and Docker's default).
DEFAULT_SHM_SIZE = "64Mi"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class PodSpecError(ValueError):
    """The pod cannot be run locally (reported as the container's start error)."""


class MissingReference(PodSpecError):
    """A ConfigMap/Secret the pod refers to does not exist (yet): kubelet keeps retrying."""


@dataclass(frozen=True)
class Mount:
    target: str
    source: str | None = None  # None: a fresh tmpfs
    read_only: bool = False
    tmpfs_size: str | None = None  # tmpfs only; None = the kernel's default (half of RAM)


@dataclass(frozen=True)
class VolumeSource:
    """Where a pod volume lives on this machine: a directory to bind, or a fresh tmpfs."""

    path: str | None = None
    tmpfs_size: str | None = None  # for `emptyDir: {medium: Memory}` (path is None)


@dataclass(frozen=True)
class ProcessPlan:
    container: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    mounts: list[Mount]
    uid: int | None = None
    gid: int | None = None
    groups: list[int] = field(default_factory=list)
    #: Host directories under /tmp that must stay visible at their own path inside the pod (the
    #: project whose virtualenv the pod runs, e.g. a clone in /tmp), although /tmp is replaced.
    keep_visible: tuple[str, ...] = ()


#: Where kept directories are parked while /tmp is replaced (inside the pod's mount namespace).
KEEP_PARKING = "/var/tmp/rtj-keep"


@dataclass(frozen=True)
class PlanContext:
    """What the plan needs from outside the pod object."""

    venv_bin: str
    apiserver_host: str
    apiserver_port: int
    hosts_file: str
    tmp_dir: str  # per-pod directory bound at /tmp
    volumes: Mapping[str, VolumeSource]
    config_maps: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    secrets: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # decoded values
    node_allocatable: Mapping[str, str] = field(default_factory=dict)


def _get(obj: Mapping[str, Any] | None, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


_FIELD_PATH = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def field_ref_value(pod: Mapping[str, Any], path: str) -> str:
    """Value of a downward-API fieldRef, as kubelet computes it for a pod on this machine."""
    simple = {
        "metadata.name": _get(pod, "metadata", "name"),
        "metadata.namespace": _get(pod, "metadata", "namespace"),
        "metadata.uid": _get(pod, "metadata", "uid"),
        "spec.nodeName": _get(pod, "spec", "nodeName"),
        "spec.serviceAccountName": _get(pod, "spec", "serviceAccountName"),
        "status.podIP": POD_IP,
        "status.podIPs": POD_IP,
        "status.hostIP": HOST_IP,
        "status.hostIPs": HOST_IP,
    }
    if path in simple:
        return str(simple[path] or "")
    match = _FIELD_PATH.match(path)
    if match:
        return str((_get(pod, "metadata", match.group(1)) or {}).get(match.group(2), ""))
    raise PodSpecError(f"unsupported fieldRef.fieldPath {path!r}")


def resource_field_value(
    container: Mapping[str, Any], ref: Mapping[str, Any], allocatable: Mapping[str, str]
) -> str:
    """Value of a resourceFieldRef: the container's limit (else request for requests.*), falling back
    to node allocatable for unset limits as kubelet does; divided by `divisor` and rounded up."""
    resource = ref.get("resource", "")
    kind, _, name = resource.partition(".")
    if kind not in ("limits", "requests") or not name:
        raise PodSpecError(f"unsupported resourceFieldRef.resource {resource!r}")
    value = _get(container, "resources", kind, name)
    if value is None:
        value = allocatable.get(name, "0")
    divisor = parse_quantity(str(ref.get("divisor") or "1"))
    return str(ceil(parse_quantity(str(value)) / divisor))


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: defined variables are replaced, `$$` escapes `$`, unknown
    references are left as they are."""

    def repl(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR_REF.sub(repl, value)


def container_env(pod: Mapping[str, Any], container: Mapping[str, Any], ctx: PlanContext) -> dict[str, str]:
    """The container's environment: image defaults, service variables, envFrom, then env (in order,
    each value expanded against what precedes it)."""
    env: dict[str, str] = {
        "PATH": f"{ctx.venv_bin}:{BASE_PATH}",
        "VIRTUAL_ENV": ctx.venv_bin.rsplit("/", 1)[0],
        "HOME": "/tmp",
        "HOSTNAME": str(_get(pod, "metadata", "name")),
        "PYTHONUNBUFFERED": "1",
        "KUBERNETES_SERVICE_HOST": ctx.apiserver_host,
        "KUBERNETES_SERVICE_PORT": str(ctx.apiserver_port),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(ctx.apiserver_port),
        "KUBERNETES_PORT": f"tcp://{ctx.apiserver_host}:{ctx.apiserver_port}",
        # Every local pod shares the host's address, so NVRx sees several ft_launchers on one node,
        # which it refuses (closing the rendezvous) unless told it is a simulation.
        "NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE": "1",
    }
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, store in (("configMapRef", ctx.config_maps), ("secretRef", ctx.secrets)):
            ref = source.get(kind)
            if ref is None:
                continue
            data = store.get(ref.get("name", ""))
            if data is None:
                if ref.get("optional"):
                    continue
                raise MissingReference(f"envFrom {kind} {ref.get('name')!r} not found")
            env.update({prefix + k: v for k, v in data.items()})
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(str(var.get("value", "")), env)
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            env[name] = field_ref_value(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            env[name] = resource_field_value(container, source["resourceFieldRef"], ctx.node_allocatable)
        else:
            kind, store = (
                ("configMapKeyRef", ctx.config_maps)
                if "configMapKeyRef" in source
                else ("secretKeyRef", ctx.secrets)
            )
            ref = source.get(kind)
            if ref is None:
                raise PodSpecError(f"env {name}: unsupported valueFrom {sorted(source)}")
            value = (store.get(ref.get("name", "")) or {}).get(ref.get("key", ""))
            if value is None:
                if ref.get("optional"):
                    continue
                raise MissingReference(f"env {name}: {kind} {ref.get('name')}/{ref.get('key')} not found")
            env[name] = value
    return env


def _mounts(container: Mapping[str, Any], ctx: PlanContext) -> list[Mount]:
    mounts = {
        "/tmp": Mount("/tmp", source=ctx.tmp_dir),
        "/dev/shm": Mount("/dev/shm", tmpfs_size=DEFAULT_SHM_SIZE),
        "/etc/hosts": Mount("/etc/hosts", source=ctx.hosts_file, read_only=True),
    }
    for vm in container.get("volumeMounts") or []:
        target = vm["mountPath"].rstrip("/") or "/"
        if target == "/":
            raise PodSpecError("volumeMount at / is not supported locally")
        source = ctx.volumes.get(vm["name"])
        if source is None:
            raise PodSpecError(f"volumeMount {vm['name']!r}: no such volume")
        read_only = bool(vm.get("readOnly"))
        if source.path is None:
            if vm.get("subPath"):
                raise PodSpecError(f"volumeMount {vm['name']!r}: subPath of a memory emptyDir")
            mounts[target] = Mount(target, tmpfs_size=source.tmpfs_size, read_only=read_only)
        else:
            sub = vm.get("subPath") or ""
            if sub.startswith("/") or ".." in sub.split("/"):
                raise PodSpecError(f"volumeMount {vm['name']!r}: invalid subPath {sub!r}")
            path = f"{source.path}/{sub}" if sub else source.path
            mounts[target] = Mount(target, source=path, read_only=read_only)
    # Parents before children (a parent is a prefix, so it sorts first); /tmp and below last, so that
    # sources under the host's /tmp (e.g. a run dir there) are bound before /tmp is replaced.
    return [mounts[t] for t in sorted(mounts, key=lambda t: (t == "/tmp" or t.startswith("/tmp/"), t))]


def _security(
    pod: Mapping[str, Any], container: Mapping[str, Any]
) -> tuple[int | None, int | None, list[int]]:
    pod_sc = _get(pod, "spec", "securityContext") or {}
    sc = container.get("securityContext") or {}
    uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
    gid = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
    groups = [g for g in [pod_sc.get("fsGroup"), *(pod_sc.get("supplementalGroups") or [])] if g is not None]
    # runAsNonRoot without runAsUser: a real kubelet runs the image's USER and refuses a root one. The
    # local agent has no images, so it runs the process as itself, as if the image declared a non-root
    # user (our images do); it cannot do better, since the local Python lives under /root (mode 700).
    if uid is not None and gid is None:
        gid = 0 if not groups else groups[0]
    return uid, gid, groups


def plan_pod(pod: Mapping[str, Any], ctx: PlanContext) -> ProcessPlan:
    """The process that runs the pod's (single) container."""
    containers = _get(pod, "spec", "containers") or []
    if len(containers) != 1 or _get(pod, "spec", "initContainers"):
        raise PodSpecError("the local node agent runs pods with exactly one container and no init containers")
    container = containers[0]
    if not container.get("command"):
        raise PodSpecError(
            f"container {container.get('name')!r}: an explicit command is required (no images locally)"
        )
    env = container_env(pod, container, ctx)
    argv = [expand(str(a), env) for a in [*container["command"], *(container.get("args") or [])]]
    uid, gid, groups = _security(pod, container)
    return ProcessPlan(
        container=container["name"],
        argv=argv,
        env=env,
        cwd=container.get("workingDir") or "/tmp",
        mounts=_mounts(container, ctx),
        uid=uid,
        gid=gid,
        groups=groups,
        keep_visible=tuple(_under_tmp(str(Path(ctx.venv_bin).parent.parent))),
    )


def _under_tmp(path: str) -> list[str]:
    return [path] if path.startswith("/tmp/") else []


def launcher_argv(plan: ProcessPlan) -> list[str]:
    """argv that runs `plan` in a new private mount namespace: mounts first, then (optionally) the
    user switch, then exec of the command, so the command's pid is the launcher's pid."""
    q = shlex.quote
    lines = ["set -e"]
    # Park what must stay visible before /tmp is replaced; bring it back right after.
    for i, path in enumerate(plan.keep_visible):
        lines.append(f"mkdir -p {KEEP_PARKING}/{i} && mount --bind {q(path)} {KEEP_PARKING}/{i}")
    for m in plan.mounts:
        if m.source is not None and m.target != "/etc/hosts":
            lines.append(
                f"if [ -d {q(m.source)} ]; then mkdir -p {q(m.target)}; "
                f'else mkdir -p "$(dirname {q(m.target)})"; [ -e {q(m.target)} ] || : > {q(m.target)}; fi'
            )
        elif m.source is None:
            lines.append(f"mkdir -p {q(m.target)}")
        if m.source is None:
            size = (
                f",size={int(parse_quantity(m.tmpfs_size))}" if m.tmpfs_size else ""
            )  # bytes: mount(8) has no "Mi"
            opts = f"mode=1777{size}"
            lines.append(f"mount -t tmpfs -o {q(opts)} tmpfs {q(m.target)}")
        else:
            lines.append(f"mount --bind {q(m.source)} {q(m.target)}")
        if m.read_only:
            lines.append(f"mount -o remount,bind,ro {q(m.target)}")
        if m.target == "/tmp":
            lines.extend(
                f"mkdir -p {q(p)} && mount --bind {KEEP_PARKING}/{i} {q(p)}"
                for i, p in enumerate(plan.keep_visible)
            )
    lines.append(f"cd {q(plan.cwd)}")
    lines.append('exec "$@"')
    prefix: list[str] = []
    if plan.uid is not None:
        groups = ",".join(str(g) for g in plan.groups)
        prefix = ["setpriv", f"--reuid={plan.uid}", f"--regid={plan.gid}"]
        prefix += [f"--groups={groups}"] if groups else ["--clear-groups"]
        prefix.append("--")
    script = "\n".join(lines)
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "rtj-pod",
            *prefix, *plan.argv]  # fmt: skip


def host_mount_points(plan: ProcessPlan, exists: Callable[[str], bool]) -> list[str]:
    """Directories the launcher will create on the host for mount targets outside /tmp (empty there:
    the mounts happen only inside the pod), deepest first, so the agent can remove them when it stops."""
    created: set[str] = set()
    for m in plan.mounts:
        if m.target == "/tmp" or m.target.startswith("/tmp/"):
            continue
        path = m.target
        while path not in ("", "/") and not exists(path):
            created.add(path)
            path = path.rsplit("/", 1)[0]
    return sorted(created, key=lambda p: (-p.count("/"), p))
