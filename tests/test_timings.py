"""The phase timer (terrain_io.timings) against time.perf_counter measured around it."""
import json
import pickle
import threading
import time

from terrain_io.timings import Timings


def test_phase_measures_its_block_and_adds_on_reentry():
    t = Timings(first=0.0)
    outer0 = time.perf_counter()
    with t.phase("sleep"):
        inner0 = time.perf_counter()
        time.sleep(0.02)
        inner = time.perf_counter() - inner0
    with t.phase("sleep"):
        time.sleep(0.01)
    outer = time.perf_counter() - outer0
    assert inner + 0.01 <= t["sleep"] <= outer
    assert list(t) == ["first", "sleep"]  # the order phases were first named: what the commands print
    assert t.seconds() >= outer


def test_phase_counts_a_block_that_raises():
    t = Timings()
    try:
        with t.phase("failed"):
            raise KeyError
    except KeyError:
        pass
    assert t["failed"] >= 0.0


def test_phases_from_threads_sum():
    t = Timings()

    def work():
        for _ in range(200):
            with t.phase("w"):
                pass
            t.add("n", 1.0)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert t["n"] == 1600.0  # no lost update


def test_results_keep_a_plain_dict():
    t = Timings(a=1.23456, b=2)
    assert t.rounded(2) == {"a": 1.23, "b": 2} and type(t.rounded()) is dict
    assert json.loads(json.dumps(t)) == {"a": 1.23456, "b": 2}
    back = pickle.loads(pickle.dumps(t))
    assert back == {"a": 1.23456, "b": 2} and type(back) is dict
