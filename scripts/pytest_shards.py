"""Runs the Python suite in N processes that share the GPU, for the GPU check
on machines without pytest-xdist (the device machine cannot install it).

    python scripts/pytest_shards.py N JUNIT_PREFIX LOG [pytest args...]

Collects the test ids once, deals them round-robin to N pytest processes
(neighbouring parametrizations, which cost alike, land on different shards),
and writes JUNIT_PREFIX.<k>.xml for each shard and their output to LOG.<k>.
Prints each shard's summary line (and a failing shard's last 40 lines);
exits non-zero if any shard failed.
"""
import subprocess
import sys


def main() -> int:
    n, junit, log, extra = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
    base = [sys.executable, "-m", "pytest", "tests/python", "-p", "no:cacheprovider", *extra]
    collected = subprocess.run(base + ["--collect-only", "-q"], capture_output=True, text=True)
    ids = [line for line in collected.stdout.splitlines() if "::" in line]
    if collected.returncode != 0 or not ids:
        print(collected.stdout[-4000:], collected.stderr[-4000:])
        print(f"pytest_shards: collection failed (exit {collected.returncode}, {len(ids)} tests)")
        return 1
    procs = []
    for k in range(n):
        shard = ids[k::n]
        if not shard:
            continue
        out = open(f"{log}.{k}", "w")
        cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
               f"--junitxml={junit}.{k}.xml", *extra, *shard]
        procs.append((k, subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT), out))
    status = 0
    for k, proc, out in procs:
        rc = proc.wait()
        out.close()
        lines = open(f"{log}.{k}").read().splitlines()
        print(f"shard {k}: exit {rc}: {lines[-1] if lines else '(no output)'}")
        if rc != 0:
            print("\n".join(lines[-40:]))
        status |= rc != 0
    print(f"{len(ids)} tests in {len(procs)} shards")
    return status


if __name__ == "__main__":
    sys.exit(main())
