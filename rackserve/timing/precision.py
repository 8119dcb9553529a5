"""Precision per tensor group: the routed experts' weight and math formats a deployment serves with
(NVFP4 MoE checkpoints of DeepSeek-R1, FP8 ones, W4A8) and the attention kernels' math (BF16 as FlashMLA,
or FP8 over an FP8 KV cache), applied to a model spec."""

from __future__ import annotations

from rackserve.timing.spec import DTYPE_BYTES, ModelSpec

# name -> (stored weight dtype, GEMM math dtype)
EXPERT_PRECISIONS: dict[str, tuple[str, str]] = {
    "fp8": ("fp8", "fp8"),  # block-FP8 weights, FP8 activations (DeepSeek's own checkpoints)
    "nvfp4": ("fp4", "fp4"),  # NVFP4 weights and activations (nvidia/DeepSeek-R1-FP4: W4A4 on Blackwell)
    "w4a8": ("fp4", "fp8"),  # FP4 weights, FP8 activations (FP8 x FP4 MMA)
}


def with_expert_precision(model: ModelSpec, name: str | None) -> ModelSpec:
    """`model` with its routed experts stored and computed as `name` says (None: as the spec has
    them). Expert bytes are rescaled from the spec's own format, so scales stay as DTYPE_BYTES has them."""
    if name is None:
        return model
    if name not in EXPERT_PRECISIONS:
        raise ValueError(f"expert_precision: unknown {name!r} (known: {', '.join(EXPERT_PRECISIONS)})")
    weight, math_dtype = EXPERT_PRECISIONS[name]
    moe = model.moe
    params = moe.expert_bytes / DTYPE_BYTES[moe.weight_dtype]
    new = moe.model_copy(update={"weight_dtype": weight, "expert_bytes": params * DTYPE_BYTES[weight],
                                 "math_dtype": math_dtype})
    return model.model_copy(update={"moe": new})


ATTENTION_MATH = ("bf16", "fp8")


def with_attention_math(model: ModelSpec, dtype: str | None) -> ModelSpec:
    """`model` with its attention kernels' math in `dtype` (None: the spec's)."""
    if dtype is None:
        return model
    if dtype not in ATTENTION_MATH:
        raise ValueError(f"attention_math: unknown {dtype!r} (known: {', '.join(ATTENTION_MATH)})")
    return model.model_copy(update={"attention": model.attention.model_copy(update={"math_dtype": dtype})})


def with_precision(model: ModelSpec, experts: str | None, attention_math: str | None) -> ModelSpec:
    return with_attention_math(with_expert_precision(model, experts), attention_math)
