"""`python -m rtj [options]`: the operator, exactly as `kopf run -m rtj.handlers [options]` (the
image's entrypoint), preceded by the leader election when RTJ_LEADER_ELECTION_LEASE names its Lease
(the chart runs this with two replicas: rtj.leader_election).

Both take kopf's options (--namespace/--all-namespaces, --liveness, --standalone, --verbose, ...)
and both read the same RTJ_* settings (rtj.settings): nothing depends on which one started it, but
only this one elects a leader. A standby blocks here, before kopf is imported into action; once
leading, kopf runs; when kopf returns (SIGTERM: a clean stop), the Lease is released at once.

`python -m rtj uninstall-cleanup [options]` is not the operator: it undoes what an uninstalled
operator leaves behind, quarantines and finalizers (rtj.uninstall; the chart's post-delete hook).
"""

from __future__ import annotations

import logging
import sys

from kopf import cli

from rtj import leader_election, uninstall
from rtj.settings import Settings


def election(settings: Settings) -> leader_election.Election | None:
    if not settings.leader_election_lease:
        return None
    cfg = leader_election.ElectionConfig(
        lease=settings.leader_election_lease,
        namespace=settings.leader_election_namespace,
        identity=leader_election.ElectionConfig.unique_identity(settings.leader_election_identity),
        lease_seconds=settings.leader_election_lease_seconds,
        renew_deadline_seconds=settings.leader_election_renew_deadline_seconds,
        retry_seconds=settings.leader_election_retry_seconds,
        request_timeout_seconds=min(settings.request_timeout_seconds, settings.leader_election_retry_seconds),
    )
    return leader_election.Election.from_environment(cfg)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == [uninstall.COMMAND]:
        sys.exit(uninstall.main(args[1:]))
    settings = Settings.from_env()
    elected = None if "--help" in args else election(settings)
    if elected is not None:
        # Until kopf configures logging (it would not remove this handler: removed first).
        standby_log = logging.StreamHandler()
        standby_log.setFormatter(logging.Formatter("%(asctime)s [%(levelname)-8s] %(name)s: %(message)s"))
        root = logging.getLogger()
        root.addHandler(standby_log)
        root.setLevel(logging.INFO)
        try:
            elected.wait_until_leading(leader_election.liveness_url(args), settings.metrics_port)
        finally:
            root.removeHandler(standby_log)
        leader_election.set_current(elected)
    try:
        cli.main(args=["run", "-m", "rtj.handlers", *args], prog_name="python -m rtj")
    finally:
        if elected is not None:
            elected.release()


if __name__ == "__main__":
    main()
