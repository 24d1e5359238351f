"""Per-pod CPU and memory defaults by EC2 instance type (one training pod per node).

Each default leaves room on the node for the kubelet's reservation and the usual DaemonSets (CNI,
kube-proxy, the NVIDIA and EFA device plugins, a log/metrics agent): about 12 of the vCPUs and 12% of
the memory. Requests equal limits, so the pods are Guaranteed. An instance type not listed has no
default: set spec.resources.cpu and memory (otherwise the pods are BestEffort).
"""

from __future__ import annotations

from typing import NamedTuple


class PodShape(NamedTuple):
    cpu: str
    memory: str


#: vCPUs / memory of the instance -> what one pod requests and is limited to.
INSTANCE_DEFAULTS: dict[str, PodShape] = {
    "p5.48xlarge": PodShape("180", "1800Gi"),  # 192 vCPUs, 2048 GiB, 8 H100
    "p5e.48xlarge": PodShape("180", "1800Gi"),  # 192 vCPUs, 2048 GiB, 8 H200
    "p5en.48xlarge": PodShape("180", "1800Gi"),  # 192 vCPUs, 2048 GiB, 8 H200
    "p4d.24xlarge": PodShape("88", "1000Gi"),  # 96 vCPUs, 1152 GiB, 8 A100
    "p4de.24xlarge": PodShape("88", "1000Gi"),  # 96 vCPUs, 1152 GiB, 8 A100 80 GB
}


def instance_defaults_text() -> str:
    """The table as one line of documentation (for the CRD's descriptions)."""
    return "; ".join(f"{t}: {s.cpu} CPUs, {s.memory}" for t, s in INSTANCE_DEFAULTS.items())
