"""Replay speed and memory: a bundle generated from the real H200 captures, timed end to end.

The bundle repeats the real 45-second NVML timeline (tests/fixtures/h200/nvml_samples.jsonl:
idle -> bf16 matmul at the power cap -> idle) back to back at its own 2 Hz, with the real
nvidia-smi dump, dmesg and /proc files. Reports the replay's speed as a multiple of real
time and, with ``--hours``, its peak RSS.

    python bench/replay_speed.py [--minutes 60]          # in this process (target >= 1000x)
    python bench/replay_speed.py --hours 24 [--rounds 3] [--other TREE]

With ``--hours`` every replay runs in a fresh child process (its peak RSS is its own
``ru_maxrss``), built once and replayed by this tree and, with ``--other``, alternately by
another checkout (``git worktree add /tmp/old REV``): each child imports the tree it is
given and calls only ``replay(bundle, [default_rules_dir()], read_bundle)``, which both
sides have. Medians and the ratios this/other are printed last (issue 17 target: a 24-hour
bundle at >= 3,000x real time in <= 200 MB peak RSS).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

H200 = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "h200"
THIS = Path(__file__).resolve().parents[1]


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


def replay_once(bundle: Path) -> dict[str, object]:
    """One replay in this process: wall time, steps, codes, and this process's peak RSS."""
    import resource

    from moptd.bundle import read_bundle
    from moptd.diagnose.loader import default_rules_dir
    from moptd.diagnose.replay import replay

    t0 = time.perf_counter()
    c0 = time.process_time()
    report = replay(bundle, [default_rules_dir()], read_bundle)
    cpu = time.process_time() - c0
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "cpu_s": cpu,  # less disturbed than wall time by other work on a shared machine
        "steps": report.steps,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "codes": sorted({str(f["code"]) for f in report.findings}),
        "findings": len(report.findings),
    }


def _child(tree: Path, bundle: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", str(bundle)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"replay in {tree} failed:\n{proc.stderr}")
    result: dict[str, object] = json.loads(proc.stdout.splitlines()[-1])
    return result


def _ab(hours: float, rounds: int, other: Path | None) -> None:
    trees = [("this", THIS)] + ([("other", other.resolve())] if other else [])
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "bundle"
        span = make_bundle(bundle, hours * 60)
        size = (bundle / "gpu" / "samples.jsonl").stat().st_size / 1e6
        print(f"bundle: {hours:g} h of samples ({size:.1f} MB samples.jsonl), {span:.0f} s")
        runs: dict[str, list[dict[str, object]]] = {name: [] for name, _ in trees}
        for r in range(1, rounds + 1):
            for name, tree in trees if r % 2 else trees[::-1]:
                res = _child(tree, bundle)
                runs[name].append(res)
                wall = float(str(res["wall_s"]))
                print(
                    f"round {r} {name:5}: {res['steps']} steps in {wall:.2f} s "
                    f"({float(str(res['cpu_s'])):.2f} s CPU) = {span / wall:.0f}x real time, "
                    f"peak RSS {res['peak_rss_mb']:.0f} MB, "
                    f"{res['findings']} findings {res['codes']}",
                    flush=True,
                )
    med: dict[str, tuple[float, float, float]] = {}
    for name, results in runs.items():
        wall = statistics.median(float(str(x["wall_s"])) for x in results)
        cpu = statistics.median(float(str(x["cpu_s"])) for x in results)
        rss = statistics.median(float(str(x["peak_rss_mb"])) for x in results)
        med[name] = (wall, cpu, rss)
        print(
            f"median {name:5}: {wall:.2f} s = {span / wall:.0f}x real time "
            f"(target >= 3000x; {span / cpu:.0f}x per CPU second), "
            f"peak RSS {rss:.0f} MB (target <= 200 MB)"
        )
    if "other" in med:
        (w_this, c_this, r_this), (w_other, c_other, r_other) = med["this"], med["other"]
        print(
            f"ratio this/other: wall {w_this / w_other:.3f}, CPU {c_this / c_other:.3f}, "
            f"peak RSS {r_this / r_other:.3f}"
        )
        same = {json.dumps(x["codes"]) for rs in runs.values() for x in rs}
        print(f"same codes on both sides: {len(same) == 1}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--hours", type=float, help="child-process mode with peak RSS (e.g. 24)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--other", type=Path, help="another checkout to replay alternately")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(replay_once(args.child)))
        return
    if args.hours is not None:
        _ab(args.hours, args.rounds, args.other)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "bundle"
        span = make_bundle(root, args.minutes)
        res = replay_once(root)
    wall = float(str(res["wall_s"]))
    print(
        f"{res['steps']} steps over {span / 60:.0f} min of bundle time in {wall:.2f} s: "
        f"{span / wall:.0f}x real time (target >= 1000x); findings: {res['codes']}"
    )


if __name__ == "__main__":
    main()
