"""Replay speed and memory, timed end to end, paired with another tree in one run.

Two bundle shapes, both from real captures:

- ``--shape samples`` (the default): the real 45-second NVML timeline of
  tests/fixtures/h200/nvml_samples.jsonl (idle -> bf16 matmul at the power cap -> idle)
  back to back at its own 2 Hz in gpu/samples.jsonl, with the real nvidia-smi dump, dmesg
  and /proc files;
- ``--shape dumps``: nvidia-smi -q -x every 10 s, a vLLM /metrics page every 15 s and one
  Xid 79, as `moptd record` or a user lays a bundle down (bench/replay_bundle.py).

    python bench/replay_speed.py [--minutes 60]          # in this process (target >= 1000x)
    python bench/replay_speed.py --shape dumps --hours 1 --rounds 7 --other /tmp/h32-6b755ee
    python bench/replay_speed.py --shape dumps --hours 24 --rounds 3 --other TREE

With ``--hours`` every replay is the whole command, ``python -m moptd replay BUNDLE --json``,
in a fresh child process whose PYTHONPATH is the tree it is given (any tree since 6b755ee
has that command, whatever its modules are called): its CPU time (user + system) and peak
RSS come from the kernel's accounting of the child (``os.wait4``), its findings from the
JSON. The bundle is built once; this tree and ``--other`` alternate (this, other; other,
this; ...) so that a shared machine's load falls on both alike. Medians and the ratios
this/other are printed last (issue 32: the 1 h dumps bundle at <= 0.8x the CPU of 6b755ee;
a 24 h bundle of either shape at >= 3,000x real time in <= 200 MB peak RSS).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import replay_bundle

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


def _child(tree: Path, bundle: Path, pycache: Path | None = None) -> dict[str, object]:
    """``moptd replay BUNDLE --json`` of ``tree`` in a child: wall, CPU, peak RSS, codes.
    With ``pycache``, the child reads and writes its compiled modules there (as an
    installed package has them) instead of compiling every module from source."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "moptd", "replay", str(bundle), "--json"],
            cwd=tree, env=env, stdout=out, stderr=err,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text, errors = out.read().decode(), err.read().decode(errors="replace")
    # the exit status is the worst finding's (docs/cli.md), or 3 for an unusable input
    try:
        report = json.loads(text)
    except ValueError:
        why = f"replay in {tree} failed ({proc.returncode})"
        raise SystemExit(f"{why}:\n{errors[-3000:]}") from None
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "steps": report["steps"],
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "codes": sorted({str(f["code"]) for f in report["findings"]}),
        "findings": len(report["findings"]),
    }


def _bundle_size(root: Path) -> float:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / 1e6


def _ab(
    hours: float, rounds: int, other: Path | None, shape: str, this: Path, bytecode: bool = False
) -> None:
    trees = [("this", this.resolve())] + ([("other", other.resolve())] if other else [])
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "bundle"
        if shape == "dumps":
            span = replay_bundle.make(bundle, hours)["span_s"]
        else:
            span = make_bundle(bundle, hours * 60)
        print(f"bundle: {hours:g} h, shape {shape}, {_bundle_size(bundle):.1f} MB, {span:.0f} s; "
              f"trees: {', '.join(f'{n} = {t}' for n, t in trees)}; "
              f"modules: {'compiled once, untimed' if bytecode else 'from source every run'}; "
              f"load average before: {os.getloadavg()[0]:.2f}")
        caches = {name: Path(tmp) / f"pycache-{name}" if bytecode else None for name, _ in trees}
        if bytecode:
            for name, tree in trees:  # an untimed run that writes each tree's .pyc files
                _child(tree, bundle, caches[name])
        runs: dict[str, list[dict[str, object]]] = {name: [] for name, _ in trees}
        for r in range(1, rounds + 1):
            for name, tree in trees if r % 2 else trees[::-1]:
                res = _child(tree, bundle, caches[name])
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
            f"({cpu:.2f} s CPU = {span / cpu:.0f}x per CPU second), "
            f"peak RSS {rss:.0f} MB"
        )
    if "other" in med:
        (w_this, c_this, r_this), (w_other, c_other, r_other) = med["this"], med["other"]
        pairs = [float(str(a["cpu_s"])) / float(str(b["cpu_s"]))
                 for a, b in zip(runs["this"], runs["other"], strict=True)]
        print(
            f"ratio this/other: wall {w_this / w_other:.3f}, CPU {c_this / c_other:.3f} "
            f"(per round {min(pairs):.3f}-{max(pairs):.3f}, their median "
            f"{statistics.median(pairs):.3f}), peak RSS {r_this / r_other:.3f}"
        )
        same = {json.dumps(x["codes"]) for rs in runs.values() for x in rs}
        print(f"same codes on both sides: {len(same) == 1}")
    print(f"load average after: {os.getloadavg()[0]:.2f} (1 min), {os.getloadavg()[1]:.2f} (5 min)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--hours", type=float, help="child-process mode with peak RSS (e.g. 24)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--other", type=Path, help="another checkout to replay alternately")
    ap.add_argument("--this", type=Path, default=THIS, help="the tree measured (default: this)")
    ap.add_argument("--shape", choices=("samples", "dumps"), default="samples")
    ap.add_argument(
        "--bytecode",
        action="store_true",
        help="each tree's modules compiled once before the timed runs, as an installed "
        "package has them (default: as the environment says; PYTHONDONTWRITEBYTECODE=1 "
        "compiles every module from source in every run)",
    )
    args = ap.parse_args()
    if args.hours is not None:
        _ab(args.hours, args.rounds, args.other, args.shape, args.this, args.bytecode)
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
