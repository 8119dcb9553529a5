"""No drift between `rackserve up` (services/launcher.py) and docker-compose.yml: every project
service gets the same flags, its ports are wired consistently (router -> workers -> pool, metrics ->
Prometheus, healthcheck -> the port the launcher waits on), Ray gets the launcher's environment.

The launcher builds its command lines inline, so they are read from its source (the `-m services.X`
list literals); a shared description read by both would replace that (see deploy/docker/README.md).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import yaml

from rackserve.config import load_config

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "services" / "launcher.py", ROOT / "services" / "engram" / "spawn.py",
           ROOT / "services" / "ray_head.py"]
WORKERS = ("prefill", "decode")


def _flag(node: ast.AST) -> str | None:
    """'--port' from "--port" or from f"--port={port}"."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("--"):
        return node.value.split("=", 1)[0]
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        text = str(node.values[0].value)
        return text.split("=", 1)[0] if text.startswith("--") else None
    return None


def _module_names(node: ast.expr, stmt: ast.stmt) -> list[str]:
    """Service names of a `-m services.X` argument; f"services.{role}" iterates a tuple of roles."""
    if isinstance(node, ast.Constant):
        return [str(node.value).removeprefix("services.")]
    assert isinstance(node, ast.JoinedStr), ast.dump(node)
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    for comp in ast.walk(stmt):
        if isinstance(comp, ast.comprehension) and isinstance(comp.target, ast.Name) and comp.target.id in names:
            if isinstance(comp.iter, ast.Tuple):
                return [str(e.value) for e in comp.iter.elts if isinstance(e, ast.Constant)]
    return list(WORKERS)  # the launcher names the roles in a separate loop


def launched_flags() -> dict[str, set[str]]:
    """Service -> flags its launcher passes, from every simple statement holding a `-m services.X` list."""
    out: dict[str, set[str]] = {}
    for source in SOURCES:
        tree = ast.parse(source.read_text())
        for stmt in ast.walk(tree):
            if not isinstance(stmt, (ast.Assign, ast.Expr, ast.Return, ast.AugAssign)):
                continue
            for lst in (n for n in ast.walk(stmt) if isinstance(n, ast.List)):
                elts = lst.elts
                for i, e in enumerate(elts[:-1]):
                    if isinstance(e, ast.Constant) and e.value == "-m":
                        flags = {f for n in ast.walk(stmt) if (f := _flag(n))}
                        for name in _module_names(elts[i + 1], stmt):
                            out.setdefault(name, set()).update(flags)
    return out


def ray_head_flags() -> set[str]:
    tree = ast.parse((ROOT / "services" / "ray_head.py").read_text())
    for lst in (n for n in ast.walk(tree) if isinstance(n, ast.List)):
        consts = [e.value for e in lst.elts if isinstance(e, ast.Constant)]
        if "start" in consts and "--head" in consts:
            return {f for e in lst.elts if (f := _flag(e))}
    raise AssertionError("launcher starts no Ray head")


@pytest.fixture(scope="module")
def compose() -> dict[str, dict[str, Any]]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def _args(svc: dict[str, Any]) -> dict[str, list[str]]:
    """--flag -> values, from a compose command list."""
    out: dict[str, list[str]] = {}
    key = None
    for item in svc["command"]:
        if item.startswith("--"):
            key, _, value = item.partition("=")
            out[key] = [value] if value else []
        elif key is not None:
            out[key].append(item)
    return out


def _module(svc: dict[str, Any]) -> str | None:
    cmd = svc["command"]
    return cmd[2].removeprefix("services.") if cmd[:2] == ["python", "-m"] else None


def test_every_launched_service_is_in_compose_with_the_same_flags(compose) -> None:
    launched = launched_flags()
    assert {"kvpool", "prefill", "decode", "router", "engram"} <= set(launched)
    by_module: dict[str, list[str]] = {}
    for name, svc in compose.items():
        if "command" in svc and (module := _module(svc)):
            by_module.setdefault(module, []).append(name)
    assert set(by_module) == set(launched), "compose runs a service the launcher does not, or vice versa"
    for module, names in by_module.items():
        for name in names:
            assert set(_args(compose[name])) == launched[module], f"{name}: flags differ from the launcher"


def test_ray_head_matches_the_launcher_but_for_container_networking(compose) -> None:
    # In a container the node IP is the container's own, Ray's fixed ports clash with nothing, and
    # /tmp/ray goes with the container (the launcher gives Ray a temp dir of its own to remove).
    container_only = {"--node-ip-address", "--ray-client-server-port", "--dashboard-agent-listen-port",
                      "--temp-dir"}
    head = _args(compose["ray-head"])
    assert set(head) | container_only >= ray_head_flags()
    assert compose["ray-head"]["command"][:3] == ["ray", "start", "--head"]
    assert head["--num-cpus"] == ["0"], "the head is the control plane; worker containers bring CPUs"
    probes = compose["ray-head"]["healthcheck"]["test"][3:]
    assert probes == [f"tcp://127.0.0.1:{head['--port'][0]}", "file:///tmp/ray/ray_current_cluster"]


def test_ports_are_wired_consistently(compose) -> None:
    port = {n: _args(s).get("--port", [None])[0] for n, s in compose.items() if "command" in s}
    router = _args(compose["router"])
    assert router["--prefill"] == [f"prefill:{port['prefill']}"]
    assert router["--decode"] == [f"decode:{port['decode']}"]
    metrics = {w: _args(compose[w])["--metrics-port"][0] for w in WORKERS}
    assert router["--worker-metrics"] == [f"http://{w}:{metrics[w]}/metrics" for w in WORKERS]
    ray_port = _args(compose["ray-head"])["--port"][0]
    shards = sorted((n for n, s in compose.items() if "command" in s and _module(s) == "engram"),
                    key=lambda n: int(_args(compose[n])["--shard"][0]))
    for worker in WORKERS:
        args = _args(compose[worker])
        assert args["--engram"] == [f"{n}:{port[n]}" for n in shards], "shard addresses in shard order"
        assert args["--pool"] == [f"kvpool:{port['kvpool']}"]
        assert args["--ray-address"] == [f"ray-head:{ray_port}"]
        assert compose[worker]["environment"]["RAY_HEAD_ADDRESS"] == f"ray-head:{ray_port}"
    for name in ("kvpool", "router", *WORKERS):
        assert _args(compose[name])["--redis-url"] == ["redis://redis:6379/0"]
    published = compose["router"]["ports"][0].rsplit(":", 1)[1]
    assert published == router["--http-port"][0]


def test_healthchecks_probe_what_the_launcher_waits_for(compose) -> None:
    """The launcher waits for each gRPC port to open and for the router's /ready."""
    for name, svc in compose.items():
        module = _module(svc) if "command" in svc else None
        if module is None:
            continue
        probe = svc["healthcheck"]["test"][-1]
        if module == "router":
            assert probe == f"http://127.0.0.1:{_args(svc)['--http-port'][0]}/ready"
        else:
            assert probe == f"tcp://127.0.0.1:{_args(svc)['--port'][0]}", name


def test_prometheus_scrapes_the_router_and_the_pool_metrics_ports(compose) -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]}
    assert targets["router"] == [f"router:{_args(compose['router'])['--http-port'][0]}"]
    assert targets["kvpool"] == [f"kvpool:{_args(compose['kvpool'])['--metrics-port'][0]}"]


def test_ray_environment_is_the_launchers_but_cross_container(compose) -> None:
    from services.launcher import RAY_ENV

    for name, svc in compose.items():
        if "command" not in svc or _module(svc) is None and name != "ray-head":
            continue
        env = svc["environment"]
        for key, value in RAY_ENV.items():
            # 0 binds every Ray socket to 127.0.0.1 (one machine); containers must bind their IP.
            expected = "1" if key == "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" else value
            assert env[key] == expected, f"{name}: {key}"


def test_engram_services_cover_every_shard_of_the_scenario(compose) -> None:
    shards = load_config(ROOT / "deploy" / "docker" / "scenario.yaml").engram.shards
    engram = [_args(s) for s in compose.values() if "command" in s and _module(s) == "engram"]
    assert sorted(int(a["--shard"][0]) for a in engram) == list(range(shards))
    assert {a["--shards"][0] for a in engram} == {str(shards)}


def test_compose_commands_parse_with_the_services_own_parsers(compose) -> None:
    from services.kvpool.__main__ import parse_args
    from services.worker_host import worker_args

    pool = parse_args(compose["kvpool"]["command"][3:])
    assert pool.port == 50051 and pool.host == "0.0.0.0"
    for role in WORKERS:
        args = worker_args(role, compose[role]["command"][3:])
        assert args.config == "/etc/rackserve/scenario.yaml" and args.host == "0.0.0.0"
