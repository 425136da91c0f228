"""The trio runtime: carries the sans-IO core's outputs over TCP.

- `peer_id`: ids that carry their address (b"host:port/tag").
- `handshake`: both ends prove the deployment key before any frame is processed (and,
  with signed publishing, the signing key their id is bound to).
- `admission`: fair slots for inbound handshakes in progress; `log_limit`: what strangers
  can cause is logged at most once a minute per kind.
- `framing`: length-prefixed frames on a stream; piggybacking of queued messages.
- `connection`: a peer's bounded send queue; a connection's reader and writer tasks.
- `network`: the listener, the dialer, every peer's queue and connections, and the rules
  for when a closed connection is a lost peer. Knows nothing of the protocol.
- `runtime`: one NodeState pumped: inputs in with `now`, outputs carried out, timers.
- `link_delay`: emulated link delays for tests and demos.

The application-facing API is `episub.Node` (episub/node/node.py), built on `runtime.Runtime`.
"""
