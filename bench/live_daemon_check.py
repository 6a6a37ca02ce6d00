#!/usr/bin/env python3
"""On a GPU host: run a real `moptd run` on the live NVML backend and save what an
operator would see: /metrics, `moptd status` (text and JSON), and what happens when a
kernel Xid record for this host's GPU 0 is written to /dev/kmsg (it must come back
attributed to that GPU). Evidence for the issue notes, not a pass/fail test.

    python bench/live_daemon_check.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.daemon_proc import DaemonProcess


def run(cmd: list[str], out: Path) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    out.write_text(f"$ {' '.join(cmd)}\n(rc={proc.returncode})\n{proc.stdout}{proc.stderr}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        d = DaemonProcess(Path(tmp))
        d.start()
        try:
            d.wait_metrics(timeout=30)
            time.sleep(12)  # one slow-tier pass and a second host pass
            (out / "metrics_live.prom").write_text(d.scrape())
            moptd = [sys.executable, "-m", "moptd"]
            cfg = ["--config", str(d.config_path)]
            run([*moptd, "status", *cfg], out / "status.txt")
            run([*moptd, "status", "--json", *cfg], out / "status.json")
            # record a bundle while the incident below happens, then replay it
            rec = subprocess.Popen(
                [*moptd, "record", "--duration", "40s", "--interval", "5s", "--quiet",
                 "--out", str(out / "bundle.tar.gz"), *cfg])
            time.sleep(10)
            try:
                bus = subprocess.run(
                    ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", "0"],
                    capture_output=True, text=True, timeout=30).stdout.strip()
            except OSError:
                bus = "00000000:FE:00.0"  # no GPU here: a PCI address no device has
            # nvidia-smi prints 00000000:3B:00.0; the kernel prints 0000:3b:00
            dom, b, rest = bus.split(":")
            kernel_bus = f"{dom[-4:]}:{b}:{rest.split('.')[0]}".lower()
            tag = f"moptd-live-check-{uuid.uuid4().hex[:8]}"
            line = (f"NVRM: Xid (PCI:{kernel_bus}): 79, pid=0, GPU has fallen off the bus. "
                    f"{tag}")
            t0 = time.time()
            with open("/dev/kmsg", "w") as kmsg:
                kmsg.write(line + "\n")
            seen = None
            for _ in range(100):
                text = d.scrape()
                if 'xid="79"' in text:
                    seen = time.time() - t0
                    break
                time.sleep(0.05)
            (out / "metrics_after_xid.prom").write_text(d.scrape())
            run([*moptd, "explain", "--json", *cfg], out / "explain.json")
            run([*moptd, "explain", *cfg], out / "explain.txt")
            rec.wait(timeout=120)
            run([*moptd, "replay", "--json", str(out / "bundle.tar.gz")], out / "replay.json")
            (out / "xid_check.json").write_text(json.dumps(
                {"line": line, "kernel_bus": kernel_bus, "seen_in_metrics_after_s": seen}))
        finally:
            d.stop()
            (out / "daemon.log").write_text(d.log())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
