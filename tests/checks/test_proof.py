"""How hits are proven without per-request cached tokens: counter deltas attributed to requests."""

import asyncio

from tui.core.server.metrics import MetricSnapshot
from tui.core.soak.proof import UNKNOWN, CacheProof, CounterWindows, attribute, quantum, rises

HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"


def test_a_request_alone_gets_its_exact_share():
    assert attribute(768.0, {7: 818}) == {7: CacheProof("counter", 768, 768)}
    assert attribute(0.0, {7: 818})[7].exact == 0


def test_concurrent_hits_get_lower_bounds_above_zero():
    # four slots of ~820 tokens, each reusing 768: the delta is 3072
    out = attribute(3072.0, {1: 817, 2: 814, 3: 815, 4: 820})
    for rid, proof in out.items():
        assert proof.source == "counter" and proof.hit, proof
        assert proof.low == 3072 - (817 + 814 + 815 + 820 - {1: 817, 2: 814, 3: 815, 4: 820}[rid])
        assert proof.high == {1: 817, 2: 814, 3: 815, 4: 820}[rid]
    assert out[1].exact is None          # a bound, not an exact count


def test_a_window_with_a_small_delta_proves_no_member_a_hit():
    out = attribute(768.0, {1: 817, 2: 814, 3: 815, 4: 820})     # one of four hit: which one is unknown
    assert all(not p.hit and p.high == 768 for p in out.values())
    assert not any(p.cold(0) for p in out.values())              # and none is proven cold either


def test_a_zero_delta_proves_every_member_cold():
    out = attribute(0.0, {1: 817, 2: 814})
    assert all(p.cold(0) and not p.hit for p in out.values())


def test_unknown_stays_unknown():
    assert attribute(None, {1: 800}) == {1: UNKNOWN}
    assert attribute(-5.0, {1: 800}) == {1: UNKNOWN}                 # a counter that went back: a restart
    assert attribute(768.0, {1: 800, 2: None}) == {1: UNKNOWN, 2: UNKNOWN}
    # someone else's requests moved the query counter: nothing in the window is attributed
    assert attribute(768.0, {1: 800}, queries=1600.0) == {1: UNKNOWN}
    assert attribute(768.0, {1: 800}, queries=800.0)[1].exact == 768


def test_printed_counters_widen_the_bounds_by_their_steps():
    assert quantum(999_999.0) == 0.0 and quantum(1_234_560.0) == 10.0 and quantum(12_345_600.0) == 100.0
    proof = attribute(770.0, {1: 800}, step=10.0)[1]
    assert proof.low == 750 and proof.high == 790 and proof.hit


def test_rises_never_takes_unknown_for_an_answer():
    assert rises(CacheProof.reported(100), CacheProof.reported(200)) is True
    assert rises(CacheProof.reported(200), CacheProof.reported(200)) is False
    assert rises(CacheProof.reported(100), UNKNOWN) is None
    assert rises(CacheProof("counter", 0, 900), CacheProof("counter", 500, 900)) is None


class FakeCounter:
    """A /metrics whose counter moves by what the requests in flight reuse."""

    def __init__(self):
        self.hits = 0.0
        self.queries = 0.0
        self.scrapes = 0

    async def scrape(self):
        self.scrapes += 1
        await asyncio.sleep(0)
        return MetricSnapshot(t=0.0, values={HITS: self.hits, QUERIES: self.queries})


async def test_windows_group_overlapping_requests_and_split_sequential_ones():
    counter = FakeCounter()
    windows = CounterWindows(counter.scrape, HITS, QUERIES)

    async def request(rid, prompt, cached, delay):
        window = await windows.enter()
        await asyncio.sleep(delay)
        counter.hits += cached
        counter.queries += prompt
        return await windows.leave(window, rid, prompt)

    # two concurrent hits: one window, both proven (each reuses most of its prompt)
    a, b = await asyncio.gather(request(1, 800, 768, 0.01), request(2, 800, 768, 0.02))
    assert a.hit and b.hit and windows.windows == 1
    # then one alone: its own window, an exact count
    c = await request(3, 800, 640, 0.0)
    assert c.exact == 640 and windows.windows == 2
    assert windows.attributed == 3 and windows.members == 3


async def test_a_failed_member_leaves_its_window_unattributed():
    counter = FakeCounter()
    windows = CounterWindows(counter.scrape, HITS, None)
    first = await windows.enter()
    second = await windows.enter()
    windows.abandon(second)
    counter.hits += 768
    assert await windows.leave(first, 1, 800) == UNKNOWN
