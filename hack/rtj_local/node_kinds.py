"""Which nodes run the pods of the e2e tier (RTJ_E2E_NODES):

- `agent` (default): rtj_local.node_agent on fake nodes, each pod a group of host processes (fast, no
  images needed);
- `kubelet`: real kubelet nodes (rtj_local.kubelet_nodes), every pod, the operator included, a container
  of an image `make images` built (`make test-e2e-nodes`).
"""

from __future__ import annotations

from collections.abc import Mapping

ENV = "RTJ_E2E_NODES"
AGENT = "agent"
KUBELET = "kubelet"
KINDS = (AGENT, KUBELET)


def e2e_nodes(environ: Mapping[str, str]) -> str:
    kind = environ.get(ENV) or AGENT
    if kind not in KINDS:
        raise ValueError(f"{ENV} must be one of {', '.join(KINDS)}, not {kind!r}")
    return kind
