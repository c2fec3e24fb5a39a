#!/usr/bin/env bash
# The checks that need a GPU, as one script: run it on a machine with an NVIDIA GPU.
#
#   bench/gpu_check.sh [OUT]        (OUT: the folder for everything; default $OUT, else results/gpu_check)
#
# Steps, each under its own time limit, each logged and kept whatever the others do:
#   env        nvidia-smi, torch and CUDA versions                      -> env.txt
#   setup      the project installed (pip install -e .) where hetsim is not importable
#   profile    hetsim profile --quick on cuda:0 (micro-benchmarks in every math mode
#              the GPU has)                                              -> profile.json, profile.log
#   fit        hetsim calibrate of that profile                          -> calibrate.log
#   tests      the CUDA tests (pytest -m gpu)                            -> tests.log, tests.xml
#   validate   hetsim validate of a 2-worker GPU config (runtime.device: cuda) -> validate/
#   published  the shipped GPU profiles against the published table (CPU only) -> published.txt
# and summary.json: each step's status (ok | failed | skipped), seconds and reason.
# Without a GPU the GPU steps are skipped (said in summary.json) and the rest run.
# Time limits (seconds) can be lowered with GPU_CHECK_LIMIT_S (default 150 a step).
set -uo pipefail

cd "$(dirname "$0")/.."
out=${1:-${OUT:-results/gpu_check}}
mkdir -p "$out"
limit=${GPU_CHECK_LIMIT_S:-150}
py=${PYTHON:-}
if [[ -z "$py" ]]; then
  if [[ -x .venv/bin/python ]]; then py=.venv/bin/python; else py=python3; fi
fi
steps=()

log() { echo "[gpu_check $(date +%H:%M:%S)] $*" | tee -a "$out/log.txt" >&2; }

# record NAME STATUS SECONDS REASON
record() { steps+=("{\"step\": \"$1\", \"status\": \"$2\", \"seconds\": $3, \"reason\": \"${4//\"/\'}\"}"); }

# run NAME LOGFILE CMD...: the command under the time limit, its output in LOGFILE
run() {
  local name=$1 logf=$2; shift 2
  local t0=$SECONDS rc
  log "$name: $*"
  timeout --kill-after=10 "$limit" "$@" >"$logf" 2>&1
  rc=$?
  if [[ $rc -eq 0 ]]; then
    record "$name" ok $((SECONDS - t0)) ""
  else
    local why="exit $rc"
    [[ $rc -eq 124 || $rc -eq 137 ]] && why="over ${limit} s"
    record "$name" failed $((SECONDS - t0)) "$why; see $(basename "$logf")"
    log "$name failed ($why)"
  fi
  return $rc
}

# -- env -----------------------------------------------------------------------
{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -a)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "devices", torch.cuda.device_count()); print("gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)' 2>&1
} >"$out/env.txt" 2>&1
record env ok 0 ""

# -- setup ---------------------------------------------------------------------
if "$py" -c "import sim, calibration, experiments.cli" 2>/dev/null; then
  record setup ok 0 "already importable"
else
  run setup "$out/setup.log" "$py" -m pip install -q -e ".[dev]" || true
fi

gpu=0
"$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null && gpu=1
if [[ $gpu -eq 0 ]] && command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU; then
  # a GPU the driver sees but this torch does not (a CPU wheel): every GPU step would be skipped
  record torch_cuda failed 0 "nvidia-smi lists a GPU but $py's torch sees no CUDA: set PYTHON to one whose torch has CUDA"
fi
hetsim=("$py" -m experiments.cli)

# -- profile and fit -----------------------------------------------------------
if [[ $gpu -eq 1 ]]; then
  if run profile "$out/profile.log" "${hetsim[@]}" profile --device cuda:0 --quick --quiet --out "$out/profile.json"; then
    run fit "$out/calibrate.log" "${hetsim[@]}" calibrate "$out/profile.json" --out "$out/profile_fitted.json" || true
  else
    record fit skipped 0 "no profile"
  fi
else
  record profile skipped 0 "no CUDA GPU visible to torch"
  record fit skipped 0 "no CUDA GPU visible to torch"
fi

# -- CUDA tests ----------------------------------------------------------------
if [[ $gpu -eq 1 ]]; then
  run tests "$out/tests.log" "$py" -m pytest -q -m gpu -p no:cacheprovider --junitxml="$out/tests.xml" || true
else
  record tests skipped 0 "no CUDA GPU visible to torch"
fi

# -- validate on the GPU ---------------------------------------------------------
if [[ $gpu -eq 1 ]]; then
  run validate "$out/validate.log" "${hetsim[@]}" validate experiments/configs/gpu/v1_mlp_2w_bsp_cuda.yaml \
    --iterations 30 --out "$out/validate" || true
else
  record validate skipped 0 "no CUDA GPU visible to torch"
fi

# -- the published table (CPU) ---------------------------------------------------
run published "$out/published.txt" "$py" -m calibration.published --predict || true

# -- summary -------------------------------------------------------------------
{
  echo "{\"gpu\": $gpu, \"limit_s\": $limit, \"steps\": ["
  for i in "${!steps[@]}"; do
    [[ $i -gt 0 ]] && echo ","
    printf '  %s' "${steps[$i]}"
  done
  echo ""
  echo "]}"
} >"$out/summary.json"
log "wrote $out/summary.json"
grep -q '"status": "failed"' "$out/summary.json" && exit 1
exit 0
