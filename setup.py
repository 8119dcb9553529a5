"""The one compiled part: the simulator's rank-cache LRU set (rackserve/sim/_lruset.c). Everything
else about the package is in pyproject.toml. `optional`: without a C compiler the install goes on
and rackserve/sim/lru_set.py uses its Python twin (same behaviour, slower)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("rackserve.sim._lruset", ["rackserve/sim/_lruset.c"], extra_compile_args=["-O2"], optional=True),
    ],
)
