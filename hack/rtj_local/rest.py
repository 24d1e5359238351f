"""A minimal Kubernetes REST client for the cluster's own bootstrap (no kubectl, no client library):
kubectl's discovery and OpenAPI downloads cost seconds while a fresh API server is still busy."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


class KubeRest:
    def __init__(self, server: str, ca_file: Path, token: str) -> None:
        self.server = server.rstrip("/")
        self._ctx = ssl.create_default_context(cafile=str(ca_file))
        self._token = token

    def request(self, method: str, path: str, body: Any = None, timeout: float = 10) -> tuple[int, Any]:
        """(HTTP status, decoded JSON body); HTTP errors are returned, not raised."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.server + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self._ctx) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, raw.decode(errors="replace")

    def create(self, path: str, obj: dict) -> bool:
        """POSTs `obj` to a collection; True if created, False if it already existed."""
        status, body = self.request("POST", path, obj)
        if status == 409:
            return False
        if status >= 300:
            raise RuntimeError(f"POST {path} {obj['metadata'].get('name')}: HTTP {status}: {body}")
        return True

    def get(self, path: str) -> dict | None:
        status, body = self.request("GET", path)
        if status == 404:
            return None
        if status >= 300:
            raise RuntimeError(f"GET {path}: HTTP {status}: {body}")
        return body
