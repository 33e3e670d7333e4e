"""One gRPC load process: `concurrency` requests in flight on one grpc.aio channel.

Sends pre-serialised ModelInferRequest bytes through a raw unary method (no per-call protobuf
work), records each latency. Protocol with the parent: print READY after one successful call,
wait for GO on stdin, run for the given seconds, write a JSON report.

Usage: python -m bench.grpc_worker HOST:PORT BODY CONCURRENCY SECONDS OUT
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

METHOD = "/inference.GRPCInferenceService/ModelInfer"


async def main(url: str, body: bytes, concurrency: int, seconds: float, out: Path) -> None:
    import grpc
    from tritonclient.grpc import service_pb2

    async with grpc.aio.insecure_channel(url) as channel:
        call = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        answer = service_pb2.ModelInferResponse.FromString(await call(body, timeout=30))
        if not answer.outputs:
            raise SystemExit(f"{url}: ModelInfer answered without outputs")
        print("READY", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

        latencies: list[int] = []
        errors = 0
        start_cpu, start = time.process_time(), time.perf_counter()
        deadline = start + seconds

        async def client() -> None:
            nonlocal errors
            while time.perf_counter() < deadline:
                sent = time.perf_counter_ns()
                try:
                    await call(body, timeout=10)
                except grpc.aio.AioRpcError:
                    errors += 1
                    continue
                latencies.append((time.perf_counter_ns() - sent) // 1000)

        await asyncio.gather(*(client() for _ in range(concurrency)))
        report = {
            "latencies_us": latencies,
            "errors": errors,
            "seconds": time.perf_counter() - start,
            "cpu_s": time.process_time() - start_cpu,
        }
        out.write_text(json.dumps(report))


if __name__ == "__main__":
    url, body, concurrency, seconds, out = sys.argv[1:6]
    asyncio.run(main(url, Path(body).read_bytes(), int(concurrency), float(seconds), Path(out)))
