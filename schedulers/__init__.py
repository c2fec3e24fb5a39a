"""Schedulers: Problem -> Plan, registered by name."""

from schedulers import equal, proportional  # noqa: F401  (registration side effect)
from schedulers.base import Scheduler, largest_remainder, make, names, register, register_lazy

__all__ = ["Scheduler", "largest_remainder", "make", "names", "register", "register_lazy"]
