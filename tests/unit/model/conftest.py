"""Fixtures of the model tests: one small model built once per session, fresh engines per test."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from rackserve.model.config import ModelConfig
from rackserve.model.engine import Engine
from rackserve.model.engram import LocalEngramTable
from rackserve.model.threads import limit_blas_threads
from rackserve.model.transformer import Transformer
from rackserve.model.weights import init_weights


@pytest.fixture(scope="session", autouse=True)
def _single_blas_thread() -> None:
    """Small matrices: one BLAS thread is faster than two on a shared 2-core machine."""
    limit_blas_threads(1)


@pytest.fixture(scope="session")
def cfg() -> ModelConfig:
    return ModelConfig(max_context=512)


@pytest.fixture(scope="session")
def transformer(cfg: ModelConfig) -> Transformer:
    return Transformer(cfg, init_weights(cfg), LocalEngramTable(cfg))


@pytest.fixture
def make_engine(cfg: ModelConfig, transformer: Transformer) -> Callable[..., Engine]:
    def make(num_blocks: int = 256, **kwargs: object) -> Engine:
        return Engine(cfg, transformer, num_blocks, **kwargs)

    return make


@pytest.fixture
def prompt() -> Callable[[int, int], list[int]]:
    """Deterministic byte prompts: prompt(length, seed)."""

    def make(length: int, seed: int = 0) -> list[int]:
        return np.random.default_rng(seed).integers(0, 256, length).tolist()

    return make
