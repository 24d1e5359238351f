"""The node agent's Nodes: registered shaped like EKS p5.48xlarge and kept Ready as a kubelet keeps
its node, by renewing the node Lease in kube-node-lease and posting the status conditions."""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.rest import ApiException
from rtj.contract import micro_time

from rtj_local.node_agent.pod_state import dig, now
from rtj_local.nodes import p5_node
from rtj_local.podrun import HOST_IP
from rtj_local.rawapi import MERGE, SMP, RawApi

log = logging.getLogger("rtj_local.node_agent")

AGENT_LABEL = "rtj.local/agent"
AGENT_ANNOTATION = "rtj.local/node-agent"
KUBELET_VERSION = "v1.37.2-rtj-local"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"


def node_manifest(name: str) -> dict[str, Any]:
    """The Node as the agent registers it: a p5.48xlarge, Ready from now."""
    node = p5_node(
        name,
        annotations={AGENT_ANNOTATION: "true"},  # not KWOK's: KWOK must leave these nodes alone
        labels={AGENT_LABEL: "true"},
    )
    node["status"].update(node_status(name, transition=now()))
    return node


def node_status(name: str, transition: str) -> dict[str, Any]:
    """A healthy node's status: no pressure, Ready since `transition`, heartbeat now."""
    heartbeat = now()

    def cond(type_: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": heartbeat,
            "lastTransitionTime": transition,
        }

    return {
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "local node agent"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "local node agent"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "local node agent"),
            cond("Ready", "True", "KubeletReady", "local node agent is posting ready status"),
        ],
        "addresses": [{"type": "InternalIP", "address": HOST_IP}, {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "nodeInfo": {
            "machineID": name,
            "systemUUID": name,
            "bootID": name,
            "kernelVersion": os.uname().release,
            "osImage": "rtj local node agent",
            "containerRuntimeVersion": "rtj-local://0",
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


class NodeHeartbeat:
    """Registers the agent's Nodes, renews their Leases, posts their status and deletes them."""

    def __init__(self, api: RawApi, lease_duration_seconds: int) -> None:
        self.request = api.request
        self.lease_duration_seconds = lease_duration_seconds
        self._node_uids: dict[str, str] = {}

    def register(self, name: str) -> None:
        manifest = node_manifest(name)
        try:
            uid = self.request("POST", "/api/v1/nodes", manifest)["metadata"]["uid"]
        except ApiException as e:
            if e.status != 409:
                raise
            patch = {"metadata": manifest["metadata"], "spec": manifest["spec"]}
            uid = self.request("PATCH", f"/api/v1/nodes/{name}", patch, SMP)["metadata"]["uid"]
        self._node_uids[name] = uid
        # The status given on create may be dropped: set it through the status subresource too.
        self.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": manifest["status"]}, SMP)
        self.renew_lease(name)

    def renew_lease(self, name: str) -> None:
        body = {
            "metadata": {
                "name": name,
                "namespace": "kube-node-lease",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": name, "uid": self._node_uids[name]}
                ],
            },
            "spec": {
                "holderIdentity": name,
                "leaseDurationSeconds": self.lease_duration_seconds,
                "renewTime": micro_time(datetime.now(UTC)),
            },
        }
        try:
            self.request("PATCH", f"{LEASES}/{name}", body, MERGE)
        except ApiException as e:
            if e.status != 404:
                raise
            self.request("POST", LEASES, body)

    def post_status(self, name: str) -> None:
        """Fresh heartbeat times on the conditions; Ready's transition time kept while it stays Ready."""
        node = self.request("GET", f"/api/v1/nodes/{name}/status")
        conditions = dig(node, "status", "conditions") or []
        ready: dict[str, Any] = next((c for c in conditions if c["type"] == "Ready"), {})
        transition = ready.get("lastTransitionTime") if ready.get("status") == "True" else None
        status = node_status(name, transition or now())
        self.request(
            "PATCH", f"/api/v1/nodes/{name}/status", {"status": {"conditions": status["conditions"]}}, SMP
        )

    def delete(self, name: str) -> None:
        try:
            self.request("DELETE", f"/api/v1/nodes/{name}")
        except ApiException as e:
            if e.status != 404:
                log.warning("delete node %s: %s", name, e.reason)
