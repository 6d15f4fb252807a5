#!/usr/bin/env bash
# Makes a Python environment in which SGLang's RadixCache imports on a CPU-only machine, for
# `radixkv-compare --sglang-python VENV/bin/python` (BENCHMARKS.md). About 5 GB, a minute or
# two from PyPI: torch from PyPI brings its CUDA libraries even where there is no GPU, and
# `sglang` is installed without its dependencies (they include GPU kernels), adding only the
# modules `sglang.srt.mem_cache.radix_cache` imports. Versions as measured in BENCHMARKS.md.
#
#   benches/compare/sglang/setup.sh [VENV]      # default VENV: target/sglang-venv
set -euo pipefail
venv=${1:-target/sglang-venv}
python3 -m venv "$venv"
pip="$venv/bin/pip"
"$pip" install -q torch==2.15.0 torchvision==0.29.2
"$pip" install -q --no-deps sglang==0.5.23
"$pip" install -q numpy==2.4.6 orjson==3.13.0 psutil==7.2.2 pybase64==1.5.1 requests==2.34.2 \
  packaging==26.4 pillow==13.0.0 starlette==1.10.0 msgspec==0.23.0 pydantic==2.14.4 \
  pyzmq==27.3.0 tqdm==4.70.1 ipython==9.18.1 aiohttp==3.14.5 transformers==5.24.0 dill==0.4.1 \
  apache-tvm-ffi==0.1.15.post2 sentencepiece==0.2.3 compressed-tensors==0.20.1 gguf==0.19.0 \
  2>&1 | grep -v "requires\|dependency resolver\|dependency conflicts" || true
"$venv/bin/python" -W ignore -c "from sglang.srt.mem_cache.radix_cache import RadixCache" 2>/dev/null
echo "ready: radixkv-compare --sglang-python $venv/bin/python"
