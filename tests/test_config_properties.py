"""Property test of the configuration's apply and version logic (episub.config.state): a few
replicas wired in memory through a network that loses, reorders, duplicates and partitions
their messages, driven through arbitrary sequences of writes, deliveries and snapshot
exchanges, then healed and repaired.

Checked after every step, for every replica:
- its version never claims values it does not hold: its entries are exactly those of the
  writes stamped 1..version (so a replica that missed a write is below it, whatever it
  received after);
- two replicas at the same version hold the same entries.
Checked after healing (messages in flight delivered or lost, then the replica's repair
rule: every replica's sync request reaches the others, and each replica that is behind
asks the others, one after another, for their snapshot, round after round):
- every replica holds the last write's version and exactly its values.

Writes come from two writers taking turns (a writer writes only while it holds every write
made): with two writers racing on one version, "held" means "holds one of them" (state.py).
The suite's run is derandomized; `EPISUB_PROPERTY_EXAMPLES=N` searches N random examples.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from episub.config.codec import entry_for
from episub.config.state import ConfigState, Entry

SEARCH = os.environ.get("EPISUB_PROPERTY_EXAMPLES")
EXAMPLES = int(SEARCH or "300")
REPLICAS = 4
WRITERS = (0, 1)  # replica 0 is the driver: asked last
KEYS = ("a", "b", "c")
NODE_IDS = [b"node-%d" % i for i in range(REPLICAS)]


@dataclass(frozen=True)
class Message:
    to: int
    kind: str  # "update" or "snapshot"
    version: int
    entries: dict[str, Entry]


@dataclass
class World:
    replicas: list[ConfigState] = field(
        default_factory=lambda: [ConfigState() for _ in range(REPLICAS)]
    )
    writes: list[dict[str, Entry]] = field(default_factory=list)  # version v at [v - 1]
    in_flight: list[Message] = field(default_factory=list)
    cut: set[int] = field(default_factory=set)  # replicas cut off from every other

    def linked(self, a: int, b: int) -> bool:
        return a == b or (a not in self.cut and b not in self.cut)

    def send(self, sender: int, message: Message) -> None:
        if self.linked(sender, message.to):  # across a partition a message is lost
            self.in_flight.append(message)

    def write(self, writer: int, changes: dict[str, object]) -> None:
        state = self.replicas[writer]
        if state.version != len(self.writes) or state.behind:
            return  # not holding every write made: another writer's turn (no races)
        version, me = state.stamp_for_write(NODE_IDS[writer])
        entries = {
            k: Entry(version, me, "deleted", b"") if v is None else entry_for(v, version, me)
            for k, v in changes.items()
        }
        self.writes.append(entries)
        state.apply_update(version, entries)
        for other in range(REPLICAS):
            if other != writer:
                self.send(writer, Message(other, "update", version, entries))

    def deliver(self, message: Message) -> None:
        state = self.replicas[message.to]
        if message.kind == "update":
            state.apply_update(message.version, message.entries)
        else:
            state.merge_snapshot(message.version, message.entries)

    def sync_request(self, asker: int, responder: int) -> None:
        """`asker` publishes a sync request (every replica it reaches notes its version);
        `responder` answers with its snapshot, in full when the asker is below it, published
        on the topic: every replica it reaches takes it in, not only the asker."""
        asking = self.replicas[asker].version
        for other in range(REPLICAS):
            if other != asker and self.linked(asker, other):
                self.replicas[other].note_version(asking)
        if self.linked(asker, responder):
            held = self.replicas[responder]
            entries = held.entries() if asking < held.version else {}
            for other in range(REPLICAS):
                if other != responder:
                    self.send(responder, Message(other, "snapshot", held.version, entries))

    def expected(self, version: int) -> dict[str, Entry]:
        """The entries of writes 1..version: what a replica at `version` must hold."""
        out: dict[str, Entry] = {}
        for entries in self.writes[:version]:
            out.update(entries)
        return out

    def check(self) -> None:
        for i, state in enumerate(self.replicas):
            assert state.version <= state.top
            expected = self.expected(state.version)
            assert state.entries() == expected, f"replica {i} lacks writes under its version"
        by_version: dict[int, dict[str, Entry]] = {}
        for state in self.replicas:
            held = by_version.setdefault(state.version, state.entries())
            assert held == state.entries(), "two replicas at one version hold different values"


changes = st.dictionaries(st.sampled_from(KEYS), st.none() | st.integers(0, 9), min_size=1)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.sampled_from(WRITERS), changes),
        st.tuples(st.just("deliver"), st.integers(0, 50)),
        st.tuples(st.just("drop"), st.integers(0, 50)),
        st.tuples(st.just("duplicate"), st.integers(0, 50)),
        st.tuples(st.just("sync"), st.integers(0, REPLICAS - 1), st.integers(0, REPLICAS - 1)),
        st.tuples(st.just("cut"), st.integers(0, REPLICAS - 1)),
        st.tuples(st.just("heal")),
    ),
    max_size=60,
)


@settings(max_examples=EXAMPLES, derandomize=SEARCH is None)
@given(steps, st.lists(st.booleans(), max_size=60))
def test_equal_versions_hold_equal_values_none_claims_what_it_lacks_and_all_converge(
    script: list[tuple], losses: list[bool]
) -> None:
    world = World()
    for step in script:
        match step:
            case ("write", writer, values):
                world.write(writer, values)
            case ("deliver", i) if world.in_flight:
                world.deliver(world.in_flight.pop(i % len(world.in_flight)))
            case ("drop", i) if world.in_flight:
                world.in_flight.pop(i % len(world.in_flight))
            case ("duplicate", i) if world.in_flight:
                world.in_flight.append(world.in_flight[i % len(world.in_flight)])
            case ("sync", asker, responder) if asker != responder:
                world.sync_request(asker, responder)
            case ("cut", replica):
                world.cut.add(replica)
            case ("heal",):
                world.cut.clear()
        world.check()

    # Heal: what is in flight arrives or is lost (in order), then the repair rule runs.
    world.cut.clear()
    for i, message in enumerate(world.in_flight):
        if not (losses[i] if i < len(losses) else False):
            world.deliver(message)
            world.check()
    world.in_flight.clear()
    for asker in range(REPLICAS):  # each relinks and asks a neighbour: everyone notes it
        world.sync_request(asker, (asker + 1) % REPLICAS)
    for _ in range(REPLICAS):  # rounds: whoever is behind asks each node, the driver last
        for asker, state in enumerate(world.replicas):
            for responder in [*range(REPLICAS - 1, 0, -1), 0]:
                if not state.behind:
                    break
                if responder != asker:
                    world.sync_request(asker, responder)
                    while world.in_flight:
                        world.deliver(world.in_flight.pop(0))
                    world.check()
    top = len(world.writes)
    assert [s.version for s in world.replicas] == [top] * REPLICAS
    assert all(s.entries() == world.expected(top) for s in world.replicas)
    assert not any(s.behind for s in world.replicas)
