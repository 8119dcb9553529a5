"""Cost model: per-step time of the target model (DeepSeek-V4.1-Flash) on the target GPUs."""
