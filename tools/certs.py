"""Certificates, accounts and the broker's password and ACL files (CLI and library).

One directory holds everything the broker and its clients need::

    DIR/accounts.json      the account registry: name -> role (the source of truth)
    DIR/ca.crt, ca.key     the private CA (ca.key never leaves this machine)
    DIR/broker.crt, .key   the broker's certificate (SANs: localhost, 127.0.0.1, extras)
    DIR/passwd             Mosquitto password file (written with ``mosquitto_passwd -b``)
    DIR/acl                Mosquitto ACL file, rendered from the registry
    DIR/clients/NAME/      what one client needs: ``password``, ``client.crt``, ``client.key``

Usage::

    python -m tools.certs init DIR [--san DNS:broker.example.org] [--group mosquitto]
    python -m tools.certs add-agent NODE --dir DIR
    python -m tools.certs add-operator NAME --dir DIR
    python -m tools.certs add-core NAME --dir DIR
    python -m tools.certs add-sim NAME --dir DIR
    python -m tools.certs remove NAME --dir DIR     (revoke; a new add-* gives a new password)

DIR defaults to ``$CFNET_PKI`` or ``run/pki`` (git-ignored). Every command is
idempotent and prints what it created. Node ids and operator
names are MQTT usernames, and so topic levels; one registry holds all of them
so no name can have two roles. The ACL has no ``pattern`` lines at all: every
account gets its own ``user`` block spelled out from its role, because a
Mosquitto pattern applies to every user, whatever its role (see
``docs/security.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast, get_args

from edge_agent.wire import (
    ACK_WILDCARD,
    DIGEST_WILDCARD,
    EVENTS_TOPIC,
    ID_RE,
    REQUEST_WILDCARD,
    STATUS_WILDCARD,
    TELEMETRY_WILDCARD,
    TOPIC_ROOT,
    ack_topic,
    placements_topic,
    request_topic,
    response_topic,
    status_topic,
    telemetry_topic,
)

Role = Literal["agent", "operator", "core", "sim", "bridge"]
ROLES: tuple[Role, ...] = get_args(Role)
# Names with these prefixes are reserved for the role, so an agent or an
# operator can never be mistaken for a core or simulator account by a human
# reading logs, and a core/sim account is recognisable from its name alone.
RESERVED_PREFIXES: dict[str, Role] = {"core-": "core", "sim-": "sim", "bridge-": "bridge"}
CA_DAYS = 3650
LEAF_DAYS = 825
MOSQUITTO_PASSWD = "mosquitto_passwd"
OPENSSL = "openssl"
PLACEMENTS_WILDCARD = f"{TOPIC_ROOT}/nodes/+/placements"
RESPONSE_WILDCARD = f"{TOPIC_ROOT}/console/+/response"
# Mosquitto 2.0.11 grants every SUBSCRIBE and checks 'read' per delivered message
# against the message's own topic, so a shared subscription needs only the plain
# rule. Brokers that check the filter itself at SUBSCRIBE time (Mosquitto 2.1,
# plugins) see the full ``$share/GROUP/FILTER``; core gets those too, any group.
SHARE_PREFIX = "$share/+/"


class CertError(RuntimeError):
    """An account or certificate operation was refused or failed."""


@dataclass(frozen=True)
class Credentials:
    """What one client needs to connect: username/password, and TLS files."""

    username: str
    password: str
    ca_file: Path | None
    certfile: Path | None
    keyfile: Path | None


def acl_rules(name: str, role: Role) -> list[tuple[str, str]]:
    """The (access, topic filter) pairs one account gets. Nothing else is allowed."""
    if role == "agent":
        return [
            ("write", telemetry_topic(name)),
            ("write", status_topic(name)),
            ("read", placements_topic(name)),
            # The core's end-to-end acks for this node's reports; nobody else's.
            ("read", ack_topic(name)),
        ]
    if role == "operator":
        return [
            ("write", request_topic(name)),
            ("read", response_topic(name)),
            ("read", EVENTS_TOPIC),
        ]
    if role == "core":
        reads = [TELEMETRY_WILDCARD, STATUS_WILDCARD, REQUEST_WILDCARD]
        rules = [("read", t) for t in reads]
        rules += [("read", SHARE_PREFIX + t) for t in reads]
        # Core reads back the retained placements and its own events so a
        # restarted (or newly elected) replica can rebuild what it had pushed.
        rules += [
            ("readwrite", PLACEMENTS_WILDCARD),
            ("read", SHARE_PREFIX + PLACEMENTS_WILDCARD),
            ("write", RESPONSE_WILDCARD),
            ("readwrite", EVENTS_TOPIC),
            # Replicas sharing ingest publish digests of what they took in.
            ("write", f"{TOPIC_ROOT}/core/{name}/digest"),
            ("read", DIGEST_WILDCARD),
            # End-to-end acks to agents (written only; no core reads them).
            ("write", ACK_WILDCARD),
        ]
        return rules
    if role == "sim":
        # Load tests only: one account speaks for many simulated nodes.
        # Its simulated agents wait for the core's acks as real ones do.
        return [("write", TELEMETRY_WILDCARD), ("write", STATUS_WILDCARD),
                ("read", ACK_WILDCARD)]
    if role == "bridge":
        # A regional broker's bridge (deploy/mosquitto/bridge.conf): carries
        # its region's agents' reports and statuses out, their placement sets
        # and the core's acks in. Which node speaks for which id is decided by
        # the regional broker's own ACL, where each agent has its own account.
        return [("write", TELEMETRY_WILDCARD), ("write", STATUS_WILDCARD),
                ("read", PLACEMENTS_WILDCARD), ("read", ACK_WILDCARD)]
    raise CertError(f"unknown role {role!r}")


def render_acl(accounts: dict[str, Role]) -> str:
    """The whole Mosquitto ACL file for these accounts (deterministic order)."""
    lines = [
        "# cfnet Mosquitto ACL, rendered by tools/certs.py from accounts.json: do not edit.",
        "# No 'pattern' lines on purpose: a pattern applies to every user whatever its",
        "# role. No topic lines before the first 'user': anonymous clients get nothing.",
        "",
    ]
    for role in get_args(Role):
        names = sorted(n for n, r in accounts.items() if r == role)
        if not names:
            continue
        lines.append(f"# ---- role: {role}")
        for name in names:
            lines.append(f"user {name}")
            lines.extend(f"topic {access} {topic}" for access, topic in acl_rules(name, role))
            lines.append("")
    return "\n".join(lines)


def render_agent_acl() -> str:
    """The ACL of the broker's certificate listener (deploy/mosquitto/agent-acl).

    Only agents reach that listener (a client certificate of the agent CA is required, and
    its CN becomes the username), so ``pattern`` lines are safe there: ``%u`` is the node
    name the certificate was issued for (docs/security.md, "One identity per agent")."""
    lines = [
        "# cfnet Mosquitto ACL of the agents' certificate listener, rendered by",
        "# tools/certs.py render_agent_acl(): do not edit. Only clients with a certificate of",
        "# the agent CA reach that listener; %u is the certificate's CN, the node name.",
        "",
        *(f"pattern {access} {topic}" for access, topic in acl_rules("%u", "agent")),
    ]
    return "\n".join(lines) + "\n"


def make_agent_ca(directory: Path, *, days: int = CA_DAYS) -> tuple[Path, Path]:
    """An agent CA (``tls.crt``, ``tls.key``: a kubernetes.io/tls Secret's layout) for
    ``cfnet-core --agent-ca`` and the broker's certificate listener; kept if it exists."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    crt, key = directory / "tls.crt", directory / "tls.key"
    if not (crt.exists() and key.exists()):
        _run([
            OPENSSL, "req", "-x509", "-new", "-newkey", "ec",
            "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(crt),
            "-days", str(days), "-subj", "/O=cfnet/CN=cfnet agent CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        ])  # fmt: skip
        key.chmod(0o600)
    return crt, key


def check_name(name: str, role: Role) -> None:
    """Refuse names that are not valid ids or that take another role's prefix."""
    if role not in ROLES:
        raise CertError(f"unknown role {role!r}; one of {ROLES}")
    # fullmatch, not valid_id(): ID_RE ends in '$', which also matches before a
    # trailing newline, and a newline must never reach the passwd or ACL file.
    if not ID_RE.fullmatch(name):
        raise CertError(f"{name!r} is not a valid id (lowercase DNS-label-like)")
    for prefix, owner in RESERVED_PREFIXES.items():
        if name.startswith(prefix) and role != owner:
            raise CertError(f"names starting {prefix!r} are reserved for {owner} accounts")


def _run(cmd: Sequence[str], *, stdin: str | None = None) -> None:
    try:
        subprocess.run(
            list(cmd), input=stdin, check=True, capture_output=True, text=True, timeout=60
        )
    except FileNotFoundError as exc:
        raise CertError(f"{cmd[0]} not found (run tools/setup.sh)") from exc
    except subprocess.CalledProcessError as exc:
        raise CertError(f"{' '.join(cmd[:3])} failed: {exc.stderr.strip()[:400]}") from exc


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _atomic_write(path: Path, text: str, mode: int = 0o600) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class CertStore:
    """The directory of CA, broker cert, accounts, password and ACL files."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # ------------------------------------------------------------------ paths
    @property
    def ca_file(self) -> Path:
        return self.root / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def broker_cert(self) -> Path:
        return self.root / "broker.crt"

    @property
    def broker_key(self) -> Path:
        return self.root / "broker.key"

    @property
    def password_file(self) -> Path:
        return self.root / "passwd"

    @property
    def acl_file(self) -> Path:
        return self.root / "acl"

    @property
    def registry_file(self) -> Path:
        return self.root / "accounts.json"

    def client_dir(self, name: str) -> Path:
        return self.root / "clients" / name

    # ------------------------------------------------------------------ locking
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # ------------------------------------------------------------------ registry
    def accounts(self) -> dict[str, Role]:
        """name -> role for every registered account."""
        if not self.registry_file.exists():
            return {}
        try:
            raw = json.loads(self.registry_file.read_text())
            return {str(n): cast(Role, str(r)) for n, r in raw["accounts"].items()}
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise CertError(f"unreadable registry {self.registry_file}: {exc}") from exc

    def broker_group(self) -> str | None:
        """The group the broker runs as (it must read passwd, acl, broker.key), if set."""
        if not self.registry_file.exists():
            return None
        try:
            group = json.loads(self.registry_file.read_text()).get("broker_group")
        except (OSError, ValueError, AttributeError) as exc:
            raise CertError(f"unreadable registry {self.registry_file}: {exc}") from exc
        return str(group) if group else None

    def _save_accounts(self, accounts: dict[str, Role], group: str | None = None) -> None:
        group = group or self.broker_group()
        doc: dict[str, object] = {"version": 1, "accounts": dict(sorted(accounts.items()))}
        if group:
            doc["broker_group"] = group
        _atomic_write(self.registry_file, json.dumps(doc, indent=2) + "\n", 0o600)

    def _share_with_broker(self) -> None:
        """Give the broker's group read access to what it reads after dropping root."""
        group = self.broker_group()
        if not group:
            return
        try:
            shutil.chown(self.root, group=group)
            self.root.chmod(0o750)
            for path in (self.password_file, self.acl_file, self.broker_key):
                if path.exists():
                    shutil.chown(path, group=group)
                    path.chmod(0o640)
        except (LookupError, OSError) as exc:
            raise CertError(f"cannot give group {group!r} access: {exc}") from exc

    # ------------------------------------------------------------------ init
    def init(self, extra_sans: Sequence[str] = (), *, group: str | None = None) -> list[Path]:
        """Create the CA, the broker cert, empty password/ACL files; return what was created.

        ``group``: the broker's group (``mosquitto`` in production). Mosquitto
        reads the password file, the ACL and its key after dropping root, so
        those become group-readable (0640) and stay so on every later change.
        """
        created: list[Path] = []
        with self._locked():
            if self.broker_group() is None:
                self.root.chmod(0o700)
            if not self.ca_file.exists() or not self.ca_key.exists():
                self._make_ca()
                created += [self.ca_file, self.ca_key]
            if not self.broker_cert.exists() or not self.broker_key.exists():
                sans = ["DNS:localhost", "IP:127.0.0.1", "IP:::1", *extra_sans]
                self._make_leaf(
                    "cfnet-broker", self.broker_cert, self.broker_key, "serverAuth", sans
                )
                created += [self.broker_cert, self.broker_key]
            if not self.registry_file.exists() or (group and group != self.broker_group()):
                self._save_accounts(self.accounts(), group)
                created.append(self.registry_file)
            if not self.password_file.exists():
                _write_private(self.password_file, "")
                created.append(self.password_file)
            if not self.acl_file.exists():
                _atomic_write(self.acl_file, render_acl(self.accounts()))
                created.append(self.acl_file)
            (self.root / "clients").mkdir(mode=0o700, exist_ok=True)
            self._share_with_broker()
        return created

    def _make_ca(self) -> None:
        _run([
            OPENSSL, "req", "-x509", "-new", "-newkey", "ec",
            "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(self.ca_key), "-out", str(self.ca_file),
            "-days", str(CA_DAYS), "-subj", "/O=cfnet/CN=cfnet CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        ])  # fmt: skip
        self.ca_key.chmod(0o600)

    def _make_leaf(
        self, cn: str, cert: Path, key: Path, usage: str, sans: Sequence[str] = ()
    ) -> None:
        with tempfile.TemporaryDirectory(dir=self.root) as tmp:
            csr = Path(tmp) / "req.csr"
            ext = Path(tmp) / "ext.cnf"
            _run([
                OPENSSL, "req", "-new", "-newkey", "ec",
                "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", str(key), "-out", str(csr), "-subj", f"/O=cfnet/CN={cn}",
            ])  # fmt: skip
            key.chmod(0o600)
            ext_lines = [
                "basicConstraints=critical,CA:FALSE",
                "keyUsage=critical,digitalSignature,keyEncipherment",
                f"extendedKeyUsage={usage}",
            ]
            if sans:
                ext_lines.append("subjectAltName=" + ",".join(sans))
            ext.write_text("\n".join(ext_lines) + "\n")
            _run([
                OPENSSL, "x509", "-req", "-in", str(csr),
                "-CA", str(self.ca_file), "-CAkey", str(self.ca_key),
                "-set_serial", "0x" + secrets.token_hex(16), "-days", str(LEAF_DAYS),
                "-sha256", "-extfile", str(ext), "-out", str(cert),
            ])  # fmt: skip

    # ------------------------------------------------------------------ accounts
    def add_account(self, name: str, role: Role) -> tuple[Credentials, list[Path]]:
        """Register ``name`` with ``role`` (idempotent); return its credentials and new files.

        Refuses a name already registered with another role: node ids and
        operator names share one namespace because both are MQTT usernames.
        """
        check_name(name, role)
        if not self.ca_file.exists():
            self.init()
        created: list[Path] = []
        with self._locked():
            accounts = self.accounts()
            have = accounts.get(name)
            if have is not None and have != role:
                raise CertError(f"{name!r} is already a {have} account; names are unique")
            cdir = self.client_dir(name)
            cdir.mkdir(parents=True, exist_ok=True, mode=0o700)
            pw_path = cdir / "password"
            if not pw_path.exists() or have is None:
                _write_private(pw_path, secrets.token_urlsafe(24))
                created.append(pw_path)
                password = pw_path.read_text().strip()
                self._set_password(name, password)
                created.append(self.password_file)
            crt, key = cdir / "client.crt", cdir / "client.key"
            if not crt.exists() or not key.exists():
                self._make_leaf(name, crt, key, "clientAuth")
                created += [crt, key]
            if have is None:
                accounts[name] = role
                self._save_accounts(accounts)
                created.append(self.registry_file)
            acl = render_acl(accounts)
            if not self.acl_file.exists() or self.acl_file.read_text() != acl:
                _atomic_write(self.acl_file, acl)
                created.append(self.acl_file)
            if created:
                self._share_with_broker()
        return self.credentials(name), created

    def remove_account(self, name: str) -> list[Path]:
        """Revoke an account: password entry, ACL block, registry entry, client files.

        Returns what was removed (empty if there was no such account). On
        reload (SIGHUP), Mosquitto 2.0.11 re-checks connected clients against
        the new password file and disconnects this one.
        """
        removed: list[Path] = []
        with self._locked():
            accounts = self.accounts()
            if name not in accounts:
                return removed
            del accounts[name]
            _run([MOSQUITTO_PASSWD, "-D", str(self.password_file), name])
            self.password_file.chmod(0o600)
            self._save_accounts(accounts)
            _atomic_write(self.acl_file, render_acl(accounts))
            removed += [self.password_file, self.registry_file, self.acl_file]
            cdir = self.client_dir(name)
            if cdir.exists():
                shutil.rmtree(cdir)
                removed.append(cdir)
            self._share_with_broker()
        return removed

    def _set_password(self, name: str, password: str) -> None:
        if not self.password_file.exists():
            _write_private(self.password_file, "")
        if shutil.which(MOSQUITTO_PASSWD) is None:
            raise CertError(f"{MOSQUITTO_PASSWD} not found (apt install mosquitto)")
        _run([MOSQUITTO_PASSWD, "-b", str(self.password_file), name, password])
        self.password_file.chmod(0o600)

    def credentials(self, name: str) -> Credentials:
        """The credentials of a registered account."""
        if name not in self.accounts():
            raise CertError(f"no account {name!r} in {self.registry_file}")
        cdir = self.client_dir(name)
        try:
            password = (cdir / "password").read_text().strip()
        except OSError as exc:
            raise CertError(f"no password for {name!r}: {exc}") from exc
        return Credentials(
            username=name,
            password=password,
            ca_file=self.ca_file,
            certfile=cdir / "client.crt",
            keyfile=cdir / "client.key",
        )


def main(argv: Sequence[str] | None = None) -> int:
    # run/ is git-ignored, so keys made in a checkout cannot be committed by accident.
    default_dir = Path(os.environ.get("CFNET_PKI", "run/pki"))
    ap = argparse.ArgumentParser(prog="python -m tools.certs", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_init = sub.add_parser("init", help="create the CA, broker cert and empty password/ACL")
    p_init.add_argument("dir", type=Path, nargs="?", default=default_dir)
    p_init.add_argument("--san", action="append", default=[], help="extra SAN, e.g. DNS:host")
    p_init.add_argument(
        "--group", help="the broker's group (production: mosquitto); gets read access"
    )
    for role in ROLES:
        p = sub.add_parser(f"add-{role}", help=f"register a {role} account")
        p.add_argument("name")
        p.add_argument("--dir", type=Path, default=default_dir)
        p.set_defaults(role=role)
    p_rm = sub.add_parser("remove", help="revoke an account (then reload the broker)")
    p_rm.add_argument("name")
    p_rm.add_argument("--dir", type=Path, default=default_dir)
    args = ap.parse_args(argv)
    try:
        store = CertStore(args.dir)
        if args.cmd == "init":
            created = store.init(args.san, group=args.group)
        elif args.cmd == "remove":
            removed = store.remove_account(args.name)
            for path in removed:
                print(f"{'updated' if path.is_file() else 'removed'} {path}")
            if not removed:
                print(f"nothing to do: no account {args.name!r}")
            return 0
        else:
            if not store.ca_file.exists():
                raise CertError(f"{args.dir} has no CA; run 'init {args.dir}' first")
            _, created = store.add_account(args.name, args.role)
    except CertError as exc:
        print(f"error: {exc}")
        return 1
    shared = {store.password_file, store.acl_file, store.registry_file}
    for path in dict.fromkeys(created):
        verb = "updated" if args.cmd != "init" and path in shared else "created"
        print(f"{verb} {path}")
    if not created:
        print("nothing to do: everything already exists")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
