"""The chart's Mosquitto starts as the non-root user of its values, as the kubelet would run
it: the real Mosquitto (Debian's 2.0) with the chart's own mosquitto.conf, started with the
uid, gid and supplementary fsGroup of ``mosquitto.podSecurityContext``, no capabilities and
no_new_privs; the Secret's files laid out as a secret volume with fsGroup makes them
(root:fsGroup, the chart's defaultMode 0440) and the data directory as fsGroup makes a volume
(root:fsGroup, setgid, group-writable). It must accept a TLS client with the right password,
refuse a wrong one, and write its persistence file on SIGTERM."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from cloud_core.k8s.enroll import AgentSigner
from tools.broker import MOSQUITTO, free_port, mqtt_connect_probe
from tools.certs import CertStore, make_agent_ca
from tools.helm import CHART
from tools.identity_probe import cannot_publish_as
from tools.procs import stop_all

SECRET_FILES = ("ca.crt", "broker.crt", "broker.key", "passwd", "acl")


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A directory outside pytest's root-only tmp tree, so the non-root broker can reach it."""
    d = Path(tempfile.mkdtemp(prefix="cfnet-mosq-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_chart_mosquitto_runs_as_its_non_root_user(world_dir: Path) -> None:
    if not os.access(MOSQUITTO, os.X_OK) or shutil.which("setpriv") is None:
        pytest.fail(f"{MOSQUITTO} and setpriv are installed by tools/setup.sh", pytrace=False)
    values = yaml.safe_load((CHART / "values.yaml").read_text())["mosquitto"]
    psc = values["podSecurityContext"]
    uid, gid, fs_group = psc["runAsUser"], psc["runAsGroup"], psc["fsGroup"]
    assert psc["runAsNonRoot"] is True and uid != 0
    assert values["securityContext"]["capabilities"] == {"drop": ["ALL"]}

    store = CertStore(world_dir / "pki")
    store.init()
    core, _ = store.add_account("core-k8s", "core")
    # The secret volume: what the kubelet writes for defaultMode 0440 with an fsGroup.
    secret = world_dir / "secret"
    secret.mkdir(mode=0o755)
    for name in SECRET_FILES:
        src = store.root / name
        shutil.copyfile(src, secret / name)
        os.chown(secret / name, 0, fs_group)
        (secret / name).chmod(0o440)
    # The data volume with fsGroup: group-owned, setgid, group-writable; root-owned otherwise.
    data = world_dir / "data"
    data.mkdir()
    os.chown(data, 0, fs_group)
    data.chmod(0o2770)

    # The agents' certificate listener as the chart adds it (agent.identity certificate): the
    # agent CA's certificate and the %u ACL in a projected volume, 0440 root:fsGroup too.
    agent_dir = world_dir / "agent"
    agent_dir.mkdir(mode=0o755)
    make_agent_ca(world_dir / "agent-ca")
    shutil.copyfile(world_dir / "agent-ca" / "tls.crt", agent_dir / "ca.crt")
    shutil.copyfile(CHART / "files" / "agent-acl", agent_dir / "acl")
    for name in ("ca.crt", "acl"):
        os.chown(agent_dir / name, 0, fs_group)
        (agent_dir / name).chmod(0o440)

    port, cert_port = free_port(), free_port()
    conf = ((CHART / "files" / "mosquitto.conf").read_text()
            + (CHART / "files" / "agent-listener.conf").read_text())
    assert "listener 8883\n" in conf and "/etc/mosquitto/cfnet/" in conf
    assert "listener 8884\n" in conf and "/etc/mosquitto/cfnet-agent/" in conf
    conf = (conf.replace("/etc/mosquitto/cfnet-agent/", f"{agent_dir}/")
            .replace("/etc/mosquitto/cfnet/", f"{secret}/")
            .replace("persistence_location /var/lib/mosquitto/", f"persistence_location {data}/")
            .replace("listener 8883\n", f"listener {port} 127.0.0.1\n")
            .replace("listener 8884\n", f"listener {cert_port} 127.0.0.1\n"))
    (world_dir / "mosquitto.conf").write_text(conf)
    (world_dir / "mosquitto.conf").chmod(0o444)

    log = open(world_dir / "broker.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}", f"--groups={fs_group}",
         "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs",
         str(MOSQUITTO), "-c", str(world_dir / "mosquitto.conf")],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        code: int | None = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                code = mqtt_connect_probe("127.0.0.1", port, username="core-k8s",
                                          password=core.password, ca_file=store.ca_file)
                break
            except OSError:
                time.sleep(0.1)
        assert code == 0, (f"no CONNACK 0 from the non-root broker (got {code}, exit "
                           f"{proc.poll()}): {(world_dir / 'broker.log').read_text()[-2000:]}")
        assert mqtt_connect_probe("127.0.0.1", port, username="core-k8s", password="wrong",
                                  ca_file=store.ca_file) == 5
        # The certificate listener is open, and a password alone does not get through it.
        assert f"listen socket on port {cert_port}." in (world_dir / "broker.log").read_text()
        with pytest.raises(OSError):
            mqtt_connect_probe("127.0.0.1", cert_port, username="core-k8s",
                               password=core.password, ca_file=store.ca_file)
        # A certificate of the agent CA for node-a publishes node-a's telemetry only: the
        # shipped listener and %u ACL, as the installed chart runs them.
        key = ec.generate_private_key(ec.SECP256R1())
        req = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(
            [x509.NameAttribute(NameOID.COMMON_NAME, "node-a")])).sign(key, hashes.SHA256())
        signer = AgentSigner.from_dir(world_dir / "agent-ca")
        (world_dir / "a.crt").write_bytes(signer.sign(req, "node-a"))
        (world_dir / "a.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        cannot_publish_as("127.0.0.1", cert_port, ca_file=store.ca_file,
                          certfile=world_dir / "a.crt", keyfile=world_dir / "a.key",
                          node="node-a", other="node-b")
        status = Path(f"/proc/{proc.pid}/status").read_text()
        uids = next(ln for ln in status.splitlines() if ln.startswith("Uid:")).split()[1:]
        assert set(uids) == {str(uid)}, status
        capeff = next(ln for ln in status.splitlines() if ln.startswith("CapEff:")).split()[1]
        assert int(capeff, 16) == 0
    finally:
        stop_all([proc], grace_s=15)
        log.close()
    # Persistence saved at exit into the fsGroup volume.
    assert (data / "mosquitto.db").exists(), (world_dir / "broker.log").read_text()[-2000:]
