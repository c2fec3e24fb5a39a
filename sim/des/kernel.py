"""The DES's event kernel: the one module that uses SimPy's internals.

The data-parallel DES processes a few hundred thousand events per run, most of
them a worker's compute step, a message end or a shard task. SimPy's public
API spends most of an event's time on bookkeeping around it (a ``Timeout``'s
five attribute stores, ``env.schedule``, ``Environment.step``'s method call and
``try``, ``Process._resume``'s loop); this module does the same work with less
of it, and is the only place that reads or writes SimPy's private state
(``_queue``, ``_eid``, ``_now``, ``_ok``, ``_value``, ``_defused``, ``_resume``,
``_target``, ``_active_proc``). Everything else in :mod:`sim.des` uses the names below and
SimPy's public API. tests/test_des_kernel.py pins each of them against plain
SimPy: the same events, in the same order, with the same ids.

* :class:`Environment`: a ``simpy.Environment`` whose clock ``now`` is a plain
  attribute (SimPy's is a property: a function call per read).
* :func:`run`: ``env.run(until=event)`` with SimPy's step inlined, and timers
  re-armed by the callback that fired them.
* :class:`Timer`, :func:`call_later`, :func:`sleep`, :func:`schedule`: timeouts
  at about half the cost of ``env.timeout``, under the key it would get.
* :class:`Process`: a ``simpy.Process`` whose resume does less per event, with
  one re-armed compute step (:meth:`Process.step`; a yielded float is a direct
  step, which resumes the generator by ``send`` alone).
* :func:`scheduled_events`, :func:`processed_events`: event counts (benchmarks).

Requires SimPy 4 (pyproject bounds it): the queue entry ``(time, priority, id,
event)``, the id counter ``_eid`` and the process protocol (``_resume``,
``_target``, ``_active_proc``) are SimPy 4's.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

import simpy
from simpy.events import NORMAL, EventPriority

SimTime = int | float


class Environment(simpy.Environment):
    """A ``simpy.Environment`` whose clock ``now`` is a plain attribute.

    SimPy keeps the clock in ``_now`` behind a read-only property; the DES reads
    it at nearly every event. Here ``now`` is the clock itself and ``_now`` an
    alias of it (SimPy's own methods keep working). :func:`run` advances it;
    ``env.run`` and ``env.step`` do too. Nothing but the event loop may assign it.
    """

    # Shadows SimPy's property (a class attribute that is no descriptor: the instance's
    # value is read as a plain attribute). Starts as ``initial_time`` (an int 0 by default,
    # as in SimPy: a trace records the first instant as 0).
    now: SimTime = 0  # type: ignore[assignment]

    @property  # type: ignore[override]
    def _now(self) -> SimTime:
        return self.now

    @_now.setter
    def _now(self, t: SimTime) -> None:
        self.now = t

    def schedule(self, event: simpy.Event, priority: EventPriority = NORMAL, delay: SimTime = 0) -> None:
        """SimPy's ``schedule``, reading the clock as an attribute."""
        heapq.heappush(self._queue, (self.now + delay, priority, next(self._eid), event))


def run(env: simpy.Environment, until: simpy.Event) -> None:
    """Process events until ``until`` has been processed.

    The same events in the same order as ``env.run(until=until)``, and the same
    errors: a failed event that no one defused raises a copy of its exception
    (cause: the original), and an empty queue before ``until`` is processed
    raises ``RuntimeError``. An ``until`` processed already returns at once.

    Where SimPy differs: ``env.run`` stops inside ``until``'s callbacks (at the
    one it appended), leaving those registered after the run began, and
    ``until`` itself, rescheduled for a later run; here every callback of
    ``until`` runs and it ends processed. A failed ``until`` raises here only
    if no callback defused it (SimPy: always, the original exception).

    On an :class:`Environment` the loop is SimPy's step inlined: per event a pop,
    the callbacks and the outcome check, without a method call and a ``try`` per
    event; ``until`` is recognised, as SimPy does, by a callback appended to it
    that raises (not by a comparison per event). There, an event with one callback
    that returns a float ``d`` (SimPy ignores what callbacks return; none of
    SimPy's returns a float) is re-armed: scheduled again ``d`` from now, with that
    callback, under the key ``sleep(env, d)`` would give it (a :class:`Timer` that
    fires again without a call or a new object: a task end that starts the next
    task, a direct step of a :class:`Process`; only a timer may be re-armed, as an
    event that failed is not checked then). On a plain ``simpy.Environment`` it steps
    with ``env.step``, which re-arms nothing.
    """
    if until.callbacks is None:  # processed already
        return
    if not isinstance(env, Environment):
        while until.callbacks is not None:
            try:
                env.step()
            except simpy.core.EmptySchedule:
                raise _dry(until) from None
        return
    queue, pop, push = env._queue, heapq.heappop, heapq.heappush
    until.callbacks.append(_stop)
    callbacks: list[Any] = []
    try:
        while True:
            try:
                env.now, _, _, event = pop(queue)
            except IndexError:
                raise _dry(until) from None
            callbacks, event.callbacks = event.callbacks, None  # type: ignore[assignment]
            # nearly every event has one callback: unpacked and called, without len() or a
            # list iterator (a try costs nothing unless it raises). Equivalent: nothing
            # appends to a list taken off its event (see Process)
            try:
                (callback,) = callbacks
            except ValueError as many:
                try:
                    for callback in callbacks:
                        callback(event)
                except BaseException as e:
                    if e.__context__ is many:  # the unpacking's error is no part of a callback's
                        e.__context__ = None
                    raise
            else:
                d = callback(event)
                if type(d) is float:  # re-armed (a timer: it succeeded)
                    if d < 0.0:
                        raise ValueError(f"Negative delay {d}")
                    event.callbacks = callbacks
                    push(queue, (env.now + d, NORMAL, next(env._eid), event))
                    continue
            if not event._ok and not hasattr(event, "_defused"):
                _fail(event)
    except _Stop:  # until's callbacks ran up to _stop
        pass
    finally:
        if until.callbacks is not None:  # not processed (the run failed): _stop taken off
            until.callbacks.remove(_stop)
    for callback in callbacks[callbacks.index(_stop) + 1:]:  # those registered during the run
        callback(until)
    if not until._ok and not hasattr(until, "_defused"):
        _fail(until)


class _Stop(Exception):
    """``until`` has been processed (see :func:`run`)."""


def _stop(_event: Any) -> None:
    raise _Stop


def _fail(event: Any) -> None:
    """A failed event that no one defused: a copy of its exception (cause: the original)."""
    exc = type(event._value)(*event._value.args)
    exc.__cause__ = event._value
    raise exc


def _dry(until: simpy.Event) -> RuntimeError:
    return RuntimeError(f'No scheduled events left but "until" event was not triggered: {until}')


class Timer:
    """An event that fires after a delay, at a fraction of ``simpy.Timeout``'s cost.

    A slotted object with the two attributes SimPy's event loop touches:
    ``callbacks`` (it writes) and ``_ok`` (always true; it reads), with ``_value``
    on the class. A process may yield one (it resumes with None), and ``env.run``,
    ``env.step`` and :func:`run` process it like any event. It is no
    ``simpy.Event``: nothing may ask it ``triggered``/``processed``/``value`` or
    combine it in ``all_of``/``any_of``.
    """

    # _ok in a slot, not on the class: the event loop reads it from every event it processes,
    # and CPython 3.11 specialises a slot's read, not a class attribute's through an instance
    __slots__ = ("callbacks", "_ok")
    _value = None  # what a process that yielded it gets back

    callbacks: list[Callable[[Any], object]] | None

    def __init__(self) -> None:
        self._ok = True  # succeeded, as a Timeout always does
        self.callbacks = None


# A Timer made without the call of __init__ (a Python frame per timer), for the two functions
# below, which set _ok themselves (a slot added to Timer.__init__ must be set there too)
_new_timer = object.__new__


def schedule(env: simpy.Environment, event: Timer | simpy.Event, delay: float) -> None:
    """Put ``event`` on the queue ``delay`` from now, under the key ``env.timeout(delay)``
    would get (``now + delay``, normal priority, the next event id); it fires with the
    callbacks it holds then. For re-armed Timers: a Timer is scheduled again only once
    it has fired (its callbacks taken)."""
    if delay < 0.0:  # (0.0: a float-float comparison, which CPython specialises)
        raise ValueError(f"Negative delay {delay}")
    queue: list[Any] = env._queue
    heapq.heappush(queue, (env.now + delay, NORMAL, next(env._eid), event))


def call_later(env: simpy.Environment, delay: float, callback: Callable[[Any], object]) -> Timer:
    """``env.timeout(delay).callbacks.append(callback)``, with the same queue key."""
    if delay < 0.0:
        raise ValueError(f"Negative delay {delay}")
    t = _new_timer(Timer)
    t._ok = True
    t.callbacks = [callback]
    queue: list[Any] = env._queue
    heapq.heappush(queue, (env.now + delay, NORMAL, next(env._eid), t))
    return t


def sleep(env: simpy.Environment, delay: float) -> Timer:
    """``env.timeout(delay)`` for a process to yield, with the same queue key."""
    if delay < 0.0:
        raise ValueError(f"Negative delay {delay}")
    t = _new_timer(Timer)
    t._ok = True
    t.callbacks = []
    queue: list[Any] = env._queue
    heapq.heappush(queue, (env.now + delay, NORMAL, next(env._eid), t))
    return t


class Process(simpy.Process):
    """A ``simpy.Process`` whose resume does less per event, with a compute step of its own.

    The common case, a succeeded event whose value is sent into the generator and a
    fresh event yielded back, runs here with the generator's ``send`` and the resume
    callback bound once (SimPy binds both anew at every resume); anything else (an
    interrupt or a failed event to throw in, a yielded event that was processed
    already) goes to ``simpy.Process._resume`` at that point, which carries on exactly
    as it would have. The generator's end (or an exception out of it) is handled as
    SimPy does: the process is scheduled as an event with its value.

    Steps: the process has one step Timer, re-armed for each step (a step is armed
    only once the process has resumed, after the previous one fired), that carries its
    resume already. :meth:`step` arms it to resume the generator through ``_resume``.
    A *direct* step resumes it by ``send`` alone (no frame of ``_resume`` between):
    the generator yields the step's delay itself, a float, and is resumed with None
    after it; under :func:`run` on an :class:`Environment` only (its loop re-arms the
    step when ``send`` returns the float; ``_resume`` arms it when it does). Resumed by
    a direct step, the generator runs with no active process set. It must then
    neither end nor raise before it yields again through ``_resume`` (nothing would
    schedule its end; an exception leaves the event loop as it is: the run fails with
    it), and it must pass any event it waits on through :meth:`wait`, which registers
    the resume as ``_resume`` would have. An interrupt puts ``_resume`` back on a
    pending step first, where SimPy's ``Interruption`` looks for it (the interrupt
    resumes the process through ``_resume``); that step then still fires, unwatched,
    so the process must not arm its step again before it has.
    """

    def __init__(self, env: simpy.Environment, generator: Any) -> None:
        super().__init__(env, generator)
        self._send = generator.send
        # equal to ``self._resume`` (an interrupt removes that from the target's callbacks)
        self._resume_cb = self._resume
        self._queue: list[Any] = env._queue
        self._step = Timer()
        # a step's callbacks: one of two lists made once, not a fresh one per step. Nothing
        # mutates them: the event loop only iterates them (it may still be iterating the
        # one the step is re-armed with: unchanged, that is harmless), _resume appends
        # nothing to the step, and interrupt replaces them with a fresh list before SimPy
        # removes _resume from it
        self._by_send: list[Callable[[Any], Any]] = [self._send]
        self._by_resume: list[Callable[[Any], Any]] = [self._resume_cb]

    def step(self, delay: float) -> Timer:
        """The process's step, armed to fire ``delay`` from now (the key ``sleep`` would
        give it) and to resume the generator through ``_resume``, for it to yield."""
        if delay < 0.0:
            raise ValueError(f"Negative delay {delay}")
        t = self._step
        t.callbacks = self._by_resume
        env = self.env
        heapq.heappush(self._queue, (env.now + delay, NORMAL, next(env._eid), t))
        return t

    def wait(self, event: simpy.Event) -> simpy.Event:
        """``event`` (not processed yet), for the generator to yield: where it runs resumed
        by a direct step (no active process is set then: ``_resume`` sets it), its resume
        is registered on ``event`` here (the yield goes to no ``_resume``)."""
        if self.env._active_proc is not self:
            event.callbacks.append(self._resume_cb)
            self._target = event
        return event

    def interrupt(self, cause: Any = None) -> None:
        """``simpy.Process.interrupt``, with ``_resume`` put back on a pending step."""
        target = self._target
        if target is self._step and target.callbacks is not None:
            target.callbacks = [self._resume_cb]  # (its send, if it carried that)
        super().interrupt(cause)

    def _resume(self, event: Any) -> None:
        if not event._ok:  # an interrupt or a failed event: thrown in by SimPy
            simpy.Process._resume(self, event)
            return
        env = self.env
        env._active_proc = self
        try:
            event = self._send(event._value)
        except StopIteration as e:  # the process ended
            self._ok = True
            self._value = e.args[0] if e.args else None
            env.schedule(self)
            event = None
        except BaseException as e:  # the process failed
            self._ok = False
            e.__traceback__ = e.__traceback__.tb_next  # type: ignore[union-attr]
            self._value = e
            env.schedule(self)
            event = None
        else:
            if type(event) is float:  # a direct step (see the class docstring)
                if event < 0.0:  # (fails the run, as a direct step's negative delay does)
                    raise ValueError(f"Negative delay {event}")
                delay, event = event, self._step
                event.callbacks = self._by_send
                heapq.heappush(self._queue, (env.now + delay, NORMAL, next(env._eid), event))
            else:
                callbacks = event.callbacks
                if callbacks is None:  # processed already: SimPy sends its value on
                    simpy.Process._resume(self, event)
                    return
                if event is not self._step:  # (that carries its resume already)
                    callbacks.append(self._resume_cb)
        self._target = event
        env._active_proc = None


def scheduled_events(env: simpy.Environment) -> int:
    """How many events have been scheduled in ``env`` so far (SimPy's event ids handed out).
    It reads the id counter by taking an id and putting a counter from that id in its place:
    nothing may hold on to ``env._eid`` (nothing here does)."""
    n = next(env._eid)
    env._eid = itertools.count(n)  # the id read is handed out again
    return n


def processed_events(env: simpy.Environment) -> int:
    """How many events ``env`` has processed: those scheduled less those still queued."""
    return scheduled_events(env) - len(env._queue)
