"""Groups the results of scripts/trtllm/run-tests.sh (a pytest JUnit XML
file) by cause: passed; failed or errored because the test reads
KVCacheManagerV2's internals (KVCM2InternalError of the shim); because the
only FakeEngine at hand (fake_engine.py at 4097b14) predates the test file;
because a capability is still missing (the capability kvcm's UnsupportedError
names); other failures (kvcm behaving differently: bugs to fix or
differences to decide); skipped, by the skip reason.

usage: python3 scripts/trtllm/report.py junit.xml
"""

from __future__ import annotations

import collections
import os
import re
import sys
import xml.etree.ElementTree as ET

# (cause, pattern in the failure text); the first match wins. The patterns
# name the error itself, so that a traceback merely passing through code
# that mentions a capability does not decide the cause.
CAUSES = [
    ("KVCacheManagerV2 internals (white-box)", r"KVCM2InternalError|internal to KVCacheManagerV2|"
     r"No module named 'tensorrt_llm\.bindings"),
    ("harness: fake_engine.py predates the test file",
     r"FakeEngine\.__init__\(\) takes|'SsmLayerConfig' object has no attribute 'window_size'|"
     r"index_mode: must be given when SWA scratch reuse is enabled"),
    ("unsupported: named by kvcm's UnsupportedError", r"kvcm does not support|UnsupportedError"),
]


# Tests whose failure names no cause but whose cause is known
# (docs/trtllm.md, "TensorRT-LLM's tests"): (cause, pattern in the test name).
NAMED_CAUSES = [
    # Its FakeEngine sizes a token by the manager's tokens_per_block, not the
    # buffer's tokens_per_block_override.
    ("harness: fake_engine.py predates the test file", r"TestHeteroTokensPerBlock\."),
]


def cause(message: str, text: str, test: str) -> str:
    """The cause named by the error message, else by the traceback, else by
    the test's name."""
    for where in (message, text):
        for name, pat in CAUSES:
            if re.search(pat, where):
                return name
    for name, pat in NAMED_CAUSES:
        if re.search(pat, test):
            return name
    return "other: kvcm differs"


def main(path: str) -> None:
    root = ET.parse(path).getroot()
    # pytest writes a second testcase entry for a test whose teardown failed
    # too: a test counts once, by the first failure it reports.
    results: dict[str, tuple[str, str]] = {}
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name')}"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        skip = case.find("skipped")
        if bad is not None:
            text = (bad.get("message") or "") + "\n" + (bad.text or "")
            first = next((ln for ln in (bad.get("message") or "").splitlines() if ln.strip()), "")
            row = ("failed | " + cause(bad.get("message") or "", text, name), f"{name}: {first[:160]}")
        elif skip is not None:
            row = ("skipped | " + (skip.get("message") or "").split("\n")[0][:100], name)
        else:
            row = ("passed", name)
        if name not in results or results[name][0] == "passed":
            results[name] = row
    rows: dict[str, list[str]] = collections.defaultdict(list)
    for key, line in results.values():
        rows[key].append(line)
    print(f"\n{len(results)} tests")
    for key in sorted(rows, key=lambda k: (not k.startswith("passed"), k)):
        print(f"{len(rows[key]):4d}  {key}")
    for key in sorted(rows):
        if key.startswith("failed | other") or os.environ.get("KVCM_TRTLLM_REPORT_ALL"):
            print(f"\n{key}:")
            for line in sorted(rows[key]):
                print("  " + line)


if __name__ == "__main__":
    main(sys.argv[1])
