"""ft_launcher, imported ahead of need: what a hot spare (TrainerConfig.standby) runs while it waits.

    python -m rtj_trainer.warm_launcher <ft_launcher arguments...>

It imports torch, NVRx's launcher and the training module (RTJ_PREWARM_MODULE, when the command
is `python -m <module>`), then blocks on stdin. A line `go` runs the launcher with its arguments
in this already-warm interpreter, so a promotion skips the launcher's cold `import torch`; the
ranks the launcher starts are new processes, which find the same files in the page cache. End of
input (the entrypoint stopped or died before a promotion) exits 0 without launching.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import time

from .launcher_main import LAUNCHER_MODULE, run_launcher

ENV_PREWARM_MODULE = "RTJ_PREWARM_MODULE"
GO = "go"

log = logging.getLogger("rtj_trainer.warm_launcher")


def prewarm_module(command: list[str]) -> str | None:
    """The module a `python -m <module> ...` command runs (pure; unit-tested)."""
    if len(command) >= 3 and os.path.basename(command[0]).startswith("python") and command[1] == "-m":
        return command[2]
    return None


def main(argv: list[str]) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    t0 = time.monotonic()
    import torch  # noqa: F401  (the point: a promotion finds it imported)

    # Everything the launcher imports stays loaded; the launcher itself runs afresh as __main__
    # (as under `python -m`), so it is dropped again: no second copy of it, whatever the NVRx version.
    importlib.import_module(LAUNCHER_MODULE)
    del sys.modules[LAUNCHER_MODULE]
    module = os.environ.get(ENV_PREWARM_MODULE)
    if module:
        try:
            importlib.import_module(module)
        except Exception as exc:  # a module that cannot be imported here still runs in its ranks
            log.warning("pre-warm import of %s failed (%s): continuing", module, type(exc).__name__)
    log.info("standby: pre-warmed torch, ft_launcher%s in %.2f s", f", {module}" if module else "",
             time.monotonic() - t0)  # fmt: skip
    line = sys.stdin.readline()
    if line.strip() != GO:
        return 0
    # Exactly what a worker runs (rtj_trainer.launcher_main), its imports already loaded.
    run_launcher(argv)  # exits with the launcher's code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
