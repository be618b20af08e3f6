"""The NATS bus's shared parts: the ingest stream's names and subjects, the mapping between
MQTT topics and NATS subjects, the shared-ingest settings and their error.

On ``--bus nats`` a core's ``$share/<group>/<filter>`` subscriptions are served from
JetStream (:mod:`cloud_core.bus_nats_ingest`), and the edge sites' sources of the ingest
stream are linked and re-armed by :mod:`cloud_core.bus_nats_sites`; both build on these.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cloud_core.errors import CoreError
from edge_agent.wire import STATUS_WILDCARD, TELEMETRY_WILDCARD

STREAM = "CFNET_INGEST"
EDGE_STREAM = "CFNET_EDGE"  # an edge site's stream, on its leaf node (tools/nats/leaf.py)
EDGE_MAX_BYTES = 256 << 20  # what a site keeps while its uplink is down, at most
EDGE_MAX_AGE_S = 7 * 86400.0
SHARE_PREFIX = "$share/"


class NatsIngestError(CoreError):
    """The shared-ingest connection or its JetStream objects could not be set up."""


def topic_to_subject(topic: str) -> str:
    """An MQTT topic filter as the subject NATS's MQTT listener maps it to."""
    out = []
    for lv in topic.split("/"):
        out.append("*" if lv == "+" else ">" if lv == "#" else lv.replace(".", "//"))
    return ".".join(out)


def subject_to_topic(subject: str) -> str:
    """Back from a concrete subject: ``//`` is a dot inside a level."""
    return subject.replace("//", "\0").replace(".", "/").replace("\0", ".")


STREAM_SUBJECTS = (topic_to_subject(TELEMETRY_WILDCARD), topic_to_subject(STATUS_WILDCARD))


@dataclass(frozen=True, slots=True)
class NatsIngestSettings:
    urls: tuple[str, ...]
    username: str
    password: str | None
    ca_file: Path | None = None
    replicas: int = 3  # stream replicas: the cluster's size, at most
    ack_wait_s: float = 5.0  # a dead replica's fetched messages go to another after this
    max_age_s: float = 900.0  # reports older than this are dropped from the stream
    max_bytes: int = 1 << 30
    max_ack_pending: int = 20000
    resume_sources: bool = True  # re-arm edge sites' stalled sources (SourceResumer)
    resume_poll_s: float = 1.0
    resume_stale_s: float = 3.0  # a healthy source heartbeats every second
    resume_min_interval_s: float = 10.0  # per site
    # Edge sites this core links (``--nats-sites``; :func:`parse_sites`): each site's
    # ``CFNET_EDGE`` on its leaf, and ``CFNET_INGEST``'s source of it (:class:`SourceResumer`).
    sites: tuple[str, ...] = ()
    edge_max_bytes: int = EDGE_MAX_BYTES
    edge_max_age_s: float = EDGE_MAX_AGE_S


def consumer_name(group: str, topic_filter: str) -> str:
    leaf = topic_filter.rstrip("/").rsplit("/", 1)[-1]
    name = f"{group}-{leaf}"
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:64]


def parse_share(topic: str) -> tuple[str, str] | None:
    """``$share/<group>/<filter>`` -> (group, filter); None for an ordinary topic."""
    if not topic.startswith(SHARE_PREFIX):
        return None
    group, sep, filt = topic[len(SHARE_PREFIX):].partition("/")
    if not sep or not group or not filt:
        raise NatsIngestError(f"bad shared subscription {topic!r}")
    return group, filt

