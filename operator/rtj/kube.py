"""The one place where the operator talks to the Kubernetes API (besides kopf's own watching).

Async for the handlers; the official `kubernetes` client does the HTTP (auth, TLS, token refresh)
in worker threads. Objects travel as plain dicts (the builders' output) through the client's raw
request layer, so nothing is lost or reshaped by its typed models.

Semantics:
- create: AlreadyExists is success (deterministic names make every create safe to repeat).
- delete: NotFound is success; pods and PVs are deleted with a UID precondition, so a pass computed
  from an old observation never deletes a newer object of the same name.
- status: one merge patch per pass carrying the resourceVersion it was computed from; a Conflict
  means the pass saw stale state and is dropped (the next pass recomputes).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config

from rtj import builders, contract
from rtj.ladder import kueue_admission

logger = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
#: Kueue's API: v1beta2 is what Kueue v0.17 stores (its CRDs: storage: true) and serves.
KUEUE_GROUP, KUEUE_VERSION = kueue_admission.WORKLOAD_GROUP, kueue_admission.WORKLOAD_VERSION
FIELD_MANAGER = "rtj-operator"
_PATHS = {
    "Pod": "/api/v1/namespaces/{ns}/pods",
    "Service": "/api/v1/namespaces/{ns}/services",
    "PersistentVolumeClaim": "/api/v1/namespaces/{ns}/persistentvolumeclaims",
    "PersistentVolume": "/api/v1/persistentvolumes",
    "Lease": "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
    "Event": "/api/v1/namespaces/{ns}/events",
    "Node": "/api/v1/nodes",
    "Job": f"/apis/{contract.API_GROUP}/{contract.API_VERSION}/namespaces/{{ns}}/{contract.PLURAL}",
    # Kueue (rtj.ladder.kueue_admission): the job's Workload, and the ResourceFlavors its admission names.
    "Workload": f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/namespaces/{{ns}}/workloads",
    "ResourceFlavor": f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/resourceflavors",
}


#: Read-modify-write rounds of a Node patch before a Conflict is given up (rtj.kube.Kube.patch_node).
NODE_PATCH_ATTEMPTS = 5


class KubeError(Exception):
    def __init__(self, status: int, reason: str, body: str = "") -> None:
        super().__init__(f"{status} {reason}: {body[:500]}")
        self.status, self.reason, self.body = status, reason, body

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def invalid(self) -> bool:
        """422: the object fails the API server's validation (the same object always will)."""
        return self.status == 422

    @property
    def server_reason(self) -> str:
        """The API server's CamelCase Status reason (e.g. Forbidden), else the HTTP reason phrase."""
        try:
            return str(json.loads(self.body)["reason"]) or self.reason
        except (ValueError, KeyError, TypeError):
            return self.reason

    @property
    def message(self) -> str:
        """The API server's Status message (it names the object and the field), else the body."""
        try:
            return str(json.loads(self.body)["message"])
        except (ValueError, KeyError, TypeError):
            return self.body[:500]


class Kube:
    """A thin async API over one `kubernetes.client.ApiClient`."""

    def __init__(
        self, api_client: client.ApiClient, request_timeout: float = 10.0, workers: int = 32
    ) -> None:
        self.api = api_client
        self.timeout = request_timeout
        # Our own threads, as many as the connection pool: asyncio's default executor has
        # min(32, CPUs + 4) threads (6 on 2 CPUs); with a slow apiserver all 6 sat waiting for
        # responses and every other call queued behind them (bench/operator_scale.py, 50 jobs).
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rtj-kube")
        #: When a call last failed for want of an API server (no connection, a timeout, a 5xx):
        #: node faults seen right after are held (rtj.ladder.pass_state.Pass.node_verdict).
        self.failed_at: datetime | None = None
        #: Called before each write is sent (rtj.leader_election.Fence.check: a leader past its renew
        #: deadline ends the process instead); None without leader election.
        self.write_fence: Callable[[], None] | None = None

    @classmethod
    def from_environment(cls, request_timeout: float = 10.0, pool_size: int = 32) -> Kube:
        """In-cluster config when running in a pod, else $KUBECONFIG / ~/.kube/config."""
        cfg = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            config.load_kube_config(client_configuration=cfg)
        cfg.connection_pool_maxsize = pool_size
        return cls(client.ApiClient(cfg), request_timeout, workers=pool_size)

    # --- raw request ----------------------------------------------------------------------------
    def _request_sync(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        content_type: str | None = None,
    ) -> dict[str, Any]:
        if method != "GET" and self.write_fence is not None:
            self.write_fence()
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        method_, url, headers_, body_, _ = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=params,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(
            method_, url, header_params=headers_, body=body_, _request_timeout=self.timeout
        )
        data = response.read()
        if response.status >= 400:
            raise KubeError(
                response.status, str(response.reason), data.decode("utf-8", "replace") if data else ""
            )
        return json.loads(data) if data else {}

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        content_type: str | None = None,
    ) -> dict[str, Any]:
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, self._request_sync, method, path, body, query, content_type
            )
        except KubeError as exc:
            if exc.status >= 500:
                self.failed_at = datetime.now(UTC)
            raise
        except Exception:  # urllib3's connection errors and timeouts: no API server answered
            self.failed_at = datetime.now(UTC)
            raise

    @staticmethod
    def _collection(kind: str, namespace: str | None) -> str:
        return _PATHS[kind].format(ns=namespace or "")

    # --- children -----------------------------------------------------------------------------------
    async def create(self, obj: dict[str, Any]) -> bool:
        """Create; True if created, False if it already existed (both are success)."""
        path = self._collection(obj["kind"], obj["metadata"].get("namespace"))
        try:
            await self.request("POST", path, obj, {"fieldManager": FIELD_MANAGER})
        except KubeError as exc:
            if exc.conflict and '"AlreadyExists"' in exc.body:
                return False
            raise
        return True

    async def delete(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        uid: str | None = None,
        grace_seconds: int | None = None,
    ) -> bool:
        """Delete; False when already gone or replaced by a newer object (UID precondition)."""
        options: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Background",
        }
        if uid:
            options["preconditions"] = {"uid": uid}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        try:
            await self.request("DELETE", f"{self._collection(kind, namespace)}/{name}", options)
        except KubeError as exc:
            if exc.not_found or exc.conflict:
                return False
            raise
        return True

    async def patch(
        self, kind: str, namespace: str | None, name: str, patch: dict[str, Any], subresource: str = ""
    ) -> bool:
        """Merge-patch (the object, or its `subresource`); False when the object is gone."""
        path = f"{self._collection(kind, namespace)}/{name}" + (f"/{subresource}" if subresource else "")
        try:
            await self.request(
                "PATCH",
                path,
                patch,
                {"fieldManager": FIELD_MANAGER},
                MERGE_PATCH,
            )
        except KubeError as exc:
            if exc.not_found:
                return False
            raise
        return True

    async def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """Read one object; None when it does not exist."""
        try:
            return await self.request("GET", f"{self._collection(kind, namespace)}/{name}")
        except KubeError as exc:
            if exc.not_found:
                return None
            raise

    async def list_objects(
        self, kind: str, namespace: str | None, label_selector: str = ""
    ) -> list[dict[str, Any]]:
        """The objects of `kind` the label selector selects (all without one), in `namespace` or, for a
        namespaced kind with None, in every namespace (one LIST)."""
        path = _PATHS[kind].replace("/namespaces/{ns}", "") if namespace is None else None
        query = {"labelSelector": label_selector} if label_selector else None
        listing = await self.request("GET", path or self._collection(kind, namespace), query=query)
        return list(listing.get("items") or [])

    # --- the job's FSx PV (cluster-scoped: no garbage collection) -------------------------------------
    async def fsx_pvs(self, namespace: str, job: str) -> list[dict[str, Any]]:
        """Every PV whose labels name the job (builders.fsx_pv_selector), whatever its name."""
        return await self.list_objects("PersistentVolume", None, builders.fsx_pv_selector(namespace, job))

    async def delete_fsx_pvs(self, namespace: str, job: str) -> list[str]:
        """Delete every PV of the job (builders.fsx_pvs_to_delete: its labels name the job; under this
        operator's name or an earlier one's), each under its UID; the names deleted. Reclaim policy
        Retain: the file system is never touched."""
        deleted = []
        for name, uid in builders.fsx_pvs_to_delete(await self.fsx_pvs(namespace, job), namespace, job):
            if await self.delete("PersistentVolume", None, name, uid=uid):
                deleted.append(name)
        return deleted

    # --- Kueue -----------------------------------------------------------------------------------------
    async def patch_workload_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> bool:
        """Merge-patch a Workload's status (conditions are written whole: the policy computed them from
        this resourceVersion; KubeError 409 when Kueue changed it since). False when it is gone."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return await self.patch("Workload", namespace, name, body, subresource="status")

    # --- the job -------------------------------------------------------------------------------------
    async def patch_job_status(
        self,
        namespace: str,
        name: str,
        status: dict[str, Any],
        resource_version: str | None,
    ) -> str:
        """The pass's one status write; returns the new resourceVersion. KubeError 409 on a stale pass."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        result = await self.request(
            "PATCH",
            f"{self._collection('Job', namespace)}/{name}/status",
            body,
            {"fieldManager": FIELD_MANAGER},
            MERGE_PATCH,
        )
        return str((result.get("metadata") or {}).get("resourceVersion", ""))

    async def delete_job(self, namespace: str, name: str, uid: str) -> bool:
        return await self.delete("Job", namespace, name, uid)

    # --- nodes (quarantine, fault record: rtj.ladder.quarantine computes the patches) ---------------------
    async def patch_node(self, node: str, make: Callable[[dict[str, Any]], dict[str, Any] | None]) -> bool:
        """Read the node, merge-patch it with `make(node)` under its resourceVersion (taints are a
        plain list, written whole). A Conflict (someone else changed the node meanwhile: its kubelet's
        status, the node lifecycle controller's own taints, which land just when a node fails) is
        read and patched again, up to NODE_PATCH_ATTEMPTS times: the pass that decided a quarantine
        may be the only one that does. False: the node is gone, or `make` had nothing to change."""
        for attempt in range(NODE_PATCH_ATTEMPTS):
            try:
                obj = await self.request("GET", f"{_PATHS['Node']}/{node}")
            except KubeError as exc:
                if exc.not_found:
                    return False
                raise
            patch = make(obj)
            if patch is None:
                return False
            try:
                await self.request(
                    "PATCH", f"{_PATHS['Node']}/{node}", patch, {"fieldManager": FIELD_MANAGER}, MERGE_PATCH
                )
                return True
            except KubeError as exc:
                if not exc.conflict or attempt == NODE_PATCH_ATTEMPTS - 1:
                    raise
        return False

    # --- events ---------------------------------------------------------------------------------------------
    async def emit_event(
        self,
        job: dict[str, Any],
        type_: str,
        reason: str,
        message: str,
        name: str | None = None,
        when: datetime | None = None,
    ) -> bool:
        """A core/v1 Event on the job (shown by `kubectl describe rtj`). Best effort: never fails a
        pass; True when posted. With a `name`, an Event already posted under it is success too."""
        meta = job.get("metadata") or {}
        now = contract.kube_time(when or datetime.now(UTC))
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": name or f"{meta.get('name')}.{uuid.uuid4().hex[:16]}",
                "namespace": meta.get("namespace"),
            },
            "involvedObject": {
                "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
                "kind": contract.KIND,
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": f"{contract.API_GROUP}/operator",
            "reportingInstance": FIELD_MANAGER,
        }
        try:
            await self.request("POST", self._collection("Event", meta.get("namespace")), event)
        except KubeError as exc:  # events are best effort; status is the record
            if name and exc.conflict and '"AlreadyExists"' in exc.body:
                return True
            logger.warning(
                "event %s on %s/%s not posted: %s", reason, meta.get("namespace"), meta.get("name"), exc
            )
            return False
        return True

    def close(self) -> None:
        self._executor.shutdown(wait=False)
        self.api.close()
