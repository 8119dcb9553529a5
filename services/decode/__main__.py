"""`python -m services.decode --port P --metrics-port M --redis-url URL --pool ADDR [--config FILE]
[--ray-address ADDR]`: the decode service (gRPC streaming) driving its Wide-EP and TP8 instances."""

from __future__ import annotations

import asyncio

from services._proto import decode_pb2_grpc
from services.decode.service import DecodeService
from services.worker_host import make_loops, serve_grpc, start_worker, worker_args


async def main() -> None:
    args = worker_args("decode")
    worker = start_worker("decode", args)
    holder: list[DecodeService] = []
    loops = make_loops(worker, "decode", lambda done: holder[0].on_step(done))
    service = DecodeService(worker.specs, worker.actors, loops, worker.timing)
    holder.append(service)
    await serve_grpc(
        args, lambda server: decode_pb2_grpc.add_DecodeServicer_to_server(service, server), loops
    )


if __name__ == "__main__":
    asyncio.run(main())
