"""Reference outputs: capture every reference output of hetsim, check them again after a change.

    python -m bench.reference_outputs capture --out results/reference/NAME [--quick] [--quiet]
    python -m bench.reference_outputs check --against bench/reference/full.json
        --out results/reference/NAME [--quick] [--baseline-dir DIR] [--quiet]

What it runs (command-line entry points only, each as ``sys.executable -m MODULE`` in
the repository root, so that it keeps working when modules move between packages):

* ``hetsim demo`` (``experiments.cli demo``);
* ``hetsim compare`` with the ``analytic`` and the ``des`` evaluator (every registered
  scheduler) on demo.yaml, this_machine.yaml and every config of
  experiments/configs/validation/ and experiments/configs/runtime_calibration/
  (heterps/dlrm.yaml is a model file, not a config: ``compare`` refuses it);
* ``hetsim dag`` with every DAG scheduler on experiments/configs/robotics/*.yaml;
* ``python -m experiments.reproduce_hps``, ``reproduce_heterps`` and
  ``reproduce_robotics`` (their CSVs and report.md);
* ``python -m bench.validation_suite --resimulate results/validation_suite/suite.json``:
  the simulated side of the validation suite again, without real runs, on the host
  (cores, background threads) each committed row recorded.

``--quick`` passes each reproduce script its own ``--quick``, compares on four configs
(demo, this_machine, v2, c4) instead of all of them and re-simulates the rows of v1 and
v3 only; a quick capture is checked only against a quick baseline.

Each output file is normalised (:func:`normalise`) and hashed (sha256): CSVs keep their
full text less what :data:`RULES` drops, JSON its full tree less the keys they drop
(written again with one key a line, so that a diff is readable), markdown its full text
with the figures they name replaced by ``<wall>`` or ``<load>``; the output folder's
absolute path becomes ``<OUT>`` and the repository's ``<ROOT>`` everywhere. Dropped is
only what differed between two runs of the same code, each rule with its reason (the
manifest's ``excluded``):

* wall-clock times: rl's planning and policy-loading seconds in its plan.json, the DAG
  schedulers' ``plan_s``, reproduce_heterps' ``sched_s``, run_seconds.txt and the RL
  fine-tuning's ``train_s``/``plan_ms``, reproduce_robotics' ``seconds``, and the
  reports' run and planning times;
* exact's solves in reproduce_heterps that can run into its 10 s wall-clock limit
  (:data:`EXACT_LIMIT_CASES`): what it returns there depends on the machine's load
  (the committed run, on a quiet machine, proved dlrm at 0.35 in 7.6 s; a run under
  load stopped at the limit with another placement), so its rows of those cases, the
  other methods' gaps to it and the report's figures over the proven cases are not
  compared. Its other cases (all under 2.5 s even under load) are.

Figures (.png) and policy files are not compared. Two things stay compared that could
still move with a much heavier load: the RL fine-tuning of a full reproduce_heterps
stops at 180 s of wall time per workload (about 70 s under load here), and the DAG
``milp`` has a 10-30 s limit (under 1 s here).

Writes OUT/raw/STEP/ (the commands' own outputs), OUT/norm/STEP/ (the normalised
files) and OUT/manifest.json: per step its command and sha256 per normalised file, a
few headline numbers per output for a human (throughput per scheduler and the like),
and the exclusions.

Before a refactor (on the commit you start from), capture a baseline or use the
committed ones (each records the commit it was captured on: quick.json the current
one; full.json is older and differs where later work changed outputs on purpose),
bench/reference/quick.json and bench/reference/full.json::

    python -m bench.reference_outputs capture --quick --out results/reference/before-quick

After it, check against the baseline (exit 0: every file the same; 1: some differ or
are missing, each listed as ``same`` or ``DIFFERENT``; 2: bad input)::

    python -m bench.reference_outputs check --quick --against bench/reference/quick.json \\
        --out results/reference/after-quick --baseline-dir results/reference/before-quick

``--baseline-dir`` (a capture's OUT with its norm/ folder) adds a short unified diff
of the first differences of each differing file. Progress (one line a step: what ran,
how long it took) goes to stderr unless ``--quiet``; the verdicts go to stdout.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import difflib
import fnmatch
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "experiments" / "configs"
SUITE_JSON = Path("results") / "validation_suite" / "suite.json"
MANIFEST_SCHEMA = 1
#: The DAG schedulers `hetsim dag` is asked for (its --schedulers names).
DAG_SCHEDULERS = "heft,energy,milp,rl-dag"
EVALUATORS = ("analytic", "des")
#: Configs `hetsim compare` runs on with --quick (relative to experiments/configs/).
QUICK_COMPARE = ("demo.yaml", "this_machine.yaml", "validation/v2_mlp_2w_bsp_pipe_q8.yaml",
                 "runtime_calibration/c4_transformer_2w_asp.yaml")
#: Validation configs re-simulated with --quick (bench.validation_suite --only).
QUICK_RESIM = "v1,v3"
#: Output files compared; anything else (figures, policies) is not.
COMPARED = (".csv", ".json", ".md", ".txt")


@dataclasses.dataclass(frozen=True)
class Rule:
    """What normalisation drops from the files matching ``glob`` (``STEP/PATH`` in the
    output tree, fnmatch), and why. CSV: ``columns`` dropped; the rows matching one of
    ``rows`` (each a set of ``(column, value)`` pairs, all of which must match) dropped,
    or only their cells under ``row_columns`` replaced by ``mark``. JSON: ``keys`` dropped
    at any depth. Markdown and text: the matches of the regexes ``patterns`` and the cells
    of markdown tables under the headers ``md_columns`` replaced by ``mark``; the lines
    from one matching the first regex of an ``md_blocks`` pair to the first after it that
    matches the second dropped. ``whole``: the file is not compared."""

    glob: str
    reason: str
    columns: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    rows: tuple[tuple[tuple[str, str], ...], ...] = ()
    row_columns: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    md_columns: tuple[str, ...] = ()
    md_blocks: tuple[tuple[str, str], ...] = ()
    whole: bool = False
    mark: str = "<wall>"

    def describe(self) -> dict[str, Any]:
        rows = " or ".join("(" + ", ".join(f"{c}={v}" for c, v in cond) + ")" for cond in self.rows)
        what = ("the whole file" if self.whole else
                "; ".join([*(f"column {c}" for c in self.columns), *(f"key {k}" for k in self.keys),
                           *([f"rows {rows}" + (f": columns {', '.join(self.row_columns)}" if self.row_columns
                                                 else "")] if rows else []),
                           *(f"text /{p}/" for p in self.patterns),
                           *(f"table column {c}" for c in self.md_columns),
                           *(f"lines /{a}/ to before /{b}/" for a, b in self.md_blocks)]))
        return {"files": self.glob, "dropped": what, "reason": self.reason}


#: exact's 10 s limit: the reproduce_heterps cases (workload, fraction) whose exact solve took
#: more than half of it in a run observed on this machine (loaded or quiet); where it runs
#: out, its placement, bound and proof depend on how far the solver got, so on the load.
EXACT_LIMIT_CASES: tuple[tuple[tuple[str, str], ...], ...] = (
    (("workload", "dlrm"), ("fraction", "0.35")),
    *((("workload", "resnet50"), ("fraction", f)) for f in ("0.35", "0.5", "0.65", "0.8")),
)
_EXACT_REASON = ("exact's result where its 10 s wall-clock limit can run out (solve above 5 s in an "
                 "observed run: dlrm at 0.35, resnet50 at 0.35-0.8): what it found depends on the "
                 "machine's load (quiet: proven; loaded: the limit's incumbent and bound)")

#: Every field found to differ between two runs of the same code: wall-clock times, and the
#: figures of exact's time-limited solves in reproduce_heterps (:data:`EXACT_LIMIT_CASES`).
RULES: tuple[Rule, ...] = (
    Rule("compare/*/rl/plan.json", "rl's planning and policy-loading wall time",
         keys=("seconds", "load_seconds")),
    Rule("dag/*/comparison.csv", "wall-clock planning time", columns=("plan_s",)),
    Rule("dag/*/summary.json", "wall-clock planning time", keys=("plan_s",)),
    Rule("reproduce_hps/report.md", "the run's wall-clock seconds", patterns=(r"(?<=DES runs in )[0-9]+(?= s wall)",)),
    Rule("reproduce_heterps/run_seconds.txt", "the run's wall-clock seconds", whole=True),
    Rule("reproduce_heterps/results.csv", "wall-clock scheduling time", columns=("sched_s",)),
    Rule("reproduce_heterps/results.csv", _EXACT_REASON, mark="<load>",
         rows=tuple((*c, ("method", "exact")) for c in EXACT_LIMIT_CASES)),
    Rule("reproduce_heterps/results.csv", _EXACT_REASON + "; the gaps of these cases are to it",
         mark="<load>", rows=EXACT_LIMIT_CASES, row_columns=("gap", "ref_proven")),
    Rule("reproduce_heterps/rl_fine_tune.csv", "wall-clock training and planning time",
         columns=("train_s", "plan_ms")),
    Rule("reproduce_heterps/report.md", "wall-clock run, scheduling, training and planning times",
         patterns=(r"(?<=` in )[0-9]+(?= s\. )",),
         md_columns=("sched median ms", "sched max ms", "train_s", "plan_ms")),
    Rule("reproduce_heterps/report.md", _EXACT_REASON + ": the counts and gaps over the proven "
         "cases, the lists of unproven and failed cases, exact's cost per case", mark="<load>",
         patterns=(r"(?<=exact proved optimality in )[0-9]+ of [0-9]+", r"(?<=mean gap )[0-9.]+% \(median [0-9.]+%\)"),
         md_columns=("cases", "gap mean %", "gap median %", "gap p90 %", "gap max %", "exact USD",
                     "single / exact"),
         md_blocks=((r"^exact's placements that are not proven optimal", r"^!\["),)),
    Rule("reproduce_robotics/energy_deadline.csv", "wall-clock planning time", columns=("seconds",)),
    Rule("reproduce_robotics/gaps.csv", "wall-clock planning time", columns=("seconds",)),
    Rule("reproduce_robotics/report.md", "wall-clock run and planning times",
         patterns=(r"(?<=\()[0-9]+(?= s on this machine\))",), md_columns=("plan_ms_mean",)),
)


# ----------------------------------------------------------------------------- steps
@dataclasses.dataclass(frozen=True)
class Step:
    """One command: ``name`` is also its folder under raw/ and norm/; ``args`` follow
    ``python -m`` and get ``--out RAW_DIR`` appended; ``headline`` picks a few numbers
    from its normalised files."""

    name: str
    args: tuple[str, ...]
    headline: Callable[[Path], dict[str, Any]]


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def _csv_rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _num(x: str | None) -> float | str | None:
    if x is None or x == "":
        return None
    try:
        return float(f"{float(x):.6g}")
    except ValueError:
        return x


def _by(path: Path, keys: Sequence[str], value: str) -> dict[str, Any]:
    """``{"k1/k2": value}`` per row of a CSV (a few numbers for a human)."""
    return {"/".join(r.get(k) or "" for k in keys): _num(r.get(value)) for r in _csv_rows(path)}


def _mean_by(path: Path, keys: Sequence[str], value: str) -> dict[str, Any]:
    """The mean of ``value`` per group of ``keys`` (rows where it is a number)."""
    groups: dict[str, list[float]] = {}
    for r in _csv_rows(path):
        v = _num(r.get(value))
        if isinstance(v, float):
            groups.setdefault("/".join(r.get(k) or "" for k in keys), []).append(v)
    return {k: float(f"{sum(v) / len(v):.6g}") for k, v in groups.items()}


def steps(quick: bool) -> list[Step]:
    """Every command, in the order they run."""
    q = ("--quick",) if quick else ()
    cli = ("experiments.cli",)
    out = [Step("demo", (*cli, "demo", "--quiet"),
                lambda d: {"throughput_sps": _by(d / "comparison.csv", ("model", "scheduler"), "throughput_sps")})]
    if quick:
        configs = [CONFIGS / c for c in QUICK_COMPARE]
    else:
        configs = [CONFIGS / "demo.yaml", CONFIGS / "this_machine.yaml",
                   *sorted((CONFIGS / "validation").glob("*.yaml")),
                   *sorted((CONFIGS / "runtime_calibration").glob("*.yaml"))]
    for c in configs:
        stem = str(c.relative_to(CONFIGS).with_suffix(""))
        for ev in EVALUATORS:
            out.append(Step(f"compare/{ev}/{stem}", (*cli, "compare", _rel(c), "--evaluator", ev),
                            lambda d: {"throughput_sps": _by(d / "comparison.csv", ("scheduler",), "throughput_sps")}))
    for c in sorted((CONFIGS / "robotics").glob("*.yaml")):
        out.append(Step(f"dag/{c.stem}", (*cli, "dag", _rel(c), "--schedulers", DAG_SCHEDULERS),
                        lambda d: {"plan_energy_mj": _by(d / "comparison.csv", ("scheduler",), "plan_energy_mj"),
                                   "des_miss_rate": _by(d / "comparison.csv", ("scheduler",), "des_miss_rate")}))
    out += [
        Step("reproduce_hps", ("experiments.reproduce_hps", *q, "--quiet"),
             lambda d: {"time_to_target_s mean": _mean_by(d / "results.csv", ("model", "method"), "time_to_target_s")}),
        Step("reproduce_heterps", ("experiments.reproduce_heterps", *q),
             lambda d: {"placement_max_sps": _by(d / "throughput.csv", ("workload",), "placement_max_sps"),
                        "cost_usd mean": _mean_by(d / "results.csv", ("method",), "cost_usd")}),
        Step("reproduce_robotics", ("experiments.reproduce_robotics", *q),
             lambda d: {"energy_mj mean": _mean_by(d / "energy_deadline.csv", ("board", "method"), "energy_mj")}),
        Step("validation_resim", ("bench.validation_suite", "--resimulate", str(SUITE_JSON), "--quiet",
                                  *(("--only", QUICK_RESIM) if quick else ())),
             lambda d: {"sim_s": _by(d / "resimulated.csv", ("config", "scheduler"), "sim_s"),
                        "recorded sim_s": _by(d / "resimulated.csv", ("config", "scheduler"), "recorded sim_s")}),
    ]
    return out


# ------------------------------------------------------------------------- normalise
def _rules_for(key: str) -> list[Rule]:
    return [r for r in RULES if fnmatch.fnmatchcase(key, r.glob)]


def _drop_keys(x: Any, keys: set[str]) -> Any:
    if isinstance(x, dict):
        return {k: _drop_keys(v, keys) for k, v in x.items() if k not in keys}
    if isinstance(x, list):
        return [_drop_keys(v, keys) for v in x]
    return x


def normalise(key: str, text: str, out_dir: str = "", root: str = str(ROOT)) -> str | None:
    """``text`` of the output file ``key`` (``STEP/PATH``) as compared: ``out_dir`` (the
    command's output folder) and ``root`` replaced by ``<OUT>`` and ``<ROOT>``, then what
    the :data:`RULES` matching ``key`` drop. JSON is compared as values: written again with
    one key a line (a float as its shortest repr, which is how Python wrote it). None: the
    whole file is dropped."""
    rules = _rules_for(key)
    if any(r.whole for r in rules):
        return None
    if out_dir:
        text = text.replace(out_dir, "<OUT>")
    if root:
        text = text.replace(root, "<ROOT>")
    suffix = Path(key).suffix
    if suffix == ".json":
        keys = {k for r in rules for k in r.keys}
        return json.dumps(_drop_keys(json.loads(text), keys), indent=1, ensure_ascii=False) + "\n"
    if suffix == ".csv":
        return _normalise_csv(text, rules)
    for r in rules:
        for p in r.patterns:
            text = re.sub(p, r.mark, text, flags=re.M)
        for start, end in r.md_blocks:
            text = _drop_blocks(text, start, end)
        if r.md_columns:
            text = _blank_table_columns(text, set(r.md_columns), r.mark)
    return text


def _normalise_csv(text: str, rules: Sequence[Rule]) -> str:
    rows = list(csv.reader(io.StringIO(text, newline="")))
    if not rows:
        return text
    head, body = rows[0], rows[1:]
    for r in rules:
        conds = [[(head.index(c), v) for c, v in cond] for cond in r.rows
                 if all(c in head for c, _ in cond)]
        hit = [any(all(i < len(row) and row[i] == v for i, v in cond) for cond in conds) for row in body]
        if r.rows and not r.row_columns:
            body = [row for row, h in zip(body, hit) if not h]
        elif r.rows:
            blank = {head.index(c) for c in r.row_columns if c in head}
            body = [[r.mark if h and i in blank else x for i, x in enumerate(row)] for row, h in zip(body, hit)]
    drop = {c for r in rules for c in r.columns}
    keep = [i for i, c in enumerate(head) if c not in drop]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([row[i] for i in keep if i < len(row)] for row in [head, *body])
    return buf.getvalue()


def _drop_blocks(text: str, start: str, end: str) -> str:
    """``text`` less the lines from each one matching ``start`` to before the next one
    after it matching ``end`` (to the end where none does)."""
    out, dropping = [], False
    for line in text.split("\n"):
        if dropping and re.search(end, line):
            dropping = False
        if not dropping and re.search(start, line):
            dropping = True
            out.append("<load: dropped>")
        if not dropping:
            out.append(line)
    return "\n".join(out)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _blank_table_columns(text: str, columns: set[str], mark: str) -> str:
    """``text`` with the cells under the headers ``columns`` of every markdown table
    (a ``|`` header line, then a ``|---`` line) replaced by ``mark``."""
    lines = text.split("\n")
    blank: list[int] = []
    for i, line in enumerate(lines):
        if not line.startswith("|"):
            blank = []
        elif i + 1 < len(lines) and lines[i + 1].startswith("|-"):
            blank = [j for j, c in enumerate(_cells(line)) if c in columns]
        elif blank and not line.startswith("|-"):
            cells = _cells(line)
            lines[i] = "| " + " | ".join(mark if j in blank else c for j, c in enumerate(cells)) + " |"
    return "\n".join(lines)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def normalise_tree(step: str, raw: Path, norm: Path) -> dict[str, str]:
    """Normalise every compared file under ``raw`` into ``norm``: ``{PATH: sha256}``."""
    hashes = {}
    for f in sorted(p for p in raw.rglob("*") if p.is_file() and p.suffix in COMPARED):
        rel = f.relative_to(raw).as_posix()
        text = normalise(f"{step}/{rel}", f.read_text(encoding="utf-8"), str(raw))
        if text is None:
            continue
        dest = norm / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text, encoding="utf-8")
        hashes[rel] = sha256(text)
    return hashes


# --------------------------------------------------------------------------- capture
def _log(quiet: bool, msg: str) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def run_step(step: Step, out: Path, quiet: bool) -> dict[str, Any]:
    """Run one command into OUT/raw/STEP, normalise into OUT/norm/STEP: its manifest entry."""
    raw, norm = out / "raw" / step.name, out / "norm" / step.name
    for d in (raw, norm):
        if d.exists():
            import shutil

            shutil.rmtree(d)
    raw.mkdir(parents=True)
    cmd = [sys.executable, "-m", *step.args, "--out", str(raw)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    _log(quiet, f"reference_outputs: {step.name}: python -m {' '.join(step.args)} ...")
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - t0
    (out / "raw" / f"{step.name.replace('/', '__')}.log").write_text(p.stdout)
    entry: dict[str, Any] = {"command": ["python", "-m", *step.args], "wall_s": round(wall, 1)}
    if p.returncode != 0:
        entry["rc"] = p.returncode
        tail = p.stdout.strip().splitlines()[-1:] or [""]
        _log(quiet, f"reference_outputs: {step.name}: FAILED (exit {p.returncode}, {wall:.0f} s): {tail[0]}")
    entry["files"] = normalise_tree(step.name, raw, norm)
    entry["headline"] = step.headline(norm)
    _log(quiet, f"reference_outputs: {step.name}: {len(entry['files'])} files, {wall:.1f} s")
    return entry


def capture(out: Path, quick: bool, quiet: bool) -> dict[str, Any]:
    """Run every step into ``out``; write and return the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    entries = {s.name: run_step(s, out, quiet) for s in steps(quick)}
    manifest = {"schema": MANIFEST_SCHEMA, "mode": "quick" if quick else "full",
                "commit": _git_head(), "wall_s": round(time.monotonic() - t0, 1),
                "excluded": [r.describe() for r in RULES] + [
                    {"files": "*.png, *.zip and other non-text outputs", "dropped": "the whole file",
                     "reason": "figures and binaries are not compared"}],
                "steps": entries}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    _log(quiet, f"reference_outputs: wrote {out}/manifest.json ({manifest['wall_s']:.0f} s)")
    return manifest


def _git_head() -> str | None:
    try:
        p = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() or None


# ----------------------------------------------------------------------------- check
def compare_manifests(base: dict[str, Any], now: dict[str, Any]) -> list[tuple[str, str]]:
    """``(STEP/PATH, verdict)`` for every file of either manifest: ``same``, ``DIFFERENT``,
    ``DIFFERENT (missing)`` (in the baseline only) or ``DIFFERENT (new)`` (now only); a
    step that failed now counts as ``DIFFERENT (step failed)`` as a whole."""
    out = []
    for name in sorted({*base["steps"], *now["steps"]}):
        b = base["steps"].get(name, {}).get("files", {})
        n = now["steps"].get(name, {}).get("files", {})
        if now["steps"].get(name, {}).get("rc") and not base["steps"].get(name, {}).get("rc"):
            out.append((name, f"DIFFERENT (step failed: exit {now['steps'][name]['rc']})"))
        for rel in sorted({*b, *n}):
            verdict = ("DIFFERENT (new)" if rel not in b else "DIFFERENT (missing)" if rel not in n
                       else "same" if b[rel] == n[rel] else "DIFFERENT")
            out.append((f"{name}/{rel}", verdict))
    return out


def short_diff(before: Path, after: Path, lines: int = 20) -> list[str]:
    """The first ``lines`` lines of the unified diff of two normalised files."""
    a = before.read_text(encoding="utf-8").splitlines() if before.is_file() else []
    b = after.read_text(encoding="utf-8").splitlines() if after.is_file() else []
    diff = list(difflib.unified_diff(a, b, str(before), str(after), lineterm="", n=1))
    return diff[:lines] + ([f"... ({len(diff) - lines} more diff lines)"] if len(diff) > lines else [])


def check(against: Path, out: Path, quick: bool, baseline_dir: Path | None, quiet: bool,
          diff_files: int = 10) -> int:
    base = read_manifest(against)
    if base.get("mode") != ("quick" if quick else "full"):
        fail(f"{against}: mode: captured {base.get('mode')!r}; check it with"
             f"{' --quick' if base.get('mode') == 'quick' else 'out --quick'}")
    now = capture(out, quick, quiet)
    verdicts = compare_manifests(base, now)
    bad = [(k, v) for k, v in verdicts if v != "same"]
    for k, v in verdicts:
        print(f"{v:<10} {k}")
    if baseline_dir is not None:
        for k, _ in bad[:diff_files]:
            print("\n".join(short_diff(baseline_dir / "norm" / k, out / "norm" / k)))
        if len(bad) > diff_files:
            print(f"(diffs of the first {diff_files} differing files only)")
    print(f"{len(verdicts) - len(bad)} same, {len(bad)} different of {len(verdicts)} files "
          f"({against} against {out}/manifest.json)")
    return 1 if bad else 0


def read_manifest(path: Path) -> dict[str, Any]:
    """A manifest written by ``capture``; a missing or malformed one exits 2 (one line)."""
    try:
        m = json.loads(path.read_text())
    except OSError as e:
        fail(f"{path}: cannot read the manifest ({e.strerror or e})")
    except ValueError as e:
        fail(f"{path}: not JSON ({e})")
    if not isinstance(m, dict) or not isinstance(m.get("steps"), dict):
        fail(f"{path}: steps: missing; not a manifest written by bench.reference_outputs capture")
    if m.get("schema") != MANIFEST_SCHEMA:
        fail(f"{path}: schema: {m.get('schema')!r}, expected {MANIFEST_SCHEMA}")
    return m


def fail(message: str) -> NoReturn:
    print(f"python -m bench.reference_outputs: error: {message}", file=sys.stderr)
    raise SystemExit(2)


class _Parser(argparse.ArgumentParser):
    """argparse with one line on stderr and exit 2 on bad arguments."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see --help)")


def main(argv: Sequence[str] | None = None) -> int:
    ap = _Parser(prog="python -m bench.reference_outputs", description=__doc__.splitlines()[0],
                 formatter_class=argparse.RawDescriptionHelpFormatter,
                 epilog=__doc__.split("\n", 1)[1] if __doc__ else None)
    sub = ap.add_subparsers(dest="mode", required=True, parser_class=_Parser, metavar="{capture,check}")
    for name, text in (("capture", "run every reference command; write OUT/manifest.json"),
                       ("check", "capture again and compare with a manifest, file by file")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--out", required=True, type=Path, help="output folder (e.g. results/reference/NAME)")
        p.add_argument("--quick", action="store_true", help="each reproduce script's --quick, fewer configs")
        p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
        if name == "check":
            p.add_argument("--against", required=True, type=Path,
                           help="the baseline manifest (e.g. bench/reference/full.json)")
            p.add_argument("--baseline-dir", type=Path,
                           help="the baseline capture's OUT (with norm/): show diffs of differing files")
    a = ap.parse_args(argv)
    out = a.out.resolve()
    if a.mode == "capture":
        m = capture(out, a.quick, a.quiet)
        failed = [n for n, s in m["steps"].items() if s.get("rc")]
        if failed:
            print(f"failed steps: {', '.join(failed)} (logs in {out}/raw/)", file=sys.stderr)
        return 1 if failed else 0
    if a.baseline_dir is not None and not (a.baseline_dir / "norm").is_dir():
        fail(f"{a.baseline_dir}: no norm/ folder here (give a capture's --out)")
    read_manifest(a.against)  # bad input fails before anything runs
    return check(a.against, out, a.quick, a.baseline_dir, a.quiet)


if __name__ == "__main__":
    sys.exit(main())
