"""BLAS thread count for the numpy engine: one call at process start (CLI, worker actor, bench).

The model's matrices are small; on a shared 2-core machine OpenBLAS threads cost more in
synchronization than they gain (a demo run takes ~3x longer with 2 threads than with 1).
"""

from __future__ import annotations

from threadpoolctl import threadpool_limits

_limits: list[threadpool_limits] = []  # keeps the limit alive for the process


def limit_blas_threads(threads: int = 1) -> None:
    """Cap BLAS (OpenBLAS/MKL) threads of this process."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    _limits.append(threadpool_limits(limits=threads, user_api="blas"))
