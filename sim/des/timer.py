"""Timeouts at a fraction of ``simpy.Timeout``'s cost, for the DES's hot paths.

A DES run creates a timeout for nearly every event it processes (a worker's
compute step, a network settle or wake, a shard task). ``env.timeout(d)``
costs a class call, ``Timeout.__init__`` (five attribute stores into an
instance dict) and ``env.schedule``; :class:`Timer` is a slotted object with
two attributes: ``callbacks``, which SimPy's event loop writes, and ``_ok``
(always true, set once), which it reads; ``_value`` it reads from the class.
It is pushed onto ``env._queue`` with the key
``env.schedule`` would give a ``Timeout`` (``now + delay``, ``NORMAL``, the next
event id), so the events, their order and the event count are those of
``env.timeout``: only the cost of making one changes (about half).

A process may yield a :class:`Timer` (SimPy appends its resume callback to
``callbacks`` and reads ``_ok`` and ``_value`` when it fires), and
``env.run``/``env.step`` process it like any event. It is not a
``simpy.Event``: nothing may ask it ``triggered``/``processed``/``value`` or
combine it in ``all_of``/``any_of``; the DES uses it only where no one does.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

import simpy
from simpy.events import NORMAL


class Timer:
    """An event that fires after a delay; see the module docstring."""

    # _ok in a slot, not on the class: the event loop reads it from every event it processes,
    # and CPython 3.11 specialises a slot's read, not a class attribute's through an instance
    __slots__ = ("callbacks", "_ok")
    _value = None  # what a process that yielded it gets back

    callbacks: list[Callable[[Any], None]] | None

    def __init__(self) -> None:
        self._ok = True  # succeeded, as a Timeout always does


# A Timer made without the call of __init__ (a Python frame per timer), for the two functions
# below, which set _ok themselves (a slot added to Timer.__init__ must be set there too) (callgrind, 64-worker benchmark: ~0.15% of a run's instructions)
_new_timer = object.__new__


def call_later(env: simpy.Environment, delay: float, callback: Callable[[Any], None]) -> Timer:
    """``env.timeout(delay).callbacks.append(callback)``, with the same queue key."""
    if delay < 0.0:  # (0.0: a float-float comparison, which CPython specialises)
        raise ValueError(f"Negative delay {delay}")
    t = _new_timer(Timer)
    t._ok = True
    t.callbacks = [callback]
    queue: list[Any] = env._queue
    heapq.heappush(queue, (env._now + delay, NORMAL, next(env._eid), t))
    return t


def sleep(env: simpy.Environment, delay: float) -> Timer:
    """``env.timeout(delay)`` for a process to yield, with the same queue key."""
    if delay < 0.0:
        raise ValueError(f"Negative delay {delay}")
    t = _new_timer(Timer)
    t._ok = True
    t.callbacks = []
    queue: list[Any] = env._queue
    heapq.heappush(queue, (env._now + delay, NORMAL, next(env._eid), t))
    return t
