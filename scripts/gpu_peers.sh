#!/usr/bin/env bash
# On the GPU machine, with the benchmark peers staged into .peers/ (../shared/peers/stage):
#   eval "$(bash scripts/gpu_peers.sh)"
# Runs .peers/install, then merges quack's three CuTe DSL wheels into its target with
# zipfile: `pip install --target` replaces a top-level folder that an earlier wheel
# made, so nvidia_cutlass_dsl/ kept only the last wheel's files and `import quack`
# failed ("cannot import name '_cutlass_ir'").  Prints the install's export line last.
set -u
cd "$(dirname "$0")/.."
export_line=$(bash .peers/install | tail -n 1)
target=/tmp/peers
for w in .peers/wheels/nvidia_cutlass_dsl*.whl; do
  [ -f "$w" ] || continue
  python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$w" "$target" \
    && echo "gpu_peers: merged $(basename "$w") into $target" >&2
done
echo "$export_line"
