"""``python -m runtime PLAN_OR_CONFIG [...]``: the same as ``hetsim run`` (for torchrun -m).

Every rank leaves with ``os._exit`` once its output is flushed, as the spawned ranks
of ``hetsim run`` do (``runtime.launch``): a PS shard's receiver thread is blocked
inside gloo, and a normal interpreter exit tears it down with ``terminate called
without an active exception`` (SIGABRT) in some runs (4 of 6 tries of a 3-rank
torchrun of v1 on 2026-11-30, after the files were written).
"""

import os
import sys

from experiments.cli import main

code = main(["run", *sys.argv[1:]])
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
