#!/bin/bash
# [experiment, not kept] does the benchmark's peer order move RMS bf16 7168-8192 forward?
set -u
MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
cd /tmp
A="--ops rmsnorm --dtypes bf16 --hidden 5120,7168,8192 --directions fwd --no-small"
for r in 1 2 3; do
  for order in ours,compile compile,ours; do
    python3 -m fused_layernorm.bench $A --peers $order --out /tmp/o_${r}_${order/,/-} > $OUT/order_${r}_${order/,/-}.txt 2>&1
    grep -E "^rmsnorm" $OUT/order_${r}_${order/,/-}.txt | awk -v o=$order -v r=$r '{print r, o, $4, $6, $9}'
    grep "copy bandwidth" $OUT/order_${r}_${order/,/-}.txt
  done
done
