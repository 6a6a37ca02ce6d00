"""Issue 30, item 5: `moptd record` kept `--api-key sk-...` and `--hf-token hf_...` verbatim in
serving/<name>/cmdline.txt, the key again in the serving log, and host names and addresses in
dmesg. Record now redacts by default, says what it redacted (bundle.yaml's `redactions`, a
summary line), keeps them with --no-redact and masks hosts with --mask-hosts; a redacted
bundle replays as the original did.

The serving process is real: a daemon runs it as its managed engine, with the command line of
vllm-project/vllm#22164 (plus secrets planted by this test), and the process prints that
report's vLLM log, which the daemon writes to the log file record copies.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from moptd.record.mask import HostMasker
from moptd.record.redact import (
    MARK,
    Redactor,
    redact_argv,
    redact_line,
    redact_text,
)
from moptd.record.writer import VERSION_FILES, Recorder, RecordOptions, ServingSource
from tests.api_helpers import get, wait_socket
from tests.conftest import FIXTURES
from tests.daemon_proc import DaemonProcess, free_port

HERE = FIXTURES / "record-redaction"
VLLM_LOG = HERE / "vllm-22164-api-key.log"  # vllm#22164: vLLM 0.9.1 with --api-key qweasdzxc
NFS_DMESG = HERE / "dmesg-nfsroot-roach2.txt"  # NRT_2G_channelizer's README

REPORTED_KEY = "qweasdzxc"  # the key in vllm#22164's command line and log
HF = "hf_PlantedByThisTestNotARealToken0000"  # planted: the test's, not a real token
URL_PASSWORD = "planted-url-pw"
DB_PASSWORD = "planted-db-pw"
SECRETS = (REPORTED_KEY, HF, URL_PASSWORD, DB_PASSWORD)
# What the process prints: the report's log, then it waits as a server would.
PRINT_LOG = "import sys, time; sys.stdout.write(open(sys.argv[1]).read()); sys.stdout.flush(); time.sleep(120)"  # noqa: E501
# The report's `docker run` arguments, the planted secrets and ordinary flags that are not
# secrets though they hold "token" and "key".
ENGINE_ARGS = (
    "--model", "Qwen3-30B-A3B-Thinking-2507",
    "--api-key", REPORTED_KEY,
    "--trust-remote-code", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    "--hf-token", HF,
    "--db-password", DB_PASSWORD,
    "--hf-endpoint", f"https://mirror:{URL_PASSWORD}@hub.internal.test",
    "--tokenizer", "Qwen/Qwen3-30B-A3B-Thinking-2507",
    "--tokenizer-mode", "auto",
    "--max-num-batched-tokens", "8192",
    "--ssl-keyfile", "/etc/ssl/private/serve.pem",
    "--host", "192.168.40.96",
)  # fmt: skip


def moptd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "moptd", *args], capture_output=True, text=True, timeout=180
    )


def bundle_text(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes().decode("utf-8", "replace")
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """A daemon running the managed engine; its log written where record copies it from."""
    tmp = tmp_path_factory.mktemp("redaction")
    log_file = tmp / "engine.log"
    managed = {
        "name": "llm",
        "device": "cpu",
        "port": free_port(),
        "command": [sys.executable, "-c", PRINT_LOG, str(VLLM_LOG), *ENGINE_ARGS],
        "log_file": str(log_file),
    }
    d = DaemonProcess(tmp, {"collectors": {"serving": {"managed": managed}}}).start()
    try:
        wait_socket(d.socket, d.proc)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            _, body = get(d.socket, "/v1/serving")
            pid = (body or {}).get("managed", {}).get("pid")
            logged = log_file.exists() and "Error retrieving file list" in log_file.read_text()
            if pid and logged:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the managed engine did not start and log:\n{d.log()}")
        yield d
    finally:
        d.stop()


def record(d: DaemonProcess, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    rec = moptd(
        "record", "--duration", "0s", "--quiet", "--out", str(out),
        "--config", str(d.config_path), *extra,
    )  # fmt: skip
    assert rec.returncode == 0, rec.stderr
    return rec


def serving_findings(bundle: Path) -> tuple[int, list[tuple[str, str]], list[Any]]:
    """Replay's exit status, its serving findings and what it read of the serving dir (the
    host's own kernel log differs between two records on a shared machine)."""
    out = moptd("replay", str(bundle), "--json")
    assert out.returncode != 3, out.stderr
    report = json.loads(out.stdout)
    found = sorted(
        (f["code"], f["subject"]) for f in report["findings"] if f["subject"].startswith("serving")
    )
    read = [
        {k: v for k, v in e.items() if k != "input"}
        for e in report["read"]
        if "serving" in str(e.get("input", ""))
    ]
    return out.returncode, found, read


@pytest.mark.slow
def test_record_redacts_the_engines_secrets_and_replays_the_same(
    engine: DaemonProcess, tmp_path: Path
) -> None:
    rec = record(engine, tmp_path / "redacted")
    files = bundle_text(tmp_path / "redacted")
    for rel, text in files.items():
        for secret in SECRETS:
            assert secret not in text, f"{secret} left in {rel}"

    cmdline = files["serving/llm/cmdline.txt"].splitlines()
    assert cmdline[-len(ENGINE_ARGS) :] == [
        "--model", "Qwen3-30B-A3B-Thinking-2507",
        "--api-key", MARK,
        "--trust-remote-code", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--hf-token", MARK,
        "--db-password", MARK,
        "--hf-endpoint", f"https://mirror:{MARK}@hub.internal.test",
        # not secrets: kept as they were
        "--tokenizer", "Qwen/Qwen3-30B-A3B-Thinking-2507",
        "--tokenizer-mode", "auto",
        "--max-num-batched-tokens", "8192",
        "--ssl-keyfile", "/etc/ssl/private/serve.pem",
        "--host", "192.168.40.96",
    ]  # fmt: skip
    # the log keeps every line; only the key's value changed, inside its quotes
    original = VLLM_LOG.read_text().splitlines()
    logged = files["serving/llm/log.txt"].splitlines()
    assert len(logged) == len(original)
    changed = [(a, b) for a, b in zip(original, logged, strict=True) if a != b]
    assert changed == [(original[2], original[2].replace(f"'{REPORTED_KEY}'", f"'{MARK}'"))]

    # what was redacted, per file, without the values
    meta = yaml.safe_load(files["bundle.yaml"])
    red = meta["redactions"]
    assert red["secrets"] == "redacted"
    assert red["hosts"] == "kept"
    assert red["files"]["serving/llm/cmdline.txt"] == {"option-value": 3, "url-credentials": 1}
    assert red["files"]["serving/llm/log.txt"] == {"key-value": 1}
    summary = re.search(r"^redacted (\d+) secrets in (\d+) files; --no-redact keeps them$",
                        rec.stdout, re.MULTILINE)  # fmt: skip
    assert summary, rec.stdout
    assert int(summary[1]) >= 5
    assert int(summary[2]) >= 2
    # environ.txt is still CUDA variables only (nothing else of the environment)
    assert "environ.txt" not in files or all(
        line.startswith("CUDA_") for line in files["serving/llm/environ.txt"].splitlines()
    )

    kept = tmp_path / "kept"
    rec_kept = record(engine, kept, "--no-redact")
    kept_files = bundle_text(kept)
    assert f"--api-key\n{REPORTED_KEY}\n" in kept_files["serving/llm/cmdline.txt"]
    assert f"'api_key': '{REPORTED_KEY}'" in kept_files["serving/llm/log.txt"]
    assert yaml.safe_load(kept_files["bundle.yaml"])["redactions"]["secrets"] == (
        "kept (--no-redact)"
    )
    assert "secrets NOT redacted (--no-redact)" in rec_kept.stdout

    # the redacted bundle reads and diagnoses as the unredacted one
    assert serving_findings(tmp_path / "redacted") == serving_findings(kept)


@pytest.mark.slow
def test_mask_hosts_gives_the_host_a_pseudonym(engine: DaemonProcess, tmp_path: Path) -> None:
    rec = record(engine, tmp_path / "masked", "--mask-hosts")
    files = bundle_text(tmp_path / "masked")
    meta = yaml.safe_load(files["bundle.yaml"])
    assert meta["host"] == "host0"
    assert meta["redactions"]["hosts"] == "masked"
    assert "192.168.40.96" not in files["serving/llm/cmdline.txt"]
    assert "--host\n10.255.0.1\n" in files["serving/llm/cmdline.txt"]
    assert "masked " in rec.stdout
    assert "host name" in rec.stdout
    for name in {socket.gethostname(), socket.getfqdn()} - {"localhost"}:
        if len(name) >= 4:
            assert all(name not in t for t in files.values())


def test_masked_addresses_and_names_are_consistent_across_files(tmp_path: Path) -> None:
    """The board's own kernel log (kmsg here) and a command line naming its address: one
    pseudonym for each address and name in both, netmask kept, every line kept."""
    opts = RecordOptions(
        duration=0.0,
        kmsg=NFS_DMESG,
        serving=[ServingSource("llm", command=("vllm", "serve", "m", "--host", "192.168.40.96"))],
        mask_hosts=["roach2.acme.pvt"],
    )
    result = Recorder(opts).record(tmp_path / "b")
    dmesg = (tmp_path / "b/kernel/dmesg.txt").read_text()
    original = NFS_DMESG.read_text()
    assert len(dmesg.splitlines()) == len(original.splitlines())
    for real in ("192.168.40.", "roach2", "acme.pvt"):
        assert real not in dmesg
    board = re.search(r"my address is (\S+)", dmesg)[1]  # type: ignore[index]
    server = re.search(r"DHCP answer from (\S+),", dmesg)[1]  # type: ignore[index]
    assert board != server
    assert f"ipaddr={board}," in dmesg
    assert f"gw={server}" in dmesg
    assert f"nfs: server {server} not responding" in dmesg
    assert "mask=255.255.255.0" in dmesg  # a netmask names no host
    assert "host=host0, domain=domain0" in dmesg
    assert "rootpath=/home/nfs/host0/current" in dmesg
    assert (tmp_path / "b/serving/llm/cmdline.txt").read_text().split()[-1] == board
    counts = result.redactor.files["kernel/dmesg.txt"]
    assert counts == {"ip-address": 9, "host-name": 3}


# Incident bundles from public reports with what masking and redaction could mistake:
# addresses in a vLLM log, firmware and OFED versions in dmesg ("40.100.00.00",
# "LINUX-23.10-2.1.3.1"), WSL2 kernel releases ("5.15.167.4-microsoft-standard-WSL2"),
# Xid lines, nvidia-smi dumps.
REPLAYED = [
    "vllm-v1-engine-dead-kimi-api",
    "clean-boot-nvswitch-550-gpud",
    "wsl2-tcc-gpus-no-devices-kernel-5-15",
    "wsl2-guest-linux-driver-470-container-mount",
    "gb200-xid149-netir-fatal-xid154-reset",
    "vllm-port-in-use-ci-spawned-child",
    "trtllm-triton-serialization-tag-226-228",
    "api-mismatch-journal-367",
]


@pytest.mark.parametrize("name", REPLAYED)
def test_a_redacted_and_masked_bundle_replays_as_the_original(name: str, tmp_path: Path) -> None:
    src = FIXTURES / "incidents" / name
    copy = tmp_path / name
    shutil.copytree(src, copy)
    red = Redactor(True, HostMasker(["gpu01.acme.pvt"]))
    for path in sorted(copy.rglob("*")):
        rel = path.relative_to(copy).as_posix()
        if path.is_file() and rel not in ("bundle.yaml", "expected.yaml", "SOURCE.md"):
            before = path.read_bytes()
            after = red.data(rel, before, addresses=rel not in VERSION_FILES)
            assert after.count(b"\n") == before.count(b"\n")
            path.write_bytes(after)

    def replay(b: Path) -> tuple[int, list[Any], list[Any]]:
        out = moptd("replay", str(b), "--json")
        report = json.loads(out.stdout)
        found = sorted((f["code"], f["subject"], f.get("state", "")) for f in report["findings"])
        read = [
            {k: v for k, v in e.items() if k not in ("input", "reason")} for e in report["read"]
        ]
        return out.returncode, found, read

    assert replay(copy) == replay(src)


# --- the redactor itself ---

NOT_SECRETS = [
    # vLLM and SGLang flags holding "token" or "key" that are not secrets
    "--tokenizer", "--tokenizer-mode", "--max-num-batched-tokens", "--skip-tokenizer-init",
    "--ssl-keyfile", "--num-speculative-tokens", "--tokenizer-revision",
    # the Firecracker guest's kernel command line in a real dmesg (h200-idle-healthy)
    "--auth-required", "--tcp-readiness-only",
]  # fmt: skip


@pytest.mark.parametrize("flag", NOT_SECRETS)
def test_flags_that_only_look_like_secrets_are_kept(flag: str) -> None:
    argv = ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", flag, "value-kept"]
    assert redact_argv(argv) == argv
    line = " ".join(argv)
    assert redact_text(line) == line
    assert redact_text(f"{flag}=value-kept") == f"{flag}=value-kept"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("vllm serve m --api-key sk-x1 --port 8000", f"vllm serve m --api-key {MARK} --port 8000"),
        ("--hf-token=hf_abc --token t0k", f"--hf-token={MARK} --token {MARK}"),
        ("--api-key --port 1", "--api-key --port 1"),  # no value: nothing to redact
        (
            "FOO_API_KEY=abc HF_TOKEN=hf_x MAX_TOKENS=9",
            f"FOO_API_KEY={MARK} HF_TOKEN={MARK} MAX_TOKENS=9",
        ),
        ("Namespace(api_key=None, hf_token='x1')", f"Namespace(api_key=None, hf_token='{MARK}')"),
        ("{'api_key': ['k1', 'k2'], 'model': 'm'}", f"{{'api_key': {MARK}, 'model': 'm'}}"),
        ('{"bos_token": "<s>", "token": "abc1"}', f'{{"bos_token": "<s>", "token": "{MARK}"}}'),
        ("Authorization: Bearer eyJhbGciOi.x1", f"Authorization: Bearer {MARK}"),
        ("https://u:p4ss@host/x", f"https://u:{MARK}@host/x"),
        (
            "usage: [--api-key API_KEY] [--hf-token [HF_TOKEN]]",
            "usage: [--api-key API_KEY] [--hf-token [HF_TOKEN]]",
        ),
        ("id AKIAIOSFODNN7EXAMPLE end", f"id {MARK} end"),
        ("ghp_" + "a" * 36, MARK),
        (
            "Please set a HF_TOKEN to enable higher rate limits.",
            "Please set a HF_TOKEN to enable higher rate limits.",
        ),
    ],
)
def test_redaction_of_each_kind(text: str, expected: str) -> None:
    assert redact_text(text) == expected


def test_the_fixture_corpus_has_no_secrets_to_find() -> None:
    """Every public log, dump and config in tests/fixtures: nothing in them is a secret, so a
    redaction there would be a false one (and could change a diagnosis)."""
    found = {}
    for path in sorted(FIXTURES.rglob("*")):
        if path.is_file() and path.stat().st_size < 4 << 20 and "record-redaction" not in str(path):
            counts: Counter[str] = Counter()
            redact_text(path.read_bytes().decode("utf-8", "surrogateescape"), counts)
            if counts:
                found[str(path)] = dict(counts)
    assert found == {}


# --- properties (hypothesis) ---

_SAFE = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)
_SECRET = st.text(alphabet="ABCDEFGHJKMNPQRSTUVWXYZabcdefghjkmnpqrstuvwxyz23456789",
                  min_size=12, max_size=40)  # fmt: skip
PLANTS = [
    "--api-key {s}",
    "--api-key={s}",
    "--hf-token {s}",
    "--token={s}",
    "--db-password '{s}'",
    "OPENAI_API_KEY={s}",
    "api_key='{s}'",
    "'api_key': ['{s}']",
    '"hf_token": "{s}"',
    "Authorization: Bearer {s}",
    "https://user:{s}@example.net/x",
    "sk-{s}{s}",
    "hf_{s}{s}{s}",
    "ghp_{s}{s}{s}{s}",
]


@settings(max_examples=300, deadline=None)
@given(
    before=st.lists(_SAFE, max_size=5),
    after=st.lists(_SAFE, max_size=5),
    plant=st.sampled_from(PLANTS),
    secret=_SECRET,
    prefix=_SAFE,
)
def test_a_planted_secret_never_survives(
    before: list[str], after: list[str], plant: str, secret: str, prefix: str
) -> None:
    surrounding = "\n".join([*before, prefix, *after])
    assume(secret not in surrounding)
    line = f"{prefix} {plant.format(s=secret)} end"
    text = "\n".join([*before, line, *after])
    out = redact_text(text)
    assert secret not in out
    assert out.count("\n") == text.count("\n")


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(_SAFE, st.sampled_from(PLANTS).map(lambda p: p.format(s="Zq9" * 5))),
                max_size=12).map(" ".join))  # fmt: skip
def test_redaction_is_idempotent_keeps_lines_and_matches_the_slow_path(text: str) -> None:
    text = text.replace(" ", "\n", 3)
    counts: Counter[str] = Counter()
    once = redact_text(text, counts)
    assert once.count("\n") == text.count("\n")
    assert once.splitlines().__len__() == text.splitlines().__len__()
    again: Counter[str] = Counter()
    assert redact_text(once, again) == once
    assert not again  # nothing counted twice
    assert once == redact_line(text, Counter())  # the trigger prefilter misses nothing


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([*NOT_SECRETS, "--api-key", "--hf-token", "x", "-1", "sk-a"]),
                max_size=8), st.lists(_SECRET, min_size=1, max_size=8))  # fmt: skip
def test_argv_redaction_keeps_the_argument_count(flags: list[str], values: list[str]) -> None:
    argv = [a for pair in zip(flags, values, strict=False) for a in pair]
    out = redact_argv(argv)
    assert len(out) == len(argv)
    assert redact_argv(out) == out
    for i, a in enumerate(argv[:-1]):
        if a in ("--api-key", "--hf-token"):
            assert out[i + 1] == MARK
