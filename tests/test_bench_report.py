"""`make bench` keeps working: its quick mode runs every loader of the course and writes the
report."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_benchmark_writes_report_with_every_target(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "report.py"), "--small", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["samples"] == 500
    assert len(results["ratios"]) == 5
    # our stream, 2 workers / 0: measured in turn
    in_turn = [ratio for ratio in results["ratios"] if ratio["rounds"]]
    assert [len(ratio["rounds"]) for ratio in in_turn] == [2]
    assert len(results["ceilings"]) == 3 and all(
        ceiling["value"] > 0 for ceiling in results["ceilings"]
    )
    assert results["fresh_page_us"] > 0
    assert len(results["handover"]) == 2 and all(
        setting["value"] > 0 for setting in results["handover"]
    )
    loaders = ["folder", "ZIP", "indexed tar", "our stream", "webdataset"]
    for cache in ("warm", "cold"):
        for name in loaders:
            for workers in (0, 1, 2):
                assert results["rates"][f"{cache}/{name}, {workers} workers"]
    assert {
        "network/per-file",
        "network/shards",
        "limit/shard files read whole",
        "limit/shard files cut at known offsets",
        "limit/JPEG decode, two processes",
        "raw/ours, gzip shards",
    } <= set(results["rates"])
    assert 0 < results["gzip_share"] < 2
    report = (tmp_path / "report.md").read_text()
    assert all(ratio["what"] in report for ratio in results["ratios"] + results["ceilings"])
    assert (tmp_path / "loaders.png").stat().st_size > 10_000
