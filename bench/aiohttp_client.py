"""The peer for loadgen's HTTP client in bench_http.py: aiohttp's ClientSession on uvloop,
N coroutines each sending GETs back to back on a keep-alive pool of N connections, for D
seconds. Prints one JSON line: ok, errors, duration_s.

    python bench/aiohttp_client.py URL CONNECTIONS DURATION_S
"""

import asyncio
import json
import sys
import time

import aiohttp


async def main(url: str, connections: int, duration_s: float) -> dict:
    counts = {"ok": 0, "errors": 0}
    connector = aiohttp.TCPConnector(limit=connections, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.monotonic()
        deadline = start + duration_s

        async def worker() -> None:
            while time.monotonic() < deadline:
                try:
                    async with session.get(url) as response:
                        await response.read()
                        counts["ok" if response.status == 200 else "errors"] += 1
                except aiohttp.ClientError:
                    counts["errors"] += 1

        await asyncio.gather(*(worker() for _ in range(connections)))
        return {**counts, "duration_s": time.monotonic() - start}


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    print(json.dumps(asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))))
