source .devwork/pre.sh
mkdir -p $OUT /tmp/en && tar xzf .devwork/t_en.tgz -C /tmp/en
date +%T
echo "== probe main"; DUMP=$OUT/m python3 .devwork/probe_attn.py 2>&1 | tail -12
echo "== probe en"; (cd /tmp/en && DUMP=$OUT/q python3 $OLDPWD/.devwork/probe_attn.py 2>&1 | tail -12)
python3 - <<'P'
import numpy as np, glob, os
o=os.environ["OUT"]
for f in sorted(glob.glob(o+"/m_*.npy")):
    g=f.replace("/m_","/q_"); a,b=np.load(f),np.load(g)
    d=np.abs(a-b).max()/max(np.abs(a).max(),1e-30)
    print(os.path.basename(f), "en vs main:", "bits equal" if np.array_equal(a.view(np.uint32),b.view(np.uint32)) else "differ, max rel %.3g"%d)
P
rm -f $OUT/*.npy
date +%T
(cd /tmp/en && timeout 120 python3 -m pytest -q -x -m gpu tests/test_kernels.py -k "attention or kv_write" 2>&1 | tail -3)
date +%T
for dt in fp8 bf16; do for t in . /tmp/en; do echo "== 8B $dt $t"; bash .devwork/bench.sh $t llama3-8b $dt; date +%T; done; done
for t in . /tmp/en; do echo "== 35B bf16 $t"; bash .devwork/bench.sh $t qwen3.6-35b-a3b bf16; date +%T; done
