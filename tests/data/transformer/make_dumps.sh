#!/usr/bin/env bash
# Regenerates the dumps of this directory (see README.md). MSPY: Python with mindspore==2.10.0 and "numpy<2".
# Usage: make_dumps.sh OUT_DIR [CASE...]   (cases: name=train options)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(realpath -m "${1:?usage: make_dumps.sh OUT_DIR}"); shift
py=${MSPY:-python3}
common="--steps 1 --layers 2 --width 64 --seq 32 --batch 1 --vocab 128 --heads 4"
cases=(
  "fp32=--change none"
  "fp16=--change none --fp16"
  "fp32_ln1=--change ln_eps:1"
  "fp16_ln1=--change ln_eps:1 --fp16"
  "fp32_act0=--change act:0"
  "fp16_act0=--change act:0 --fp16"
  "fp32_big=--change big"
  "fp16_big=--change big --fp16"
)
[ $# -gt 0 ] && cases=("$@")
for c in "${cases[@]}"; do
  name=${c%%=*}; opts=${c#*=}
  rm -rf "$out/$name"; mkdir -p "$out/$name"
  cfg=$(mktemp --suffix=.json)
  cat > "$cfg" <<JSON
{
  "common_dump_settings": {
    "op_debug_mode": 0, "dump_mode": 0, "path": "$out/$name", "net_name": "TransformerLM",
    "iteration": "all", "saved_data": "tensor", "input_output": 0, "kernels": [],
    "support_device": [0,1,2,3,4,5,6,7]
  },
  "e2e_dump_settings": {"enable": true, "trans_flag": true}
}
JSON
  (cd "$(mktemp -d)" && MINDSPORE_DUMP_CONFIG=$cfg "$py" "$here/ms_transformer_variant.py" $common $opts)
  rm -f "$cfg"
  du -sh "$out/$name"
done
