"""The compact tables behind the message store, against reference models.

MessageStore (proto/store.py) keeps every seen id and every held message of the node's
topics in one table of columns, rows in arrival order, and finds a publisher's places
through SeqIndex (proto/seqindex.py). Each is checked here against the simplest model of
its documented rules, under arbitrary sequences of operations, including the ones a peer
chooses (seqs anywhere in 0..2**63-1, rival messages for one place, bursts past a bound)
and the ones ordering makes (pins held past the windows).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import example, given, settings
from hypothesis import strategies as st

from episub.proto.envelope import MAX_SEQ, Envelope
from episub.proto.seqindex import SeqIndex
from episub.proto.store import MessageStore, Places, RetentionConfig, Span
from tests.helpers import mid as message_id

# -- SeqIndex -------------------------------------------------------------------------------

near_seqs = st.integers(0, 300)
any_seqs = st.one_of(near_seqs, st.sampled_from([1 << 20, (1 << 40) + 3, MAX_SEQ]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), any_seqs, st.integers(0, 10**9)), max_size=300))
def test_seq_index_answers_as_a_dict_does(ops: list[tuple[bool, int, int]]) -> None:
    index, model = SeqIndex(), {}
    for put, seq, row in ops:
        if put:
            assert index.put(seq, row) == model.get(seq)  # the row it replaced
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


# -- MessageStore against a model -----------------------------------------------------------


@dataclass(eq=False)
class Row:
    """A message the store took in, as the model sees it."""

    serial: int
    mid: bytes
    topic: str
    env: Envelope
    hops: int
    at: float
    seen: bool = True  # its id is seen
    indexed: bool = True  # added as seen (False: history, held but never seen)
    held: bool = True  # its bytes are held
    in_seen: bool = True  # within the seen window
    in_bytes: bool = True  # within the bytes' window (of held rows: no other is passed)
    pinned: bool = False

    @property
    def place(self) -> tuple[str, bytes, int]:
        return self.topic, self.env.publisher, self.env.seq  # type: ignore[return-value]


class Model:
    """The documented rules, kept as plainly as possible: every row in arrival order, two
    windows that pass the oldest first (bytes: count, bytes, age; ids: count, age; a row
    the ids' window passes leaves the bytes' window too), pinned rows kept past both until
    unpinned and not counted in either once past it, and one message per place."""

    def __init__(self, config: RetentionConfig) -> None:
        self.config = config
        self.rows: list[Row] = []
        self.owner: dict[tuple[str, bytes, int], Row] = {}
        self.evicted = self.replaced = self.released = 0
        self.expired_at = 0.0  # the last `now` the bounds applied at

    def counted(self) -> list[Row]:
        """Rows whose bytes count against the bounds (`len(store)`, `store.bytes`)."""
        return [r for r in self.rows if r.held and r.in_bytes]

    def seen(self) -> set[bytes]:
        return {r.mid for r in self.rows if r.seen and r.indexed}

    def takes_place(self, topic: str, env: Envelope, mid: bytes) -> int:
        held = self.owner.get((topic, env.publisher, env.seq))  # type: ignore[arg-type]
        if held is None or held.mid == mid:
            return -1
        if (env.timestamp_ms, mid) < (held.env.timestamp_ms, held.mid):
            return -2
        return held.serial

    def add(
        self, topic: str, mid: bytes, env: Envelope, hops: int, now: float, seen: bool = True
    ) -> int:
        old = self.owner.get((topic, env.publisher, env.seq))  # type: ignore[arg-type]
        if mid in self.seen() if seen else (old is not None and old.mid == mid):
            return -1
        row = Row(len(self.rows), mid, topic, env, hops, now, indexed=seen)
        self.rows.append(row)
        self.owner[row.place] = row
        if old is not None:
            self.replaced += old.mid != mid
            if not old.pinned:
                self._drop(old)
        self.expire(now)
        return row.serial

    def _drop(self, row: Row) -> None:
        """Its bytes go, and its place if it holds it."""
        row.held = False
        self.released += row.env.size
        if self.owner.get(row.place) is row:
            del self.owner[row.place]

    def _pass_bytes(self, row: Row) -> None:
        row.in_bytes = False
        if row.held and not row.pinned:
            self._drop(row)
            self.evicted += 1

    def expire(self, now: float) -> None:
        c = self.config
        self.expired_at = now
        while window := self.counted():
            if not (
                len(window) > c.max_messages
                or sum(r.env.size for r in window) > c.max_bytes
                or window[0].at + c.max_age <= now
            ):
                break
            self._pass_bytes(window[0])
        while window := [r for r in self.rows if r.in_seen]:
            if not (len(window) > c.seen_max or window[0].at + c.seen_ttl <= now):
                break
            row = window[0]
            row.in_seen = False
            if row.in_bytes:
                self._pass_bytes(row)
            if not row.pinned:
                row.seen = False

    def pin(self, row: Row) -> bool:
        row.pinned = row.pinned or row.held
        return row.held

    def unpin(self, row: Row) -> None:
        row.pinned = False
        if not row.in_bytes:
            if row.held:
                self._drop(row)
                self.evicted += 1
            row.seen = row.seen and row.in_seen
        elif row.held and self.owner.get(row.place) is not row:
            self._drop(row)


TOPICS = ("a", "b")
PUBLISHERS = (b"p", b"q")
FAR = (1 << 33, MAX_SEQ)


@dataclass(frozen=True)
class Add:
    """A first copy of a message, after `dt` seconds (`history`: fetched, held not seen)."""

    topic: str
    publisher: bytes
    seq: int
    stamp: int
    size: int
    fill: bytes
    dt: float
    history: bool = False


@dataclass(frozen=True)
class Rival:
    """Another message for the place of a message taken in before (a sink row written
    again), earlier or later stamped: it takes the place only by the winner rule."""

    pick: int
    stamp: int
    size: int
    fill: bytes
    dt: float


@dataclass(frozen=True)
class Pin:
    """Pin a row (`on`: one of those taken in, now and then one gone), or unpin a pinned one."""

    pick: int
    on: bool = True


@dataclass(frozen=True)
class Expire:
    dt: float


@dataclass(frozen=True)
class Shrink:
    pass


stamps = st.integers(0, 3)
sizes = st.integers(0, 12)  # payload bytes
fills = st.sampled_from([b"x", b"y"])
pauses = st.sampled_from([0.0, 0.0, 0.0, 0.25, 0.5, 1.5])
picks = st.integers(0, 1000)
adds = st.builds(
    Add,
    st.sampled_from(TOPICS),
    st.sampled_from(PUBLISHERS),
    st.one_of(st.integers(0, 4), st.sampled_from(FAR)),
    stamps,
    sizes,
    fills,
    pauses,
    st.sampled_from([False, False, True]),
)
operations = st.lists(
    st.one_of(
        adds,
        adds,
        st.builds(Rival, picks, stamps, sizes, fills, pauses),
        st.builds(Pin, picks, st.booleans()),
        st.builds(Expire, st.sampled_from([0.0, 0.25, 1.0, 3.0])),
        st.just(Shrink()),
    ),
    min_size=4,
    max_size=60,
)
small_configs = st.builds(
    RetentionConfig,
    max_messages=st.integers(1, 6),
    max_bytes=st.integers(8, 40),
    max_age=st.sampled_from([0.5, 1.0, 2.5]),
    seen_max=st.integers(1, 8),
    seen_ttl=st.sampled_from([0.75, 1.5, 4.0]),
)


def check(store: MessageStore, model: Model, now: float, reads: bool) -> None:
    """The store against the model. `reads`: also the history reads, which apply the
    bounds at `now` (as an explicit `expire` does): left out after the other operations,
    so that what an add alone expires is checked."""
    c = model.config
    counted = model.counted()
    assert len(store) == len(counted)
    assert store.bytes == sum(r.env.size for r in counted)
    seen = model.seen()
    assert len(store.seen) == len(seen)
    held = {r.mid: r for r in model.rows if r.held and r.indexed}  # found by id
    for row in model.rows:
        assert (row.mid in store.seen) == (row.mid in seen), row
        got = store.cached(row.mid)
        want = held.get(row.mid)
        if want is None:
            assert got is None and store.find(row.mid) == -1
        else:
            assert got is not None and got.raw == want.env.raw
            assert (got.hops, got.received_at, got.size) == (want.hops, want.at, want.env.size)
            assert store.place_of(row.mid) == (want.env.publisher, want.env.seq)
    assert (store.evicted, store.replaced, store.released) == (
        model.evicted,
        model.replaced,
        model.released,
    )
    # No bound is exceeded but by pinned rows.
    pinned = sum(r.pinned for r in model.rows)
    assert len(store) <= c.max_messages and store.bytes <= c.max_bytes
    assert sum(r.held for r in model.rows) <= c.max_messages + pinned
    assert len(store.seen) <= c.seen_max + pinned
    then = model.expired_at  # a second copy's add changes nothing, nor expires
    assert all(r.pinned or r.at + c.max_age > then for r in model.rows if r.held)
    assert all(r.pinned or r.at + c.seen_ttl > then for r in model.rows if r.seen)
    # Places, as broadcast reads them, and as history shows them.
    for topic in TOPICS:
        places = store.places(topic)
        at_place = store.lookup(places)
        owned = {(p, s): r for (t, p, s), r in model.owner.items() if t == topic}
        for publisher in PUBLISHERS:
            for seq in (*range(5), *FAR):
                want = owned.get((publisher, seq))
                assert store.place(places, publisher, seq) == (want and want.mid)
                got = at_place(publisher, seq)
                assert (got and got.id) == (want and want.mid)
        if not reads:
            continue
        model.expire(now)  # as the reads do
        owned = {(p, s): r for (t, p, s), r in model.owner.items() if t == topic}
        spans = {}
        for publisher in PUBLISHERS:
            held_seqs = sorted(s for p, s in owned if p == publisher)
            if held_seqs:
                spans[publisher] = Span(held_seqs[0], held_seqs[-1], len(held_seqs))
            raws = [owned[publisher, s].env.raw for s in held_seqs]
            assert store.get(topic, publisher, 0, MAX_SEQ, now) == raws
        assert store.offsets(topic, now) == spans


@settings(max_examples=400, deadline=None)
@example(  # two pinned rows past the seen window: the next message is still seen and held
    RetentionConfig(max_messages=5, max_bytes=40, max_age=2.5, seen_max=2, seen_ttl=4.0),
    [Add("a", b"p", 0, 0, 1, b"x", 0.0), Add("a", b"p", 1, 0, 1, b"x", 0.0), Pin(2), Pin(5),
     Add("a", b"p", 2, 0, 1, b"x", 0.0)],
)  # fmt: skip
@given(small_configs, operations)
def test_message_store_keeps_what_its_rules_say(config: RetentionConfig, ops: list[object]) -> None:
    store, model = MessageStore(config), Model(config)
    now = 0.0
    for op in ops:
        if isinstance(op, Add | Rival):
            history = isinstance(op, Add) and op.history
            if isinstance(op, Add):
                topic, publisher, seq = op.topic, op.publisher, op.seq
            elif model.rows:
                topic, publisher, seq = model.rows[op.pick % len(model.rows)].place
            else:
                continue
            now += op.dt
            env = Envelope(
                publisher=publisher, seq=seq, timestamp_ms=op.stamp, payload=op.fill * op.size
            )
            mid = message_id(env, topic)
            places = store.places(topic)
            keeper = store.takes_place(places, publisher, seq, op.stamp, mid)
            assert keeper == model.takes_place(topic, env, mid)
            if keeper < 0:  # -1: a free place (or the same message), -2: it wins the place
                hops = len(model.rows) % 7
                assert store.add(places, mid, env, hops, now, seen=not history) == model.add(
                    topic, mid, env, hops, now, seen=not history
                )
        elif isinstance(op, Pin) and op.on and model.rows:
            live = [r for r in model.rows if r.held]
            pool = live if live and op.pick % 4 else model.rows  # now and then a gone one
            row = pool[op.pick % len(pool)]
            assert store.pin(row.serial) == model.pin(row)
        elif isinstance(op, Pin) and not op.on:
            pinned = [r for r in model.rows if r.pinned]
            if pinned:
                row = pinned[op.pick % len(pinned)]
                store.unpin(row.serial)
                model.unpin(row)
        elif isinstance(op, Expire):
            now += op.dt
            store.expire(now)
            model.expire(now)
        elif isinstance(op, Shrink):
            store.shrink()
        check(store, model, now, reads=isinstance(op, Expire))
    for row in [r for r in model.rows if r.pinned]:  # ordering lets every one go
        store.unpin(row.serial)
        model.unpin(row)
        check(store, model, now, reads=False)
    check(store, model, now, reads=True)


# -- MessageStore: compaction, bounds and pins ------------------------------------------------


def _env(seq: int, size: int = 10, *, publisher: bytes = b"p", ts: int = 0) -> Envelope:
    return Envelope(publisher=publisher, seq=seq, timestamp_ms=ts, payload=b"x" * size)


def _id(n: int) -> bytes:
    return n.to_bytes(32, "big")


def _add(store: MessageStore, seq: int, now: float = 0.0, **fields: object) -> int:
    """Add a message with the id `seq` (no rival checks: each seq once)."""
    return store.add(store.places("t"), _id(seq), _env(seq, **fields), 1, now)  # type: ignore[arg-type]


def test_the_store_wraps_around_many_times_and_keeps_its_bounds() -> None:
    """Past the compaction point several times: lookups stay right after the columns move,
    and the columns give back what the windows passed."""
    store = MessageStore(RetentionConfig(max_messages=1000, seen_max=2000))
    for seq in range(50_000):
        _add(store, seq)
    assert len(store) == 1000 and store.bytes == 10_000 and len(store.seen) == 2000
    assert store.seqs("t", b"p", 0, MAX_SEQ, now=0.0) == list(range(49_000, 50_000))
    assert store.offsets("t", now=0.0) == {b"p": Span(49_000, 49_999, 1000)}
    assert len(store._raws) < 1000 + 8 * 1000  # spent rows are given back
    assert len(store._at) < 2000 + 8 * 2000
    assert _id(47_999) not in store.seen and _id(48_000) in store.seen
    assert store.cached(_id(48_999)) is None and store.cached(_id(49_000)) is not None
    assert store.evicted == 49_000


def test_the_store_evicts_by_each_bound_and_forgets_ids_by_the_seen_bounds() -> None:
    stores = {
        "count": MessageStore(RetentionConfig(max_messages=2)),
        "bytes": MessageStore(RetentionConfig(max_bytes=25)),
        "age": MessageStore(RetentionConfig(max_age=1.0)),
        "seen count": MessageStore(RetentionConfig(seen_max=2)),
        "seen age": MessageStore(RetentionConfig(seen_ttl=1.0)),
    }
    for seq in range(3):
        for store in stores.values():
            _add(store, seq, now=seq * 0.6)
    for name, store in stores.items():
        ids = [i for i, _ in store.entries("t", b"p", 0, 10, now=1.2)]
        assert ids == [_id(1), _id(2)], name
        assert store.evicted == 1 and store.released == 10, name
        assert (_id(0) in store.seen) == (not name.startswith("seen")), name


def test_a_replacement_storm_stays_bounded() -> None:
    """A place rewritten with ever-earlier stamps (a hostile writer): each replaces the
    last, and spent rows do not pile up."""
    store = MessageStore(RetentionConfig(seen_max=100))
    places = store.places("t")
    for i in range(30_000):
        env = _env(0, ts=30_000 - i)
        assert store.takes_place(places, b"p", 0, env.timestamp_ms, _id(i)) == (
            -1 if i == 0 else -2
        )
        assert store.add(places, _id(i), env, 1, 0.0) == i
    assert len(store) == 1 and store.replaced == 29_999 and store.bytes == 10
    assert len(store._raws) <= 100 + 4096 and len(store._at) <= 100 + 4096
    assert store.place(places, b"p", 0) == _id(29_999)


def test_a_message_bigger_than_the_byte_bound_is_not_kept() -> None:
    store = MessageStore(RetentionConfig(max_bytes=100))
    _add(store, 0, size=60)
    _add(store, 1, size=101)  # alone past the bound: it goes, and so does 0
    assert len(store) == 0 and store.bytes == 0 and store.evicted == 2
    assert _id(1) in store.seen  # its id is seen: a second copy is not taken again
    assert store.add(store.places("t"), _id(1), _env(1, size=101), 1, 0.0) == -1
    _add(store, 2, size=100)
    assert store.seqs("t", b"p", 0, 9, now=0.0) == [2]


def test_a_pinned_message_outlives_both_windows_until_unpinned() -> None:
    store = MessageStore(RetentionConfig(max_messages=2, seen_max=3, max_age=10.0))
    first = _add(store, 0)
    assert store.pin(first)
    for seq in range(1, 6):
        _add(store, seq)
    # Past both windows and not counted in them, but held, seen and at its place.
    assert len(store) == 2 and store.bytes == 20 and store.evicted == 3
    assert _id(0) in store.seen and store.cached(_id(0)) is not None
    assert store.seqs("t", b"p", 0, 9, now=0.0) == [0, 4, 5]
    assert store.message(first)[0] == _id(0) and store.message(first)[1] == _env(0)
    store.unpin(first)
    assert _id(0) not in store.seen and store.cached(_id(0)) is None
    assert store.seqs("t", b"p", 0, 9, now=0.0) == [4, 5] and store.evicted == 4
    assert not store.pin(first)  # its bytes are gone: nothing to pin


def test_pinned_ids_past_the_seen_window_do_not_shrink_it() -> None:
    """Pinned rows are kept past the windows, not counted in them: as pinned bytes past
    the bytes' window leave `len` and `bytes`, pinned ids past the seen window leave its
    count. Else a node whose pins reach seen_max forgets each new message as it comes:
    not held, its place left empty, and a second copy taken (delivered) again."""
    store = MessageStore(RetentionConfig(seen_max=2))
    assert store.pin(_add(store, 0)) and store.pin(_add(store, 1))
    assert _add(store, 2) == 2
    assert _id(2) in store.seen and store.cached(_id(2)) is not None
    assert store.add(store.places("t"), _id(2), _env(2), 1, 0.0) == -1  # a second copy
    assert len(store) == 2 and store.seqs("t", b"p", 0, 9, now=0.0) == [0, 1, 2]


def test_a_pinned_message_within_the_windows_stays_when_unpinned() -> None:
    store = MessageStore(RetentionConfig(max_messages=5))
    row = _add(store, 0)
    assert store.pin(row)
    store.unpin(row)
    assert store.cached(_id(0)) is not None and len(store) == 1 and store.evicted == 0


def test_a_pinned_message_another_took_the_place_of_goes_when_unpinned() -> None:
    store = MessageStore(RetentionConfig())
    places = store.places("t")
    held = store.add(places, _id(2), _env(0, ts=5), 1, 0.0)
    assert store.pin(held)
    assert store.takes_place(places, b"p", 0, 1, _id(3)) == -2
    store.add(places, _id(3), _env(0, size=4, ts=1), 1, 0.0)
    assert store.replaced == 1 and store.place(places, b"p", 0) == _id(3)
    assert store.cached(_id(2)) is not None and len(store) == 2 and store.bytes == 14
    store.unpin(held)
    assert store.cached(_id(2)) is None and _id(2) in store.seen
    assert len(store) == 1 and store.bytes == 4 and store.released == 10
    assert store.place(places, b"p", 0) == _id(3)


def test_compaction_never_passes_a_pinned_row() -> None:
    store = MessageStore(RetentionConfig(max_messages=5, seen_max=6))
    first = _add(store, 0)
    assert store.pin(first)
    for seq in range(1, 10_000):
        _add(store, seq)
    store.shrink()
    assert store._base <= first and store.cached(_id(0)) is not None
    store.unpin(first)
    store.shrink()
    assert store.cached(_id(0)) is None and _id(0) not in store.seen
    assert len(store._raws) == 5 and len(store._at) <= 6  # everything before goes
    assert store.seqs("t", b"p", 0, MAX_SEQ, now=0.0) == list(range(9_995, 10_000))


def test_shrink_gives_back_the_room_a_large_release_left() -> None:
    store = MessageStore(RetentionConfig(max_age=1.0, seen_ttl=1.0))
    for seq in range(3000):  # fewer than the rows that compact on their own
        _add(store, seq)
    store.expire(now=1.0)
    assert len(store) == 0 and len(store.seen) == 0 and len(store._raws) == 3000
    store.shrink()
    assert len(store._raws) == 0 and len(store._at) == 0 and len(store._seqs) == 0
    _add(store, 5000, now=2.0)  # numbering goes on after the rows given back
    assert store.find(_id(5000)) == 3000 and store.seqs("t", b"p", 0, MAX_SEQ, 2.0) == [5000]


def test_a_place_index_drops_a_publisher_with_its_last_place_and_orders_publishers() -> None:
    """`Places`, the one place index (one a topic): a row a place, a publisher's stream
    gone with its last place, and publishers in byte order (the store pages through them),
    so the store's page never names a publisher it holds nothing of."""
    places = Places("t")
    for publisher, seq, row in [(b"b", 0, 10), (b"a", 5, 11), (b"c", 1, 12), (b"a", 6, 13)]:
        places.stream(publisher).put(seq, row)
    assert places.publishers == [b"a", b"b", b"c"] and places.places() == 4 and len(places) == 3
    assert places.row(b"a", 6) == 13 and places.row(b"a", 7) is None
    places.remove(places.streams[b"b"], 0)
    assert places.publishers == [b"a", b"c"] and b"b" not in places.streams
    places.remove(places.streams[b"a"], 5)
    assert places.publishers == [b"a", b"c"] and places.row(b"a", 5) is None
    store = MessageStore(RetentionConfig(max_messages=2))
    for seq, publisher in enumerate([b"x", b"y", b"z"]):
        store.add(store.places("t"), _id(seq), _env(seq, 1, publisher=publisher), 1, 0.0)
    assert store.page("t", b"", 10, 0.0) == ([(b"y", Span(1, 1, 1)), (b"z", Span(2, 2, 1))], False)
    assert store.places("t").publishers == [b"y", b"z"]
