"""Offline discrete-event simulator of the rack: virtual clock, same sched/routing/kv/timing as live."""
