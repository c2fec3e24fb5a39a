"""Where a worker's time goes: computing, blocked on its own transfers, or waiting."""

from __future__ import annotations

#: a worker's states: computing, blocked (on its transfers or on others), failed
COMPUTE, BLOCKED, DONE = 0, 1, 2
#: :meth:`WorkerTime.advance`'s ``state`` that leaves the state as it is
KEEP = -1


class WorkerTime:
    """Per-worker time split: compute, blocked on own transfers (comm), blocked otherwise (wait).

    Its owner calls :meth:`advance` with the current time at every change of its
    state or of its messages in flight (``inflight``), so that the time since the
    previous call is counted under the split that held during it: ``compute``
    while it computes, ``comm`` while it is blocked with messages in flight,
    ``wait`` while it is blocked with none (a failed worker's time is counted no
    more). It runs at every message end and compute step of a run: every argument
    is passed (no defaults to fill in).
    """

    __slots__ = ("state", "t", "inflight", "compute", "comm", "wait")

    def __init__(self) -> None:
        self.state = BLOCKED
        self.t = 0.0
        self.inflight = 0
        self.compute = 0.0
        self.comm = 0.0
        self.wait = 0.0

    def advance(self, now: float, messages: int, state: int) -> None:
        """Count the time since the previous call (at ``t``) under the current split;
        then ``messages`` more are in flight (fewer where negative) and the state is
        ``state`` (:data:`KEEP`: unchanged)."""
        dt = now - self.t
        self.t = now
        if self.state == COMPUTE:
            self.compute += dt
        elif self.state == BLOCKED:
            if self.inflight > 0:
                self.comm += dt
            else:
                self.wait += dt
        self.inflight += messages
        if state != KEEP:
            self.state = state
