"""The account surface the test buses share (tools.broker.Broker, tools.nats.cluster.NatsCluster).

Both keep their accounts in a :class:`tools.certs.CertStore` and must, after adding or
removing one on a running bus, have the bus re-read them and wait until the change is
live. What differs is how (Mosquitto: SIGHUP, one listener; NATS: rewrite every node's
config, SIGHUP each, check each), so a bus implements :meth:`_reload_accounts` and
:meth:`_wait_account` and inherits the rest; its error class (``_error``) wraps the
store's :class:`~tools.certs.CertError`.
"""

from __future__ import annotations

from tools.certs import CertError, CertStore, Credentials, Role


class BusAccounts:
    """``add_account``/``remove_account``/``credentials`` over a cert store (a mixin)."""

    store: CertStore
    tls: bool
    _error: type[RuntimeError] = RuntimeError

    @property
    def running(self) -> bool:
        raise NotImplementedError

    def _reload_accounts(self) -> None:
        """Make the running bus re-read its accounts."""
        raise NotImplementedError

    def _wait_account(self, creds: Credentials, *, accepted: bool) -> None:
        """Wait until the running bus accepts (or refuses) these credentials."""
        raise NotImplementedError

    def add_account(self, name: str, role: Role) -> Credentials:
        """Register an account (idempotent); on a running bus, reload and wait until live."""
        try:
            creds, created = self.store.add_account(name, role)
        except CertError as exc:
            raise self._error(str(exc)) from exc
        creds = self._shape(creds)
        if created and self.running:
            self._reload_accounts()
            self._wait_account(creds, accepted=True)
        return creds

    def remove_account(self, name: str) -> None:
        """Revoke an account; on a running bus, reload and wait until it is refused."""
        try:
            creds = self.store.credentials(name)
            self.store.remove_account(name)
        except CertError as exc:
            raise self._error(str(exc)) from exc
        if self.running:
            self._reload_accounts()
            self._wait_account(creds, accepted=False)

    def credentials(self, name: str) -> Credentials:
        """Credentials of an account added earlier (no client certificate without TLS)."""
        return self._shape(self.store.credentials(name))

    def _shape(self, creds: Credentials) -> Credentials:
        if self.tls:
            return creds
        return Credentials(creds.username, creds.password, None, None, None)
