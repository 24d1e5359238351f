"""The node agent's command line: `run` (register nodes and run their pods until SIGTERM/SIGINT) and
`kill-node` (ask a running agent, by its run dir, to simulate the death of one of its nodes)."""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import threading
from pathlib import Path

from rtj_local.node_agent.agent import DEFAULT_PREFIX, NodeAgent, request_kill_node


def main(argv: list[str] | None = None) -> None:
    from rtj_local import node_agent  # the package's docstring, imported in full by now

    parser = argparse.ArgumentParser(
        prog="python -m rtj_local.node_agent", description=(node_agent.__doc__ or "").split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="register nodes and run their pods until SIGTERM/SIGINT")
    run.add_argument("--kubeconfig", required=True, type=Path)
    run.add_argument("--run-dir", required=True, type=Path)
    run.add_argument("--nodes", type=int, default=3)
    run.add_argument("--prefix", default=DEFAULT_PREFIX)
    kill = sub.add_parser("kill-node", help="simulate the death of a node of a running agent")
    kill.add_argument("--run-dir", required=True, type=Path)
    kill.add_argument("node")
    args = parser.parse_args(argv)
    if args.command == "kill-node":
        request_kill_node(args.run_dir, args.node)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    agent = NodeAgent(args.kubeconfig, args.run_dir, [f"{args.prefix}{i}" for i in range(args.nodes)])
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    agent.start()
    done.wait()
    agent.stop()
    shutil.rmtree(args.run_dir / "control", ignore_errors=True)
