"""Plain-JSON requests to the API server for the local tools (cluster bootstrap, node agent, demo,
timeline).

The generated kubernetes client validates request bodies against its typed models, which reject the
partial objects a kubelet stand-in sends (e.g. a Node whose nodeInfo is filled in later); dicts in and
dicts out keep these tools small.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kubernetes import config
from kubernetes.client import ApiClient
from kubernetes.client.rest import ApiException

SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


class RawApi:
    def __init__(self, api: ApiClient) -> None:
        self.api = api

    @classmethod
    def for_kubeconfig(cls, kubeconfig: Path) -> RawApi:
        return cls(config.new_client_from_config(config_file=str(kubeconfig)))

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json", **query: Any
    ) -> dict[str, Any]:
        """`query` holds URL parameters by their API names (e.g. labelSelector=...). Raises ApiException
        (with .status) for non-2xx answers."""
        params = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=[(k, v) for k, v in query.items() if v is not None],
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(*params, _request_timeout=30)
        data = resp.read()
        if not 200 <= resp.status <= 299:
            raise ApiException.from_response(http_resp=resp, body=None, data=None)
        return json.loads(data)

    def get(self, path: str, **query: Any) -> dict[str, Any] | None:
        """GET, or None when the object does not exist."""
        try:
            return self.request("GET", path, **query)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def create(self, path: str, obj: dict[str, Any]) -> bool:
        """POST `obj` to a collection; True if created, False if it already existed."""
        try:
            self.request("POST", path, obj)
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        return True
