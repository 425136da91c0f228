"""Publishing a burst: many records in one call (Node.publish_many).

    .venv/bin/python examples/publish_many.py

Two nodes in one process. Node a publishes 1,000 records in one call: bare bytes, or
`episub.Record`s with a key and headers. A Record is checked when it is made (a wrong type
raises there, naming it) and trusted after; the batch goes into a's core together and out
to b in a few writes, so it costs a fraction of 1,000 `publish` calls. The receipts come
back in the records' order; b's subscription sees every record once, in order.
"""

from __future__ import annotations

import trio

from episub import Delivery, Node, Record

KEY = bytes(32)  # the deployment's shared 32-byte key; use a secret one
COUNT = 1000


async def main() -> None:
    async with Node(key=KEY) as a, Node(key=KEY) as b:
        await a.join("orders")
        await b.join("orders", bootstrap=[a.address])
        async with b.subscribe("orders", buffer=COUNT) as sub:
            records = [
                Record(b"order %d" % i, key=b"customer-%d" % (i % 7), headers={"kind": b"new"})
                for i in range(COUNT)
            ]
            receipts = await a.publish_many("orders", records)
            print(f"published {len(receipts)} records: seqs {receipts[0].seq}..{receipts[-1].seq}")
            got = []
            while len(got) < COUNT:
                got += [item for item in await sub.receive_batch() if type(item) is Delivery]
        in_order = [m.seq for m in got] == [r.seq for r in receipts]
        print(f"b received {len(got)} records, in order: {in_order}; last {got[-1].value!r}")
        try:
            Record("not bytes")  # type: ignore[arg-type]
        except TypeError as exc:
            print(f"refused where it was made: {exc}")


if __name__ == "__main__":
    trio.run(main)
