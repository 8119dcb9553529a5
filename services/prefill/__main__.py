"""`python -m services.prefill --port P --metrics-port M --redis-url URL --pool ADDR [--config FILE]
[--ray-address ADDR]`: the prefill service (gRPC) driving its DEP2 instances' rank actors on Ray."""

from __future__ import annotations

import asyncio

from services._proto import prefill_pb2_grpc
from services.prefill.service import PrefillService
from services.worker_host import make_loops, serve_grpc, start_worker, worker_args


async def main() -> None:
    args = worker_args("prefill")
    worker = start_worker("prefill", args)
    holder: list[PrefillService] = []
    loops = make_loops(worker, "prefill", lambda done: holder[0].on_step(done))
    service = PrefillService(
        worker.specs,
        worker.actors,
        loops,
        worker.cfg.engine.model_id,
        worker.cfg.engine.block_size,
        worker.metrics,
    )
    holder.append(service)
    await serve_grpc(
        args, lambda server: prefill_pb2_grpc.add_PrefillServicer_to_server(service, server), loops
    )


if __name__ == "__main__":
    asyncio.run(main())
