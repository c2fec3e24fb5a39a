"""``python -m runtime PLAN_OR_CONFIG [...]``: the same as ``hetsim run`` (for torchrun -m)."""

import sys

from experiments.cli import main

sys.exit(main(["run", *sys.argv[1:]]))
