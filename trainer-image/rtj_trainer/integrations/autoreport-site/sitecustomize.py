"""Runs at the start of every Python process the pod's ranks are (the entrypoint puts this
directory first on their PYTHONPATH): installs `rtj_trainer.integrations.autoreport`, then runs
the `sitecustomize` this one shadows, if any. Stdlib only until torch is imported."""

import importlib.machinery
import importlib.util
import os
import sys


def _install() -> None:
    try:
        from rtj_trainer.integrations.autoreport import install_on_import

        install_on_import()
    except Exception as exc:  # a rank must train without it
        print(f"rtj autoreport not installed: {exc!r}", file=sys.stderr)


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_install()
_chain()
