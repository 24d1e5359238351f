"""`python -m rtj_local.node_agent`: see rtj_local.node_agent.cli."""

from rtj_local.node_agent.cli import main

main()
