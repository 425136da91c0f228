"""Live configuration replicated over a topic: every node converges to one snapshot.

- `state`: one replica's key -> entry map and its merge rule (plain data, no I/O).
- `codec`: the update / sync / snapshot messages replicas exchange on the topic.
- `replica`: a replica kept by a running `Node` (trio): applies what arrives, asks a
  neighbour for its snapshot when it joins late or notices a gap, answers such requests.
"""

from episub.config.codec import ConfigCodecError
from episub.config.replica import DELETE, ConfigReplica, config_topic
from episub.config.state import ConfigLimitError, ConfigState, Entry

__all__ = [
    "DELETE",
    "ConfigCodecError",
    "ConfigLimitError",
    "ConfigReplica",
    "ConfigState",
    "Entry",
    "config_topic",
]
