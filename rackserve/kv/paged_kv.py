"""The KV memory of one rank: fixed-size blocks of K and V for every layer, addressed by block id.

One shared KV head per layer (as the target model), so a token's KV in one layer is two vectors of
head_dim floats. Which block holds what is decided by `block_cache.BlockCache`; this module only
stores and moves the floats.
"""

from __future__ import annotations

import numpy as np


class PagedKV:
    """K and V as [n_layers, num_blocks, block_size, head_dim] float32 arrays."""

    def __init__(self, n_layers: int, num_blocks: int, block_size: int, head_dim: int) -> None:
        shape = (n_layers, num_blocks, block_size, head_dim)
        self.k = np.zeros(shape, np.float32)
        self.v = np.zeros(shape, np.float32)
        self.block_size = block_size
        self.head_dim = head_dim

    @property
    def num_blocks(self) -> int:
        return self.k.shape[1]

    def write(self, layer: int, slots: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Store per-token K/V [n, head_dim] at flat slots (block_id * block_size + offset)."""
        flat = (-1, self.head_dim)
        self.k[layer].reshape(flat)[slots] = k
        self.v[layer].reshape(flat)[slots] = v

    def gather(self, layer: int, block_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """K, V of the blocks `block_ids[..., nb]` as [..., nb * block_size, head_dim] copies."""
        k = self.k[layer][block_ids]
        v = self.v[layer][block_ids]
        shape = (*block_ids.shape[:-1], -1, self.head_dim)
        return k.reshape(shape), v.reshape(shape)

    def read_block(self, block_id: int) -> tuple[np.ndarray, np.ndarray]:
        """All layers' K, V of one block: two [n_layers, block_size, head_dim] arrays."""
        return self.k[:, block_id].copy(), self.v[:, block_id].copy()

    def write_block(self, block_id: int, k: np.ndarray, v: np.ndarray) -> None:
        self.k[:, block_id] = k
        self.v[:, block_id] = v
