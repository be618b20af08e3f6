"""cfnet edge agent: measures a node's TCP links in the kernel (eBPF) and its host load,
and reports them over MQTT."""

from edge_agent.lightimport import dataclasses_imports

__version__ = "0.1.0"

# Before the package's first dataclass: dataclasses without inspect (~0.7 MiB of the agent's
# resident memory; see edge_agent.lightimport).
dataclasses_imports()
