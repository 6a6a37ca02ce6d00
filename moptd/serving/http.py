"""Bounded HTTP for scrapes and probes: a deadline on the whole exchange, a cap on the body.

No ``Accept`` header is sent: prometheus_client answers Prometheus 2.x's OpenMetrics
Accept with ``vllm_`` names instead of ``vllm:`` ones.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where a session is made: the CLI need not load aiohttp
    import aiohttp

MAX_BODY = 8 << 20  # a vLLM page is ~60 KiB; a bigger body is not a metrics page


class FetchError(Exception):
    """The exchange failed; the message says how (refused, timed out, too large, status)."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    seconds: float

    def json(self) -> Any:
        return json.loads(self.body)


async def request(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    deadline: float,
    max_bytes: int = MAX_BODY,
    payload: Any = None,
) -> Response:
    import aiohttp

    t0 = time.monotonic()
    try:
        async with asyncio.timeout(deadline):
            async with session.request(
                method,
                url,
                json=payload,
                skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent"),
                headers={"User-Agent": "moptd"},
                allow_redirects=False,
                auto_decompress=False,
            ) as resp:
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_chunked(65536):
                    size += len(chunk)
                    if size > max_bytes:
                        raise FetchError(f"{url}: body larger than {max_bytes} bytes")
                    chunks.append(chunk)
                return Response(resp.status, b"".join(chunks), time.monotonic() - t0)
    except TimeoutError:
        raise FetchError(f"{url}: no complete answer within {deadline:g}s") from None
    except aiohttp.ClientError as exc:
        raise FetchError(f"{url}: {type(exc).__name__}: {exc}") from None
    except OSError as exc:
        raise FetchError(f"{url}: {exc.strerror or exc}") from None


def new_session() -> aiohttp.ClientSession:
    import aiohttp

    # One connection per request: a wedged keep-alive connection must not outlive a
    # timed-out scrape, and serving endpoints are local.
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True, limit=16),
        timeout=aiohttp.ClientTimeout(total=None),
    )
