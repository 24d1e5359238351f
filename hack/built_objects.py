"""Prints, as one YAML stream, every object the operator builds for the given job manifests: worker,
hot-spare and rendezvous pods, the rendezvous Service and, for FSx jobs, the PV and PVC. Used by
hack/audit.sh to run third-party checkers on what the operator really sends (rtj.builders, with the
API models' defaults applied, as the API server's CRD defaults would). A script, not part of rtj_local,
which plays the cluster and may import only the contract:

    .venv/bin/python hack/built_objects.py examples/*.yaml > built.yaml
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from rtj import builders
from rtj.api.models import ResilientTrainingJob
from rtj.contract import KIND

NAMESPACE = "ml"
UID = "00000000-0000-0000-0000-000000000001"  # the API server assigns one; the owner references need it


def objects_of(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    manifest = {**manifest, "metadata": {"namespace": NAMESPACE, **manifest["metadata"], "uid": UID}}
    job = ResilientTrainingJob.model_validate(manifest)
    built = [
        builders.worker_pod(job, 0, 0, "Initial"),
        builders.spare_pod(job, 0, 0),  # what a hot spare would be, even where the example asks for none
        builders.rendezvous_pod(job),
        builders.rendezvous_service(job),
        builders.fsx_persistent_volume(job),
        builders.fsx_persistent_volume_claim(job),
    ]
    return [obj for obj in built if obj is not None]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifests", nargs="+", type=Path, help="YAML files (their jobs)")
    args = parser.parse_args(argv)
    jobs = [d for p in args.manifests for d in yaml.safe_load_all(p.read_text()) if d and d["kind"] == KIND]
    docs = [obj for job in jobs for obj in objects_of(job)]
    yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
