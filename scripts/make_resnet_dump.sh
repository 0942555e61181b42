#!/usr/bin/env bash
# A real MindSpore conv-net dump for benchmarks (issue 29): scripts/ms_resnet_train.py (GRAPH mode, CPU) with a
# synchronous tensor dump of every kernel's inputs and outputs, every step (the corpus tools' make_big_dump.sh
# for the ResNet instead of the Transformer).
# Usage: make_resnet_dump.sh OUT_DIR [train options, e.g. --steps 1 --fp16 --seed 2]
# Environment: MSPY, the Python of a venv with mindspore==2.10.0 and "numpy<2" (default: python3).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(realpath -m "${1:?usage: make_resnet_dump.sh OUT_DIR [train options]}"); shift
py=${MSPY:-python3}
mkdir -p "$out"
cfg=$(mktemp --suffix=.json); trap 'rm -f "$cfg"' EXIT
cat > "$cfg" <<JSON
{
  "common_dump_settings": {
    "op_debug_mode": 0, "dump_mode": 0, "path": "$out", "net_name": "ResNet",
    "iteration": "all", "saved_data": "tensor", "input_output": 0, "kernels": [],
    "support_device": [0,1,2,3,4,5,6,7]
  },
  "e2e_dump_settings": {"enable": true, "trans_flag": true}
}
JSON
cd "$(mktemp -d)"
MINDSPORE_DUMP_CONFIG=$cfg "$py" "$here/ms_resnet_train.py" "$@"
du -sh "$out"
