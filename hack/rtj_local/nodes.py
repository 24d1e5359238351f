"""Fake EKS p5.48xlarge Nodes.

`p5_node()` is a pure function returning the Node manifest (a dict), as EKS and the NVIDIA device
plugin / GPU feature discovery would label it. KWOK simulates nodes carrying `KWOK_ANNOTATION`; the
local node agent simulates nodes carrying its own annotation instead, using the same builder.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

# Nodes with this annotation are managed by KWOK (`--manage-nodes-with-annotation-selector`).
KWOK_ANNOTATION_KEY = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
KWOK_ANNOTATIONS: Mapping[str, str] = {KWOK_ANNOTATION_KEY: KWOK_ANNOTATION_VALUE}
# KWOK also requires this label (`--manage-nodes-with-label-selector`). Unlike the annotation (filtered
# inside KWOK, never re-evaluated), a label selector is evaluated by the API server: removing the label
# makes KWOK drop the node and stop renewing its Lease, so the node goes NotReady like a dead machine
# (see LocalCluster.stop_node_heartbeat). Added by p5_node() to every node carrying KWOK_ANNOTATIONS.
KWOK_HEARTBEAT_LABEL = "rtj.local/kwok-heartbeat"

INSTANCE_TYPE = "p5.48xlarge"
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
# A pod needs this toleration to land on a p5 node.
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}

DEFAULT_REGION = "us-east-1"
DEFAULT_ZONES: tuple[str, ...] = ("us-east-1a", "us-east-1b", "us-east-1c")
DEFAULT_NODEGROUP = "p5-training"

P5_RESOURCES: Mapping[str, str] = {
    "cpu": "192",
    "memory": "2048Gi",
    "pods": "110",
    "ephemeral-storage": "28000Gi",  # 8 x 3.84 TB local NVMe
    GPU_RESOURCE: "8",
    EFA_RESOURCE: "32",
    "hugepages-1Gi": "0",
    "hugepages-2Mi": "0",
}


def _instance_id(name: str) -> str:
    return "i-0" + hashlib.sha256(name.encode()).hexdigest()[:16]


def p5_node(
    name: str,
    zone: str = DEFAULT_ZONES[0],
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    region: str = DEFAULT_REGION,
    nodegroup: str = DEFAULT_NODEGROUP,
) -> dict:
    """Node manifest of an EKS p5.48xlarge. `annotations` default to KWOK's (then the KWOK heartbeat
    label is added too); `labels` are added last (so they can override any default). Capacity equals
    allocatable; the API server keeps status on create, and KWOK's node-initialize stage preserves it."""
    node_labels = {
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        "kubernetes.io/hostname": name,
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/instance-type": INSTANCE_TYPE,
        "node.kubernetes.io/instance-type": INSTANCE_TYPE,
        "topology.kubernetes.io/region": region,
        "topology.kubernetes.io/zone": zone,
        "failure-domain.beta.kubernetes.io/region": region,
        "failure-domain.beta.kubernetes.io/zone": zone,
        "eks.amazonaws.com/nodegroup": nodegroup,
        "eks.amazonaws.com/capacityType": "ON_DEMAND",
        "k8s.io/cloud-provider-aws": "rtj-local",
        "vpc.amazonaws.com/efa.present": "true",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.memory": "81559",
    }
    node_annotations = dict(KWOK_ANNOTATIONS if annotations is None else annotations)
    if node_annotations.get(KWOK_ANNOTATION_KEY) == KWOK_ANNOTATION_VALUE:
        node_labels[KWOK_HEARTBEAT_LABEL] = "true"
    node_labels.update(labels or {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": node_labels,
            "annotations": node_annotations,
        },
        "spec": {
            "providerID": f"aws:///{zone}/{_instance_id(name)}",
            "taints": [dict(GPU_TAINT)],
        },
        "status": {
            "capacity": dict(P5_RESOURCES),
            "allocatable": dict(P5_RESOURCES),
        },
    }


def p5_nodes(
    count: int,
    prefix: str = "p5-",
    zones: Sequence[str] = DEFAULT_ZONES,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> list[dict]:
    """`count` nodes named <prefix>0, <prefix>1, ..., spread round-robin over `zones`."""
    return [
        p5_node(f"{prefix}{i}", zone=zones[i % len(zones)], annotations=annotations, labels=labels)
        for i in range(count)
    ]


def schedulable(node: Mapping[str, Any] | None) -> bool:
    """A Node (as the API returns it; None: absent) is Ready and carries none of the node lifecycle
    controller's `node.kubernetes.io/*` taints (not-ready, unreachable, ...): pods can land on it."""
    if node is None:
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    taints = (node.get("spec") or {}).get("taints") or []
    return ready and not any(str(t.get("key", "")).startswith("node.kubernetes.io/") for t in taints)
