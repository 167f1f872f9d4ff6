"""Turns the GPU check's JUnit XML files (a glob: one a test process) into
the test counts stored in the results file.

    python scripts/test_summary.py JUNIT_GLOB CTEST_SUMMARY SANITIZER_RC [EXPECTED_FILE]

EXPECTED_FILE (scripts/pytest_shards.py writes it) holds the number of tests
collected; fewer test cases in the JUnit files (a process that crashed) is
recorded as an error rather than as lower counts.
"""
import glob
import json
import sys
import xml.etree.ElementTree as ET


def main(junit_glob: str, ctest: str, sanitizer_rc: str, expected_file: str = "") -> None:
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    skipped = {}
    paths = sorted(glob.glob(junit_glob))
    try:
        if not paths:
            raise OSError("no such file")
        cases = [case for path in paths for case in ET.parse(path).getroot().iter("testcase")]
        for case in cases:
            if case.find("failure") is not None:
                counts["failed"] += 1
            elif case.find("error") is not None:
                counts["errors"] += 1
            elif case.find("skipped") is not None:
                counts["skipped"] += 1
                msg = case.find("skipped").get("message", "")
                skipped[msg] = skipped.get(msg, 0) + 1
            else:
                counts["passed"] += 1
        if expected_file:
            expected = int(open(expected_file).read())
            if len(cases) != expected:
                counts["error"] = f"{len(cases)} test cases in {junit_glob}, {expected} collected"
    except (OSError, ValueError, ET.ParseError) as e:
        counts["error"] = f"could not read {junit_glob}: {e}"
    counts["skip_reasons"] = skipped
    counts["compute_sanitizer_exit"] = int(sanitizer_rc)
    counts["ctest"] = ctest
    print(json.dumps(counts, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:5])
