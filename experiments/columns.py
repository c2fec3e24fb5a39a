"""The columns of a sweep's ``results.csv`` that are not its axes: shared by the sweep
(:mod:`experiments.sweep`, which writes the table) and the plots (:mod:`experiments.plots`,
which read it). A training sweep's metric columns are :data:`sim.result.HEADLINE_KEYS`."""

#: Every row's first columns (the axes follow ``point_id``).
FIXED_COLUMNS = ("point_id", "status", "error")
#: results.csv metric columns of a robotics sweep (experiments.dag_runner's rows).
#: (The deadline is the config's ``deadline_ms``: a column when swept, not repeated here.)
DAG_HEADLINE = ("scheduler", "mode", "plan_feasible", "plan_frame_ms", "plan_effects_ms", "plan_energy_mj",
                "plan_s", "des_miss_rate", "miss_tolerance", "des_miss_ok", "des_latency_p99_ms", "des_energy_mj")
