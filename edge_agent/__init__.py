"""cfnet edge agent: measures a node's TCP links in the kernel (eBPF) and its host load,
and reports them over MQTT."""

__version__ = "0.1.0"
