"""The agent's side of one identity per agent (edge_agent/enroll.py, its config): the key is
made once and 0600, a kept certificate is reused only for this node, this key and outside its
last third, and the configuration refuses what cannot work. Filing and waiting for the CSR
runs against the real API server in tests/k8s/test_identity.py."""

from __future__ import annotations

import datetime as dt
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from cloud_core.k8s.enroll import AgentSigner, make_ca
from edge_agent.config import load_config
from edge_agent.enroll import (
    EnrollError,
    api_server_from_env,
    load_or_make_key,
    make_csr,
    renew_at,
    usable_cert,
)
from edge_agent.errors import ConfigError


def test_key_is_made_once_and_private(tmp_path: Path) -> None:
    path = tmp_path / "identity" / "client.key"
    key = load_or_make_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    pem = path.read_bytes()
    assert load_or_make_key(path) == key == path and path.read_bytes() == pem  # not remade
    made = serialization.load_pem_private_key(pem, None)  # what the core's library reads
    assert isinstance(made, ec.EllipticCurvePrivateKey) and made.curve.name == "secp256r1"


def test_a_non_ec_key_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "client.key"
    path.write_text("not a key")
    with pytest.raises(EnrollError, match="cannot read the agent key"):
        load_or_make_key(path)
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path.write_bytes(rsa_key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    with pytest.raises(EnrollError, match="is not an EC key"):
        load_or_make_key(path)


def _key_file(tmp_path: Path, key: ec.EllipticCurvePrivateKey, name: str = "client.key") -> Path:
    """A key made by the core's library, in a file as the agent keeps its own."""
    path = tmp_path / name
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path


def _issue(tmp_path: Path, key: Path, node: str, days: int, now: dt.datetime) -> Path:
    crt, ca_key = make_ca(now=now)
    signer = AgentSigner.from_pem(crt, ca_key, days=days)
    pem = signer.sign(x509.load_pem_x509_csr(make_csr(key, node)), node, now=now)
    out = tmp_path / "client.crt"
    out.write_bytes(pem)
    return out


def test_kept_certificate_is_reused_only_when_it_fits(tmp_path: Path) -> None:
    key = _key_file(tmp_path, ec.generate_private_key(ec.SECP256R1()))
    now = dt.datetime.now(dt.UTC)
    crt = _issue(tmp_path, key, "node-a", 30, now)
    assert usable_cert(crt, key, "node-a", now=now)
    assert not usable_cert(crt, key, "node-b", now=now)  # another node's name
    other = _key_file(tmp_path, ec.generate_private_key(ec.SECP256R1()), "other.key")
    assert not usable_cert(crt, other, "node-a", now=now)
    # In its last third (30 days: after day 20, counted from 5 minutes before issue): renew.
    assert usable_cert(crt, key, "node-a", now=now + dt.timedelta(days=19))
    assert not usable_cert(crt, key, "node-a", now=now + dt.timedelta(days=21))
    assert not usable_cert(tmp_path / "missing.crt", key, "node-a")


def test_csr_asks_for_the_node_name_only(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    csr = x509.load_pem_x509_csr(make_csr(_key_file(tmp_path, key), "node-a"))
    assert csr.subject.rfc4514_string() == "CN=node-a"
    assert csr.is_signature_valid
    assert csr.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) == \
        key.public_key().public_bytes(serialization.Encoding.DER,
                                      serialization.PublicFormat.SubjectPublicKeyInfo)
    # A name that is not a valid node id never reaches openssl's -subj syntax.
    for bad in ("node-a/CN=node-b", "Node", "a,b", "x" * 64, ""):
        with pytest.raises(EnrollError, match="cannot be a certificate's subject"):
            make_csr(_key_file(tmp_path, key), bad)


def test_api_server_from_the_pod_environment() -> None:
    assert api_server_from_env({"KUBERNETES_SERVICE_HOST": "10.96.0.1",
                                "KUBERNETES_SERVICE_PORT": "443"}) == "https://10.96.0.1:443"
    assert api_server_from_env({"KUBERNETES_SERVICE_HOST": "fd00::1",
                                "KUBERNETES_SERVICE_PORT": "6443"}) == "https://[fd00::1]:6443"
    assert api_server_from_env({}) == ""


def test_config_identity(tmp_path: Path) -> None:
    cfg = load_config(["--node", "n1", "--identity", "certificate"])
    assert cfg.identity == "certificate" and cfg.identity_dir is None
    with pytest.raises(ConfigError, match="identity 'token' must be password or certificate"):
        load_config(["--node", "n1", "--identity", "token"])
    with pytest.raises(ConfigError, match="needs tls: true"):
        load_config(["--node", "n1", "--identity", "certificate", "--no-tls"])
    with pytest.raises(ConfigError, match="enroll_timeout_s"):
        load_config(["--node", "n1", "--enroll-timeout-s", "0"])
    (tmp_path / "a.yaml").write_text("identity: certificate\nidentity_dir: /x/id\n"
                                     "api_server: https://10.0.0.1:6443\n")
    cfg = load_config(["--node", "n1", "--config", str(tmp_path / "a.yaml")])
    assert cfg.identity_dir == Path("/x/id") and cfg.api_server == "https://10.0.0.1:6443"


def test_renewal_time_is_the_start_of_the_last_third(tmp_path: Path) -> None:
    key = _key_file(tmp_path, ec.generate_private_key(ec.SECP256R1()))
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    crt = _issue(tmp_path, key, "node-a", 30, now)
    cert = x509.load_pem_x509_certificate(crt.read_bytes())
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    assert renew_at(crt) == pytest.approx((start + (end - start) * 2 / 3).timestamp())
    # The moment usable_cert stops reusing it at start-up is the same moment.
    at = dt.datetime.fromtimestamp(renew_at(crt), dt.UTC)
    assert usable_cert(crt, key, "node-a", now=at - dt.timedelta(seconds=1))
    assert not usable_cert(crt, key, "node-a", now=at + dt.timedelta(seconds=1))
    with pytest.raises(EnrollError, match="cannot read the client certificate"):
        renew_at(tmp_path / "missing.crt")
