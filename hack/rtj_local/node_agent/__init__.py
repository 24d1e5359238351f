"""A kubelet + container runtime stand-in, for LOCAL USE ONLY (tests and `make demo-agent`).

It is not a kubelet, isolates nothing that matters for security, and must never be pointed at a real
cluster. It registers Nodes shaped like EKS p5.48xlarge (full p5 capacity is advertised; the local
CPU demo requests no GPUs), keeps them Ready (node Lease in kube-node-lease + status conditions), and
runs every pod bound to one of them as a local process group:

- each pod in its own mount namespace (`unshare --mount`): private /tmp, a 64 MiB tmpfs /dev/shm
  (containerd's default) unless a memory volume is mounted there, every volume bind-mounted at its
  mountPath (emptyDir -> a per-pod directory; a PVC -> one directory per claim's volume, shared by all
  local nodes; ConfigMap/Secret/downward-API/projected -> files, the ServiceAccount token from the
  TokenRequest API bound to the pod), an /etc/hosts naming every Service `<svc>.<ns>.svc[.cluster.local]`
  at 127.0.0.1;
- host network: pod IP = host IP = 127.0.0.1, KUBERNETES_SERVICE_HOST/PORT = the local apiserver;
- no images: the project's virtualenv is first on PATH (see rtj_local.podrun);
- status through pods/status (Running with containerStatuses, then Terminated with the exit code,
  phase Succeeded/Failed for restartPolicy Never); on deletion SIGTERM to the container's main
  process, SIGKILL to everything in the pod after the grace period, then delete with grace 0.
- `kill_node(name)` simulates a node's death: SIGKILL everything on it and stop renewing its Lease
  and status, so the real node-lifecycle controller marks it NotReady/Unknown and taints it;
  `revive_node(name)` brings it back empty (a repaired node).

All processes of a pod share its mount namespace; that, not the process group, is how "everything in
the pod" is found (torch elastic starts its workers in new sessions).

The agent authenticates with the admin kubeconfig: a real kubelet has a node identity confined by
the Node authorizer; this stand-in does not need one.

The parts: `agent` (NodeAgent: its threads, the pod watch and each pod's run), `node_heartbeat` (the
Nodes, their Leases and status), `pod_inputs` (what a pod's plan needs: volumes, ConfigMaps, Secrets,
ServiceAccount tokens), `pod_status` (pods/status as a kubelet writes it), `cluster_hosts` (the
/etc/hosts every pod sees), `mount_namespaces` (a pod's processes, found by mount namespace),
`pod_state` (what the agent keeps per pod), `cli` (the command line).

CLI: `python -m rtj_local.node_agent run --kubeconfig K --run-dir D --nodes 3` and
`python -m rtj_local.node_agent kill-node --run-dir D NODE`.
"""

from rtj_local.node_agent.agent import DEFAULT_NODE_NAMES, DEFAULT_PREFIX, NodeAgent, request_kill_node
from rtj_local.node_agent.node_heartbeat import AGENT_ANNOTATION, AGENT_LABEL, KUBELET_VERSION

__all__ = [
    "AGENT_ANNOTATION",
    "AGENT_LABEL",
    "DEFAULT_NODE_NAMES",
    "DEFAULT_PREFIX",
    "KUBELET_VERSION",
    "NodeAgent",
    "request_kill_node",
]
