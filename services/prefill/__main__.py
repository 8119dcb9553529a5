"""`python -m services.prefill --port P --metrics-port M --redis-url URL --pool ADDR [--config FILE]
[--ray-address ADDR]`: the prefill service (gRPC) driving its DEP2 instances' rank actors on Ray."""

from __future__ import annotations

from services._proto import prefill_pb2_grpc
from services.event_loop import run
from services.prefill.service import PrefillService
from services.worker_host import run_worker

if __name__ == "__main__":
    run(
        run_worker("prefill", PrefillService, prefill_pb2_grpc.add_PrefillServicer_to_server)
    )
