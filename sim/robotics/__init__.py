"""Robotics pipelines on heterogeneous embedded platforms (issue 8).

kernels.py: parallel torch implementations of the robotics algorithms
(particle filter, EKF, occupancy grid, ICP); reference.py: their sequential
NumPy references; pipelines.py: periodic task DAGs built from them.
"""
