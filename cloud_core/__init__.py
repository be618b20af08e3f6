"""cfnet cloud core: MQTT ingest, the live model of nodes and links, placement, actuation
and the console service."""

__version__ = "0.1.0"
