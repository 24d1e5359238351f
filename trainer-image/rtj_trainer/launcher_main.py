"""ft_launcher as `python -m`, with the job's rendezvous kept open when this launcher leaves.

    python -m rtj_trainer.launcher_main <ft_launcher arguments...>

See `nvrx_compat.keep_rendezvous_open` for why. Everything else is NVRx's launcher, run as __main__.
"""

from __future__ import annotations

import runpy
import sys

from . import nvrx_compat
from .warm_launcher import LAUNCHER_MODULE


def run_launcher(argv: list[str]) -> None:
    """Run NVRx's launcher in this interpreter with `argv`; exits with the launcher's code."""
    nvrx_compat.keep_rendezvous_open()
    sys.argv = [sys.argv[0], *argv]
    runpy.run_module(LAUNCHER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    run_launcher(sys.argv[1:])
