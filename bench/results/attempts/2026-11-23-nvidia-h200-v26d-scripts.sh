# v26d: abtmp/run.sh (variants H, C, D; see the -ab1 file)
set -u
for v in H C D; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; done
cp abtmp/h/* /tmp/H/csrc/kernels/cuda/
cp abtmp/c/* /tmp/C/csrc/kernels/cuda/
date
for v in H C D; do (cd /tmp/$v && MAX_JOBS=6 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
date
F=""; for op in ln rms; do for dt in bf16 fp16; do for h in 256 512 640 768 1024; do F="$F fwd:$op:$dt:$h"; done; done; done
F="$F fwd:ln:fp32:256 fwd:ln:fp32:384 fwd:ln:fp32:512 fwd:rms:fp32:256 fwd:rms:fp32:384 fwd:rms:fp32:512"
for round in 1 2; do
  for v in H C D; do PYTHONPATH=/tmp/$v python3 abtmp/ab3.py $v $F; done
done 2>&1 | grep -v Warning | tee $OUT/ab.txt
date
cd /tmp/D && timeout 150 python3 -m pytest -q -n 8 tests/python/test_cuda_only.py -k "short_rows or sweep or row_count" > $OUT/testD.txt 2>&1; echo testD rc $? >> $OUT/testD.txt
tail -3 $OUT/testD.txt
date

# ==== abtmp/ab3.py
# identical to abtmp/ab3.py in 2026-11-23-nvidia-h200-v26-scripts.sh (not repeated)
