"""Workloads as streams of Requests: Mooncake JSONL traces, recorded agentic conversations replayed
by the AgentX rules (conversation.py, trace_file.py, trace_blocks.py, trace_replay.py), and
AgentX-like synthetic sessions."""
