"""Turns the GPU check's JUnit XML (several files, comma-separated, for a suite run in
parts) into the test counts stored in the results file."""
import json
import sys
import xml.etree.ElementTree as ET


def main(junit_path: str, ctest: str, sanitizer_rc: str) -> None:
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    skipped = {}
    try:
        cases = [c for path in junit_path.split(",") for c in ET.parse(path).getroot().iter("testcase")]
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
    except (OSError, ET.ParseError) as e:
        counts["error"] = f"could not read {junit_path}: {e}"
    counts["skip_reasons"] = skipped
    counts["compute_sanitizer_exit"] = int(sanitizer_rc)
    counts["ctest"] = ctest
    print(json.dumps(counts, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:4])
