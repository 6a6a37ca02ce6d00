"""Probes of a serving endpoint: /health, /v1/models and a real one-token generation.

vLLM V1's /health only reflects a flag: it stays 200 while a hung engine core serves
nothing. Only the generation probe, with a deadline, shows that the engine answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    import aiohttp

from moptd.serving.http import FetchError, request


@dataclass(frozen=True, slots=True)
class ProbeResult:
    probe: str  # health | models | generate
    ok: bool
    seconds: float
    status: int = 0  # HTTP status, 0 when there was no answer
    detail: str = ""
    models: tuple[str, ...] = ()


async def probe_health(session: aiohttp.ClientSession, base: str, deadline: float) -> ProbeResult:
    try:
        r = await request(session, "GET", base + "/health", deadline=deadline, max_bytes=65536)
    except FetchError as exc:
        return ProbeResult("health", False, deadline, 0, str(exc))
    return ProbeResult(
        "health",
        r.status == 200,
        r.seconds,
        r.status,
        "" if r.status == 200 else f"HTTP {r.status}",
    )


async def probe_models(session: aiohttp.ClientSession, base: str, deadline: float) -> ProbeResult:
    try:
        r = await request(session, "GET", base + "/v1/models", deadline=deadline, max_bytes=1 << 20)
    except FetchError as exc:
        return ProbeResult("models", False, deadline, 0, str(exc))
    if r.status != 200:
        return ProbeResult("models", False, r.seconds, r.status, f"HTTP {r.status}")
    try:
        data = r.json()
        ids = tuple(str(m["id"]) for m in data["data"])
    except (ValueError, KeyError, TypeError):
        return ProbeResult("models", False, r.seconds, r.status, "not an OpenAI model list")
    return ProbeResult("models", bool(ids), r.seconds, r.status, "" if ids else "no model", ids)


async def probe_generate(
    session: aiohttp.ClientSession, base: str, model: str, deadline: float
) -> ProbeResult:
    """One completion token; a hung engine accepts the request and never answers."""
    payload = {"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0}
    try:
        r = await request(
            session,
            "POST",
            base + "/v1/completions",
            deadline=deadline,
            max_bytes=1 << 20,
            payload=payload,
        )
    except FetchError as exc:
        return ProbeResult("generate", False, deadline, 0, str(exc))
    if r.status != 200:
        return ProbeResult("generate", False, r.seconds, r.status, f"HTTP {r.status}")
    try:
        ok = bool(r.json()["choices"])
    except (ValueError, KeyError, TypeError):
        ok = False
    return ProbeResult("generate", ok, r.seconds, r.status, "" if ok else "no completion")
