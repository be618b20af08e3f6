"""Which buffered reports to (re)send, given the core's end-to-end acknowledgements.

A report leaves the agent's buffer only when the core says it ingested it
(``cfnet/v1/nodes/{node}/ack``). Until then it is *in flight* once sent. This
module is the policy, pure and clock-driven so the agent (over its SQLite
buffer) and the fleet simulator (over memory) run the same one:

- at most ``cwnd`` (<= ``window``) reports are in flight, the oldest unsent
  first, so delivery stays oldest-first and a core that is away costs the
  broker a few reports per agent, not the agent's whole backlog. ``cwnd``
  moves as TCP's congestion window does (doubling per acknowledged round
  below ``ssthresh``, +1 per round above; halved on a loss; back to 1 after
  the core was silent): a fleet draining its backlogs into one broker queue
  finds together what that queue holds instead of overflowing it;
- a report in flight longer than the resend delay is sent again. While the core
  is acknowledging (an ack within ``resend_s``) every such report is resent at
  once: it was lost (a core killed with it in its pipe, a broker queue that
  overflowed). While the core is silent only the oldest one is resent, as a
  probe, and the delay doubles up to ``max_resend_s``: a core that is down is
  not flooded, and the first ack after it returns restarts the flow (reports
  sent during the silence get ``resend_s / 2`` from then: the broker may still
  deliver them from the core's queue; less than the ``resend_s`` the core counts
  as alive without another ack, so the resends go out while it does);
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
    """One report in flight: when it was last sent and how many times."""
    sent_at: float
    tries: int


@dataclass(slots=True)
class AckWindow(Generic[K]):
    """Which reports to (re)send, given the core's acknowledgements (see the module docstring)."""
    window: int = 100  # the most reports ever in flight
    initial: int = 16  # the congestion window at start
    resend_s: float = 10.0
    max_resend_s: float = 60.0
    max_tries: int = 8
    inflight: dict[K, _Flight] = field(default_factory=dict)
    last_ack: float = float("-inf")
    cwnd: float = 0.0
    ssthresh: float = 0.0
    _alive_since: float = float("-inf")
    _delay: float = 0.0
    _last_probe: float = float("-inf")
    _last_cut: float = float("-inf")

    def __post_init__(self) -> None:
        if self.window < 1 or self.resend_s <= 0 or self.max_resend_s < self.resend_s:
            raise ValueError("window >= 1, 0 < resend_s <= max_resend_s")
        self._delay = self.resend_s
        self.cwnd = float(max(1, min(self.initial, self.window)))
        self.ssthresh = float(self.window)

    def core_alive(self, now: float) -> bool:
        return now - self.last_ack <= self.resend_s

    def acked(self, keys: Iterable[K], now: float) -> None:
        """The core acknowledged ``keys`` (any of them may be unknown: already gone)."""
        n = sum(1 for k in keys if self.inflight.pop(k, None) is not None)
        if not self.core_alive(now):
            # Back after a silence: what we sent meanwhile may still be queued
            # for it at the broker; give that resend_s to arrive before resending.
            self._alive_since = now
        self.last_ack = now
        self._delay = self.resend_s
        # Grow as TCP does: doubling per round trip below ssthresh, then one
        # report per round trip. Thousands of agents share the broker's queue
        # for the core (10,000 messages): together they find what it holds.
        for _ in range(n):
            self.cwnd += 1.0 if self.cwnd < self.ssthresh else 1.0 / self.cwnd
        self.cwnd = min(self.cwnd, float(self.window))

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
        if self.core_alive(now):
            # After a silence, what was sent during it gets half the resend delay to
            # arrive from the broker's queue, not the whole: the core counts as alive for
            # resend_s after its last ack, and an agent whose only traffic is those reports
            # gets no other ack meanwhile. Waiting the whole delay let the core lapse back
            # into "silent" at the same instant, so each return restarted the probing: one
            # report per resend_s (a backlog took minutes to drain after a core restart).
            settle = self.resend_s / 2
            stale = [k for k in head if k in self.inflight and (
                now - self.inflight[k].sent_at >= self.resend_s
                and now - self._alive_since >= settle)]
            if stale and now - self._last_cut >= self.resend_s:
                # Lost while the core acknowledges others: too much in flight
                # (a queue overflowed) or a core died with them. Halve, once
                # per resend period.
                self.ssthresh = max(1.0, self.cwnd / 2)
                self.cwnd = self.ssthresh
                self._last_cut = now
            give_up = [k for k in stale if self.inflight[k].tries >= self.max_tries]
            stale = [k for k in stale if self.inflight[k].tries < self.max_tries]
            budget = int(self.cwnd) - (len(self.inflight) - len(stale) - len(give_up))
            send = stale[:max(0, budget)]
            budget -= len(send)
        else:
            stale = [k for k in head if k in self.inflight
                     and now - self.inflight[k].sent_at >= self._delay]
            if stale and now - self._last_probe >= self._delay:
                # The core is silent: one probe, and start again from one
                # report in flight when it answers (TCP after a timeout).
                send.append(stale[0])
                self._last_probe = now
                self._delay = min(self._delay * 2, self.max_resend_s)
                self.ssthresh = max(2.0, self.cwnd / 2)
                self.cwnd = 1.0
            budget = int(self.cwnd) - len(self.inflight)
        for k in head:
            if budget <= 0:
                break
            if k not in self.inflight:
                send.append(k)
                budget -= 1
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
