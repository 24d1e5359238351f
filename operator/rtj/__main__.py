"""`python -m rtj [options]`: the operator, exactly as `kopf run -m rtj.handlers [options]` (the
image's entrypoint, which the chart runs).

Both take kopf's options (--namespace/--all-namespaces, --liveness, --standalone, --verbose, ...)
and both read the same RTJ_* settings (rtj.settings): nothing depends on which one started it.
"""

from __future__ import annotations

import sys

from kopf import cli


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    cli.main(args=["run", "-m", "rtj.handlers", *args], prog_name="python -m rtj")


if __name__ == "__main__":
    main()
