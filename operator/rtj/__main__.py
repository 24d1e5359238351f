"""`python -m rtj`: run the operator (same as `kopf run -m rtj.handlers` with our settings)."""

from __future__ import annotations

import logging
import os

import kopf

from rtj import handlers


def main() -> None:
    settings = handlers.SETTINGS
    kopf.configure(debug=settings.log_level == "DEBUG")
    # kopf logs "Timer 'reconcile' succeeded." for every pass of every job at INFO: keep its
    # per-object log for warnings; our own "rtj" loggers keep RTJ_LOG_LEVEL.
    if settings.log_level != "DEBUG":
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    kopf.run(
        clusterwide=not settings.namespaces,
        namespaces=list(settings.namespaces),
        standalone=not settings.peering,
        peering_name=settings.peering or None,
        liveness_endpoint=os.environ.get("RTJ_HEALTH_ENDPOINT", "http://0.0.0.0:8081/healthz"),
    )


if __name__ == "__main__":
    main()
