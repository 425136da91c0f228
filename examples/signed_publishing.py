"""Signed publishing: no member of a deployment can publish as another.

    python examples/signed_publishing.py

Two nodes sign what they publish (`Node(sign=True)`; `--signed` on the command line,
`spark_connector.register(spark, signed=True)` for a Spark application). Each node's id
ends in a tag derived from its Ed25519 public key, every message carries its publisher's
signature, and a node drops (and counts, `bad_signatures`) a message its publisher did
not sign. A third node, which holds the deployment key but does not sign, cannot join:
every node of a deployment must agree. docs/threat-model.md says what this protects.
"""

from __future__ import annotations

import secrets

import trio

from episub import BootstrapError, Delivery, Node

TOPIC = "payments"


async def main() -> None:
    key = secrets.token_bytes(32)  # the deployment's shared key
    async with Node(key=key, sign=True) as a, Node(key=key, sign=True) as b:
        print(f"a is {a.id.decode()} (its tag is derived from its signing key)")
        await a.join(TOPIC)
        await b.join(TOPIC, bootstrap=[a.address])
        async with b.subscribe(TOPIC) as sub:
            await a.publish(TOPIC, b"pay 10")
            with trio.fail_after(10):
                item = await sub.receive()
            assert isinstance(item, Delivery)
            print(f"b got {item.value!r} from {item.publisher.decode()}, signature checked")
        stats = b.stats()
        print(f"b: signed={stats['signed']}, bad_signatures={stats['bad_signatures']}")

        async with Node(key=key) as unsigned:  # the key, but not signing
            try:
                await unsigned.join(TOPIC, bootstrap=[a.address])
            except BootstrapError as exc:
                print(f"a node that does not sign cannot join: {exc.failures[a.address]}")


if __name__ == "__main__":
    trio.run(main)
