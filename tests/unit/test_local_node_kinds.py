"""Which nodes the e2e tier runs its pods on (RTJ_E2E_NODES): the node agent or kubelet nodes."""

from __future__ import annotations

import pytest
from rtj_local import node_kinds

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("environ", "kind"),
    [({}, node_kinds.AGENT), ({"RTJ_E2E_NODES": "agent"}, node_kinds.AGENT),
     ({"RTJ_E2E_NODES": "kubelet"}, node_kinds.KUBELET), ({"RTJ_E2E_NODES": ""}, node_kinds.AGENT)],
    ids=["unset", "agent", "kubelet", "empty"],
)  # fmt: skip
def test_e2e_nodes_kind_from_the_environment(environ: dict[str, str], kind: str) -> None:
    assert node_kinds.e2e_nodes(environ) == kind


def test_an_unknown_kind_is_refused_naming_the_variable() -> None:
    with pytest.raises(ValueError, match=r"RTJ_E2E_NODES must be one of agent, kubelet, not 'kwok'"):
        node_kinds.e2e_nodes({"RTJ_E2E_NODES": "kwok"})
