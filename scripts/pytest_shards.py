"""Runs the Python suite in N processes that share the GPU, for the GPU check
on machines without pytest-xdist (the device machine cannot install it).

    python scripts/pytest_shards.py N JUNIT_PREFIX LOG [pytest options...]

Collects the test ids once and deals them round-robin to N pytest processes
(neighbouring parametrizations, which cost alike, land on different shards).
Tests marked `slow` (tens of GB of GPU memory each) run afterwards in one
more process, one at a time, so that shards do not compete for memory.  Each
process k writes JUNIT_PREFIX.<k>.xml and its output to LOG.<k>.  Extra
arguments are pytest options (not paths: every process would run them).

Prints each process's summary line (and a failing one's last 40 lines), and
writes JUNIT_PREFIX.expected with the number of tests collected, which
test_summary.py checks.  Exits non-zero if any process failed, or wrote no
JUnit file or fewer test cases than it was given (a crash).
"""
import subprocess
import sys
import xml.etree.ElementTree as ET


def collect(base: list, marker: str) -> list:
    """Test ids selected by `marker`, or None if collection failed."""
    out = subprocess.run(base + ["--collect-only", "-q", "-m", marker], capture_output=True, text=True)
    if out.returncode not in (0, 5):  # 5: nothing selected
        print(out.stdout[-4000:], out.stderr[-4000:])
        return None
    ids = []
    for line in out.stdout.splitlines():
        if not line.strip():
            break  # the ids end at the first blank line; a summary follows
        ids.append(line)
    return ids


def cases_in(path: str) -> int:
    try:
        return sum(1 for _ in ET.parse(path).getroot().iter("testcase"))
    except (OSError, ET.ParseError):
        return -1


def main() -> int:
    n, junit, log, extra = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
    if n < 1:
        print(f"pytest_shards: need at least one shard, got {n}")
        return 1
    base = [sys.executable, "-m", "pytest", "tests/python", "-p", "no:cacheprovider", *extra]
    fast, slow = collect(base, "not slow"), collect(base, "slow")
    if fast is None or slow is None or not fast + slow:
        print("pytest_shards: collection failed")
        return 1
    with open(f"{junit}.expected", "w") as f:
        f.write(f"{len(fast) + len(slow)}\n")

    def start(k: int, ids: list):
        out = open(f"{log}.{k}", "w")
        cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
               f"--junitxml={junit}.{k}.xml", *extra, *ids]
        return k, ids, subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT), out

    def finish(k: int, ids: list, proc, out) -> int:
        rc = proc.wait()
        out.close()
        lines = open(f"{log}.{k}").read().splitlines()
        got = cases_in(f"{junit}.{k}.xml")
        print(f"process {k} ({len(ids)} tests): exit {rc}: {lines[-1] if lines else '(no output)'}")
        if got != len(ids):
            print(f"process {k}: {got} test cases in its JUnit file, {len(ids)} given (a crash?)")
        if rc != 0 or got != len(ids):
            print("\n".join(lines[-40:]))
            return 1
        return 0

    shards = [fast[k::n] for k in range(n) if fast[k::n]]
    running = [start(k, ids) for k, ids in enumerate(shards)]
    status = sum(finish(*r) for r in running)
    if slow:
        status += finish(*start(len(shards), slow))
    print(f"{len(fast)} tests in {len(shards)} parallel processes, then {len(slow)} marked slow in one")
    return 1 if status else 0


if __name__ == "__main__":
    sys.exit(main())
