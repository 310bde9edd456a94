# bench.sh TREE MODEL DTYPE [extra]
tree=$1; m=$2; dt=$3; shift 3
( cd $tree && timeout 240 python3 -m engine bench --synthetic $m --backend cupy --context 16384 --prompt-lengths 2048 \
  --decode-tokens 128 --parallel 8 --streams 1,8 --history 8192 --kv-pages 256 --kv-pages-all --interleave 0 --kv-dtype $dt "$@" > $OUT/bench_$(basename $tree)_${m}_$dt.txt 2>&1; tail -8 $OUT/bench_$(basename $tree)_${m}_$dt.txt )
