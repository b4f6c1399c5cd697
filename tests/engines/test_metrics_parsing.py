"""Metrics pages the captures do not cover: label order, missing and NaN values, DP engines, older names."""

from __future__ import annotations

import pytest

from opod.engines import promtext
from opod.engines.base import LoadSample, MetricsState
from opod.engines.registry import get_driver

# Two DP engines, labels in two orders, a NaN gauge, a series of another family that must not leak in.
VLLM_DP = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="q"} 3.0
vllm:num_requests_running{model_name="q",engine="1"} 5.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="q"} 2.0
vllm:num_requests_waiting{model_name="q",engine="1"} NaN
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="q",reason="capacity"} 99.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="q"} 0.5
vllm:kv_cache_usage_perc{model_name="q",engine="1"} 0.7
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="q"} 100.0
vllm:generation_tokens_total{engine="1",model_name="q"} 300.0
vllm:generation_tokens_created{engine="0",model_name="q"} 1.7e9
"""

# A release from before the renames: gpu_* names.
VLLM_OLD = """\
vllm:gpu_cache_usage_perc{model_name="q"} 0.25
vllm:gpu_prefix_cache_queries_total{model_name="q"} 200.0
vllm:gpu_prefix_cache_hits_total{model_name="q"} 50.0
"""


def test_vllm_dp_engines_are_summed_and_averaged_whatever_the_label_order() -> None:
    sample, state = get_driver("vllm").parse_metrics(VLLM_DP, None, 10.0)
    assert sample.running == 8
    assert sample.queue_depth == 2, "a NaN reading is missing, not zero-plus-garbage"
    assert sample.kv_used_pct == pytest.approx(60.0)
    assert sample.prefix_hit_pct is None and sample.tokens_per_s is None
    assert state.counters == {"vllm:generation_tokens_total": 400.0}


def test_older_vllm_names_still_read() -> None:
    sample, _ = get_driver("vllm").parse_metrics(VLLM_OLD, None, 1.0)
    assert sample.kv_used_pct == pytest.approx(25.0) and sample.prefix_hit_pct == pytest.approx(25.0)


def test_a_page_with_nothing_known_says_nothing() -> None:
    for name in ("vllm", "sglang", "llamacpp", "sim"):
        sample, state = get_driver(name).parse_metrics("# nothing here\nprocess_cpu_seconds_total 3.0\n", None, 2.0)
        assert sample == LoadSample(sampled_at=2.0) and state.counters == {}


def test_llamacpp_kv_gauge_when_present_else_busy_slots() -> None:
    driver = get_driver("llamacpp")
    busy = "llamacpp:requests_processing 3\nllamacpp:requests_deferred 2\n"
    assert driver.parse_metrics(busy, MetricsState(at=0, slots=4), 1.0)[0].kv_used_pct == pytest.approx(75.0)
    assert driver.parse_metrics(busy, None, 1.0)[0].kv_used_pct is None, "slots unknown: no guess"
    with_gauge = busy + "llamacpp:kv_cache_usage_ratio 0.125\n"
    assert driver.parse_metrics(with_gauge, MetricsState(at=0, slots=4), 1.0)[0].kv_used_pct == pytest.approx(12.5)


def test_sglang_falls_back_to_its_gauges_without_counters() -> None:
    page = 'sglang:gen_throughput{tp_rank="0"} 120.5\nsglang:cache_hit_rate{tp_rank="0"} 0.4\nsglang:token_usage{tp_rank="0"} 1.2\n'
    sample, _ = get_driver("sglang").parse_metrics(page, None, 1.0)
    assert sample.tokens_per_s == pytest.approx(120.5)
    assert sample.prefix_hit_pct == pytest.approx(40.0)
    assert sample.kv_used_pct == 100.0, "an overshooting fraction is clamped"


def test_rates_need_an_interval_and_a_counter_that_grew() -> None:
    prev = MetricsState(at=100.0, counters={"c": 10.0, "h": 5.0, "q": 10.0})
    assert promtext.counter_rate("c", {"c": 30.0}, prev, 110.0) == pytest.approx(2.0)
    assert promtext.counter_rate("c", {"c": 30.0}, prev, 100.0) is None  # no time passed
    assert promtext.counter_rate("c", {"c": 3.0}, prev, 110.0) is None  # restarted
    assert promtext.counter_rate("c", {"c": 30.0}, None, 110.0) is None  # first scrape
    assert promtext.counter_share("h", "q", {"h": 5.0, "q": 10.0}, prev) is None  # nothing asked since
    assert promtext.counter_share("h", "q", {"h": 6.0, "q": 14.0}, prev) == pytest.approx(25.0)
    assert promtext.counter_share("h", "q", {"h": 1.0, "q": 4.0}, prev) == pytest.approx(
        25.0
    )  # restarted: since the start
    assert promtext.loose_pct(0.4) == pytest.approx(40.0) and promtext.loose_pct(40.0) == 40.0


def test_metrics_state_carries_slots_to_the_next_sample() -> None:
    driver = get_driver("vllm")
    _, state = driver.parse_metrics(VLLM_DP, MetricsState(at=0.0, slots=16), 10.0)
    sample, _ = driver.parse_metrics(VLLM_DP, state, 20.0)
    assert sample.slots == 16 and sample.tokens_per_s == 0.0
    load = sample.to_engine_load()
    assert (load.kv_used_pct, load.queue_depth, load.sampled_at) == (pytest.approx(60.0), 2, 20)
