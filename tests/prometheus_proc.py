"""A real Prometheus (the Debian package `prometheus`) on loopback: its config and data in a
directory of its own, a free port, its HTTP API. The end-to-end test and
bench/daemon_steady.py both run it this way."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.daemon_proc import free_port


class PrometheusProcess:
    def __init__(self, binary: str, workdir: Path, config: dict[str, Any]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        path = workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        self._log = (workdir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={path}",
                f"--storage.tsdb.path={workdir / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            cwd=workdir,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def api(self, path: str, **params: str) -> dict[str, Any]:
        """GET /api/v1/PATH; a 400 (a PromQL error) returns its body, which says why."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return dict(json.loads(resp.read()))
        except urllib.error.HTTPError as exc:
            if exc.code != 400:
                raise
            return dict(json.loads(exc.read()))

    def query(self, expr: str) -> dict[str, Any]:
        return self.api("query", query=expr)

    def ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
            return bool(resp.status == 200)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
