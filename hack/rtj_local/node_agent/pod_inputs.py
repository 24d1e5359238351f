"""What a pod's process plan needs from the cluster and the host, fetched and laid out by the node
agent before the pod starts: its volumes (emptyDir, PVC, hostPath, files), the ConfigMaps and Secrets
its environment reads, and its ServiceAccount tokens (refreshed as kubelet refreshes them)."""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes.client.rest import ApiException

from rtj_local.node_agent.pod_state import PodRun, ServiceAccountToken, dig
from rtj_local.podrun import MissingReference, PodSpecError, VolumeSource, field_ref_value
from rtj_local.rawapi import RawApi


class PodInputs:
    """Fetches a pod's ConfigMaps, Secrets and tokens, and makes its volume directories under
    `run_dir` (`pods/...` per pod, `volumes/...` per claim's volume, shared by every node)."""

    def __init__(self, api: RawApi, run_dir: Path) -> None:
        self.request = api.request
        self.run_dir = run_dir

    def env_sources(
        self, namespace: str, container: dict[str, Any]
    ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
        """(ConfigMaps, Secrets) by name, of those the container's env reads that exist."""
        config_maps: dict[str, dict[str, str]] = {}
        secrets: dict[str, dict[str, str]] = {}
        for name in referenced(container, "configMap"):
            data = self.config_map(namespace, name)
            if data is not None:
                config_maps[name] = data
        for name in referenced(container, "secret"):
            data = self.secret(namespace, name)
            if data is not None:
                secrets[name] = data
        return config_maps, secrets

    def config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            return self.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}").get("data") or {}
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def secret(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            data = self.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}").get("data") or {}
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return {k: base64.b64decode(v).decode() for k, v in data.items()}

    def pvc_source(self, namespace: str, claim: str) -> str:
        """One directory per volume the claim is bound to (for a CSI volume, per volumeHandle, so
        claims of one file system share it); shared by every node of this agent."""
        pvc = self.request("GET", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
        pv_name = dig(pvc, "spec", "volumeName")
        key = f"claims/{namespace}/{claim}"
        if pv_name:
            pv = self.request("GET", f"/api/v1/persistentvolumes/{pv_name}")
            csi = dig(pv, "spec", "csi")
            if csi:
                key = f"csi/{csi['driver']}/{csi['volumeHandle']}"
            elif dig(pv, "spec", "hostPath", "path"):
                host_path = dig(pv, "spec", "hostPath")
                if host_path.get("type") == "DirectoryOrCreate":
                    Path(host_path["path"]).mkdir(parents=True, exist_ok=True)
                return str(host_path["path"])
            else:
                key = f"pv/{pv_name}"
        path = self.run_dir / "volumes" / key
        path.mkdir(parents=True, exist_ok=True)
        return str(path)

    def volumes(self, run: PodRun, pod: dict[str, Any]) -> dict[str, VolumeSource]:
        """Each of the pod's volumes, made ready on the host, by name."""
        out: dict[str, VolumeSource] = {}
        fs_group = dig(pod, "spec", "securityContext", "fsGroup")
        for vol in dig(pod, "spec", "volumes") or []:
            name = vol["name"]
            vol_dir = run.pod_dir / "volumes" / name
            if "emptyDir" in vol:
                empty = vol["emptyDir"] or {}
                if empty.get("medium") == "Memory":
                    out[name] = VolumeSource(tmpfs_size=empty.get("sizeLimit"))
                    continue
                vol_dir.mkdir(parents=True, exist_ok=True)
                vol_dir.chmod(0o777)  # as kubelet creates emptyDirs
                out[name] = VolumeSource(path=str(vol_dir))
            elif "persistentVolumeClaim" in vol:
                path = self.pvc_source(run.namespace, vol["persistentVolumeClaim"]["claimName"])
                if fs_group is not None:
                    apply_fs_group(Path(path), int(fs_group))
                out[name] = VolumeSource(path=path)
            elif "hostPath" in vol:
                path = vol["hostPath"]["path"]
                if vol["hostPath"].get("type") == "DirectoryOrCreate":
                    Path(path).mkdir(parents=True, exist_ok=True)
                out[name] = VolumeSource(path=path)
            elif any(k in vol for k in ("configMap", "secret", "downwardAPI", "projected")):
                self.write_files(run, pod, vol, vol_dir)
                out[name] = VolumeSource(path=str(vol_dir))
            else:
                kinds = sorted(set(vol) - {"name"})
                raise PodSpecError(f"volume {name!r}: type {kinds} is not supported by the local node agent")
        return out

    def write_files(self, run: PodRun, pod: dict[str, Any], vol: dict[str, Any], vol_dir: Path) -> None:
        """The files of a configMap, secret, downwardAPI or projected volume, written into `vol_dir`."""
        vol_dir.mkdir(parents=True, exist_ok=True)
        sources = dig(vol, "projected", "sources") or [vol]
        for src in sources:
            if "serviceAccountToken" in src:
                sat = src["serviceAccountToken"]
                token = ServiceAccountToken(
                    path=vol_dir / sat.get("path", "token"),
                    service_account=dig(pod, "spec", "serviceAccountName") or "default",
                    audience=sat.get("audience"),
                    expiration_seconds=int(sat.get("expirationSeconds") or 3607),
                    refresh_at=0.0,
                )
                self.issue_token(run, token)
                run.tokens.append(token)
            for kind, fetch in (("configMap", self.config_map), ("secret", self.secret)):
                if kind not in src:
                    continue
                ref = src[kind]
                data = fetch(run.namespace, ref.get("name") or ref.get("secretName", ""))
                if data is None:
                    if ref.get("optional"):
                        continue
                    raise MissingReference(f"{kind} {ref.get('name') or ref.get('secretName')!r} not found")
                items = ref.get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    if item["key"] in data:
                        write_atomic(vol_dir / item["path"], data[item["key"]].encode())
            if "downwardAPI" in src:
                for item in src["downwardAPI"].get("items") or []:
                    if "fieldRef" not in item:
                        raise PodSpecError(
                            f"downwardAPI item {item.get('path')!r}: only fieldRef is supported"
                        )
                    write_atomic(
                        vol_dir / item["path"], field_ref_value(pod, item["fieldRef"]["fieldPath"]).encode()
                    )

    def issue_token(self, run: PodRun, token: ServiceAccountToken) -> None:
        """A token from the TokenRequest API, bound to the pod, written to its file."""
        spec: dict[str, Any] = {
            "expirationSeconds": token.expiration_seconds,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": run.name, "uid": run.uid},
        }
        if token.audience:
            spec["audiences"] = [token.audience]
        resp = self.request(
            "POST",
            f"/api/v1/namespaces/{run.namespace}/serviceaccounts/{token.service_account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        expires = datetime.fromisoformat(resp["status"]["expirationTimestamp"].replace("Z", "+00:00"))
        now = time.time()
        token.refresh_at = now + 0.8 * (expires.timestamp() - now)  # kubelet refreshes at 80% of the TTL
        write_atomic(token.path, resp["status"]["token"].encode(), 0o644)

    def refresh_tokens(self, runs: Iterable[PodRun]) -> None:
        """A new token for each of the pods' tokens past its refresh time."""
        for run in runs:
            for token in run.tokens:
                if time.time() >= token.refresh_at:
                    self.issue_token(run, token)


def referenced(container: dict[str, Any], kind: str) -> set[str]:
    """Names of ConfigMaps (kind="configMap") or Secrets (kind="secret") the container's env uses."""
    names = set()
    for src in container.get("envFrom") or []:
        ref = src.get(f"{kind}Ref")
        if ref:
            names.add(ref.get("name", ""))
    for var in container.get("env") or []:
        ref = dig(var, "valueFrom", f"{kind}KeyRef")
        if ref:
            names.add(ref.get("name", ""))
    return names


def apply_fs_group(path: Path, gid: int) -> None:
    """What kubelet does for fsGroup on a volume: group ownership and group write, setgid dirs."""
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, d) for d in dirs), *(os.path.join(root, f) for f in files)]:
            st = os.lstat(name)
            os.lchown(name, -1, gid)
            if os.path.isdir(name):
                os.chmod(name, st.st_mode | 0o2070)
            else:
                os.chmod(name, st.st_mode | 0o060)


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    tmp.replace(path)
