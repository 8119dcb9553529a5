"""Build the venv for `vllm bench serve` once, then run bench/clients/outside_clients.py, whose table and
bench/results/clients/outside_clients.json include its rows (completions and chat, random and custom datasets).

    .venv/bin/python bench/clients/vllm_bench.py [bench/clients/outside_clients.py options]

vLLM 0.33 depends on CUDA wheels (flashinfer, cutlass, torch 2.14 with CUDA) that this machine
cannot use and `vllm bench serve` does not import: the benchmark client needs vLLM itself
(`--no-deps`), torch (the machine's local CPU wheel) and the pure-Python packages its CLI imports.
So it is installed in steps, outside the project's .venv (~/.cache/rackserve/venv-vllm-0.33.0,
linked as .venv-vllm).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from client_venv import REPO, ensure  # noqa: E402

VLLM_VERSION = "0.33.0"
TORCH = "torch==2.13.0"  # resolves to the CPU wheel in /opt/wheels on this kind of machine
STEPS = [
    ["--no-deps", f"vllm=={VLLM_VERSION}"],
    [TORCH, "transformers>=5.16.1,<5.21", "fastapi[standard]>=0.133,<0.137", "xgrammar==0.2.8",
     "lark==1.2.2", "outlines_core==0.2.14", "lm-format-enforcer==0.11.3", "llguidance>=1.7,<1.8",
     "mistral_common[image]>=1.11.6", "model-hosting-container-standards>=0.1.14,<1",
     "mcp>=2.2,<3", "oss-harmony", "anthropic", "openai", "aiohttp", "pydantic", "numpy", "pandas",
     "tqdm", "pillow", "pyyaml", "regex", "requests", "cachetools", "psutil", "msgspec", "pyzmq",
     "cloudpickle", "prometheus_client", "prometheus-fastapi-instrumentator", "sentencepiece",
     "tiktoken", "blake3", "cbor2", "pybase64", "orjson", "py-cpuinfo", "setproctitle", "einops",
     "opentelemetry-sdk", "opentelemetry-api", "opentelemetry-exporter-otlp",
     "opentelemetry-semantic-conventions-ai", "jsonschema", "partial-json-parser", "watchfiles",
     "python-json-logger", "ijson", "ninja", "safetensors", "huggingface_hub>=1.31",
     "tokenizers>=0.23.2", "protobuf", "opencv-python-headless"],
]

if __name__ == "__main__":
    ensure("vllm", VLLM_VERSION, STEPS)
    sys.exit(subprocess.run([sys.executable, str(REPO / "bench" / "clients" / "outside_clients.py"), *sys.argv[1:]])
             .returncode)
