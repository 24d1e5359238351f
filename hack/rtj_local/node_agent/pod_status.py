"""Pod status as a kubelet writes it (pods/status): the container waiting, running or terminated,
the Ready conditions, and the phase for pods that do not restart."""

from __future__ import annotations

import logging
from typing import Any

from kubernetes.client.rest import ApiException

from rtj_local.node_agent.pod_state import PodRun, dig, now
from rtj_local.podrun import HOST_IP, POD_IP
from rtj_local.rawapi import SMP, RawApi

log = logging.getLogger("rtj_local.node_agent")


def pod_conditions(ready: bool, reason: str | None = None) -> list[dict[str, Any]]:
    at = now()
    out = [
        {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": at},
        {"type": "Initialized", "status": "True", "lastTransitionTime": at},
    ]
    for type_ in ("ContainersReady", "Ready"):
        cond = {"type": type_, "status": "True" if ready else "False", "lastTransitionTime": at}
        if reason:
            cond["reason"] = reason
        out.append(cond)
    return out


def container_status(run: PodRun, pod: dict[str, Any], state: dict[str, Any], ready: bool) -> dict:
    """The status of the pod's (first and only) container in `state` (`{"running": {...}}`, ...)."""
    container = (dig(pod, "spec", "containers") or [{}])[0]
    state = {"waiting": None, "running": None, "terminated": None, **state}
    return {
        "name": container.get("name", "main"),
        "image": container.get("image", ""),
        "imageID": "",
        "containerID": f"rtj-local://{run.uid}-{run.restart_count}",
        "ready": ready,
        "started": ready,
        "restartCount": run.restart_count,
        "state": state,
    }


class PodStatusReporter:
    """Posts each pod's status through pods/status; a pod deleted meanwhile needs none."""

    def __init__(self, api: RawApi) -> None:
        self.request = api.request

    def patch(self, run: PodRun, status: dict[str, Any]) -> None:
        try:
            self.request(
                "PATCH", f"/api/v1/namespaces/{run.namespace}/pods/{run.name}/status", {"status": status}, SMP
            )
        except ApiException as e:
            if e.status != 404:  # a pod deleted meanwhile needs no status
                log.warning("status of %s/%s: %s %s", run.namespace, run.name, e.status, e.body)

    def waiting(self, run: PodRun, pod: dict[str, Any], reason: str, message: str) -> None:
        waiting = {"waiting": {"reason": reason, "message": message}}
        self.patch(run, {"containerStatuses": [container_status(run, pod, waiting, False)]})

    def running(self, run: PodRun, pod: dict[str, Any], started: str) -> None:
        status = {
            "phase": "Running",
            "podIP": POD_IP,
            "podIPs": [{"ip": POD_IP}],
            "hostIP": HOST_IP,
            "hostIPs": [{"ip": HOST_IP}],
            "startTime": dig(pod, "status", "startTime") or started,
            "conditions": pod_conditions(ready=True),
            "containerStatuses": [container_status(run, pod, {"running": {"startedAt": started}}, True)],
        }
        self.patch(run, status)
        log.info("pod %s/%s running on %s (pid %s, log %s)", run.namespace, run.name, run.node,
                 run.proc.pid if run.proc else None, run.log_path)  # fmt: skip

    def terminated(
        self,
        run: PodRun,
        pod: dict[str, Any],
        exit_code: int,
        reason: str,
        message: str,
        started: str | None = None,
    ) -> None:
        """The container terminated with `exit_code`; the pod's phase is set where it will not restart
        (restartPolicy Never, OnFailure after a success, or a container that could not start)."""
        terminated = {
            "exitCode": exit_code,
            "reason": reason,
            "startedAt": started or now(),
            "finishedAt": now(),
            "containerID": f"rtj-local://{run.uid}-{run.restart_count}",
        }
        if message:
            terminated["message"] = message
        policy = dig(pod, "spec", "restartPolicy") or "Always"
        status: dict[str, Any] = {
            "conditions": pod_conditions(ready=False, reason="PodCompleted"),
            "containerStatuses": [container_status(run, pod, {"terminated": terminated}, False)],
        }
        if policy == "Never" or (policy == "OnFailure" and exit_code == 0) or reason == "StartError":
            status["phase"] = "Succeeded" if exit_code == 0 else "Failed"
        if reason == "StartError" and message:
            status["message"] = message
            status["reason"] = "StartError"
        self.patch(run, status)
        log.info("pod %s/%s terminated: exit %s (%s)", run.namespace, run.name, exit_code, reason)
