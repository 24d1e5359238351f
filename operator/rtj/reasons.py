"""Condition and Event reasons: CamelCase constants in one place (jobset style).

Each is used both as a condition `reason` and as the Event reason of the transition.
"""

from __future__ import annotations

# --- Level 1 / 2: soft faults, recovered inside the pod (pods untouched) -----------------------
IN_PROCESS_RESTART = "InProcessRestart"
IN_JOB_RESTART = "InJobRestart"

# --- Level 3: hard faults, the operator replaces one pod ----------------------------------------
HEARTBEAT_TIMEOUT = "HeartbeatTimeout"
STARTUP_TIMEOUT = "StartupTimeout"
LAUNCHER_BUDGET_EXHAUSTED = "LauncherBudgetExhausted"
POD_FAILED = "PodFailed"
POD_EVICTED = "PodEvicted"
POD_DELETED = "PodDeleted"
NODE_NOT_READY = "NodeNotReady"
NODE_LOST = "NodeLost"
POD_REPORTED_HARD_FAULT = "PodReportedHardFault"
RENDEZVOUS_LOST = "RendezvousLost"
#: Hard-fault reasons that point at the node (the node is quarantined when the spec asks for it).
NODE_SUSPECT = frozenset(
    {
        HEARTBEAT_TIMEOUT,
        STARTUP_TIMEOUT,
        NODE_NOT_READY,
        NODE_LOST,
        POD_REPORTED_HARD_FAULT,
        LAUNCHER_BUDGET_EXHAUSTED,
    }
)

# --- Level 4: the job ends ------------------------------------------------------------------------
POD_RESCHEDULE_BUDGET_EXHAUSTED = "PodRescheduleBudgetExhausted"
DO_NOT_RESTART_EXIT_CODE = "DoNotRestartExitCode"
ALL_PODS_SUCCEEDED = "AllPodsSucceeded"
INVALID_SPEC = "InvalidSpec"

# --- Lifecycle --------------------------------------------------------------------------------------
PODS_PENDING = "PodsPending"
#: Most slots' heartbeats stale at once: replacements held (see ladder.decide).
HEARTBEATS_STALE = "HeartbeatsStale"
ALL_PODS_RUNNING = "AllPodsRunning"
POD_RESCHEDULED = "PodRescheduled"
RECOVERED = "Recovered"
NOT_RECOVERING = "NotRecovering"
NODE_QUARANTINED = "NodeQuarantined"
SPARE_PROMOTED = "SparePromoted"
SUSPENDED = "Suspended"
RESUMED = "Resumed"
FINISHED = "Finished"

#: Pod causes (the builders' CAUSE annotation): a pod created for these is not a reschedule.
CAUSE_INITIAL = "Initial"
CAUSE_RESUME = "Resume"
NON_FAULT_CAUSES = frozenset({CAUSE_INITIAL, CAUSE_RESUME})

# --- Ladder levels (metric label `level`, status recoveringLevel) -----------------------------------
LEVEL_IN_PROCESS = "InProcess"
LEVEL_IN_JOB = "InJob"
LEVEL_POD = "Pod"
