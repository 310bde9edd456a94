source .devwork/pre.sh
mkdir -p $OUT /tmp/en && tar xzf .devwork/t_en.tgz -C /tmp/en
cd /tmp/en
date +%T
timeout 240 python3 -m pytest -q -m gpu tests/test_kernels.py tests/test_cupy_backend.py 2>&1 | tail -3
date +%T
for m in tiny-qwen3.5 tiny-qwen3.5-moe smollm2-135m; do
  timeout 100 python3 -m engine gates --backend cupy --model synthetic:$m --quick > $OUT/gates_$m.txt 2>&1; echo "gates $m rc=$?"; grep -iE "fail|pass" $OUT/gates_$m.txt | tail -3
done
date +%T
cd - >/dev/null
for t in . /tmp/en; do echo "== 35B fp8 $t"; bash .devwork/bench.sh $t qwen3.6-35b-a3b fp8; date +%T; done
