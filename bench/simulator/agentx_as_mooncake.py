"""The agentic trace of bench/simulator/vs_dynamo.py: recorded AgentX conversations (data/agentx) written as a Mooncake
trace, so that our simulator and Dynamo's replay read the same file.

Conversations [FIRST, FIRST + COUNT) of the capture (30 conversations, 1,147 requests, prompts 139.6k tokens
on average: the contiguous run of the issue-51 table's size and mean prompt), each a lane from t = 0, every
request (parent and subagent turns) at its recorded time. Mooncake's hash ids are per 512-token block: a
block's id is the same number wherever its whole prefix is (its conversation's 64-token ids up to its end,
chained block by block), and a last partial block gets an id of its own.

Run: .venv/bin/python bench/simulator/agentx_as_mooncake.py [OUT]   (default /tmp/rackserve-agentx-mooncake.jsonl)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rackserve.workload.spec import DEFAULT_AGENTX_TRACE
from rackserve.workload.trace_file import read_conversations

FIRST, COUNT = 89, 30
MOONCAKE_BLOCK, AGENTX_BLOCK = 512, 64
PER = MOONCAKE_BLOCK // AGENTX_BLOCK
DEFAULT_OUT = Path("/tmp/rackserve-agentx-mooncake.jsonl")


def records(first: int = FIRST, count: int = COUNT) -> list[dict]:
    """The Mooncake records, in time order (ties in conversation then step order)."""
    ids: dict[tuple, int] = {}
    rows = []
    for k, conv in enumerate(read_conversations(DEFAULT_AGENTX_TRACE)[first:first + count]):
        for j, turn in enumerate(conv.all_turns()):
            blocks = -(-turn.prompt_tokens // MOONCAKE_BLOCK)
            hashes: list[int] = []
            prev = -1 - k  # the conversation, before its first block
            for b in range(blocks):
                part = tuple(int(h) for h in turn.hash_ids[b * PER:(b + 1) * PER])
                key = (prev, part) if len(part) == PER else ("own", k, j, b)  # a partial block: this request's
                prev = ids.setdefault(key, len(ids))
                hashes.append(prev)
            rows.append(((turn.t_s, k, j), {"timestamp": round(turn.t_s * 1e3, 3), "input_length": turn.prompt_tokens,
                                            "output_length": max(turn.output_tokens, 1), "hash_ids": hashes}))
    rows.sort(key=lambda r: r[0])
    return [r for _, r in rows]


def write(out: Path = DEFAULT_OUT) -> Path:
    """The trace at `out` (rewritten only when its contents differ)."""
    text = "".join(json.dumps(r) + "\n" for r in records())
    if not out.exists() or out.read_text() != text:
        out.write_text(text)
    return out


if __name__ == "__main__":
    path = write(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    print(f"{path}: {len(rows)} requests, mean prompt {sum(r['input_length'] for r in rows) / len(rows):,.0f} tokens, "
          f"last at {rows[-1]['timestamp'] / 1e3:,.0f} s")
