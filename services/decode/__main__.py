"""`python -m services.decode --port P --metrics-port M --redis-url URL --pool ADDR [--config FILE]
[--ray-address ADDR]`: the decode service (gRPC streaming) driving its Wide-EP and TP8 instances."""

from __future__ import annotations

from services._proto import decode_pb2_grpc
from services.decode.service import DecodeService
from services.event_loop import run
from services.worker_host import run_worker

if __name__ == "__main__":
    run(run_worker("decode", DecodeService, decode_pb2_grpc.add_DecodeServicer_to_server))
