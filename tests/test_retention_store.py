"""The compact tables behind retention and the broadcast cache, against reference models.

RetentionStore keeps rows in columns (retention.py), the core's MessageCache keeps seen ids
and cached envelope bytes in columns (proto/cache.py), and both find a publisher's places
through SeqIndex (proto/seqindex.py). Each is checked here against the simplest model of
its documented rules, under arbitrary sequences of operations, including the ones a peer
chooses (seqs anywhere in 0..2**63-1, rival messages for one place, bursts past a bound).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import example, given, settings
from hypothesis import strategies as st

from episub.proto.cache import MessageCache
from episub.proto.config import BroadcastConfig
from episub.proto.envelope import MAX_SEQ, Envelope
from episub.proto.seqindex import SeqIndex
from episub.proto.store import Places, RetentionConfig, RetentionStore, Span

# -- SeqIndex -------------------------------------------------------------------------------

near_seqs = st.integers(0, 300)
any_seqs = st.one_of(near_seqs, st.sampled_from([1 << 20, (1 << 40) + 3, MAX_SEQ]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), any_seqs, st.integers(0, 10**9)), max_size=300))
def test_seq_index_answers_as_a_dict_does(ops: list[tuple[bool, int, int]]) -> None:
    index, model = SeqIndex(), {}
    for put, seq, row in ops:
        if put:
            index.put(seq, row)
            model[seq] = row
        elif seq in model:
            index.remove(seq)
            del model[seq]
        assert len(index) == len(model)
        if model:
            assert (index.low, index.high) == (min(model), max(model))
        for probe in (seq, seq + 1, max(seq - 1, 0), 0, MAX_SEQ):
            assert index.get(probe) == model.get(probe)
    assert index.rows_in(0, MAX_SEQ) == sorted(model.items())
    assert index.rows_in(10, 20) == sorted((s, r) for s, r in model.items() if 10 <= s <= 20)
    assert sorted(index.seqs()) == sorted(model.items())


def test_seq_index_of_scattered_seqs_costs_what_it_holds() -> None:
    """A peer's seqs far apart do not make a dense array spanning them."""
    index = SeqIndex()
    for i in range(100):
        index.put(i * (1 << 40), i)
    assert index._sparse is not None and len(index._rows) == 0
    assert index.rows_in(0, MAX_SEQ)[-1] == (99 * (1 << 40), 99)


def test_seq_index_of_a_stream_is_an_array_that_gives_back_what_it_passed() -> None:
    index = SeqIndex()
    for seq in range(10_000):
        index.put(seq, seq)
        if seq >= 100:
            index.remove(seq - 100)  # oldest first, as streams age out
    assert index._sparse is None and (index.low, index.high, len(index)) == (9_900, 9_999, 100)
    assert len(index._rows) < 2_000  # spent slots are given back, not kept forever


class _CountedPasses(dict):
    """A dict that counts the passes over all its keys (min and max make one each)."""

    passes = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        _CountedPasses.passes += 1
        return super().__iter__()


def test_a_sparse_seq_index_drops_its_oldest_in_turn_without_a_pass_over_all() -> None:
    """Two runs of seqs far apart (a cache holding a stream's old and new messages) dropped
    oldest first, as the cache drops them: the next lowest is found a step away, not by a
    pass over every seq held (that made a cache of 100,000 history messages quadratic)."""
    index = SeqIndex()
    runs = [range(0, 1_000), range(1 << 40, (1 << 40) + 1_000)]
    for seq in (s for run in runs for s in run):
        index.put(seq, seq)
    assert index._sparse is not None
    index._sparse = _CountedPasses(index._sparse)
    held = [s for run in runs for s in run]
    for i, seq in enumerate(held[:-1]):
        index.remove(seq)
        assert (index.low, index.high) == (held[i + 1], held[-1])
    assert len(index) == 1
    assert _CountedPasses.passes <= 1  # from 999 to 2**40: one pass, the walk is too short


# -- RetentionStore against a model ----------------------------------------------------------


@dataclass(frozen=True)
class Msg:
    topic: str
    publisher: bytes
    seq: int
    timestamp_ms: int
    id: bytes
    size: int


class Model:
    """The documented rules, kept as plainly as possible: a list in storage order."""

    def __init__(self, config: RetentionConfig) -> None:
        self.config = config
        self.rows: list[tuple[Msg, float]] = []

    @property
    def bytes(self) -> int:
        return sum(m.size for m, _ in self.rows)

    def add(self, msg: Msg, now: float) -> bool:
        place = (msg.topic, msg.publisher, msg.seq)
        for i, (old, _) in enumerate(self.rows):
            if (old.topic, old.publisher, old.seq) == place:
                if old.id == msg.id or not (msg.timestamp_ms, msg.id) < (
                    old.timestamp_ms,
                    old.id,
                ):
                    return False
                del self.rows[i]
                break
        self.rows.append((msg, now))
        self.expire(now)
        return True

    def expire(self, now: float) -> None:
        c = self.config
        while self.rows and (
            len(self.rows) > c.max_messages
            or self.bytes > c.max_bytes
            or self.rows[0][1] + c.max_age <= now
        ):
            del self.rows[0]

    def get(self, topic: str, publisher: bytes, first: int, last: int, now: float) -> list[Msg]:
        self.expire(now)  # as every query of the store does
        held = [m for m, _ in self.rows if (m.topic, m.publisher) == (topic, publisher)]
        return sorted((m for m in held if first <= m.seq <= last), key=lambda m: m.seq)


topics = st.sampled_from(["a", "b"])
publishers = st.sampled_from([b"p", b"q"])
messages = st.builds(
    Msg,
    topic=topics,
    publisher=publishers,
    seq=st.one_of(st.integers(0, 40), st.sampled_from([1 << 33, MAX_SEQ])),
    timestamp_ms=st.integers(0, 5),
    id=st.binary(min_size=1, max_size=2),
    size=st.integers(0, 40),
)
steps = st.lists(st.tuples(messages, st.floats(0, 3, allow_nan=False)), max_size=120)
configs = st.builds(
    RetentionConfig,
    max_messages=st.integers(0, 12),
    max_bytes=st.integers(0, 200),
    max_age=st.floats(0.5, 20),
)


@settings(max_examples=300, deadline=None)
@given(configs, steps)
def test_retention_store_keeps_what_the_rules_say(
    config: RetentionConfig, ops: list[tuple[Msg, float]]
) -> None:
    store: RetentionStore[Msg] = RetentionStore(config)
    model = Model(config)
    now = 0.0
    stored = 0  # bytes of every message the store took
    for msg, dt in ops:
        now += dt
        if msg.size % 5 == 0:  # now and then, as a quiet node process does
            store.shrink()
        took = store.add(msg, now)
        assert took == model.add(msg, now)
        stored += msg.size if took else 0
        assert (len(store), store.bytes) == (len(model.rows), model.bytes)
        assert store.released == stored - store.bytes  # let go: evicted, expired, replaced
        for topic in ("a", "b"):
            for publisher in (b"p", b"q"):
                want = model.get(topic, publisher, 0, MAX_SEQ, now)
                assert store.get(topic, publisher, 0, MAX_SEQ, now) == want
                assert store.get(topic, publisher, 3, 9, now) == model.get(
                    topic, publisher, 3, 9, now
                )
                assert [i for i, _ in store.entries(topic, publisher, 0, MAX_SEQ, now)] == [
                    m.id for m in want
                ]
                span = store.span(topic, publisher, 2, 30, now)
                inside = [m.seq for m in want if 2 <= m.seq <= 30]
                assert span == (Span(inside[0], inside[-1], len(inside)) if inside else None)
                since = [m.seq for m in want if m.timestamp_ms >= 3]
                first = store.first_since(topic, publisher, 3, now)
                stamps = [m.timestamp_ms for m in want]
                if stamps == sorted(stamps):  # as a publisher's stamps rise with its seqs
                    assert first == min(since, default=None)
                else:  # a binary search over stamps out of order: still one stamped since
                    assert first is None or first in since
            offsets = store.offsets(topic, now)
            assert set(offsets) == {m.publisher for m, _ in model.rows if m.topic == topic}
    # Columns hold live rows and a bounded number of spent ones, whatever came in.
    assert len(store._items) <= 2 * len(store) + 4096


def _msg(seq: int, *, size: int = 10, ts: int = 0, mid: bytes | None = None) -> Msg:
    return Msg("t", b"p", seq, ts, mid if mid is not None else seq.to_bytes(8, "big"), size)


def test_retention_store_wraps_around_many_times_and_keeps_its_bounds() -> None:
    """Past the compaction point several times: lookups stay right after the columns move."""
    store: RetentionStore[Msg] = RetentionStore(RetentionConfig(max_messages=1000))
    for seq in range(50_000):
        store.add(_msg(seq), now=0.0)
    assert len(store) == 1000 and store.bytes == 10_000
    assert [m.seq for m in store.get("t", b"p", 0, MAX_SEQ, now=0.0)] == list(range(49_000, 50_000))
    assert len(store._items) < 1000 + 8 * 1000  # spent rows are given back
    assert store.offsets("t", now=0.0) == {b"p": Span(49_000, 49_999, 1000)}


def test_retention_store_evicts_by_each_bound_and_forgets_evicted_ids() -> None:
    by_count: RetentionStore[Msg] = RetentionStore(RetentionConfig(max_messages=2))
    by_bytes: RetentionStore[Msg] = RetentionStore(RetentionConfig(max_bytes=25))
    by_age: RetentionStore[Msg] = RetentionStore(RetentionConfig(max_age=1.0))
    for seq in range(3):
        for store in (by_count, by_bytes, by_age):
            store.add(_msg(seq), now=seq * 0.6)
    for store in (by_count, by_bytes, by_age):
        ids = [i for i, _ in store.entries("t", b"p", 0, 10, now=1.2)]
        assert ids == [(1).to_bytes(8, "big"), (2).to_bytes(8, "big")]
        assert store.evicted == 1


def test_retention_store_replacement_storm_stays_bounded() -> None:
    """A place rewritten with ever-earlier stamps (a hostile writer): each replaces the
    last, and spent rows do not pile up."""
    store: RetentionStore[Msg] = RetentionStore(RetentionConfig())
    for i in range(30_000):
        assert store.add(_msg(0, ts=30_000 - i, mid=i.to_bytes(4, "big")), now=0.0)
    assert len(store) == 1 and store.replaced == 29_999
    assert len(store._items) <= 2 + 4096


def test_retention_store_keeps_a_message_bigger_than_the_byte_bound_out() -> None:
    store: RetentionStore[Msg] = RetentionStore(RetentionConfig(max_bytes=100))
    store.add(_msg(0, size=60), now=0.0)
    store.add(_msg(1, size=101), now=0.0)  # alone past the bound: it goes, and so does 0
    assert len(store) == 0 and store.bytes == 0
    store.add(_msg(2, size=100), now=0.0)
    assert [m.seq for m in store.get("t", b"p", 0, 9, now=0.0)] == [2]


# -- MessageCache against a model ------------------------------------------------------------


def _env(seq: int, size: int, publisher: bytes = b"pub") -> Envelope:
    return Envelope(publisher=publisher, seq=seq, timestamp_ms=1, payload=b"x" * size)


cache_configs = st.builds(
    BroadcastConfig,
    cache_max_messages=st.integers(0, 10),
    cache_max_bytes=st.integers(0, 60),
    cache_ttl=st.floats(0.5, 10),
    seen_max=st.integers(0, 14),
    seen_ttl=st.floats(0.5, 20),
)


@settings(max_examples=300, deadline=None)
@example(  # a row cached after the cache emptied: its ttl comes before seen's
    BroadcastConfig(
        cache_max_messages=2, cache_max_bytes=2, cache_ttl=1.0, seen_max=3, seen_ttl=2.0
    ),
    [(0, 3, 0.0), (0, 1, 0.0), (0, 1, 1.0)],
)
@given(
    cache_configs,
    st.lists(
        st.tuples(st.integers(0, 30), st.integers(1, 12), st.floats(0, 2, allow_nan=False)),
        max_size=80,
    ),
)
def test_message_cache_keeps_what_its_bounds_say(
    config: BroadcastConfig, ops: list[tuple[int, int, float]]
) -> None:
    """Seen: the newest ids within seen_max and seen_ttl. Cached: the newest within the
    cache's bounds and seen's (a cache never keeps what seen forgot). `place`: a place's
    latest cached message, which at_place reads as get does."""
    cache = MessageCache(config)
    rows: list[tuple[bytes, Envelope, float]] = []  # remembered, oldest first
    now = 0.0
    for n, (seq, size, dt) in enumerate(ops):
        now += dt
        mid = n.to_bytes(32, "big")  # a message id's size
        env = _env(seq, size)
        cache.remember(mid, env, hops=n % 5, now=now)
        rows.append((mid, env, now))
        seen = [r for r in rows if r[2] + config.seen_ttl > now][-config.seen_max :]
        seen = seen if config.seen_max else []
        cached: list[tuple[bytes, Envelope, float]] = []
        total = 0
        for r in reversed(seen):
            if (
                len(cached) >= config.cache_max_messages
                or total + r[1].size > config.cache_max_bytes
                or r[2] + config.cache_ttl <= now
            ):
                break
            cached.append(r)
            total += r[1].size
        cached.reverse()
        assert [m for m, _, _ in rows if m in cache.seen] == [m for m, _, _ in seen]
        assert list(cache.cache) == [m for m, _, _ in cached]
        assert (len(cache.seen), len(cache.cache)) == (len(seen), len(cached))
        assert cache.cache_bytes == total
        for m, e, t in cached:
            got = cache.get(m)
            assert got is not None and got.raw is e.raw and got.received_at == t
            assert got.envelope == e
        latest = {r[1].seq: r[0] for r in cached}
        for s in range(31):
            assert cache.place(b"pub", s) == latest.get(s)
            at = cache.at_place(b"pub", s)
            assert (at and at.id) == latest.get(s)
            assert at is None or at == cache.get(at.id)


def test_an_id_taken_again_moves_to_its_new_row_and_its_old_row_is_passed_over() -> None:
    """`remember` of a seen id (not done by broadcast.py) spends its old row: seen and the
    cache hold it once, at the new row, and expiry passes the spent row without counting
    it out twice."""
    cache = MessageCache(BroadcastConfig(seen_max=2))
    m, n, o = b"m" * 32, b"n" * 32, b"o" * 32
    cache.remember(m, _env(1, 1), hops=1, now=0.0)
    cache.remember(n, _env(2, 1), hops=1, now=1.0)
    cache.remember(m, _env(1, 1), hops=3, now=2.0)
    assert list(cache.seen) == [n, m] and list(cache.cache) == [n, m]
    got = cache.get(m)
    assert got is not None and (got.hops, got.received_at) == (3, 2.0)
    cache.remember(o, _env(3, 1), hops=1, now=3.0)  # seen_max 2: n goes, m stays
    assert list(cache.seen) == [m, o] and len(cache.seen) == 2
    assert cache.place(b"pub", 1) == m and not cache.holds_place(b"pub", 2)
    assert cache.places() == 2


def test_a_place_index_drops_a_publisher_with_its_last_place_and_orders_publishers() -> None:
    """`Places`, the one place index (the store's per topic, the cache's): a row a place,
    a publisher's stream gone with its last place, and publishers in byte order when
    `ordered` (the store pages through them), so the store's page never names a
    publisher it holds nothing of."""
    places = Places("t", ordered=True)
    for publisher, seq, row in [(b"b", 0, 10), (b"a", 5, 11), (b"c", 1, 12), (b"a", 6, 13)]:
        places.stream(publisher).put(seq, row)
    assert places.publishers == [b"a", b"b", b"c"] and places.places() == 4
    assert places.row(b"a", 6) == 13 and places.row(b"a", 7) is None
    places.remove(places.streams[b"b"], 0)
    assert places.publishers == [b"a", b"c"] and b"b" not in places.streams
    places.remove(places.streams[b"a"], 5)
    assert places.publishers == [b"a", b"c"] and places.row(b"a", 5) is None
    store: RetentionStore[str] = RetentionStore(RetentionConfig(max_messages=2))
    for seq, publisher in enumerate([b"x", b"y", b"z"]):
        store.add_item(
            publisher.decode(), topic="t", publisher=publisher, seq=seq, timestamp_ms=seq,
            size=1, id=publisher, now=0.0,
        )  # fmt: skip
    assert store.page("t", b"", 10, 0.0) == ([(b"y", Span(1, 1, 1)), (b"z", Span(2, 2, 1))], False)
