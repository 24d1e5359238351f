"""`python -m rtj`: run the operator (same as `kopf run -m rtj.handlers` with our settings)."""

from __future__ import annotations

import os

import kopf

from rtj import handlers


def main() -> None:
    settings = handlers.SETTINGS
    kopf.configure(debug=settings.log_level == "DEBUG")
    kopf.run(
        clusterwide=not settings.namespaces,
        namespaces=list(settings.namespaces),
        standalone=not settings.peering,
        peering_name=settings.peering or None,
        liveness_endpoint=os.environ.get("RTJ_HEALTH_ENDPOINT", "http://0.0.0.0:8081/healthz"),
    )


if __name__ == "__main__":
    main()
