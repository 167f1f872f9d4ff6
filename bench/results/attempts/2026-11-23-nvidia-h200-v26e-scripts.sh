# v26e: abtmp/run.sh of ab4 (ab2 and ab3 as ab1's with their variants' files); abtmp/ab3.py as in the v26d scripts
set -u
for v in H F; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; done
cp abtmp/h/* /tmp/H/csrc/kernels/cuda/
date
for v in H F; do (cd /tmp/$v && MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
date
F="fwd:ln:bf16:128 fwd:ln:bf16:256 fwd:ln:bf16:512 fwd:ln:bf16:768 fwd:ln:bf16:1024 fwd:ln:fp16:256 fwd:ln:fp16:512 fwd:ln:fp32:256 fwd:ln:fp32:512 fwd:rms:bf16:256 fwd:rms:bf16:768"
F="$F fwd:rms:bf16:12288 fwd:ln:bf16:12288 fwd:rms:fp16:12288 fwd:ln:fp32:6144 fwd:rms:fp32:6144 fwd:ln:bf16:11264 fwd:rms:bf16:10496"
F="$F fwd:rms:bf16:16384 fwd:ln:bf16:16384 fwd:rms:fp16:16384 fwd:ln:bf16:14336 fwd:ln:bf16:24576"
for round in 1 2 3; do
  for v in H F; do PYTHONPATH=/tmp/$v python3 abtmp/ab3.py $v $F; done
done 2>&1 | grep -v Warning | tee $OUT/ab.txt
date
cd /tmp/F && timeout 120 python3 -m pytest -q -n 8 -x tests/python/test_cuda_only.py -k "short_rows or sweep or reread" > $OUT/testF.txt 2>&1; echo testF rc $? >> $OUT/testF.txt
tail -3 $OUT/testF.txt
date
