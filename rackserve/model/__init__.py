"""The small MoE model the workers really execute: tokenizer, config, weights, forward, sampling."""
