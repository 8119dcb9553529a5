"""Pages generated from frontier.json: the README block and the results page carry the reports' figures."""

import pytest

from rackserve.search.pages import BEGIN, END, headline, ratio, replace_block, results_page

CFG = {"label": "dep2x8+wideep16x1 seqs64 chunk16k", "prefill_layout": "dep2", "prefill_ranks": 2,
       "prefill_count": 8, "decode_layout": "wide-ep", "decode_ranks": 16, "decode_count": 1,
       "decode_max_num_seqs": 64, "max_num_batched_tokens": 16384, "mtp": True, "gpus": 32}


def rep(name: str, at387: float | None, peak: float) -> dict:
    point = {"config": CFG, "concurrency": 100, "window_s": 900, "throughput_per_gpu": peak, "tps_user_p50": 500,
             "tps_user_p90": 400, "ttft_p90_s": 0.1, "source": "replay"}
    win = None if at387 is None else {"config": CFG, "throughput_per_gpu": at387, "source": "replay", "point": point}
    return {"rack": name, "hardware": "hw", "gpus": 72, "targets": [387, 1000], "percentile": "p90",
            "interactivity": "e2e", "at_target": {"387": win, "1000": None}, "peak": point, "points": [point],
            "configs_screened": 5, "configs_rejected": [], "envelope": {"p90": [point]}, "area": 1.0,
            "area_range": [387, 1000], "cpu_s": {"total": 10, "screen": 1},
            "screen_error": {"median_throughput": 0.05, "median_tps_user_e2e_p90": 0.1, "per_point": []}}


def test_headline_has_each_rack_its_ratio_and_says_not_reached():
    text = headline([rep("vr", 300.0, 900.0), rep("gb", 100.0, 300.0)])
    assert "| vr | 300 | not reached | 900 |" in text
    assert "| vr / gb | 3.00x | n/a |" in text
    assert "8 DEP2 prefill (16 GPUs) + 1 Wide-EP 16 decode (16 GPUs)" in text
    assert ratio(rep("a", None, 1), rep("b", 1.0, 1), "387") is None


def test_readme_block_is_replaced_between_markers_only():
    text = f"intro\n{BEGIN}\nold\n{END}\nafter\n"
    out = replace_block(text, "new")
    assert out == f"intro\n{BEGIN}\nnew\n{END}\nafter\n"
    with pytest.raises(ValueError, match="frontier:begin"):
        replace_block("no markers", "x")


def test_results_page_links_the_json_and_lists_the_envelope(tmp_path):
    page = results_page([rep("vr", 300.0, 900.0)], [str(tmp_path / "r" / "frontier.json")], str(tmp_path / "docs"))
    assert "[frontier.json](../r/frontier.json)" in page
    assert "| `dep2x8+wideep16x1 seqs64 chunk16k` | 32 | 100 | 900 | 900 |" in page


def test_findings_say_why_the_other_layout_does_not_win_and_keep_prose_short():
    tp8 = {**CFG, "label": "dep2x4+tp8x4 seqs64 chunk8k", "decode_layout": "tp8", "decode_ranks": 8,
           "decode_count": 4, "prefill_count": 4}
    r = rep("vr", 300.0, 900.0)
    r["at_target"]["387"] = {**r["at_target"]["387"], "config": tp8}
    slow_wide = {"config": CFG, "concurrency": 5000, "tps_user_p90": 120.0, "ttft_p90_s": 2.5, "source": "replay"}
    r["points"] = r["points"] + [slow_wide]
    text = headline([r])
    assert "4 TP8 decode (32 GPUs)" in text
    assert "wins (replay, near 100 lanes)" in " ".join(text.split())  # where on the curve it wins
    assert "no Wide-EP point reaches it (best 400 tok/s/user" not in text  # the fastest Wide-EP is 400 >= 387
    r["points"] = [slow_wide]
    text = headline([r])
    assert "no Wide-EP point reaches it (best 120 tok/s/user, `dep2x8+wideep16x1 seqs64 chunk16k` at 5,000" in \
        " ".join(text.split())
    assert all(len(line) <= 120 for line in text.splitlines() if not line.startswith("|"))
