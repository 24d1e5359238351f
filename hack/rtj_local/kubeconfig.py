"""Kubeconfig files (written as JSON, which every kubeconfig reader accepts as YAML)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

CLUSTER_NAME = "rtj-local"


def build_kubeconfig(
    server: str, ca_pem: bytes, token: str, user: str = "admin", namespace: str | None = None
) -> dict:
    context: dict[str, str] = {"cluster": CLUSTER_NAME, "user": user}
    if namespace:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CLUSTER_NAME,
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": f"{user}@{CLUSTER_NAME}", "context": context}],
        "current-context": f"{user}@{CLUSTER_NAME}",
        "preferences": {},
    }


def write_kubeconfig(path: Path, config: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(config, indent=2) + "\n")
    tmp.chmod(0o600)
    tmp.replace(path)
    return path
