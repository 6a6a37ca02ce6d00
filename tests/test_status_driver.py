"""`moptd status` shows the driver stack the driver collector saw."""

from __future__ import annotations

from moptd.cli import render
from moptd.clock import VirtualClock
from moptd.collector import CollectorContext
from moptd.collectors.driver import DriverCollector
from moptd.daemon.views import driver_view
from moptd.store import SignalStore
from tests.test_driver_collector import _host


async def test_status_shows_modules_versions_nodes_and_persistence(tmp_path, capsys):
    proc, sys, dev = _host(tmp_path)
    ctx = CollectorContext(
        options={"dev_dir": str(dev), "serving_user": "root", "use_tools": False},
        procfs=proc,
        sysfs=sys,
    )
    collector = DriverCollector(ctx)
    try:
        batch = await collector.collect()
    finally:
        await collector.stop()
    store = SignalStore(VirtualClock(1000))
    store.ingest("driver", batch)
    d = driver_view(store)
    assert d["kernel_module_version"] == ["580.159.04"]
    assert d["modules"]["nvidia"] is True
    assert d["modules"]["nvidia_peermem"] is False
    assert d["device_nodes"] == {"nvidia-uvm": False, "nvidia-uvm-tools": False,
                                 "nvidia0": True, "nvidiactl": True}
    assert d["persistenced_running"] == 1
    render.print_status({"driver": d, "collectors": []})
    out = capsys.readouterr().out
    assert "Driver: kernel module 580.159.04" in out
    assert "nvidia loaded" in out
    assert "nvidia_peermem missing" in out
    assert "nvidia-uvm missing" in out
    assert "nvidia-persistenced running: yes" in out
