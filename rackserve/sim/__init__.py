"""Offline discrete-event simulator of the rack: virtual clock, same sched/routing/kv/timing as live.

Drive it from a scenario and an arrival list (or the scenario's own workload):

    from rackserve.sim.run import simulate
    from rackserve.sim.scenario import load_scenario
    result = simulate(load_scenario("scenarios/mooncake-small.yaml"), requests, policy="round-robin")

`rackserve sim SCENARIO` / `rackserve sim sweep` wrap the same calls (rackserve/sim/cli.py).
"""
