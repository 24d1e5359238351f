"""A quarantine is lifted by a decision about the node, against the real API server: a node that
booted again since it was quarantined (node auto repair reboots a node in place: same Node object,
same taint, a new status.nodeInfo.bootID) and is healthy again is lifted at once, long before its
check time; a node healthy again without booting again waits for its check."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from operator_harness import (
    OperatorEnv,
    node_quarantine,
    quarantine_taint,
    running,
    set_boot_id,
    set_node_condition,
    until,
)
from rtj import reasons

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

#: Far beyond the test: only a boot ID change can lift a quarantine before it.
QUARANTINE_SECONDS = 86400
GPU_CONDITION = "AcceleratedHardwareReady"


def test_a_node_rebooted_and_healthy_is_lifted_at_once_and_one_only_healthy_again_is_not(
    env: Callable[..., OperatorEnv],
) -> None:
    e = env(nodes=4, RTJ_QUARANTINE_SECONDS=str(QUARANTINE_SECONDS))
    boots = {n: f"{n}-boot-1" for n in e.nodes}
    for n, boot in boots.items():  # as each kubelet reported when it registered
        set_boot_id(e.core, n, boot)
    e.create_job("train", 2)
    t = e.trainers("train")
    until(running(e, "train", 2), t, 90, e.explain("train"))

    # Slot 0's node, then slot 1's, reports a GPU fallen off the bus: each pod is replaced and its
    # node quarantined, the record holding the boot ID the node had then.
    quarantined: list[str] = []
    for slot in (0, 1):
        bad = e.workers("train")[slot].spec.node_name
        set_node_condition(e.core, bad, GPU_CONDITION, "False", "NvidiaXID79Error", "GPU fell off the bus")

        def taken(bad: str = bad) -> bool:
            record = node_quarantine(e.core, bad)
            return quarantine_taint(e.core, bad) is not None and record is not None

        until(taken, t, 60, e.explain("train"))
        until(running(e, "train", 2), t, 60, e.explain("train"))
        quarantined.append(bad)
    rebooted, control = quarantined
    for n in quarantined:
        record = node_quarantine(e.core, n)
        assert record is not None and record.boot_id == boots[n], record
        assert (record.until - record.since).total_seconds() >= QUARANTINE_SECONDS - 60, record

    # The control is healthy again without booting again; the other is rebooted by a repair: a new
    # boot ID while its condition still says the GPU is lost, then healthy.
    set_node_condition(e.core, control, GPU_CONDITION, "True", "NvidiaGPUHealthy", "GPUs healthy")
    set_boot_id(e.core, rebooted, f"{rebooted}-boot-2")
    set_node_condition(e.core, rebooted, GPU_CONDITION, "True", "NvidiaGPUHealthy", "GPUs healthy")
    healthy_at = time.monotonic()

    def lifted() -> bool:
        return quarantine_taint(e.core, rebooted) is None and node_quarantine(e.core, rebooted) is None

    until(lifted, t, 30, lambda: f"{node_quarantine(e.core, rebooted)}\n{e.operator.log_tail(40)}")
    seconds = time.monotonic() - healthy_at
    # The control, healthy and not rebooted, is judged only at its check, a day away.
    taint = quarantine_taint(e.core, control)
    record = node_quarantine(e.core, control)
    assert taint is not None and taint.value == reasons.NODE_UNHEALTHY, taint
    assert record is not None and record.boot_id == boots[control], record
    said = f"boot ID {boots[rebooted]} -> {rebooted}-boot-2"
    until(
        lambda: said in e.operator.log_tail(200),
        t,
        10,
        lambda: f"the operator log names neither boot ID:\n{e.operator.log_tail(40)}",
    )
    assert reasons.NODE_QUARANTINE_LIFTED in next(
        line for line in e.operator.log_tail(200).splitlines() if said in line
    )
    print(f"rebooted node lifted {seconds:.1f}s after it reported healthy (quarantine {QUARANTINE_SECONDS}s)")
