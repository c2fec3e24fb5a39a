"""sim.des.kernel against plain SimPy: the same events, in the same order, with the same ids.

Each scenario is written once against a small API and run twice: on plain SimPy
(``simpy.Environment``, ``env.process``, ``env.timeout``, ``env.run``) and on the
kernel's fast path (:class:`Environment`, :class:`Process`, :func:`sleep`,
:func:`call_later`, :func:`run`); a third run puts :func:`run` on a plain
environment. The logs record what ran when and the id the next event would get,
and are asserted whole, against each other and against the expected log.

The last test keeps SimPy's private names inside sim/des/kernel.py.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
import simpy

from sim.des import kernel
from sim.des.kernel import (
    Environment,
    Process,
    Timer,
    call_later,
    processed_events,
    scheduled_events,
    sleep,
)

Log = list[tuple[float, str, int]]


class Api:
    """What a scenario may use; ``fast``: the kernel's path, else plain SimPy."""

    def __init__(self, fast: bool, plain_run_by_kernel: bool = False) -> None:
        self.fast = fast
        self.env: simpy.Environment = Environment() if fast else simpy.Environment()
        self.by_kernel = fast or plain_run_by_kernel
        self.log: Log = []

    def note(self, tag: str) -> None:
        """Log ``tag`` at the current time with the id the next event would get."""
        self.log.append((self.env.now, tag, scheduled_events(self.env)))

    def process(self, gen: Any) -> simpy.Process:
        return Process(self.env, gen) if self.fast else self.env.process(gen)

    def timeout(self, delay: float) -> Any:
        return sleep(self.env, delay) if self.fast else self.env.timeout(delay)

    def later(self, delay: float, tag: str, then: Callable[[], Any] | None = None) -> None:
        def cb(_e: Any) -> None:
            self.note(tag)
            if then is not None:
                then()

        if self.fast:
            call_later(self.env, delay, cb)
        else:
            self.env.timeout(delay).callbacks.append(cb)

    def run(self, until: simpy.Event) -> None:
        if self.by_kernel:
            kernel.run(self.env, until)
        else:
            self.env.run(until=until)


def _modes() -> list[Api]:
    return [Api(False), Api(True), Api(False, plain_run_by_kernel=True)]


def _each(scenario: Callable[[Api], Any]) -> list[tuple[Log, Any]]:
    out = []
    for api in _modes():
        result = scenario(api)
        out.append((api.log, result))
    return out


def _same(scenario: Callable[[Api], Any]) -> tuple[Log, Any]:
    """Run ``scenario`` in every mode; every mode's log and result are the same."""
    runs = _each(scenario)
    for run_ in runs[1:]:
        assert run_ == runs[0]
    return runs[0]


def _run_to_end(api: Api, gen: Any) -> float:
    """Run ``gen`` as a process until it ends; the time then."""
    api.run(api.process(gen))
    return api.env.now


# ------------------------------------------------------------------ scenarios
def _equal_times(api: Api) -> float:
    """Timeouts, callbacks and zero delays landing on the same instants."""
    env = api.env

    def proc(tag: str, delays: tuple[float, ...]) -> Any:
        for d in delays:
            yield api.timeout(d)
            api.note(f"{tag}@{d}")

    api.later(1.0, "a")
    api.process(proc("p", (1.0, 0.0, 1.0)))
    api.later(1.0, "b")
    api.process(proc("q", (0.0, 1.0, 1.0)))
    api.later(0.0, "z")
    api.later(2.0, "c", then=lambda: api.later(0.0, "c0"))
    end = env.timeout(3.0)
    api.later(3.0, "after-end")  # queued behind the until event at the same instant
    api.run(end)
    return env.now


def test_timeouts_at_equal_times_keep_their_order() -> None:
    # (time, tag, the next event id): p and q start first (urgent), then z; at 1.0 the
    # timeouts in id order (a and b were scheduled first); "after-end" never runs
    assert _same(_equal_times) == ([
        (0.0, "z", 10), (0.0, "q@0.0", 10), (1.0, "a", 11), (1.0, "b", 11), (1.0, "p@1.0", 11), (1.0, "q@1.0", 12),
        (1.0, "p@0.0", 13), (2.0, "c", 14), (2.0, "q@1.0", 15), (2.0, "p@1.0", 16), (2.0, "c0", 17)], 3.0)


def _interrupts(api: Api) -> Any:
    """A process interrupted while it sleeps, while it waits on an event, and twice at one
    instant (the second finds it sleeping again)."""
    env = api.env
    gate = env.event()

    def sleeper() -> Any:
        try:
            yield api.timeout(5.0)
            api.note("slept")
        except simpy.Interrupt as e:
            api.note(f"woken {e.cause}")
        try:
            yield gate
        except simpy.Interrupt as e:
            api.note(f"gate {e.cause}")
        try:
            yield api.timeout(1.0)
        except simpy.Interrupt as e:
            api.note(f"again {e.cause}")
        yield gate
        api.note("done")
        return "ok"

    p = api.process(sleeper())
    api.later(1.0, "poke", then=lambda: p.interrupt("one"))
    api.later(2.0, "poke2", then=lambda: (p.interrupt("two"), p.interrupt("three")))
    api.later(2.5, "open", then=lambda: gate.succeed())
    api.run(p)
    return env.now, p.value, gate.processed


def test_interrupts_resume_a_process_as_simpy_does() -> None:
    assert _same(_interrupts) == ([
        (1.0, "poke", 5), (1.0, "woken one", 6), (2.0, "poke2", 6), (2.0, "gate two", 8), (2.0, "again three", 9),
        (2.5, "open", 9), (2.5, "done", 10)], (2.5, "ok", True))


def _triggered(api: Api) -> Any:
    """A process yielding events triggered but not processed, processed, and failed-but-defused."""
    env = api.env
    early = env.event().succeed("early")
    got = []

    def proc() -> Any:
        got.append((yield early))  # triggered, not processed yet
        api.note("early")
        got.append((yield early))  # processed by now: its value at once
        api.note("again")
        bad = env.event()
        bad.fail(ValueError("boom"))
        try:
            yield bad
        except ValueError as e:
            api.note(f"caught {e}")
        yield api.timeout(0.5)
        api.note("slept")

    return _run_to_end(api, proc()), got


def test_processes_yielding_triggered_events() -> None:
    assert _same(_triggered) == ([(0, "early", 2), (0, "again", 2), (0, "caught boom", 3), (0.5, "slept", 4)],
                                 (0.5, ["early", "early"]))


def _conditions(api: Api) -> Any:
    """all_of and any_of over timeouts and events, one already processed."""
    env = api.env
    t1, t2 = env.timeout(1.0, "one"), env.timeout(2.0, "two")
    done = env.event().succeed("done")
    seen = []

    def proc() -> Any:
        yield api.timeout(0.5)
        api.note("start")
        first = yield env.any_of([t1, t2])
        seen.append(sorted(first.todict().values()))
        api.note("any")
        both = yield env.all_of([t1, t2, done])
        seen.append(sorted(both.todict().values()))
        api.note("all")
        yield env.all_of([])
        api.note("empty")

    return _run_to_end(api, proc()), seen


def test_conditions() -> None:
    assert _same(_conditions) == ([(0.5, "start", 5), (1.0, "any", 6), (2.0, "all", 7), (2.0, "empty", 8)],
                                  (2.0, [["one"], ["done", "one", "two"]]))


def _until(api: Api) -> Any:
    """``until`` an event at an instant others share: those before it in id order run, not the rest."""
    env = api.env
    api.later(2.0, "before")
    until = env.timeout(2.0)
    api.later(2.0, "after")
    api.later(1.0, "early")
    api.run(until)
    return env.now, until.triggered


def test_until_stops_right_after_the_until_event() -> None:
    assert _same(_until) == ([(1.0, "early", 4), (2.0, "before", 4)], (2.0, True))


def test_until_processed_already_and_never_triggered() -> None:
    for api in _modes():
        env = api.env
        done = env.event().succeed()
        api.run(done)
        assert done.processed == api.by_kernel  # (SimPy leaves it rescheduled, for a later run)
        if api.by_kernel:
            api.run(done)  # processed: nothing to do
            assert env.now == 0
        with pytest.raises(RuntimeError, match="No scheduled events left"):
            api.run(env.event())


def _late_callback(api: Api) -> tuple[list[str], list[str]]:
    env = api.env
    until = env.timeout(1.0)
    until.callbacks.append(lambda _e: api.note("registered before"))
    api.later(0.5, "register", then=lambda: until.callbacks.append(lambda _e: api.note("during")))
    api.run(until)
    tags = [tag for _, tag, _ in api.log]
    assert until.processed == api.by_kernel
    env.run()
    return tags, [tag for _, tag, _ in api.log[len(tags):]]


def test_until_callbacks_registered_during_the_run() -> None:
    # SimPy stops at the callback env.run appended: one registered after the run began
    # waits for a later run; kernel.run runs every callback of until and stops
    simpy_, fast, plain_by_kernel = (_late_callback(api) for api in _modes())
    assert simpy_ == (["register", "registered before"], ["during"])
    assert fast == plain_by_kernel == (["register", "registered before", "during"], [])


def _failing_process(api: Api, watched: bool) -> simpy.Process:
    """A process that fails at 1.0 (KeyError), and with ``watched`` one waiting for it."""

    def proc() -> Any:
        yield api.timeout(1.0)
        raise KeyError("k")

    def watcher(p: simpy.Process) -> Any:
        try:
            yield p
        except KeyError:
            api.note("watched")

    p = api.process(proc())
    if watched:
        api.process(watcher(p))
    return p


def _failing(api: Api, defused: bool) -> Any:
    env = api.env
    p = _failing_process(api, defused)
    api.later(2.0, "later")
    stop = env.timeout(3.0)
    try:
        api.run(stop)
    except KeyError as e:
        return env.now, repr(e), type(e.__cause__).__name__, p.ok
    return env.now, None, None, p.ok


def test_exceptions_propagate_as_in_simpy() -> None:
    # a failed process no one waits for fails the run, with a copy of its exception
    assert _same(lambda api: _failing(api, defused=False)) == ([], (1.0, "KeyError('k')", "KeyError", False))
    # one a process waits for is thrown into that process, and the run goes on
    assert _same(lambda api: _failing(api, defused=True)) == ([(1.0, "watched", 6), (2.0, "later", 7)],
                                                              (3.0, None, None, False))


def _callback_error(api: Api) -> Any:
    env = api.env

    def boom(_e: Any) -> None:
        raise KeyError("boom")

    t = env.timeout(1.0)
    t.callbacks.append(lambda _e: api.note("first"))
    t.callbacks.append(boom)
    with pytest.raises(KeyError, match="boom") as info:
        api.run(env.timeout(2.0))
    return info.value.__context__, env.now


def _failing_until(api: Api, watched: bool) -> Any:
    p = _failing_process(api, watched)
    try:
        api.run(p)
    except KeyError as e:
        return api.env.now, repr(e), e.__cause__ is not None
    return api.env.now, None, None


def test_a_failed_until() -> None:
    # unwatched: a copy of its exception (SimPy: the original, without a cause)
    simpy_, fast, plain_by_kernel = (_failing_until(api, False) for api in _modes())
    assert simpy_ == (1.0, "KeyError('k')", False) and fast == plain_by_kernel == (1.0, "KeyError('k')", True)
    # watched (defused): SimPy still raises it; the kernel's run returns
    simpy_, fast, plain_by_kernel = (_failing_until(api, True) for api in _modes())
    assert simpy_ == (1.0, "KeyError('k')", False) and fast == plain_by_kernel == (1.0, None, None)


def test_a_failed_run_leaves_until_as_it_was() -> None:
    env = Environment()
    until = env.timeout(2.0)
    until.callbacks.append(lambda _e: None)
    call_later(env, 1.0, lambda _e: (_ for _ in ()).throw(KeyError("boom")))
    with pytest.raises(KeyError, match="boom"):
        kernel.run(env, until)
    assert len(until.callbacks) == 1  # (the run's own callback taken off)
    kernel.run(env, until)
    assert env.now == 2.0 and until.processed


def test_a_callbacks_exception_leaves_the_run_as_it_is() -> None:
    assert _same(_callback_error) == ([(1.0, "first", 2)], (None, 1.0))


# --------------------------------------------------------- the process's step
def _stepper(api: Api, interrupt_at: float | None) -> Any:
    """Two worker-like processes: each waits for an input, steps (direct), waits for a
    second input (registered by the process itself after a direct step), steps again (not
    direct: it may end after it); on plain SimPy, the same as SimPy timeouts and events."""
    env = api.env
    procs: dict[str, Any] = {}

    def worker(tag: str, d0: float, d1: float, inputs: list[simpy.Event]) -> Any:
        proc = procs[tag]
        try:
            for k, ev in enumerate(inputs):
                yield proc.wait(ev) if api.fast else ev
                mid = env.event()
                api.later(d0 + 0.05, f"{tag} mid{k}", then=mid.succeed)
                yield d0 if api.fast else env.timeout(d0)  # (a float: a direct step)
                api.note(f"{tag} s0")
                yield proc.wait(mid) if api.fast else mid
                yield proc.step(d1) if api.fast else env.timeout(d1)
                api.note(f"{tag} s1")
        except simpy.Interrupt as e:
            api.note(f"{tag} {e.cause}")
            return "stopped"
        return "done"

    for tag, d0, d1 in (("a", 0.25, 0.5), ("b", 0.5, 0.25)):
        inputs = [env.event() for _ in range(3)]
        for k, ev in enumerate(inputs):
            api.later(0.1 + k, f"{tag} in{k}", then=ev.succeed)
        procs[tag] = api.process(worker(tag, d0, d1, inputs))
    if interrupt_at is not None:
        api.later(interrupt_at, "stop", then=lambda: procs["a"].interrupt("fail"))
    api.run(env.all_of([procs["a"], procs["b"]]))
    return env.now, procs["a"].value, procs["b"].value


def test_steps_direct_or_not_run_as_simpy_timeouts() -> None:
    assert _same(lambda api: _stepper(api, None)) == ([
        (0.1, "a in0", 8), (0.1, "b in0", 9), (0.35, "a s0", 14), (0.4, "a mid0", 14), (0.6, "b s0", 16),
        (0.65, "b mid0", 16), (0.9, "a s1", 18), (0.9, "b s1", 18), (1.1, "a in1", 18), (1.1, "b in1", 19),
        (1.35, "a s0", 24), (1.4000000000000001, "a mid1", 24), (1.6, "b s0", 26), (1.6500000000000001, "b mid1", 26),
        (1.9000000000000001, "a s1", 28), (1.9000000000000001, "b s1", 28), (2.1, "a in2", 28), (2.1, "b in2", 29),
        (2.35, "a s0", 34), (2.4, "a mid2", 34), (2.6, "b s0", 36), (2.6500000000000004, "b mid2", 36),
        (2.9, "a s1", 38), (2.9000000000000004, "b s1", 39)], (2.9000000000000004, "done", "done"))


@pytest.mark.parametrize("at", [1.2, 1.37])
def test_an_interrupt_during_a_direct_step_or_a_wait_after_one(at: float) -> None:
    # at 1.2 worker a is in its first step (direct) of input 1; at 1.37 it waits for mid1
    # (registered by the process itself); either way it stops there, and its step or wait
    # fires unwatched
    a_s0 = [(1.35, "a s0", 25)] if at > 1.35 else []
    assert _same(lambda api: _stepper(api, at)) == ([
        (0.1, "a in0", 9), (0.1, "b in0", 10), (0.35, "a s0", 15), (0.4, "a mid0", 15), (0.6, "b s0", 17),
        (0.65, "b mid0", 17), (0.9, "a s1", 19), (0.9, "b s1", 19), (1.1, "a in1", 19), (1.1, "b in1", 20),
        *a_s0, (at, "stop", 25), (at, "a fail", 26), (1.4000000000000001, "a mid1", 27), (1.6, "b s0", 28),
        (1.6500000000000001, "b mid1", 28), (1.9000000000000001, "b s1", 30), (2.1, "a in2", 30), (2.1, "b in2", 31),
        (2.6, "b s0", 34), (2.6500000000000004, "b mid2", 34), (2.9000000000000004, "b s1", 36)],
        (2.9000000000000004, "stopped", "done"))


def test_a_failure_after_a_direct_step_leaves_the_loop_as_it_is() -> None:
    # resumed by send alone, a process's exception is no event: it leaves the run directly
    env = Environment()

    def proc(holder: list[Process]) -> Any:
        yield holder[0].step(0.5)
        yield 0.5  # direct
        raise KeyError("direct")

    holder: list[Process] = []
    holder.append(Process(env, proc(holder)))
    with pytest.raises(KeyError, match="direct") as info:
        kernel.run(env, env.timeout(5.0))
    assert env.now == 1.0 and info.value.__cause__ is None and holder[0].is_alive


def _rearmed(api: Api) -> Any:
    """A timer whose callback starts the next of a chain of tasks: on the kernel by returning
    the task's length (the loop re-arms the timer), on SimPy with a timeout of that length."""
    env = api.env
    tasks = [0.5, 0.25, 0.0, 1.0]

    def next_task(_e: Any) -> float | None:
        api.note(f"task {4 - len(tasks)}")
        if not tasks:
            return None
        d = tasks.pop(0)
        if api.fast:
            return d
        env.timeout(d).callbacks.append(next_task)
        return None

    api.later(0.25, "other")
    if api.fast:
        call_later(env, 0.5, next_task)
    else:
        env.timeout(0.5).callbacks.append(next_task)
    api.later(1.0, "other2")
    api.run(env.timeout(5.0))
    return env.now


def test_a_callback_returning_a_float_re_arms_its_event() -> None:
    runs = [(api.log, _rearmed(api)) for api in _modes()[:2]]  # (SimPy's env.step re-arms nothing)
    assert runs[0] == runs[1] == ([
        (0.25, "other", 4), (0.5, "task 0", 4), (1.0, "other2", 5), (1.0, "task 1", 5), (1.25, "task 2", 6),
        (1.25, "task 3", 7), (2.25, "task 4", 8)], 5.0)
    env = Environment()
    call_later(env, 1.0, lambda _e: -0.5)
    with pytest.raises(ValueError, match="Negative delay"):
        kernel.run(env, env.timeout(2.0))


# ----------------------------------------------------------------- timers
def test_timers_take_the_keys_timeouts_would() -> None:
    keys = []
    for fast in (False, True):
        env = Environment() if fast else simpy.Environment()
        if fast:
            call_later(env, 1.0, lambda _e: None)
            sleep(env, 0.0)
            t = Timer()
            t.callbacks = []
            kernel.schedule(env, t, 2.5)
        else:
            env.timeout(1.0).callbacks.append(lambda _e: None)
            env.timeout(0.0)
            env.timeout(2.5)
        keys.append([k[:3] for k in sorted(env._queue)])
    assert keys[0] == keys[1] == [(0.0, 1, 1), (1.0, 1, 0), (2.5, 1, 2)]
    env = Environment()
    for bad in (lambda: call_later(env, -1.0, lambda _e: None), lambda: sleep(env, -1e-9),
                lambda: kernel.schedule(env, Timer(), -0.5)):
        with pytest.raises(ValueError, match="Negative delay"):
            bad()


def test_environment_clock_and_counts() -> None:
    env = Environment()
    assert env.now == 0 and isinstance(env.now, int)  # SimPy's start: an int 0
    assert Environment(2.5).now == 2.5
    env.timeout(1.5)
    env.timeout(0.5).callbacks.append(lambda _e: None)
    assert scheduled_events(env) == 2 and scheduled_events(env) == 2  # reading uses no id
    env.run(until=1.0)  # SimPy's own run keeps the clock too
    # its until event is scheduled, processed (with the 0.5 timeout) and rescheduled: 4 in all
    assert env.now == 1.0 and processed_events(env) == 2 and scheduled_events(env) == 4


# ----------------------------------------------------- SimPy's private names
ROOT = pathlib.Path(__file__).resolve().parents[1]
KERNEL = ROOT / "sim" / "des" / "kernel.py"
SOURCE_DIRS = ("sim", "schedulers", "runtime", "experiments", "bench", "hardware_profiles", "calibration")


def simpy_private_names() -> set[str]:
    """Every private attribute or method name SimPy's source uses (``_now``, ``_queue``, ...)."""
    names: set[str] = set()
    for path in pathlib.Path(simpy.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "name", None)
            if isinstance(name, str) and name.startswith("_") and not name.startswith("__"):
                names.add(name)
    return names


def private_uses(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """Accesses of ``names`` in ``tree``: ``x._name`` on anything but ``self``/``cls`` (a
    class's own attribute, unless the class derives from a SimPy one) and
    ``getattr``/``setattr``/``hasattr``/``delattr`` with that name."""
    simpy_names = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                   and (node.module or "").startswith("simpy") for alias in node.names}
    own: set[int] = set()  # ids of the self/cls Name nodes of classes that are not SimPy's
    for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
        bases = {ast.unparse(b) for b in cls.bases}
        if any(b.startswith("simpy.") or b in simpy_names for b in bases):
            continue
        own.update(id(n) for n in ast.walk(cls) if isinstance(n, ast.Name) and n.id in ("self", "cls"))
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in names and id(node.value) not in own:
            hits.append((node.lineno, node.attr))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and node.args[1].value in names):
            hits.append((node.lineno, str(node.args[1].value)))
    return sorted(hits)


def test_the_scan_finds_what_it_should() -> None:
    names = simpy_private_names()
    assert {"_now", "_queue", "_eid", "_resume", "_active_proc", "_value", "_ok", "_defused", "_target"} <= names
    src = ("import simpy\nclass Own:\n    def f(self, env):\n        self._queue = env._queue\n"
           "        return getattr(env, '_now'), self._value\n"
           "class Sub(simpy.Process):\n    def g(self):\n        return self._target\n")
    assert private_uses(ast.parse(src), names) == [(4, "_queue"), (5, "_now"), (8, "_target")]


def test_no_simpy_private_name_outside_the_kernel() -> None:
    names = simpy_private_names()
    found = []
    for d in SOURCE_DIRS:
        for path in sorted((ROOT / d).rglob("*.py")):
            if path == KERNEL:
                continue
            found += [f"{path.relative_to(ROOT)}:{line}: {name}"
                      for line, name in private_uses(ast.parse(path.read_text()), names)]
    assert found == []
