"""Which buffered reports to (re)send, given the core's end-to-end acknowledgements.

A report leaves the agent's buffer only when the core says it ingested it
(``cfnet/v1/nodes/{node}/ack``). Until then it is *in flight* once sent. This
module is the policy, pure and clock-driven so the agent (over its SQLite
buffer) and the fleet simulator (over memory) run the same one:

- at most ``window`` reports are in flight; the oldest unsent go first, so
  delivery stays oldest-first and a core that is away costs the broker at most
  ``window`` reports per agent, not the agent's whole backlog;
- a report in flight longer than the resend delay is sent again. While the core
  is acknowledging (an ack within ``resend_s``) every such report is resent at
  once: it was lost (a core killed with it in its pipe, a broker queue that
  overflowed). While the core is silent only the oldest one is resent, as a
  probe, and the delay doubles up to ``max_resend_s``: a core that is down is
  not flooded, and the first ack after it returns restarts the flow (reports
  sent during the silence get ``resend_s`` from then: the broker may still
  deliver them from the core's queue);
- a report the core keeps not acknowledging while it acknowledges others (it
  refuses it) is given up after ``max_tries`` sends, so one bad report cannot
  hold a slot forever; the caller counts it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(slots=True)
class _Flight:
    sent_at: float
    tries: int


@dataclass(slots=True)
class AckWindow(Generic[K]):
    window: int = 100
    resend_s: float = 10.0
    max_resend_s: float = 60.0
    max_tries: int = 8
    inflight: dict[K, _Flight] = field(default_factory=dict)
    last_ack: float = float("-inf")
    _alive_since: float = float("-inf")
    _delay: float = 0.0
    _last_probe: float = float("-inf")

    def __post_init__(self) -> None:
        if self.window < 1 or self.resend_s <= 0 or self.max_resend_s < self.resend_s:
            raise ValueError("window >= 1, 0 < resend_s <= max_resend_s")
        self._delay = self.resend_s

    def core_alive(self, now: float) -> bool:
        return now - self.last_ack <= self.resend_s

    def acked(self, keys: Iterable[K], now: float) -> None:
        """The core acknowledged ``keys`` (any of them may be unknown: already gone)."""
        for k in keys:
            self.inflight.pop(k, None)
        if not self.core_alive(now):
            # Back after a silence: what we sent meanwhile may still be queued
            # for it at the broker; give that resend_s to arrive before resending.
            self._alive_since = now
        self.last_ack = now
        self._delay = self.resend_s

    def forget(self, keys: Iterable[K]) -> None:
        """These left the buffer otherwise (thinned, expired, given up)."""
        for k in keys:
            self.inflight.pop(k, None)

    def due(self, head: list[K], now: float) -> tuple[list[K], list[K]]:
        """Given the buffer's oldest ``window`` keys in order, return (send now, give up).

        The caller publishes the first list, in order, then calls :meth:`sent`.
        """
        present = set(head)
        for k in [k for k in self.inflight if k not in present]:
            del self.inflight[k]  # thinned or expired under us
        send: list[K] = []
        give_up: list[K] = []
        alive = self.core_alive(now)
        if alive:
            stale = [k for k in head if k in self.inflight and now - max(
                self.inflight[k].sent_at, self._alive_since) >= self.resend_s]
        else:
            stale = [k for k in head if k in self.inflight
                     and now - self.inflight[k].sent_at >= self._delay]
        if stale:
            if alive:
                for k in stale:
                    (give_up if self.inflight[k].tries >= self.max_tries else send).append(k)
            elif now - self._last_probe >= self._delay:
                send.append(stale[0])
                self._last_probe = now
                self._delay = min(self._delay * 2, self.max_resend_s)
        room = self.window - len(self.inflight)
        for k in head:
            if room <= 0:
                break
            if k not in self.inflight:
                send.append(k)
                room -= 1
        for k in give_up:
            del self.inflight[k]
        return send, give_up

    def sent(self, keys: Iterable[K], now: float) -> None:
        # Only sends while the core acknowledges count as tries: probes into a
        # core that is down say nothing about the report itself.
        alive = int(self.core_alive(now))
        for k in keys:
            f = self.inflight.get(k)
            if f is None:
                self.inflight[k] = _Flight(now, alive)
            else:
                f.sent_at, f.tries = now, f.tries + alive
