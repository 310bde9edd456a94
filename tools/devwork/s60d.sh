# best on an H200: the one-row product against its read floor, then main's three models
source .devwork/pre.sh
mkdir -p $OUT
date +%T
timeout 200 python3 .devwork/probe_qmv.py 2>&1 | tail -8
date +%T
for m in llama3-8b qwen3.6-35b-a3b qwen3.5-27b; do echo "== $m"; bash .devwork/bench.sh . $m bf16; date +%T; done
