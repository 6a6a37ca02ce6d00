"""Replay speed: a one-hour bundle generated from the real H200 captures, timed end to end.

The bundle repeats the real 45-second NVML timeline (tests/fixtures/h200/nvml_samples.jsonl:
idle -> bf16 matmul at the power cap -> idle) back to back for an hour at its own 2 Hz
(7,200 samples), with the real nvidia-smi dump, dmesg and /proc files. Reports the replay's
speed as a multiple of real time (target: at least 1,000x).

    python bench/replay_speed.py [--minutes 60]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from moptd.bundle import read_bundle
from moptd.diagnose.loader import default_rules_dir
from moptd.diagnose.replay import replay

H200 = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "h200"


def make_bundle(root: Path, minutes: float) -> float:
    rows = [json.loads(line) for line in (H200 / "nvml_samples.jsonl").read_text().splitlines()]
    t0 = rows[0]["t"]
    period = rows[-1]["t"] - t0 + 0.5
    span = minutes * 60
    (root / "gpu" / "nvidia-smi").mkdir(parents=True)
    (root / "kernel").mkdir()
    (root / "host").mkdir()
    with (root / "gpu" / "samples.jsonl").open("w") as out:
        k = 0
        while k * period < span:
            for r in rows:
                t = r["t"] + k * period
                if t - t0 >= span:
                    break
                out.write(json.dumps({**r, "t": round(t, 3)}) + "\n")
            k += 1
    shutil.copy(H200 / "nvsmi_idle.txt", root / "gpu" / "nvidia-smi" / "001.txt")
    shutil.copy(H200 / "dmesg.txt", root / "kernel" / "dmesg.txt")
    shutil.copy(H200 / "proc_modules", root / "kernel" / "proc_modules")
    shutil.copy(H200 / "proc_driver_nvidia_version", root / "kernel" / "driver_version")
    for name in ("meminfo", "swappiness"):
        shutil.copy(H200 / name, root / "host" / name)
    shutil.copy(H200 / "df.txt", root / "host" / "df.txt")
    shutil.copy(H200 / "dev_nodes.txt", root / "host" / "dev_nodes.txt")
    (root / "bundle.yaml").write_text(
        "format: moptd-bundle/v1\nhost: h200-bench\ncaptured_at: '2026-11-29T16:21:26Z'\n"
    )
    return span


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=60)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "bundle"
        span = make_bundle(root, args.minutes)
        t0 = time.perf_counter()
        report = replay(root, [default_rules_dir()], read_bundle)
        wall = time.perf_counter() - t0
    codes = sorted({str(f["code"]) for f in report.findings})
    print(
        f"{report.steps} steps over {span / 60:.0f} min of bundle time in {wall:.2f} s: "
        f"{span / wall:.0f}x real time (target >= 1000x); findings: {codes}"
    )


if __name__ == "__main__":
    main()
