"""Per-rank batch scheduling shared by the simulator and the live workers."""
