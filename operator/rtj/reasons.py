"""Condition and Event reasons: CamelCase constants in one place (jobset style).

Each is used both as a condition `reason` and as the Event reason of the transition. Where the
operator names what a pod reports too, the word is the pod's (`rtj.contract.FaultReason`).
"""

from __future__ import annotations

from rtj.contract import FaultReason

# --- Level 1 / 2: soft faults, recovered inside the pod (pods untouched) -----------------------
IN_PROCESS_RESTART = "InProcessRestart"
IN_JOB_RESTART = "InJobRestart"
IN_PLACE_RESTART = "InPlaceRestart"

# --- Level 3: hard faults, the operator replaces one pod ----------------------------------------
HEARTBEAT_TIMEOUT = "HeartbeatTimeout"
STARTUP_TIMEOUT = "StartupTimeout"
LAUNCHER_BUDGET_EXHAUSTED = FaultReason.LAUNCHER_BUDGET_EXHAUSTED
POD_FAILED = "PodFailed"
POD_EVICTED = "PodEvicted"
POD_DELETED = "PodDeleted"
NODE_NOT_READY = "NodeNotReady"
NODE_LOST = "NodeLost"
POD_REPORTED_HARD_FAULT = "PodReportedHardFault"
#: A Node condition says the node's hardware or OS is unhealthy, or its GPU count dropped.
NODE_UNHEALTHY = "NodeUnhealthy"
#: A rank reported an error of the node's hardware (contract.HARDWARE_FAULT_REASONS).
HARDWARE_FAULT = "HardwareFault"
#: The same node failed pods of different jobs within contract.NODE_FAULT_WINDOW_SECONDS.
REPEATED_NODE_FAULTS = "RepeatedNodeFaults"
#: The pod's evidence fits no class: replaced like a pod failure, reported as such, node untouched.
UNCLASSIFIED = "Unclassified"
#: A disruption, not a fault (rtj.ladder.blame): an eviction, preemption, drain or a delete by
#: someone else. The pod is replaced, counted in restarts.disruptions; no fault budget is spent.
POD_DISRUPTED = "PodDisrupted"
#: The pod's launcher gave up waiting for peers the operator knows were not running yet: the pod is
#: recreated, no budget spent, no node suspected.
PEERS_NOT_READY = "PeersNotReady"
#: The pod's peers cannot reach it, nor it them (rtj.ladder.partition's reach probe): replaced, a
#: pod budget spent, no node quarantined.
POD_PARTITIONED = "PodPartitioned"
#: The operator asked a stuck job's pods to probe their peers (rtj.ladder.partition).
REACH_PROBE = "ReachProbe"
#: The trainer container was killed by its own memory limit (the job's sizing, not the node's):
#: the job fails with the limit in the message, as no restart can fix it.
CONTAINER_OOM_KILLED = "ContainerOOMKilled"

# --- Job level: one recovery for a fault that is not the pods' own (rtj.ladder.job_level) ----------
#: The rendezvous pod was lost and is recreated (one job restart; the workers rejoin it).
RENDEZVOUS_LOST = FaultReason.RENDEZVOUS_LOST
#: Workers failed right after the rendezvous pod was lost.
RENDEZVOUS_RESTART = "RendezvousRestart"
#: Several workers failed in the same pass (a shared cause).
PODS_FAILED_TOGETHER = "PodsFailedTogether"
#: Causes of pods replaced at job level: never counted as pod reschedules.
JOB_LEVEL_CAUSES = frozenset({RENDEZVOUS_RESTART, PODS_FAILED_TOGETHER})
JOB_RESTART_BUDGET_EXHAUSTED = "JobRestartBudgetExhausted"

# --- Level 4: the job ends ------------------------------------------------------------------------
POD_RESCHEDULE_BUDGET_EXHAUSTED = "PodRescheduleBudgetExhausted"
DO_NOT_RESTART_EXIT_CODE = "DoNotRestartExitCode"
ALL_PODS_SUCCEEDED = "AllPodsSucceeded"
#: rtj.ladder.training_finished: a worker pod exited 0 and a slot that faulted after its ranks had
#: finished was stopped, not replaced (Succeeded's reason) ...
TRAINING_FINISHED = "TrainingFinished"
#: ... or a slot was stopped before its ranks finished (Failed's reason; the Event of a stopped slot
#: without a pod).
TRAINING_INCOMPLETE = "TrainingIncomplete"
INVALID_SPEC = "InvalidSpec"
#: A pod reported a fault of severity Permanent (a checkpoint of another world size, a bad
#: config): deterministic, so the job fails on the first report; no pod replaced, no node quarantined.
PERMANENT_FAULT = "PermanentFault"

# --- Waiting, not failing (condition Waiting; rtj.ladder.blame) ---------------------------------------
#: Pods the scheduler cannot place (the scheduler's message): waiting for capacity.
UNSCHEDULABLE = "Unschedulable"
#: The kubelet retries pulling the image (ErrImagePull, ImagePullBackOff) ...
IMAGE_PULL_RETRYING = "ImagePullRetrying"
#: ... and gave up: an invalid image name at once, else still failing after imagePullTimeoutSeconds.
IMAGE_PULL_FAILED = "ImagePullFailed"
#: The container cannot be created from its config (a missing Secret or ConfigMap) ...
CONFIG_WAITING = "CreateContainerConfigError"
#: ... still so after the bound: the job fails naming it.
CONFIG_FAILED = "ContainerConfigFailed"
NOT_WAITING = "NotWaiting"

# --- The API server refused a create (403, ...): condition type, Event reason (rtj.ladder.create_refusals)
CREATE_REFUSED = "CreateRefused"
CREATES_ACCEPTED = "CreatesAccepted"

# --- The heartbeat budget (rtj.ladder.heartbeat_budget): condition type and Event reason -------------
#: The operator's budget of heartbeat writes (RTJ_HEARTBEAT_WRITES_PER_SECOND) cannot be met within a
#: third of the job's heartbeatTimeoutSeconds: its pods renew at that bound, above the budget.
HEARTBEAT_BUDGET_EXCEEDED = "HeartbeatBudgetExceeded"
HEARTBEAT_BUDGET_MET = "HeartbeatBudgetMet"

# --- Progress watchdog (rtj.ladder.progress_watchdog): condition Stalled, then the job fails -------
STALLED = "Stalled"
PROGRESSING = "Progressing"
NO_PROGRESS = FaultReason.NO_PROGRESS

# --- Lifecycle --------------------------------------------------------------------------------------
PODS_PENDING = "PodsPending"
#: Every pod runs, some have not sent their first heartbeat yet.
PODS_STARTING = "PodsStarting"
#: Every pod runs, some no longer heartbeat (Lease missing, silence held): not known to train.
PODS_NOT_HEARTBEATING = "PodsNotHeartbeating"
#: Most slots' heartbeats stale at once: replacements held (see ladder.decide).
HEARTBEATS_STALE = "HeartbeatsStale"
ALL_PODS_RUNNING = "AllPodsRunning"
POD_RESCHEDULED = "PodRescheduled"
RECOVERED = "Recovered"
NOT_RECOVERING = "NotRecovering"
NODE_QUARANTINED = "NodeQuarantined"
#: A job's evidence added to a node already quarantined (by another job, or earlier).
NODE_QUARANTINE_EXTENDED = "NodeQuarantineExtended"
#: The quarantine was lifted (rtj.ladder.quarantine: the node showed no evidence at its check).
NODE_QUARANTINE_LIFTED = "NodeQuarantineLifted"
#: A pod fault without node evidence recorded on the node (for RepeatedNodeFaults across jobs).
NODE_FAULT_RECORDED = "NodeFaultRecorded"
SPARE_PROMOTED = "SparePromoted"
#: A pod the API no longer knows still heartbeats for an old attempt of its slot: fenced
#: (rtj.ladder.fencing), it stops itself.
STALE_POD_FENCED = "StalePodFenced"
SUSPENDED = "Suspended"
RESUMED = "Resumed"
#: Kueue (rtj.ladder.kueue_admission): a labelled job waits for its Workload's admission, or its
#: admitted Workload was evicted (pods stopped as by a suspend; it queues again).
WAITING_FOR_ADMISSION = "WaitingForAdmission"
WORKLOAD_EVICTED = "WorkloadEvicted"
FINISHED = "Finished"

#: Pod causes (the builders' CAUSE annotation): a pod created for these is not a reschedule.
CAUSE_INITIAL = "Initial"
CAUSE_RESUME = "Resume"
NON_FAULT_CAUSES = frozenset({CAUSE_INITIAL, CAUSE_RESUME})

# --- Ladder levels (metric label `level`, status recoveringLevel) -----------------------------------
LEVEL_IN_PROCESS = "InProcess"
LEVEL_IN_JOB = "InJob"
#: Level 2b: the pod restarted in place on its node (rtj.ladder.in_place).
LEVEL_IN_PLACE = "InPlace"
LEVEL_POD = "Pod"
LEVEL_JOB = "Job"
#: Not a level: pods replaced after a disruption (metric label `level`; no budget).
LEVEL_DISRUPTION = "Disruption"
