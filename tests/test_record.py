"""`moptd record` on this host: the bundle layout, notes of what could not be captured,
serving scrapes from a real HTTP server, and record -> replay against a live daemon."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from moptd.bundle import read_bundle
from moptd.observations import Batch
from moptd.record.writer import Recorder, RecordOptions, ServingSource, read_kmsg
from tests.api_helpers import get, kmsg_writable, wait_for, wait_socket, write_xid79
from tests.conftest import FIXTURES
from tests.daemon_proc import DaemonProcess

SPEC_FILES = {  # docs/bundle.md: every file a recorder may write
    "bundle.yaml",
    "kernel/dmesg.txt",
    "kernel/proc_modules",
    "kernel/driver_version",
    "kernel/uname_r",
    "kernel/tainted",
    "kernel/dkms_status.txt",
    "gpu/samples.jsonl",
    "host/meminfo",
    "host/df.txt",
    "host/swappiness",
    "host/dev_nodes.txt",
    "host/listening.txt",
    "container/daemon.json",
    "container/toolkit_version.txt",
    "versions.json",
    "host/journal/nvidia-fabricmanager.txt",
    "host/journal/nvidia-persistenced.txt",
    "host/fabricmanager.log",
    "container/cli_errors.txt",
}


def in_spec(rel: str) -> bool:
    parts = rel.split("/")
    return (
        rel in SPEC_FILES
        or (rel.startswith("gpu/nvidia-smi/") and rel.endswith((".xml", ".txt")))
        or (rel.startswith("container/cdi/") and rel.endswith((".yaml", ".json")))
        or (
            parts[0] == "serving"
            and len(parts) >= 3
            and (
                parts[2] in ("log.txt", "cmdline.txt", "model_files.txt", "health.jsonl")
                or (parts[2] == "metrics" and rel.endswith(".prom"))
            )
        )
    )


def moptd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "moptd", *args], capture_output=True, text=True, timeout=120
    )


def test_layout_is_the_spec_and_notes_say_what_is_missing(tmp_path):
    opts = RecordOptions(duration=0.0, interval=1.0, kmsg=tmp_path / "no-kmsg")
    result = Recorder(opts).record(tmp_path / "bundle")
    root = tmp_path / "bundle"
    written = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert written == result.files
    assert all(in_spec(f) for f in written), [f for f in written if not in_spec(f)]
    meta = yaml.safe_load((root / "bundle.yaml").read_text())
    assert meta["format"] == "moptd-bundle/v1"
    assert "kernel/dmesg.txt: cannot read" in meta["notes"]
    assert "host/meminfo" in written
    tl = read_bundle(root)  # the reader accepts it and lists the gaps as missing evidence
    assert "kernel/dmesg.txt" in tl.missing


def test_out_dir_must_be_new_or_empty(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("keep me")
    out = moptd("record", "--duration", "0", "--out", str(tmp_path / "b"), "--quiet")
    assert out.returncode == 1
    assert "not empty" in out.stderr
    assert (tmp_path / "b" / "x").read_text() == "keep me"


def test_bad_duration_is_a_usage_error(tmp_path):
    out = moptd("record", "--duration", "soon", "--out", str(tmp_path / "b"))
    assert out.returncode == 2
    assert "not a duration" in out.stderr
    assert "Traceback" not in out.stderr


def test_serving_metrics_scraped_from_a_real_server(tmp_path):
    body = (FIXTURES / "vllm-cpu" / "vllm_cpu_metrics_after_load.txt").read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        opts = RecordOptions(
            duration=1.2,
            interval=0.5,
            kmsg=tmp_path / "none",
            serving=[
                ServingSource("vllm", url, command=("vllm", "serve", "m")),
                ServingSource("down", "http://127.0.0.1:1/metrics"),
            ],
        )
        result = Recorder(opts).record(tmp_path / "b.tar.gz")
    finally:
        server.shutdown()
        server.server_close()
    with tarfile.open(tmp_path / "b.tar.gz") as tar:
        names = tar.getnames()
    scrapes = [n for n in names if "/serving/vllm/metrics/" in n]
    assert len(scrapes) >= 2
    assert all(float(Path(n).stem) > 1e9 for n in scrapes)  # named by scrape time
    assert any(n.endswith("serving/vllm/cmdline.txt") for n in names)
    assert any("serving/down/metrics" in n and "did not answer" in n for n in result.notes)


@pytest.mark.skipif(not kmsg_writable(), reason="needs a readable /dev/kmsg")
def test_read_kmsg_returns_raw_records():
    records = read_kmsg(Path("/dev/kmsg"))
    assert records
    prio_seq = records[-1].split(";", 1)[0].split(",")
    assert len(prio_seq) >= 3
    assert all(p.lstrip("-").isdigit() for p in prio_seq[:3])


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.skipif(not kmsg_writable(), reason="needs a writable /dev/kmsg (root)")
def test_record_then_replay_finds_what_the_live_daemon_found(tmp_path):
    d = DaemonProcess(tmp_path).start()
    try:
        wait_socket(d.socket, d.proc)
        # the daemon follows /dev/kmsg once its kernel collector has run
        wait_for(lambda: get(d.socket, "/v1/health")[1]["collectors"]["kernel"]["runs"] > 0)
        bundle = tmp_path / "rec.tar.gz"
        rec = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "moptd",
                "record",
                "--duration",
                "3s",
                "--interval",
                "1s",
                "--out",
                str(bundle),
                "--config",
                str(d.config_path),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            time.sleep(1.0)
            _, pci = write_xid79()

            def live_gpu_lost():
                active = get(d.socket, "/v1/findings?code=GPU_LOST")[1]["active"]
                return [f for f in active if f.get("pci_bus_id") == pci]

            live = wait_for(live_gpu_lost, timeout=5.0)
        finally:
            out, err = rec.communicate(timeout=60)
        assert rec.returncode == 0, err
        assert "bundle written to" in out
        assert "moptd record:" in err  # progress, on stderr when piped
    finally:
        d.stop()
    replay = moptd("replay", str(bundle), "--json")
    report = json.loads(replay.stdout)
    # the exit status says the worst finding, as doctor's (bundle spec, issue 17)
    worst = {"critical": 2, "warning": 1}
    assert replay.returncode == max(
        (worst.get(f["severity"], 0) for f in report["findings"]), default=0
    ), replay.stderr
    replayed = [f for f in report["findings"] if f.get("pci_bus_id") == pci]
    assert {(f["code"], f["subject"]) for f in replayed} == {
        (f["code"], f["subject"]) for f in live
    }
    assert abs(replayed[0]["first_seen"] - live[0]["first_seen"]) < 2.0


def test_nvml_samples_the_recorder_writes_are_what_replay_reads(tmp_path: Path) -> None:
    """Without nvidia-smi the recorder writes NVML's fast readings to gpu/samples.jsonl;
    replay reads back exactly the samples the live NVML collector makes of them. The
    real H200 recording stands in for NVML (the recorded backend, not a fake)."""
    from moptd.gpu.batch import add_fast
    from moptd.gpu.recorded import RecordedBackend

    recording = FIXTURES / "h200" / "nvml_recording_h200.jsonl"
    recorder = Recorder(RecordOptions(duration=0))
    recorder._nvml = RecordedBackend.from_file(recording)
    for _ in range(30):
        recorder._nvml_sample(tmp_path)
    assert recorder.files == ["gpu/samples.jsonl"]
    tl = read_bundle(tmp_path)
    got = [b for _, source, b in tl.iter_observations() if source == "samples"]
    same = RecordedBackend.from_file(recording)
    assert len(got) == 30
    for batch in got:
        want = Batch()
        add_fast(want, 0, same.read_fast(0))
        fast = {s.signal for s in want.samples}
        assert [s for s in batch.samples if s.signal in fast] == want.samples
