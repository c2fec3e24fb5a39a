"""`rl`: the HeterPS method, a policy trained with masked PPO that places layers on device types.

Importing this package registers the gymnasium environment
``hetsim/Placement-v0`` (schedulers/rl/env.py). torch and stable-baselines3
load only with the scheduler (schedulers/rl/scheduler.py) and the trainer
(schedulers/rl/train.py).
"""

import gymnasium

ENV_ID = "hetsim/Placement-v0"

if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point="schedulers.rl.env:PlacementEnv")

__all__ = ["ENV_ID"]
