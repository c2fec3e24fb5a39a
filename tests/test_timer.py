"""sim.des.kernel's timers: a Timer is scheduled, ordered, counted and processed exactly as the
``simpy.Timeout`` it stands in for (the DES's outputs are byte-identical either way)."""

from __future__ import annotations

from typing import Any

import pytest
import simpy

from sim.des.kernel import Timer, call_later, sleep
from sim.des.kernel import run as run_until


def _trace(use_timer: bool) -> tuple[list[tuple[float, str]], list[Any]]:
    """Callbacks at equal and distinct times, zero delays, and a process yielding its
    sleeps, interleaved; returns what ran when and the queue keys after setup."""
    env = simpy.Environment()
    log: list[tuple[float, str]] = []

    def later(delay: float, tag: str) -> None:
        cb = lambda _e: log.append((env.now, tag))  # noqa: E731
        if use_timer:
            call_later(env, delay, cb)
        else:
            env.timeout(delay).callbacks.append(cb)

    def proc() -> Any:
        for k, d in enumerate((0.5, 0, 1.0, 0.25)):
            yield sleep(env, d) if use_timer else env.timeout(d)
            log.append((env.now, f"p{k}"))
            later(0, f"z{k}")

    later(1.0, "a")
    later(0.5, "b")
    later(1.0, "c")
    later(0, "d")
    env.process(proc())
    keys = [(t, prio, eid) for t, prio, eid, _ in sorted(env._queue)]
    env.run()
    return log, keys + [next(env._eid)]


def test_same_keys_same_order_same_count_as_timeouts() -> None:
    assert _trace(True) == _trace(False)


def test_run_until_and_a_process_waiting_on_a_timer() -> None:
    env = simpy.Environment()
    done = env.event()
    seen: list[float] = []

    def proc() -> Any:
        yield sleep(env, 2.0)
        seen.append(env.now)
        done.succeed()

    env.process(proc())
    run_until(env, done)
    assert seen == [2.0] and env.now == 2.0


def test_an_interrupted_process_leaves_its_timer() -> None:
    env = simpy.Environment()
    seen: list[tuple[float, str]] = []

    def proc() -> Any:
        try:
            yield sleep(env, 5.0)
            seen.append((env.now, "slept"))
        except simpy.Interrupt:
            seen.append((env.now, "interrupted"))

    p = env.process(proc())
    call_later(env, 1.0, lambda _e: p.interrupt())
    env.run()
    assert seen == [(1.0, "interrupted")] and env.now == 5.0  # the timer still fires, unwatched


def test_negative_delay_is_refused() -> None:
    env = simpy.Environment()
    with pytest.raises(ValueError):
        call_later(env, -1.0, lambda _e: None)
    with pytest.raises(ValueError):
        sleep(env, -1e-9)
    assert isinstance(sleep(env, 0.0), Timer)


def _process_trace(make: Any) -> tuple[list[tuple[float, str]], Any, int]:
    """What a process sees and returns, and the events scheduled, run by ``make(env, gen)``:
    timers, a processed event, a failed event it catches, an interrupt, its return value."""
    env = simpy.Environment()
    log: list[tuple[float, str]] = []
    done = env.event()
    done.succeed("early")

    def proc() -> Any:
        yield sleep(env, 1.0)
        log.append((env.now, "slept"))
        got = yield done  # processed by now: its value comes back at once
        log.append((env.now, f"got {got}"))
        bad = env.event()
        call_later(env, 0.5, lambda _e: bad.fail(ValueError("boom")))
        try:
            yield bad
        except ValueError as e:
            log.append((env.now, f"caught {e}"))
        try:
            yield sleep(env, 10.0)
        except simpy.Interrupt as e:
            log.append((env.now, f"interrupted {e.cause}"))
        yield env.timeout(0.25)
        return "end"

    p = make(env, proc())
    call_later(env, 1.0, lambda _e: None)
    call_later(env, 3.0, lambda _e: p.interrupt("stop"))
    env.run()
    return log, p.value, next(env._eid)


def test_engine_process_behaves_as_simpys() -> None:
    from sim.des.kernel import Process as _Process

    want = _process_trace(lambda env, gen: env.process(gen))
    assert want[0][-1] == (3.0, "interrupted stop") and want[1] == "end"
    assert _process_trace(_Process) == want


def test_engine_process_fails_as_simpys() -> None:
    from sim.des.kernel import Process as _Process

    for make in (lambda env, gen: env.process(gen), _Process):
        env = simpy.Environment()

        def proc(env: simpy.Environment) -> Any:
            yield sleep(env, 1.0)
            raise KeyError("k")

        p = make(env, proc(env))
        with pytest.raises(KeyError):
            run_until(env, p)
        assert env.now == 1.0 and not p.ok


def test_run_until_an_event_already_processed_or_never_triggered() -> None:
    env = simpy.Environment()
    done = env.event().succeed()
    run_until(env, done)  # processes it
    assert done.processed
    run_until(env, done)  # nothing left to do
    with pytest.raises(RuntimeError, match="No scheduled events left"):
        run_until(env, env.event())


def test_a_callback_error_of_a_many_callback_event_carries_no_unrelated_context() -> None:
    # an event with two callbacks goes through the loop's fallback (the one-callback
    # unpacking fails first); the second callback's error is raised as it is
    env = simpy.Environment()
    ev = env.timeout(1.0)

    def boom(_e: Any) -> None:
        raise KeyError("boom")

    ev.callbacks.append(lambda _e: None)
    ev.callbacks.append(boom)
    with pytest.raises(KeyError, match="boom") as info:
        run_until(env, env.event())
    assert info.value.__context__ is None
