"""Workloads: Mooncake JSONL traces and AgentX-like agentic sessions, as streams of Requests."""
