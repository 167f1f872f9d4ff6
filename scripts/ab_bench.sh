#!/usr/bin/env bash
# A/B of two trees on one GPU machine: this tree (A) against the files of a tar (B), e.g.
#   here:   git archive my-branch csrc tests fused_layernorm setup.py > .devrun/b.tar
#           (carry .devrun to the machine)
#   there:  AB_TAR=.devrun/b.tar AB_COMMITS="<A's 40-hex> <B's 40-hex>" \
#           bash scripts/ab_bench.sh fused --peers ours --dropout 0 --hidden 1024,4096
# Builds A from scratch, keeps its package in /tmp/ab_a, replaces the tar's top-level folders
# with B's and builds B, then runs `python -m fused_layernorm.bench.<module> <args>` for A and
# B, AB_ROUNDS rounds (default 2), the order swapped each round. The progress lines go to
# $OUT/ab.log (or bench/out/ab.log) as "A1 ...", "B1 ...". sm_90 only unless
# TORCH_CUDA_ARCH_LIST says otherwise. The tree is left built as B.
set -uo pipefail
cd "$(dirname "$0")/.."
module=${1:?usage: AB_TAR=file.tar bash scripts/ab_bench.sh MODULE [bench args]}; shift
tar_file=${AB_TAR:?AB_TAR: the tar of tree B, from git archive BRANCH csrc tests fused_layernorm setup.py}
commit_a="" commit_b=""; read -r commit_a commit_b <<<"${AB_COMMITS:-}" || true
LOG=${OUT:-bench/out}; mkdir -p "$LOG"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16} FLN_GIT_DIRTY=0
build() {
  python3 setup.py build_ext --inplace >"/tmp/ab_build_$1.log" 2>&1 \
    || { tail -30 "/tmp/ab_build_$1.log"; exit 1; }
  echo "$1 built at $SECONDS s" | tee -a "$LOG/ab.log"
}
extension() {  # the one built extension under $1
  local found=("$1"/fused_layernorm/_C*.so)
  [ ${#found[@]} = 1 ] && [ -f "${found[0]}" ] || { echo "ab_bench: not one extension in $1/fused_layernorm" >&2; exit 1; }
  echo "${found[0]}"
}
if [ -n "${AB_REUSE:-}" ]; then  # AB_REUSE=1: the builds of the last run (A in /tmp/ab_a, B here), another module
  [ -d /tmp/ab_a/fused_layernorm ] || { echo "ab_bench: AB_REUSE without an earlier run's /tmp/ab_a" >&2; exit 1; }
else
  # A from scratch: a warm machine may hold B's objects from an earlier run, newer than A's sources.
  rm -rf build fused_layernorm/_C*.so
  build A
  rm -rf /tmp/ab_a && mkdir -p /tmp/ab_a && cp -r fused_layernorm /tmp/ab_a/
  # B replaces A's folders (a file B deleted must not stay); -m: the archive's mtimes are older
  # than A's objects, and the build would skip B's sources.
  for top in $(tar -tf "$tar_file" | cut -d/ -f1 | sort -u); do
    case $top in ""|.|..|.devrun|.git) ;; *) rm -rf "./$top" ;; esac
  done
  tar -xmf "$tar_file"
  build B
fi
if cmp -s "$(extension .)" "$(extension /tmp/ab_a)"; then
  echo "B's extension is A's: nothing of B was rebuilt" | tee -a "$LOG/ab.log"; exit 1
fi
run() {  # label, commit, directory to run in (`python -m` puts it ahead of PYTHONPATH), bench args
  (cd "$3" && env ${2:+FLN_GIT_COMMIT=$2} python3 -m "fused_layernorm.bench.$module" "${@:4}" --out "/tmp/ab_$1" \
     >"/tmp/ab_$1.log" 2>&1)
  local rc=$?
  grep "^\[" "/tmp/ab_$1.log" | sed "s/^/$1 /" >>"$LOG/ab.log"
  grep -m3 -iE "error|wrong|traceback" "/tmp/ab_$1.log" | sed "s/^/$1 /" >>"$LOG/ab.log"
  [ $rc = 0 ] || echo "$1 exit $rc" | tee -a "$LOG/ab.log"
}
for ((r = 1; r <= ${AB_ROUNDS:-2}; r++)); do
  if ((r % 2)); then
    run "A$r" "$commit_a" /tmp/ab_a "$@"; run "B$r" "$commit_b" "$PWD" "$@"
  else
    run "B$r" "$commit_b" "$PWD" "$@"; run "A$r" "$commit_a" /tmp/ab_a "$@"
  fi
  echo "round $r at $SECONDS s" | tee -a "$LOG/ab.log"
done
