#!/usr/bin/env bash
# The follow-up to gpu_lease.sh's H200 call of 2026-11-28, in one short device call (~150 s):
#   1. the auto-budget probe's CUDA test (both step paths), whose assertion was wrong for the
#      planned path and is fixed, not yet re-run on a GPU (~25 s by estimate);
#   2. gpu_scale.py's shared_minilm case (one MiniLM process alone, then four at once), which did
#      not fit the first call, if what is left fits its two runs (~90 s by estimate); its fresh
#      runs now mark where the seconds before the first step go (gpu_fresh_run.py);
#   3. whether this Python has bytecode caches for torch and transformers, and (if time is
#      left) which imports transformers' BERT code spends its seconds on.
# Run from the repository root on the device machine with .gpu/ carried (made here by
# `benchmarks/gpu_lease.sh --pack`). At most 5 files go to $OUT.
#
#   OUT=/tmp/out benchmarks/gpu_followup.sh    # there (WELLFED_BENCH_SMOKE=1 on a CPU)
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:?set OUT to a folder for the logs}
export PYTHONPATH="$PWD/src:$PWD/benchmarks:$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
export WELLFED_MODEL_DIR="$PWD/.gpu/minilm" WELLFED_SST2_DIR="$PWD/.gpu/sst2"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
started=$SECONDS
left() { echo $(( ${LEASE_S:-150} - (SECONDS - started) )); }

# Versions from package metadata and the bytecode check: no import of torch (a second or less).
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  python - <<'EOF'
import importlib.metadata as md, importlib.util, os, sys
print(sys.version.split()[0], *(f"{p} {md.version(p)}" for p in ("torch", "transformers")))
print("dont_write_bytecode", sys.flags.dont_write_bytecode,
      "PYTHONPYCACHEPREFIX", os.environ.get("PYTHONPYCACHEPREFIX"))
tag = sys.implementation.cache_tag
for pkg in ("torch", "transformers", "wellfed"):
    root = os.path.dirname(importlib.util.find_spec(pkg).origin)
    py = pyc = 0
    for folder, _, files in os.walk(root):
        py += sum(f.endswith(".py") for f in files)
        pyc += sum(f.endswith(f".{tag}.pyc") for f in files)
    print(f"{pkg}: {py} .py, {pyc} {tag}.pyc, folder writable {os.access(root, os.W_OK)}")
EOF
} > "$OUT/gpu_env.txt" 2>&1
cat "$OUT/gpu_env.txt"

# 1. The probe's test alone (2 parametrised cases).
timeout 120 python -m pytest \
  "tests/gpu/test_cuda.py::test_auto_budget_probe_finds_a_fitting_budget_on_the_device" \
  -m cuda -rA -q -p no:cacheprovider --durations=4 > "$OUT/cuda_probe_test.txt" 2>&1
echo "probe test: exit $? after $((SECONDS - started)) s"; tail -3 "$OUT/cuda_probe_test.txt"

# 2. shared_minilm in what is left, 20 s kept for the rest: each of its runs starts only with
# 30 s or more before the deadline (gpu_scale.py cuts a run short at its limit and says so).
export WELLFED_BENCH_DEADLINE_S=$(( $(left) - 20 )) WELLFED_BENCH_LEAST_S=30
if (( WELLFED_BENCH_DEADLINE_S > 70 )); then
  timeout $(( WELLFED_BENCH_DEADLINE_S + 10 )) python benchmarks/gpu_scale.py shared_minilm \
    > "$OUT/gpu_scale_shared_minilm.log" 2>&1
  echo "shared_minilm: exit $? after $((SECONDS - started)) s"
  tail -4 "$OUT/gpu_scale_shared_minilm.log"
  # The JSON it wrote (this copy's gpu_scale.json, or a temporary one in a smoke run) holds
  # shared_minilm alone: it comes back under its own name, so that the committed gpu_scale.json
  # (the first five cases) is not replaced by it.
  result=$(grep -o 'wrote .*gpu_scale\.json' "$OUT/gpu_scale_shared_minilm.log" | tail -1)
  [[ -n "$result" ]] && cp "${result#wrote }" "$OUT/gpu_scale_shared_minilm.json"
else
  echo "shared_minilm: skipped, $(left) s left"
fi

# 3. Where importing transformers' BERT code goes, if 15 s are left (a warm page cache by now).
if (( $(left) > 15 )); then
  times=$(mktemp)
  timeout $(( $(left) - 3 )) python -X importtime -c "import transformers.models.bert.modeling_bert" \
    2> "$times"
  { echo "# python -X importtime -c 'import transformers.models.bert.modeling_bert': the 40"
    echo "# largest cumulative times (us), after the test and the shared_minilm runs"
    sort -t'|' -k2 -n -r "$times" | head -40; } > "$OUT/gpu_importtime.txt"
  rm -f "$times"
fi
echo "follow-up done after $((SECONDS - started)) s"
