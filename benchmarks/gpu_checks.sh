#!/usr/bin/env bash
# Issue #44's GPU checks on a lent GPU machine (16 cores; its image has torch, torchvision, transformers and timm).
# What clipcache needs beside them travels as .whl-bench/site.tar.xz or .whl-cli/site.tar.xz, made here by
# benchmarks/gpu_wheels.py and unpacked under /tmp/site: the two together are more than one call carries, so the
# checks take two calls, one per set:
#   call 1, carry .whl-bench:  STEPS="tests decode amp amp_parity sweep" bash benchmarks/gpu_checks.sh
#   call 2, carry .whl-cli:    STEPS=cli bash benchmarks/gpu_checks.sh
# Each step is time-limited and logs to $OUT/<step>.txt as it goes; the limits add up to 9 minutes, 7.1 in call 1
# and 2 in call 2 (the steps should take about 7 in all on an H100):
#   tests       the CUDA tests (-k cuda): batched nvJPEG + grouped resizes == one image at a time, --decode gpu's
#               streams == a synchronous loop, the overlapped encode == a plain loop, clip_benchmark parity on CUDA;
#   decode      benchmarks/input_pipeline.py's CUDA section: ViT-B-32 and ViT-L-14 against the forward pass alone and
#               clip_benchmark's DataLoader loop, --decode cpu (16 workers) and --decode gpu, with the targets;
#   amp         benchmarks/amp.py: fp32 vs --amp (fp16) vs bf16 autocast, both towers, ViT-B-32 and ViT-L-14;
#   amp_parity  benchmarks/amp.py --parity: clip_benchmark's own --amp run vs clipcache eval --amp, every metric;
#   sweep       benchmarks/input_pipeline.py --sweep: decoding alone at 1..16 workers (prefetch 2 and 4) against the
#               DataLoader: the table for docs/input_pipeline.md;
#   cli         benchmarks/cli_on_device.py: clipcache eval --device cuda (Prefect) on webdataset shards, --decode gpu,
#               SQL, clipcache report (dbt), a cached rescore;
#   models      the CUDA tests of the InternVL and SigLIP 2 loaders (#42): fp32 and fp16 weights against the CPU;
#   places      benchmarks/retrieval_places_cuda.py (#40): per-query places on CUDA equal the CPU pass's, and the
#               tie-heavy / tie-free rescore with and without rows on CUDA.
# DRY=1 runs the steps on the CPU at tiny sizes with this machine's environment (a check of the script itself).
set -u
OUT=${OUT:-/tmp/gpu-checks}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 PREFECT_SERVER_ANALYTICS_ENABLED=false \
    DO_NOT_TRACK=1 DBT_SEND_ANONYMOUS_USAGE_STATS=False PREFECT_LOGGING_LEVEL=WARNING PREFECT_UI_ENABLED=false
PY=${PY:-python3}
started_all=$SECONDS
if [ -n "${DRY:-}" ]; then  # this machine's environment as it is
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
elif compgen -G ".whl*/site.tar.xz" > /dev/null; then  # benchmarks/gpu_wheels.py --pack (LZMA; python, not xz)
    for pack in .whl*/site.tar.xz; do
        $PY -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall('/tmp/site', filter='data')" "$pack" || exit 1
    done
    export PYTHONPATH=/tmp/site:$PWD
elif compgen -G ".whl*/*.whl" > /dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl*/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PATH=/tmp/site/bin:$PATH
STEPS=${STEPS:-tests decode amp amp_parity sweep cli}
if [ -n "${DRY:-}" ]; then  # every step on the CPU, tiny: flags and plumbing only, no figure means anything
    DEV=cpu LIMIT_SCALE=${LIMIT_SCALE:-4}
    DECODE=(--gpu_device cpu --gpu_models tiny-shapes-clip --images 64 --gpu_images 64 --gpu_batch_size 16
            --gpu_workers 2 --gpu_repeats 1)
    AMP=(--models tiny-shapes-clip --batch_size 8 --batches 2 --repeats 1)
    CLI=(--samples 40 --batch_size 16)
    PARITY=(--samples 40 --batch_size 16)
    SWEEP=(--sweep 1 2 --images 64 --batch_size 16 --sweep_images_per_worker 16)
else
    DEV=cuda
    DECODE=(--gpu_images 12000 --gpu_batch_size 256 --gpu_repeats 2 ${GPU_WORKERS:+--gpu_workers $GPU_WORKERS})
    AMP=(--models ViT-B-32 ViT-L-14 --batch_size 256 --batches 8 --repeats 2)
    CLI=(--samples 2000 --batch_size 256)
    PARITY=(--samples 1000 --batch_size 64)
    SWEEP=(--sweep 1 2 4 8 16 --batch_size 64 --sweep_images_per_worker 384)
fi
step() {  # step NAME SECONDS COMMAND...: one logged, time-limited step (skipped unless STEPS names it)
    local name=$1 limit=$(($2 * ${LIMIT_SCALE:-1}))
    shift 2
    [[ " $STEPS " == *" $name "* ]] || return 0
    echo "=== $name ($(date -u +%T), limit $limit s)"
    local started=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
    echo "exit $? after $((SECONDS - started)) s"
    tail -n 30 "$OUT/$name.txt"
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1; nproc
  lscpu | grep -E "Model name|Thread|per socket|Socket"
  $PY -c "import torch, torchvision, numpy; print(torch.__version__, torchvision.__version__, numpy.__version__)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
step tests 50 $PY -m pytest -q -p no:cacheprovider -o addopts="" -k cuda tests/test_gpu_decode.py \
    tests/test_input_pipeline.py tests/test_retrieval_pass.py tests/test_parity_clip_benchmark.py
step decode 200 $PY benchmarks/input_pipeline.py --no_cpu "${DECODE[@]}"
step amp 55 $PY benchmarks/amp.py --device $DEV "${AMP[@]}"
step amp_parity 60 $PY benchmarks/amp.py --parity --device $DEV "${PARITY[@]}"
step sweep 60 $PY benchmarks/input_pipeline.py --no_gpu --sweep_prefetch 2 4 --repeats 1 "${SWEEP[@]}"
step cli 120 $PY benchmarks/cli_on_device.py --device $DEV "${CLI[@]}"
step models 70 $PY -m pytest -q -p no:cacheprovider -o addopts="" -k cuda tests/test_internvl.py tests/test_siglip2.py
step places 60 $PY benchmarks/retrieval_places_cuda.py
echo "=== targets (ratios measured in this run; $((SECONDS - started_all)) s in all)"
for name in $STEPS; do [ -f "$OUT/$name.txt" ] && grep -h -E "target|parity with|every step|passed|failed|FAILED" \
    "$OUT/$name.txt"; done \
    | grep -v "^  *$" | sed 's/^ */  /'
