#!/usr/bin/env bash
# The GPU checks of issue #30 in one call on a lent GPU machine (its image has torch, torchvision, transformers and
# timm; what clipcache needs beside them travels as cp312 wheels in .whl/, installed under /tmp/site):
#   1. the CUDA tests: overlapped encode == a plain loop to the bit, nvJPEG vs PIL, clip_benchmark parity on CUDA;
#   2. benchmarks/input_pipeline.py's CUDA section: ViT-B-32 and ViT-L-14 encode throughput against the peer's
#      loop and the forward pass alone, --decode gpu, and its difference from PIL;
#   3. benchmarks/retrieval_scoring.py on CUDA: 5k x 25k and 100k x 500k;
#   4. the CPU section of input_pipeline.py at 1, 4 and 16 decoding workers (scaling with cores).
# Each step writes its log under $OUT (or /tmp/gpu-checks) as it goes. STEPS="tests input_pipeline_gpu" runs some;
# GPU_WORKERS="16 14" times --decode cpu at each number of decoding processes (default: one per core).
set -u
OUT=${OUT:-/tmp/gpu-checks}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
STEPS=${STEPS:-tests input_pipeline_gpu scoring_5k scoring_100k input_pipeline_cpu}
step() {  # step NAME SECONDS COMMAND...: one logged, time-limited step (skipped unless STEPS names it)
    local name=$1 limit=$2
    shift 2
    [[ " $STEPS " == *" $name "* ]] || return 0
    echo "=== $name ($(date -u +%T))"
    local started=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
    echo "exit $? after $((SECONDS - started)) s"
    tail -n 25 "$OUT/$name.txt"
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv; nproc; lscpu | grep -E "Model name|Thread|per socket|Socket"
  python3 -c "import torch, torchvision, numpy; print(torch.__version__, torchvision.__version__, numpy.__version__)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
step tests 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -k cuda \
    tests/test_input_pipeline.py tests/test_retrieval_pass.py tests/test_parity_clip_benchmark.py
step input_pipeline_gpu "${GPU_LIMIT:-300}" python3 benchmarks/input_pipeline.py --no_cpu \
    ${GPU_WORKERS:+--gpu_workers $GPU_WORKERS}
step scoring_5k 90 python3 benchmarks/retrieval_scoring.py --device cuda
step scoring_100k 180 python3 benchmarks/retrieval_scoring.py --device cuda --images 100000 --captions 500000
step input_pipeline_cpu 150 python3 benchmarks/input_pipeline.py --no_gpu --workers 1 4 16 --repeats 2 \
    --only "clipcache processes" "clip_benchmark DataLoader"
