"""The /etc/hosts every pod of the node agent sees, its stand-in for cluster DNS: the host's own
entries, then every Service (`<svc>.<ns>.svc[.cluster.local]`) and every pod with a hostname and
subdomain, all at the pod IP (host network)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rtj_local.node_agent.pod_state import dig
from rtj_local.podrun import POD_IP


def hosts_text(base: str, services: Iterable[dict[str, Any]], pods: Iterable[dict[str, Any]]) -> str:
    """`base` (the host's /etc/hosts) followed by one line per name of the cluster."""
    names: list[str] = []
    for svc in services:
        n, ns = svc["metadata"]["name"], svc["metadata"]["namespace"]
        names += [f"{n}.{ns}.svc", f"{n}.{ns}.svc.cluster.local", f"{n}.{ns}"]
    for pod in pods:
        host, sub = dig(pod, "spec", "hostname"), dig(pod, "spec", "subdomain")
        if host and sub:
            ns = pod["metadata"]["namespace"]
            names += [f"{host}.{sub}.{ns}.svc", f"{host}.{sub}.{ns}.svc.cluster.local"]
    text = base.rstrip("\n") + "\n# Services and pods of the local cluster (rtj local node agent)\n"
    return text + "".join(f"{POD_IP} {name}\n" for name in sorted(set(names)))


def rewrite_in_place(path: Path, text: str) -> None:
    """`path` holds `text`, rewritten in place when it differs: the file is bind-mounted into running
    pods, a rename would not reach them."""
    if not path.exists() or path.read_text() != text:
        with open(path, "a+") as f:
            f.seek(0)
            f.truncate()
            f.write(text)
