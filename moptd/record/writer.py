"""Record a bundle from the live host, in the layout of docs/bundle.md.

Every file is the tool's or the kernel's own format, so a bundle recorded here reads the
same as one pasted together by hand. What cannot be captured (no nvidia-smi, no NVML, no
/dev/kmsg access, an endpoint that does not answer) is written down in bundle.yaml's notes
and the file is left out: a missing file is unknown evidence, never healthy.
"""

from __future__ import annotations

import datetime as dt
import errno
import json
import logging
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from moptd.bundle.sources import (
    CONTAINER_CLI_ERRORS,
    CONTAINER_UNITS,
    DAEMON_JOURNALS,
    FABRICMANAGER_LOG,
)
from moptd.collectors.daemon_journals import FABRICMANAGER_LOG as FM_LOG_PATH
from moptd.collectors.daemon_journals import journal_argv
from moptd.collectors.driver import parse_module_version
from moptd.gpu.backend import NvmlBackend
from moptd.gpu.nvsmi import NvsmiError, read_dump
from moptd.gpu.recorded import sample_row
from moptd.proc import wsl
from moptd.record.mask import HostMasker
from moptd.record.redact import Redactor
from moptd.serving import version_lock
from moptd.serving.bundle import ENVIRON
from moptd.serving.environment import site_packages_of
from moptd.serving.signals import CUDA_ENV, MAX_ENVIRON_BYTES, cuda_environ

log = logging.getLogger(__name__)

FORMAT = "moptd-bundle/v1"
SAMPLES = "gpu/samples.jsonl"
# Files of version numbers, where "12.4.5.8" (a cuBLAS wheel) is one and not an address:
# --mask-hosts masks names in them, never addresses.
VERSION_FILES = frozenset(
    {version_lock.FILE, "kernel/uname_r", "kernel/driver_version", "kernel/proc_modules"}
)
TOOL_TIMEOUT = 30.0
MAX_DAEMON_LOG = 4 << 20  # bytes of /var/log/fabricmanager.log kept (its end)
JOURNAL_NOTE = "host/journal"
MAX_SCRAPE_BYTES = 8 << 20
# A serving log can be days long; the last 64 MiB hold the incident and keep the bundle
# under the size `moptd replay` accepts (moptd/cli/bundle_guard.py).
MAX_LOG_BYTES = 64 << 20
# A bundle holds the kernel log, command lines and listening sockets of the host: only the
# user who recorded it may read it, whatever the umask.
FILE_MODE = 0o600
DIR_MODE = 0o700

Progress = Callable[[str, float], None]  # (what is happening, fraction done)


@dataclass(frozen=True)
class ServingSource:
    name: str
    metrics_url: str | None = None
    log_file: Path | None = None
    command: tuple[str, ...] = ()
    model_dir: Path | None = None
    pid: int | None = None  # the managed process's, as the daemon reports it
    managed: bool = False


@dataclass(frozen=True)
class RecordOptions:
    duration: float
    interval: float = 5.0
    procfs: Path = Path("/proc")
    kmsg: Path = Path("/dev/kmsg")
    serving: Sequence[ServingSource] = ()
    extra_notes: Sequence[str] = ()
    site_packages: Sequence[Path] = ()  # versions.site_packages: more serving environments
    # the host collector's WSL2 directories (collectors.host.wsl_lib_dir, guest_lib_dirs)
    wsl_lib_dir: Path = Path(wsl.WSL_LIB_DIR)
    guest_lib_dirs: Sequence[Path] = tuple(Path(d) for d in wsl.GUEST_LIB_DIRS)
    # moptd/record/redact.py: secrets out of every file unless --no-redact; with --mask-hosts
    # (mask_hosts: this host's names, host name and FQDN, all of them host0) host names and
    # addresses too (moptd/record/mask.py)
    redact: bool = True
    mask_hosts: Sequence[str] | None = None


@dataclass
class RecordResult:
    path: Path
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    redactor: Redactor = field(default_factory=Redactor)


def _run(argv: Sequence[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        out = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=TOOL_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 or out.stdout else None


class Recorder:
    def __init__(self, opts: RecordOptions, progress: Progress | None = None) -> None:
        self.opts = opts
        self.progress = progress or (lambda _what, _done: None)
        self.notes: list[str] = list(opts.extra_notes)
        self.files: list[str] = []
        self._nvml: Any = None
        self._seq = 0
        masker = HostMasker(opts.mask_hosts) if opts.mask_hosts is not None else None
        self.redactor = Redactor(opts.redact, masker)

    # --- writing files ---

    def _write(self, root: Path, rel: str, text: str | bytes, redacted: bool = False) -> None:
        """Every file of the bundle is written here, through the redactor; ``redacted``: the
        caller has (bundle.yaml and cmdline.txt, redacted value by value)."""
        data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
        if not redacted:
            data = self.redactor.data(rel, data, addresses=rel not in VERSION_FILES)
        path = root / rel
        _mkdirs(root, path.parent)
        with _open_private(path, append=False) as fh:
            fh.write(data)
        self.files.append(rel)

    def _copy(self, root: Path, src: Path, rel: str, what: str, tail: int | None = None) -> None:
        try:
            with src.open("rb") as fh:
                if tail is not None and fh.seek(0, os.SEEK_END) > tail:
                    fh.seek(-tail, os.SEEK_END)
                    self.notes.append(f"{rel}: only the last {tail} bytes of {src}")
                else:
                    fh.seek(0)
                data = fh.read()
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                self.notes.append(f"{rel}: cannot read {src}: {exc.strerror}")
            else:
                self.notes.append(f"{rel}: {what} not present ({src})")
            return
        self._write(root, rel, data)

    def _tool(self, root: Path, argv: Sequence[str], rel: str) -> None:
        out = _run(argv)
        if out is None:
            self.notes.append(f"{rel}: `{' '.join(argv)}` not available or failed")
            return
        self._write(root, rel, out)

    # --- the recording ---

    def record(self, out: Path) -> RecordResult:
        tarball = out.name.endswith((".tar.gz", ".tgz"))
        if tarball:
            tmp = Path(tempfile.mkdtemp(prefix="moptd-record-"))
            root = tmp / out.name.removesuffix(".tgz").removesuffix(".tar.gz")
        else:
            if out.exists() and any(out.iterdir()):
                raise FileExistsError(f"{out} exists and is not empty")
            root = out
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, DIR_MODE)
        try:
            started = time.time()
            self.progress("host, driver and container files", 0.0)
            self._static(root)
            self._sample_loop(root, started)
            self.progress("kernel log", 0.95)
            self._kernel_log(root)
            self._daemon_logs(root)
            self._host_end(root)
            self._versions(root)
            self._meta(root, started)
            if tarball:
                out.parent.mkdir(parents=True, exist_ok=True)
                with (
                    _open_private(out, append=False) as fh,
                    tarfile.open(fileobj=fh, mode="w:gz") as tar,
                ):
                    tar.add(root, arcname=root.name)
        finally:
            if tarball:
                shutil.rmtree(root.parent, ignore_errors=True)
            self._nvml_close()
        self.progress("done", 1.0)
        return RecordResult(out, sorted(self.files), self.notes, self.redactor)

    def _static(self, root: Path) -> None:
        proc = self.opts.procfs
        self._copy(root, proc / "modules", "kernel/proc_modules", "module list")
        self._copy(
            root,
            proc / "driver/nvidia/version",
            "kernel/driver_version",
            "NVIDIA driver (module not loaded)",
        )
        self._copy(root, proc / "sys/kernel/tainted", "kernel/tainted", "taint flags")
        # uname's release is /proc/sys/kernel/osrelease: read there, so a record taken with
        # another procfs (a host root) says that host's, as the rest of it does
        if (proc / "sys/kernel/osrelease").is_file():
            self._copy(root, proc / "sys/kernel/osrelease", "kernel/uname_r", "kernel release")
        else:
            self._tool(root, ["uname", "-r"], "kernel/uname_r")
        if shutil.which("dkms"):
            self._tool(root, ["dkms", "status"], "kernel/dkms_status.txt")
        self._copy(
            root, Path("/etc/docker/daemon.json"), "container/daemon.json", "Docker configuration"
        )
        for folder in (Path("/etc/cdi"), Path("/var/run/cdi")):
            for spec in sorted(folder.glob("*")) if folder.is_dir() else []:
                if spec.suffix in (".yaml", ".json"):
                    self._copy(root, spec, f"container/cdi/{spec.name}", "CDI spec")
        for argv in (["nvidia-ctk", "--version"], ["nvidia-container-cli", "--version"]):
            if shutil.which(argv[0]):
                self._tool(root, argv, "container/toolkit_version.txt")
                break
        for s in self.opts.serving:
            if s.command:
                rel = f"serving/{s.name}/cmdline.txt"
                # argument by argument: "--api-key" and its value are two lines here
                argv = self.redactor.argv(rel, s.command)
                self._write(root, rel, "\n".join(argv) + "\n", redacted=True)
            if s.model_dir is not None:
                self._tool(
                    root, ["ls", "-l", str(s.model_dir)], f"serving/{s.name}/model_files.txt"
                )
            if s.managed:
                self._environ(root, s)

    def _environ(self, root: Path, s: ServingSource) -> None:
        """serving/NAME/environ.txt: the managed process's CUDA_VISIBLE_DEVICES and
        CUDA_DEVICE_ORDER from /proc/PID/environ (nothing else of its environment), the GPUs
        replay's links join it to (moptd.serving.signals.CUDA_ENV)."""
        rel = f"serving/{s.name}/{ENVIRON}"
        if s.pid is None:
            self.notes.append(
                f"{rel}: the managed process's PID is not known (no moptd daemon "
                "answered on the API socket, or the process is not running)"
            )
            return
        src = self.opts.procfs / str(s.pid) / "environ"
        try:
            with src.open("rb") as fh:
                data = fh.read(MAX_ENVIRON_BYTES)
        except OSError as exc:
            self.notes.append(f"{rel}: cannot read {src}: {exc.strerror or exc}")
            return
        found = cuda_environ(data)
        if not found:
            self.notes.append(
                f"{rel}: the process sets none of {', '.join(CUDA_ENV)} (every GPU is visible "
                "to it)"
            )
            return
        self._write(root, rel, "".join(f"{k}={found[k]}\n" for k in CUDA_ENV if k in found))

    def _sample_loop(self, root: Path, started: float) -> None:
        duration = max(0.0, self.opts.duration)
        gpu_source = self._gpu_source()
        deadline = time.monotonic() + duration
        while True:
            tick = time.monotonic()
            elapsed = duration - max(0.0, deadline - tick)
            self.progress(
                f"sampling ({elapsed:.0f}/{duration:.0f}s)",
                0.05 + 0.9 * (elapsed / duration if duration else 1.0),
            )
            if gpu_source == "nvidia-smi":
                self._nvsmi_dump(root)
            elif gpu_source == "nvml":
                self._nvml_sample(root)
            for s in self.opts.serving:
                if s.metrics_url:
                    self._scrape(root, s)
            if tick >= deadline:
                break
            time.sleep(
                max(
                    0.0,
                    min(
                        self.opts.interval - (time.monotonic() - tick), deadline - time.monotonic()
                    ),
                )
            )
            if time.monotonic() >= deadline and duration == 0:
                break
        for s in self.opts.serving:
            if s.log_file is not None:
                self._copy(
                    root, s.log_file, f"serving/{s.name}/log.txt", "serving log", MAX_LOG_BYTES
                )

    def _gpu_source(self) -> str:
        if shutil.which("nvidia-smi") and _run(["nvidia-smi", "-L"]):
            return "nvidia-smi"
        try:
            backend = NvmlBackend()
            backend.init()
            self._nvml = backend
            self.notes.append("gpu: nvidia-smi not found; NVML samples in gpu/samples.jsonl")
            return "nvml"
        except Exception as exc:  # noqa: BLE001 - any NVML failure means no GPU source
            self.notes.append(f"gpu: no nvidia-smi and no NVML ({exc}); no GPU evidence")
            return ""

    def _nvsmi_dump(self, root: Path) -> None:
        out = _run(["nvidia-smi", "-q", "-x"])
        if out is None:
            self.notes.append("gpu/nvidia-smi: a dump failed")
            return
        self._seq += 1
        self._write(root, f"gpu/nvidia-smi/{self._seq:04d}.xml", out)

    def _nvml_sample(self, root: Path) -> None:
        b = self._nvml
        t = time.time()
        rows = []
        for i in range(b.device_count()):
            rows.append(json.dumps(sample_row(t, i, b.read_fast(i))))
        path = root / "gpu" / "samples.jsonl"
        _mkdirs(root, path.parent)
        with _open_private(path, append=True) as fh:
            text = self.redactor.text(SAMPLES, "\n".join(rows) + "\n")
            fh.write(text.encode("utf-8"))
        if SAMPLES not in self.files:
            self.files.append(SAMPLES)

    def _nvml_close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.shutdown()
            except Exception as exc:  # noqa: BLE001 - shutting down; only worth a log line
                log.debug("NVML shutdown: %s", exc)
            self._nvml = None

    def _scrape(self, root: Path, s: ServingSource) -> None:
        assert s.metrics_url is not None
        t = time.time()
        try:
            with urllib.request.urlopen(s.metrics_url, timeout=5) as resp:  # noqa: S310
                body = resp.read(MAX_SCRAPE_BYTES + 1)
        except (OSError, urllib.error.URLError) as exc:
            note = f"serving/{s.name}/metrics: {s.metrics_url} did not answer ({exc})"
            if note not in self.notes:
                self.notes.append(note)
            return
        if len(body) > MAX_SCRAPE_BYTES:
            self.notes.append(
                f"serving/{s.name}/metrics: a scrape over {MAX_SCRAPE_BYTES} bytes was left out"
            )
            return
        self._write(root, f"serving/{s.name}/metrics/{t:.3f}.prom", body)

    def _kernel_log(self, root: Path) -> None:
        try:
            records = read_kmsg(self.opts.kmsg)
        except OSError as exc:
            self.notes.append(
                f"kernel/dmesg.txt: cannot read {self.opts.kmsg}: {exc.strerror or exc}"
            )
            return
        self._write(root, "kernel/dmesg.txt", "".join(r + "\n" for r in records))

    def _daemon_logs(self, root: Path) -> None:
        """The NVIDIA daemons' journals of this boot, Fabric Manager's log file (its last
        MAX_DAEMON_LOG bytes), and the container engines' journal lines that carry
        nvidia-container-cli's errors (only those: the rest of the engines' records is
        not moptd's to keep)."""
        if shutil.which("journalctl") is None:
            self.notes.append(f"{JOURNAL_NOTE}: journalctl not installed")
        else:
            for unit, rel in DAEMON_JOURNALS.items():
                out = self._journal(journal_argv([unit]), rel)
                if out is not None:
                    self._write(root, rel, out)
            out = self._journal(journal_argv(list(CONTAINER_UNITS)), CONTAINER_CLI_ERRORS)
            lines = [x for x in (out or "").splitlines() if "nvidia-container-cli: " in x]
            if lines:
                self._write(root, CONTAINER_CLI_ERRORS, "".join(x + "\n" for x in lines))
        self._copy(
            root, Path(FM_LOG_PATH), FABRICMANAGER_LOG, "Fabric Manager log", tail=MAX_DAEMON_LOG
        )

    def _journal(self, argv: list[str], rel: str) -> str | None:
        """journalctl's output, or None with a note: journalctl prints "-- No entries --"
        and exits 0 where it found no journal at all (it says so on stderr only), which
        written down would read as a daemon that logged nothing."""
        try:
            res = subprocess.run(
                argv, capture_output=True, text=True, errors="replace",
                timeout=TOOL_TIMEOUT, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.notes.append(f"{rel}: `{' '.join(argv)}` failed: {exc}")
            return None
        err = res.stderr.strip().splitlines()
        if res.returncode != 0 or any("journal" in x.lower() for x in err):
            why = err[-1] if err else f"exit status {res.returncode}"
            self.notes.append(f"{rel}: `{' '.join(argv)}`: {why[:200]}")
            return None
        return res.stdout

    def _host_end(self, root: Path) -> None:
        proc = self.opts.procfs
        self._copy(root, proc / "meminfo", "host/meminfo", "meminfo")
        self._copy(root, proc / "sys/vm/swappiness", "host/swappiness", "swappiness")
        self._tool(root, ["df", "-P"], "host/df.txt")
        nodes = sorted(str(p) for p in Path("/dev").glob("nvidia*"))
        if nodes:
            self._tool(root, ["ls", "-l", *nodes], "host/dev_nodes.txt")
        else:
            # left out rather than empty: with no driver the nodes are not the question
            self.notes.append("host/dev_nodes.txt: no /dev/nvidia* device nodes on this host")
        if shutil.which("ss"):
            self._tool(root, ["ss", "-ltnp"], "host/listening.txt")
        else:
            self.notes.append("host/listening.txt: `ss` not installed")
        self._wsl(root)

    def _wsl(self, root: Path) -> None:
        """On a WSL2 guest (docs/wsl.md): `ls -l` of the Windows driver's library mount as
        host/wsl_lib.txt (its "No such file or directory" when it is absent: that is the
        evidence), and of the guest's library directories as host/guest_libs.txt."""
        release = ""
        try:
            release = (self.opts.procfs / "sys/kernel/osrelease").read_text()[:256].strip()
        except OSError:
            pass
        if wsl.wsl_generation(release) != 2:
            return
        out = _ls(self.opts.wsl_lib_dir)
        if out is not None and not wsl.listed_names(out, (str(self.opts.wsl_lib_dir),)):
            # an empty mount: ls's own word on the stub the collector looks for, which
            # replay reads as absent ("total 0" names nothing and would not read)
            out = _ls(self.opts.wsl_lib_dir / "libcuda.so.1")
        if out is None:
            self.notes.append(f"host/wsl_lib.txt: `ls -l {self.opts.wsl_lib_dir}` failed")
        else:
            self._write(root, "host/wsl_lib.txt", out)
        present = [d for d in self.opts.guest_lib_dirs if d.is_dir()]
        listing = _run(["ls", "-l", *map(str, present)]) if present else None
        dirs = tuple(map(str, self.opts.guest_lib_dirs))
        if listing is not None and not wsl.listed_names(listing, dirs):
            self.notes.append(f"host/guest_libs.txt: {', '.join(dirs)} hold no file")
        elif listing is None:
            self.notes.append(
                "host/guest_libs.txt: no guest library directory could be listed ("
                + ", ".join(map(str, self.opts.guest_lib_dirs))
                + ")"
            )
        else:
            self._write(root, "host/guest_libs.txt", listing)

    def _versions(self, root: Path) -> None:
        """versions.json, always: the driver, its CUDA version, the GPUs' compute
        capabilities and each serving environment's stack (moptd/serving/version_lock.py).
        What could not be read is empty in it and named in the notes."""
        module_text = ""
        try:
            with (self.opts.procfs / "driver/nvidia/version").open() as fh:
                module_text = fh.read(4096)
        except OSError:
            pass
        module = parse_module_version(module_text)
        facts = version_lock.live_driver_facts(module[0] if module else "")
        if facts.cuda_source in ("", "table"):
            self._driver_from_dumps(root, facts)
        stacks = []
        for s in self.opts.serving:
            sps = site_packages_of(s.command, self.opts.site_packages) if s.command else []
            if sps:
                stacks.append(version_lock.stack_for(s.name, sps))
        if not stacks and self.opts.site_packages:
            stacks.append(version_lock.stack_for("configured", list(self.opts.site_packages)))
        record = version_lock.VersionsRecord(facts, stacks)
        if not facts.version:
            self.notes.append(
                f"{version_lock.FILE}: no driver version (neither NVML nor nvidia-smi)"
            )
        if not stacks:
            self.notes.append(
                f"{version_lock.FILE}: no serving environment found (no managed command, "
                "no versions.site_packages)"
            )
        for st in stacks:
            self.notes.extend(f"{version_lock.FILE}: {p}" for p in st.env.problems[:20])
        self._write(root, version_lock.FILE, json.dumps(record.to_json(), indent=1) + "\n")

    def _driver_from_dumps(self, root: Path, facts: Any) -> None:
        """Where NVML did not say the driver's CUDA version, the first nvidia-smi dump's."""
        for path in sorted((root / "gpu" / "nvidia-smi").glob("*.*")):
            try:
                dump = read_dump(path)
            except (NvsmiError, OSError):
                continue
            if dump.cuda_version and dump.driver_version:
                facts.version = facts.version or dump.driver_version
                facts.cuda, facts.cuda_source = dump.cuda_version, "nvidia-smi"
                return

    def _meta(self, root: Path, started: float) -> None:
        meta: dict[str, Any] = {
            "format": FORMAT,
            "host": self.redactor.host("bundle.yaml", socket.gethostname()),
            "captured_at": dt.datetime.fromtimestamp(started, tz=dt.UTC).isoformat(),
            "duration_seconds": self.opts.duration,
            "interval_seconds": self.opts.interval,
            "recorded_by": "moptd record",
        }
        boot = boot_time(self.opts.procfs)
        if boot is not None:
            meta["boot_time"] = boot
        self.notes = [self.redactor.text("bundle.yaml", n) for n in self.notes]
        meta["notes"] = "\n".join(self.notes) if self.notes else "nothing was left out"
        meta["redactions"] = self.redactor.manifest()
        self._write(root, "bundle.yaml", yaml.safe_dump(meta, sort_keys=False), redacted=True)


def _ls(directory: Path) -> str | None:
    """`ls -l DIR`'s output; for a directory that is not there, ls's own message."""
    if shutil.which("ls") is None:
        return None
    try:
        out = subprocess.run(
            ["ls", "-l", str(directory)],
            capture_output=True,
            text=True,
            timeout=TOOL_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode == 0:
        return out.stdout
    return out.stderr if "No such file or directory" in out.stderr else None


def _mkdirs(root: Path, folder: Path) -> None:
    """Create folder and the parents below root with DIR_MODE, whatever the umask."""
    missing = []
    while folder != root and not folder.is_dir():
        missing.append(folder)
        folder = folder.parent
    for d in reversed(missing):
        d.mkdir(exist_ok=True)
        os.chmod(d, DIR_MODE)


def _open_private(path: Path, append: bool) -> BinaryIO:
    """Open for writing with FILE_MODE, whatever the umask; never through a symlink that
    someone placed where a bundle file goes."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    flags |= os.O_APPEND if append else os.O_TRUNC
    fd = os.open(path, flags, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab" if append else "wb")


def boot_time(procfs: Path) -> float | None:
    """Boot time to the microsecond where /proc/uptime allows it; raw kernel records are
    stamped in microseconds since boot."""
    try:
        uptime = float((procfs / "uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        uptime = None
    if uptime is not None:
        return round(time.time() - uptime, 3)
    try:
        for line in (procfs / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def read_kmsg(path: Path) -> list[str]:
    """Every record in the kernel ring buffer, as /dev/kmsg gives it ("prio,seq,usec,flags;
    message"), without continuation lines. Does not block."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    out: list[str] = []
    try:
        while True:
            try:
                data = os.read(fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:
                continue  # a record was overwritten while we read: go on with the next
            if not data:
                break
            for line in data.decode("utf-8", "replace").splitlines():
                if line and not line.startswith(" "):
                    out.append(line)
    finally:
        os.close(fd)
    return out
