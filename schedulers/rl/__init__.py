"""`rl`: the HeterPS method, a policy trained with masked PPO that places layers on device types;
`rl-dag`: a policy that picks units for the tasks of a DAG (robotics pipelines, issue 8).

Importing this package registers the gymnasium environments
``hetsim/Placement-v0`` (schedulers/rl/env.py) and ``hetsim/DagSchedule-v0``
(schedulers/rl/dag_env.py). torch and stable-baselines3 load only with the
schedulers (schedulers/rl/scheduler.py, dag_scheduler.py) and the trainers
(schedulers/rl/train.py, dag_train.py).
"""

import gymnasium

ENV_ID = "hetsim/Placement-v0"
DAG_ENV_ID = "hetsim/DagSchedule-v0"

if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point="schedulers.rl.env:PlacementEnv")
if DAG_ENV_ID not in gymnasium.registry:
    gymnasium.register(id=DAG_ENV_ID, entry_point="schedulers.rl.dag_env:DagScheduleEnv")

__all__ = ["DAG_ENV_ID", "ENV_ID"]
