"""The pipeline's Spark session without Spark: its master sized to the task slots, its JVMs' compilers."""

from __future__ import annotations

import pytest

from pipeline.session import NotEnoughSlots, jit_options, local_master


@pytest.mark.parametrize("master, slots, want", [
    ("local[*]", 22, "local[22]"), ("local[32]", 22, "local[32]"), ("spark://h:7077", 22, "spark://h:7077")])
def test_a_local_master_is_sized_to_the_realtime_queries_task_slots(master, slots, want):
    assert local_master(master, slots) == want


def test_a_local_master_too_small_for_the_realtime_queries_is_refused():
    with pytest.raises(NotEnoughSlots, match=r"spark_master local\[4\] runs 4 task\(s\) at once, and the Real-time "
                                             r"queries hold 22 .*local\[22\]"):
        local_master("local[4]", 22)


@pytest.mark.parametrize("spark_jit, realtime, microbatches, options", [
    # micro-batches only: compiling well never pays back
    ("auto", False, True, " -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"),
    ("auto", True, True, ""),
    ("auto", True, False, ""),
    ("tiered", False, True, ""),
    ("client", True, False, " -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"),
])
def test_the_spark_jit_setting_picks_the_jvms_compilers(spark_jit, realtime, microbatches, options):
    assert jit_options(spark_jit, realtime=realtime, microbatches=microbatches) == options
