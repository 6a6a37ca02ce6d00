"""Probe a GPU host for the interfaces of issue 23 and record what they return.

Read-only: it never changes clocks, power, persistence, ECC, MIG or streaming settings.
For every GPU it records GPM support and metrics, per-process utilisation, NVLink per
link (state, error counters, throughput) and MIG mode, in three phases: idle, a tensor
load (bf16 matmul) and a DRAM load (large copies), each with nvidia-smi's own readings
beside NVML's, and the median cost of each call. The output is one JSON document, kept
whole as a capture for the CPU tests.

    python3 tools/gpu_depth_probe.py --out probe.json [--seconds 6]
"""

# Every lambda here is called at once, inside the loop that binds its variables (some
# bind them as default arguments, which mypy cannot type).
# ruff: noqa: B023
# mypy: disable-error-code="misc"
from __future__ import annotations

import argparse
import importlib.metadata
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pynvml as p

GPM_IDS = [*range(1, 14), 20, 21, *range(60, 98), 100, 101, 102, 103]
LINKS = 18
NVLINK_PER_LINK_FIELDS = {
    "throughput_data_tx_kib": 138,
    "throughput_data_rx_kib": 139,
    "throughput_raw_tx_kib": 140,
    "throughput_raw_rx_kib": 141,
    "dl_replay": 161,
    "dl_recovery": 162,
    "dl_crc": 163,
    "speed_mbps": 164,
    "state": 165,
    "version": 166,
}
ENERGY_FIELDS = {"total_energy_consumption_mj": 83, "energy_mj": 191}


def text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def err(exc: BaseException) -> dict[str, Any]:
    value = getattr(exc, "value", None)
    return {"error": str(exc), "nvml_return": value}


def call(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except p.NVMLError as exc:
        return err(exc)


def cost(fn: Callable[[], Any], n: int = 30) -> dict[str, Any]:
    times = []
    ok = True
    for _ in range(n):
        t0 = time.perf_counter()
        try:
            fn()
        except p.NVMLError:
            ok = False
        times.append((time.perf_counter() - t0) * 1e6)
    return {
        "median_us": round(statistics.median(times), 2),
        "min_us": round(min(times), 2),
        "n": n,
        "ok": ok,
    }


def field_values(h: Any, ids: list[Any]) -> list[dict[str, Any]]:
    out = []
    for fv in p.nvmlDeviceGetFieldValues(h, ids):
        row: dict[str, Any] = {
            "field": fv.fieldId,
            "scope": fv.scopeId,
            "return": fv.nvmlReturn,
            "type": fv.valueType,
        }
        if fv.nvmlReturn == p.NVML_SUCCESS:
            u = fv.value
            row["value"] = {
                0: u.dVal,
                1: u.uiVal,
                2: u.ulVal,
                3: u.ullVal,
                4: u.sllVal,
                5: u.siVal,
                6: getattr(u, "usVal", None),
            }.get(fv.valueType)
        out.append(row)
    return out


def gpm_window(h: Any, seconds: float) -> dict[str, Any]:
    support = call(lambda: p.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
    if isinstance(support, dict) or not support:
        return {"supported": support}
    s1, s2 = p.nvmlGpmSampleAlloc(), p.nvmlGpmSampleAlloc()
    try:
        p.nvmlGpmSampleGet(h, s1)
        t1 = time.time()
        time.sleep(seconds)
        p.nvmlGpmSampleGet(h, s2)
        t2 = time.time()
        mg = p.c_nvmlGpmMetricsGet_t()
        mg.version = p.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(GPM_IDS)
        mg.sample1, mg.sample2 = s1, s2
        for i, mid in enumerate(GPM_IDS):
            mg.metrics[i].metricId = mid
        p.nvmlGpmMetricsGet(mg)
        metrics = []
        for i in range(len(GPM_IDS)):
            m = mg.metrics[i]
            info = m.metricInfo
            metrics.append(
                {
                    "id": m.metricId,
                    "return": m.nvmlReturn,
                    "value": m.value if m.nvmlReturn == p.NVML_SUCCESS else None,
                    "name": text(info.shortName or b"") if m.nvmlReturn == 0 else None,
                    "unit": text(info.unit or b"") if m.nvmlReturn == 0 else None,
                }
            )
        return {
            "supported": 1,
            "t1": t1,
            "t2": t2,
            "metrics": metrics,
            "sample_get_cost": cost(lambda: p.nvmlGpmSampleGet(h, s1), 20),
            "metrics_get_cost": cost(lambda: p.nvmlGpmMetricsGet(mg), 20),
        }
    finally:
        p.nvmlGpmSampleFree(s1)
        p.nvmlGpmSampleFree(s2)


def process_util(h: Any) -> dict[str, Any]:
    def v0() -> Any:
        return [
            {
                "pid": s.pid,
                "ts": s.timeStamp,
                "sm": s.smUtil,
                "mem": s.memUtil,
                "enc": s.encUtil,
                "dec": s.decUtil,
            }
            for s in p.nvmlDeviceGetProcessUtilization(h, 0)
        ]

    def v1() -> Any:
        return [
            {
                "pid": s.pid,
                "ts": s.timeStamp,
                "sm": s.smUtil,
                "mem": s.memUtil,
                "enc": s.encUtil,
                "dec": s.decUtil,
                "jpg": s.jpgUtil,
                "ofa": s.ofaUtil,
            }
            for s in p.nvmlDeviceGetProcessesUtilizationInfo(h, 0)
        ]

    def running() -> Any:
        return [
            {
                "pid": x.pid,
                "used": x.usedGpuMemory,
                "gi": getattr(x, "gpuInstanceId", None),
                "ci": getattr(x, "computeInstanceId", None),
            }
            for x in p.nvmlDeviceGetComputeRunningProcesses(h)
        ]

    return {
        "GetProcessUtilization": call(v0),
        "GetProcessesUtilizationInfo": call(v1),
        "ComputeRunningProcesses": call(running),
        "cost": {
            "GetProcessUtilization": cost(lambda: call(v0), 20),
            "GetProcessesUtilizationInfo": cost(lambda: call(v1), 20),
        },
    }


def nvlink(h: Any) -> dict[str, Any]:
    links = []
    for link in range(LINKS):
        row: dict[str, Any] = {
            "link": link,
            "state": call(lambda: p.nvmlDeviceGetNvLinkState(h, link)),
        }
        if isinstance(row["state"], dict):
            links.append(row)
            continue
        row["version"] = call(lambda: p.nvmlDeviceGetNvLinkVersion(h, link))
        row["remote_pci"] = call(lambda: text(p.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId))
        row["errors"] = {
            name: call(lambda c=c: p.nvmlDeviceGetNvLinkErrorCounter(h, link, c))
            for name, c in (
                ("replay", 0),
                ("recovery", 1),
                ("crc_flit", 2),
                ("crc_data", 3),
                ("ecc_data", 4),
            )
        }
        links.append(row)
    per_link_ids = [(fid, link) for fid in NVLINK_PER_LINK_FIELDS.values() for link in range(LINKS)]
    return {
        "links": links,
        "link_count_field": call(lambda: field_values(h, [91])),
        "per_link_fields": call(lambda: field_values(h, per_link_ids)),
        "field_names": NVLINK_PER_LINK_FIELDS,
        "cost": {
            "NvLinkState x18": cost(
                lambda: [call(lambda k=k: p.nvmlDeviceGetNvLinkState(h, k)) for k in range(LINKS)],
                10,
            ),
            f"FieldValues({len(per_link_ids)} per-link)": cost(
                lambda: p.nvmlDeviceGetFieldValues(h, per_link_ids), 10
            ),
        },
    }


def expensive(h: Any) -> dict[str, Any]:
    """The calls issue 23 names as expensive, beside cheaper candidates for the same value."""
    out: dict[str, Any] = {}
    out["TotalEnergyConsumption"] = {
        "value": call(lambda: p.nvmlDeviceGetTotalEnergyConsumption(h)),
        "cost": cost(lambda: p.nvmlDeviceGetTotalEnergyConsumption(h)),
    }
    for name, fid in ENERGY_FIELDS.items():
        out[f"field {fid} {name}"] = {
            "value": call(lambda fid=fid: field_values(h, [fid])),
            "cost": cost(lambda fid=fid: p.nvmlDeviceGetFieldValues(h, [fid])),
        }
    for fid in (269, 270, 271, 251, 252):
        out[f"field {fid}"] = {
            "value": call(lambda fid=fid: field_values(h, [fid])),
            "cost": cost(lambda fid=fid: p.nvmlDeviceGetFieldValues(h, [fid])),
        }
    for name, pol in (
        ("POWER", 0),
        ("THERMAL", 1),
        ("SYNC_BOOST", 2),
        ("BOARD_LIMIT", 3),
        ("LOW_UTILIZATION", 4),
        ("RELIABILITY", 5),
    ):

        def viol(pol: int = pol) -> Any:
            v = p.nvmlDeviceGetViolationStatus(h, pol)
            return {"reference_time": v.referenceTime, "violation_time": v.violationTime}

        out[f"ViolationStatus({name})"] = {"value": call(viol), "cost": cost(lambda: call(viol))}
    for name, clk in (("SM", p.NVML_CLOCK_SM), ("MEM", p.NVML_CLOCK_MEM)):
        out[f"MaxClockInfo({name})"] = {
            "value": call(lambda clk=clk: p.nvmlDeviceGetMaxClockInfo(h, clk)),
            "cost": cost(lambda clk=clk: p.nvmlDeviceGetMaxClockInfo(h, clk), 10),
        }
    out["fields 270+271 together"] = {
        "cost": cost(lambda: p.nvmlDeviceGetFieldValues(h, [270, 271]))
    }
    return out


def smi(*args: str) -> dict[str, Any]:
    try:
        r = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30)
        return {
            "args": list(args),
            "rc": r.returncode,
            "stdout": r.stdout,
            "stderr": r.stderr[-2000:],
        }
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"args": list(args), "error": str(exc)}


LOADS = {
    "tensor": (
        "import torch,time,sys\n"
        "a=torch.randn(8192,8192,device='cuda',dtype=torch.bfloat16);b=torch.randn_like(a)\n"
        "print('ready',flush=True);end=time.time()+float(sys.argv[1])\n"
        "while time.time()<end:\n  c=a@b\n  torch.cuda.synchronize()\n"
    ),
    "dram": (
        "import torch,time,sys\n"
        "a=torch.empty(2**30,device='cuda',dtype=torch.float32);b=torch.empty_like(a)\n"
        "print('ready',flush=True);end=time.time()+float(sys.argv[1])\n"
        "while time.time()<end:\n  b.copy_(a)\n  torch.cuda.synchronize()\n"
    ),
}


def phase(name: str, handles: list[Any], seconds: float) -> dict[str, Any]:
    proc = None
    if name in LOADS:
        proc = subprocess.Popen(
            [sys.executable, "-c", LOADS[name], str(seconds + 12)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        proc.stdout.readline()
        time.sleep(2)
    try:
        result: dict[str, Any] = {"phase": name, "load_pid": proc.pid if proc else None, "gpus": []}
        for h in handles:
            util = call(lambda: p.nvmlDeviceGetUtilizationRates(h))
            result["gpus"].append(
                {
                    "utilization": util
                    if isinstance(util, dict)
                    else {"gpu": util.gpu, "memory": util.memory},
                    "gpm": gpm_window(h, 1.0),
                    "process_util": process_util(h),
                }
            )
        result["nvidia_smi"] = {
            "pmon": smi("pmon", "-c", "1", "-s", "um"),
            "dmon": smi("dmon", "-c", "2", "-s", "ut"),
            "query": smi(
                "--query-gpu=index,utilization.gpu,utilization.memory,pcie.link.gen.current",
                "--format=csv",
            ),
        }
        return result
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=6)
    args = ap.parse_args()
    doc: dict[str, Any] = {}
    p.nvmlInit()
    try:
        n = p.nvmlDeviceGetCount()
        handles = [p.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        doc.update(
            {
                "format": "moptd-gpu-depth-probe/1",
                "taken": time.time(),
                "driver_version": p.nvmlSystemGetDriverVersion(),
                "nvml_version": p.nvmlSystemGetNVMLVersion(),
                "cuda_driver_version": call(p.nvmlSystemGetCudaDriverVersion_v2),
                "pynvml": importlib.metadata.version("nvidia-ml-py"),
                "gpus": [],
            }
        )
        for i, h in enumerate(handles):
            mig = call(lambda: p.nvmlDeviceGetMigMode(h))
            doc["gpus"].append(
                {
                    "index": i,
                    "name": p.nvmlDeviceGetName(h),
                    "uuid": p.nvmlDeviceGetUUID(h),
                    "pci_bus_id": text(p.nvmlDeviceGetPciInfo(h).busId),
                    "architecture": call(lambda: p.nvmlDeviceGetArchitecture(h)),
                    "mig_mode": mig if isinstance(mig, dict) else list(mig),
                    "gpm_support": call(lambda: p.nvmlGpmQueryDeviceSupport(h).isSupportedDevice),
                    "gpm_streaming": call(lambda: p.nvmlGpmQueryIfStreamingEnabled(h)),
                    "nvlink": nvlink(h),
                    "expensive": expensive(h),
                }
            )
        doc["nvidia_smi_nvlink"] = {"status": smi("nvlink", "-s"), "errors": smi("nvlink", "-e")}
        doc["nvidia_smi_q"] = smi("-q", "-d", "UTILIZATION,PERFORMANCE")
        doc["phases"] = [phase(name, handles, args.seconds) for name in ("idle", "tensor", "dram")]
    except Exception as exc:
        doc["failed"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        p.nvmlShutdown()
        with open(args.out, "w") as fh:
            json.dump(doc, fh, indent=1, default=str)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
