"""The one per-rank scheduler of the live engine and the simulator: state, limits, KV ledger, output."""
