"""The escalation ladder: pure decisions (no I/O, clock passed in)."""

from rtj.ladder.actions import (
    Action,
    AssignLease,
    CreateRendezvousPod,
    CreateRendezvousService,
    CreateSparePod,
    CreateWorkerPod,
    CreateWorkload,
    DeleteJob,
    DeletePod,
    JobEvent,
    PatchWorkloadStatus,
    PromoteSpare,
    RecordNodeFault,
    RecoveryObserved,
    RestartObserved,
    TaintNode,
)
from rtj.ladder.decide import decide
from rtj.ladder.observe import (
    OBSERVED_AT,
    LeaseObs,
    NodeObs,
    Observed,
    PodObs,
    lease_from_dict,
    node_from_dict,
    pod_from_dict,
)
from rtj.ladder.pass_state import Decision, LadderConfig
from rtj.ladder.summary import goodput

__all__ = [
    "OBSERVED_AT",
    "Action",
    "AssignLease",
    "CreateRendezvousPod",
    "CreateRendezvousService",
    "CreateSparePod",
    "CreateWorkerPod",
    "CreateWorkload",
    "Decision",
    "DeleteJob",
    "DeletePod",
    "JobEvent",
    "LadderConfig",
    "LeaseObs",
    "NodeObs",
    "Observed",
    "PatchWorkloadStatus",
    "PodObs",
    "PromoteSpare",
    "RecordNodeFault",
    "RecoveryObserved",
    "RestartObserved",
    "TaintNode",
    "decide",
    "goodput",
    "lease_from_dict",
    "node_from_dict",
    "pod_from_dict",
]
