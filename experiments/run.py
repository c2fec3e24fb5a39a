"""`hetsim run PLAN_OR_CONFIG`: load, build the RunSpec, run, write the files.

A config (YAML) is planned by its scheduler, whose object keeps driving the
shares online; a plan (JSON) needs ``--config`` for the cluster and job and
runs as given (its options may carry a ``runtime`` section), with the
config's scheduler rebalancing it when that scheduler is online.

Under torchrun (RANK and WORLD_SIZE set) every process runs its own rank and
rank 0 writes the files; otherwise all ranks are spawned here.

Checkpoints live in ``OUT/checkpoint`` (:func:`attach_checkpoints`): a fresh
run clears that folder, ``--resume`` continues from its manifest after
checking that the config matches it field by field.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import schedulers
from hardware_profiles.errors import ConfigError
from hardware_profiles.fileio import atomic_write
from runtime import checkpoint
from runtime.launch import run_local, run_rank
from runtime.spec import RunSpec, RuntimeOptions, build_spec, parse_options
from sim.config import Config, config_from_dict, read_yaml
from sim.plan import Plan, check_plan, load_plan
from sim.problem import build_problem
from sim.result import RunResult


@dataclass
class Prepared:
    spec: RunSpec
    plan: Plan
    config: dict[str, Any]  # the resolved config plus its runtime section
    source: str  # the config file, for error messages


def read_config(path: str | Path) -> tuple[Config, Any]:
    """A config YAML split into the simulator's validated config and its raw ``runtime:``
    section (None when absent; :func:`runtime.spec.parse_options` validates it).

    Raises:
        ConfigError: unreadable YAML, not a mapping, or an invalid config (one line).
    """
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(str(path), "", "a config must be a YAML mapping")
    raw = dict(raw)
    runtime_raw = raw.pop("runtime", None)
    return config_from_dict(raw, str(path)), runtime_raw


def prepare(path: str | Path, config: str | Path | None = None, iterations: int | None = None,
            timeout_s: float = 600.0, scheduler: str | None = None) -> Prepared:
    """Read PLAN_OR_CONFIG (and ``config`` for a plan) into a RunSpec.

    Raises:
        ConfigError: unreadable or invalid input (one line).
    """
    p = Path(path)
    plan_file: Path | None = None
    if p.suffix == ".json":
        if config is None:
            raise ConfigError(str(p), "", "a plan needs --config CONFIG (the cluster and job it runs)")
        plan_file, cfg_path = p, Path(config)
    else:
        cfg_path = p
    cfg, runtime_raw = read_config(cfg_path)
    problem = build_problem(cfg, cfg_path.resolve().parent, str(cfg_path))
    name = scheduler or cfg.scheduler.name
    params = cfg.scheduler.params if name == cfg.scheduler.name else {}
    sched = schedulers.make(name, params, str(cfg_path))
    planned = sched.plan(problem)
    if plan_file is not None:
        plan = load_plan(plan_file)
        check_plan(plan, problem, source=str(plan_file))
    else:
        plan = planned
        check_plan(plan, problem, source=f"plan from scheduler {name!r}")
    opts_raw = dict(plan.options.get("runtime") or {})
    opts_raw.update(runtime_raw or {})
    opts = parse_options(opts_raw, str(cfg_path))
    check_runtime(problem.job.model.name, problem.seed, opts, str(cfg_path))
    if iterations is not None and iterations <= 0:
        raise ConfigError("<command line>", "--iterations", f"must be > 0, got {iterations}")
    spec = build_spec(problem, plan, opts, sched, iterations, timeout_s, str(cfg_path),
                      plan_source=str(plan_file) if plan_file is not None else f"plan from scheduler {name!r}")
    check_gpus(spec, str(cfg_path))
    resolved = cfg.model_dump(mode="json")
    resolved["runtime"] = opts.model_dump(mode="json")
    return Prepared(spec, plan, resolved, str(cfg_path))


def check_runtime(model: str, seed: int, opts: RuntimeOptions, source: str) -> None:
    """What every rank would otherwise fail on, checked here before any rank starts:
    ``runtime.device: cuda`` on a machine where torch sees no GPU, and
    ``runtime.model_kwargs`` the zoo's torch module refuses (an unknown key, a negative
    size), by building the module once.

    Raises:
        ConfigError: naming the runtime field and why.
    """
    if opts.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(source, "runtime.device", "cuda, but torch sees no CUDA device on this machine "
                              "(use device: cpu)")
    if not opts.model_kwargs:
        return
    from runtime import task

    try:
        task.build(model, seed, opts.model_kwargs)
    except Exception as e:  # noqa: BLE001 (whatever the module's constructor raises is the user's input)
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(source, "runtime.model_kwargs", f"the {model} module refuses them: {why}") from None


def check_gpus(spec: RunSpec, source: str) -> None:
    """Refuse an all-reduce plan on ``runtime.device: cuda`` that one machine's ``hetsim run``
    cannot give a GPU per worker: nccl refuses two ranks of a group on one GPU (under
    torchrun each node's ranks take its GPUs by ``LOCAL_RANK``; not checked here).

    Raises:
        ConfigError: naming ``runtime.device``, the workers and the GPUs.
    """
    if spec.device != "cuda" or not spec.allreduce or under_torchrun():
        return
    import torch

    gpus = torch.cuda.device_count()
    if spec.n_workers > gpus:
        raise ConfigError(source, "runtime.device", f"cuda with job.sync: allreduce needs a GPU per worker (nccl "
                          f"refuses two ranks on one GPU): {spec.n_workers} workers, {gpus} GPU(s) visible")


def attach_checkpoints(prep: Prepared, out: Path, resume: bool, writer: bool = True) -> None:
    """Checkpoint into ``out/checkpoint``; with ``resume``, start from its last complete checkpoint.

    ``writer``: this process owns the folder (not a torchrun rank other than 0),
    so a fresh run clears a previous run's checkpoint there: resuming into it
    later would mix two runs.

    Raises:
        ConfigError: resume without a checkpoint, with a config that differs from
            the checkpoint's (naming the field), or with nothing left to run.
    """
    folder = out / "checkpoint"
    prep.spec.checkpoint_dir = str(folder)
    if not resume:
        if writer:
            checkpoint.clear(str(folder))
        return
    manifest = checkpoint.read_manifest(str(folder))
    checkpoint.check_fingerprint(manifest, prep.spec, prep.source)
    if manifest.version >= prep.spec.iterations:
        raise ConfigError(prep.source, "job.iterations", f"{prep.spec.iterations}, and the checkpoint in "
                          f"{folder} is at iteration {manifest.version}: nothing left to run "
                          f"(--iterations N > {manifest.version} trains on)")
    prep.spec.resume = manifest


def resume_hint(prep: Prepared) -> str:
    """After a failed run: how to continue it, when a complete checkpoint exists ('' otherwise)."""
    if prep.spec.checkpoint_dir is None:
        return ""
    try:
        m = checkpoint.read_manifest(prep.spec.checkpoint_dir)
    except ConfigError:
        return ""
    return f"; --resume continues from the checkpoint of iteration {m.version} in {m.folder}"


def files(result: RunResult, plan: Plan, config: dict[str, Any]) -> dict[str, str]:
    """summary.json, iterations.csv (with the measured loss), trace.json, plan.json, config.json."""
    return {"summary.json": result.summary_json(), "iterations.csv": result.iterations_csv(),
            "trace.json": result.trace_json(), "plan.json": plan.dumps(),
            "config.json": json.dumps(config, indent=2) + "\n"}


def write(out: Path, result: RunResult, plan: Plan, config: dict[str, Any]) -> None:
    """:func:`files` into ``out`` (created if missing), each written atomically."""
    for name, text in files(result, plan, config).items():
        atomic_write(out / name, text)


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def execute(prep: Prepared, out: Path | None) -> RunResult | None:
    """Run locally (or as this torchrun rank); write the files (rank 0) when ``out`` is given."""
    if under_torchrun():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        result = run_rank(prep.spec, rank, world, int(os.environ.get("LOCAL_RANK", "0")))
    else:
        result = run_local(prep.spec)
    if result is not None and out is not None:
        write(out, result, prep.plan, prep.config)
    return result
