"""Robotics pipelines on heterogeneous embedded platforms (issue 8).

kernels.py: parallel torch implementations of the robotics algorithms
(particle filter, EKF, occupancy grid, ICP); reference.py: their sequential
NumPy references; pipelines.py: periodic task DAGs built from them.
``hetsim profile --suite robotics`` times the kernels and sets them against the
cost model (hardware_profiles/measured/robotics/; not in measured/ itself,
where every JSON file is loaded as a device profile).
"""
