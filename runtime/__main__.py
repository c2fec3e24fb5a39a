"""``python -m runtime PLAN_OR_CONFIG [...]``: the same as ``hetsim run`` (for torchrun -m).

Every rank leaves with ``os._exit`` once its output is flushed, as the spawned ranks
of ``hetsim run`` do (``runtime.launch``): a PS shard's receiver thread is blocked
inside gloo, and a normal interpreter exit can tear it down with ``terminate called
without an active exception`` (SIGABRT) after the files were written.
"""

import os
import sys

from experiments.cli import main

code = main(["run", *sys.argv[1:]])
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
