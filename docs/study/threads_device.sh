#!/bin/sh
# Thread scaling on a many-core machine (docs/benchmarks.md section 16): one short prepared run.
#
#   sh docs/study/threads_device.sh [OUT_DIR]        # from the repository root
#
# Builds diffuse (the C++ engine) into its own venv, writes the random Qwen2.5-0.5B-shaped Dream
# and its qwen2 twin (Q4_K_M, about 1 GB together), then runs `diffuse bench threads` over
# 1, 2, 4, 8, 12 and 16 threads. llama.cpp's side runs where its source is given: LLAMA_SRC=DIR
# (llama.cpp's tree, e.g. the vendor/llama.cpp of the pinned llama-cpp-python 0.3.36 sdist) is
# built with the instruction sets named (a native build dies in ggml's AMX product on VMs that list
# AMX without enabling it, see app/diffuse/bench/llama_ref.py). Offline machines: WHEELS=DIR, a
# folder of the build and runtime wheels (pip download -d DIR scikit-build-core==1.1.2
# pybind11==3.1.0 numpy==2.4.6 gguf==0.19.0 tokenizers==0.23.3 safetensors==0.8.0 jinja2==3.1.6
# cmake ninja). Everything it writes goes to OUT_DIR (default /tmp/diffuse-threads).
set -eu
OUT=${1:-/tmp/diffuse-threads}
THREADS=${THREADS:-1,2,4,8,12,16}
mkdir -p "$OUT"
uptime | tee "$OUT/uptime-start.txt"
nproc; lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket|L3' || true

python3 -m venv "$OUT/venv"
PIP="$OUT/venv/bin/pip"
if [ -n "${WHEELS:-}" ]; then
    $PIP install -q --no-index --find-links "$WHEELS" scikit-build-core==1.1.2 pybind11==3.1.0 cmake ninja
    $PIP install -q --no-index --find-links "$WHEELS" --no-build-isolation -e .
else
    $PIP install -q scikit-build-core==1.1.2 pybind11==3.1.0
    $PIP install -q --no-build-isolation -e .
fi
PY="$OUT/venv/bin/python"

LLAMA=""
if [ -n "${LLAMA_SRC:-}" ]; then
    FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
    grep -q avx512f /proc/cpuinfo && FLAGS="$FLAGS -DGGML_AVX512=ON"
    grep -q avx512_vnni /proc/cpuinfo && FLAGS="$FLAGS -DGGML_AVX512_VNNI=ON"
    grep -q avx512_bf16 /proc/cpuinfo && FLAGS="$FLAGS -DGGML_AVX512_BF16=ON"
    # shellcheck disable=SC2086
    cmake -S "$LLAMA_SRC" -B "$OUT/llama-build" -DLLAMA_CURL=OFF $FLAGS > "$OUT/llama-cmake.log"
    cmake --build "$OUT/llama-build" --target llama-bench -j "$(nproc)" > "$OUT/llama-build.log"
    LLAMA="--llama-bin $OUT/llama-build/bin"
fi

"$PY" -m diffuse.bench.threads make "$OUT"
# shellcheck disable=SC2086
"$OUT/venv/bin/diffuse" bench threads "$OUT/dream-0.5b-shape-24l-q4_k_m.gguf" \
    --ar-model "$OUT/qwen2-0.5b-shape-24l-q4_k_m.gguf" $LLAMA --threads "$THREADS" --reps 3 \
    --json "$OUT/threads.json" --markdown "$OUT/threads.md"
uptime | tee "$OUT/uptime-end.txt"
