"""`dpadmm.deploy` and `dpadmm deploy`: real certificates, keys, TLS handshakes and Flower's own readers.

Nothing is mocked: the certificates are checked with `cryptography` and a real `ssl` handshake,
the keys and the connection with the loaders `flwr` itself uses, and one test runs a real
SuperLink and SuperNodes through the CLI (exec, TLS, registration, authentication).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import re
import shlex
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key

from clients.client_app import agent_data_for
from dpadmm import deploy
from dpadmm.cli import main
from dpadmm.data.checks import DataError
from dpadmm.data.node import load_node_data
from dpadmm.iadmm.config import RunConfig
from dpadmm.iadmm.federation import agent_data, load_for
from tests.conftest import free_ports
from tests.corrupt import head, write_gz

NODE_CONFIG = "partition-id=0 data-path='/x.npz' num-samples-total=60000"


@pytest.fixture
def certs(tmp_path: Path) -> deploy.Certificates:
    return deploy.make_certificates(tmp_path / "certs", ["127.0.0.1", "localhost"])


def _load_cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_server_certificate_is_signed_by_the_ca(certs: deploy.Certificates) -> None:
    ca, server = _load_cert(certs.ca_cert), _load_cert(certs.server_cert)
    # Raises InvalidSignature if the CA did not sign it.
    ca.public_key().verify(server.signature, server.tbs_certificate_bytes,
                           ec.ECDSA(server.signature_hash_algorithm))
    assert server.issuer == ca.subject
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    now = datetime.datetime.now(datetime.UTC)
    for cert in (ca, server):
        assert cert.not_valid_before_utc <= now < cert.not_valid_after_utc
        assert cert.not_valid_after_utc > now + datetime.timedelta(days=364)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert os.stat(certs.server_key).st_mode & 0o777 == 0o600


def test_existing_certificates_are_refused_and_kept(certs: deploy.Certificates) -> None:
    before = {p: p.read_bytes() for p in (certs.ca_cert, certs.server_cert, certs.server_key)}
    with pytest.raises(FileExistsError, match="ca.crt"):
        deploy.make_certificates(certs.ca_cert.parent, ["127.0.0.1"])
    assert {p: p.read_bytes() for p in before} == before


def test_bad_certificate_arguments_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="hosts is empty"):
        deploy.make_certificates(tmp_path, [" ", ""])
    with pytest.raises(ValueError, match="days=0"):
        deploy.make_certificates(tmp_path, ["127.0.0.1"], days=0)
    # a certificate for a name no client can ask for (it was issued for DNS:not a host!!)
    with pytest.raises(ValueError, match="hosts='not a host!!' is not allowed; give an IP address or a DNS"):
        deploy.make_certificates(tmp_path, ["127.0.0.1", "not a host!!"])
    with pytest.raises(ValueError, match="host='not a host!' is not allowed"):
        deploy.superlink_command(None, host="not a host!", insecure=True)
    assert not list(tmp_path.iterdir())


@pytest.fixture
def tls_server(certs: deploy.Certificates) -> Iterator[int]:
    """A real TLS server on 127.0.0.1 with server.crt/server.key; yields its port."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.server_cert, certs.server_key)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:  # timeout, or closed by the fixture
                continue
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"ok")
            except (ssl.SSLError, OSError):  # the client refused our certificate
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    listener.close()
    thread.join(timeout=15)


def test_tls_handshake_trusts_only_the_ca(tls_server: int, certs: deploy.Certificates,
                                          tmp_path: Path) -> None:
    client = ssl.create_default_context(cafile=str(certs.ca_cert))  # checks the hostname
    with socket.create_connection(("127.0.0.1", tls_server), timeout=10) as sock, \
            client.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
        assert tls.recv(2) == b"ok"
    other = deploy.make_certificates(tmp_path / "other", ["127.0.0.1"])
    stranger = ssl.create_default_context(cafile=str(other.ca_cert))
    with socket.create_connection(("127.0.0.1", tls_server), timeout=10) as sock, \
            pytest.raises(ssl.SSLCertVerificationError):
        stranger.wrap_socket(sock, server_hostname="127.0.0.1")


# --- node keys ------------------------------------------------------------------------------------------


def test_node_keys_load_with_flowers_loaders(tmp_path: Path) -> None:
    from flwr.cli.supernode.register import try_load_public_key
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    paths = deploy.make_node_keys(tmp_path / "keys", ["node-0", "node-1"])
    assert [p.name for p in paths] == ["node-0", "node-1"]
    publics = []
    for path in paths:
        private = load_ssh_private_key(path.read_bytes(), password=None)
        assert isinstance(private, ec.EllipticCurvePrivateKey)
        assert isinstance(private.curve, ec.SECP384R1)
        assert os.stat(path).st_mode & 0o777 == 0o600
        public = try_load_public_key(path.with_name(path.name + ".pub"))
        assert public == public_key_to_bytes(private.public_key())
        publics.append(public)
    assert publics[0] != publics[1]


def test_node_keys_refuse_bad_names_and_existing_files(tmp_path: Path) -> None:
    out = tmp_path / "keys"
    for names, message in (([], "names is empty"), (["ok", "a/b"], "'a/b' is not allowed"),
                           ([".hidden"], "'.hidden' is not allowed"), (["n", "n"], "n repeat")):
        with pytest.raises(ValueError, match=message):
            deploy.make_node_keys(out, names)
    assert not out.exists()  # checked before anything was written
    (key,) = deploy.make_node_keys(out, ["node-0"])
    before = key.read_bytes()
    with pytest.raises(FileExistsError, match="node-0"):
        deploy.make_node_keys(out, ["node-1", "node-0"])
    assert key.read_bytes() == before and not (out / "node-1").exists()


# --- commands -------------------------------------------------------------------------------------------


def test_superlink_command_is_secure_by_default(certs: deploy.Certificates, tmp_path: Path) -> None:
    command = deploy.superlink_command(certs.ca_cert.parent, port=9093, database=tmp_path / "state.db")
    for flag, value in (("--ssl-ca-certfile", certs.ca_cert), ("--ssl-certfile", certs.server_cert),
                        ("--ssl-keyfile", certs.server_key), ("--database", tmp_path / "state.db")):
        assert command[command.index(flag) + 1] == str(value)
    assert command[0] == "flower-superlink" and "--enable-supernode-auth" in command
    assert "--insecure" not in command
    with pytest.raises(ValueError, match="certs missing"):
        deploy.superlink_command(None)
    with pytest.raises(ValueError, match="port=0"):
        deploy.superlink_command(certs.ca_cert.parent, port=0)
    certs.server_key.unlink()
    with pytest.raises(FileNotFoundError, match="server.key"):
        deploy.superlink_command(certs.ca_cert.parent)


def test_supernode_command_is_secure_by_default(certs: deploy.Certificates, tmp_path: Path) -> None:
    (key,) = deploy.make_node_keys(tmp_path / "keys", ["node-0"])
    command = deploy.supernode_command("10.0.0.1:9093", NODE_CONFIG, ca_cert=certs.ca_cert, private_key=key)
    assert command[command.index("--root-certificates") + 1] == str(certs.ca_cert)
    assert command[command.index("--auth-supernode-private-key") + 1] == str(key)
    assert command[command.index("--node-config") + 1] == NODE_CONFIG
    assert "--insecure" not in command
    with pytest.raises(ValueError, match="private_key missing"):
        deploy.supernode_command("10.0.0.1:9093", NODE_CONFIG, ca_cert=certs.ca_cert)
    with pytest.raises(ValueError, match="ca_cert and private_key missing"):
        deploy.supernode_command("10.0.0.1:9093", NODE_CONFIG)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        deploy.supernode_command("10.0.0.1:9093", NODE_CONFIG, ca_cert=tmp_path / "nowhere", private_key=key)


@pytest.mark.parametrize(("superlink", "node_config", "message"), [
    ("foo", NODE_CONFIG, "superlink='foo' is not allowed; give the SuperLink's HOST:PORT"),
    ("host:99999", NODE_CONFIG, "superlink='host:99999' is not allowed"),
    (":9092", NODE_CONFIG, "superlink=':9092' is not allowed"),
    ("10.0.0.1:9093", "partition-id=abc", "node-config='partition-id=abc' is not allowed: Flower reads"),
    ("10.0.0.1:9093", "data-path='/x.npz'", "partition-id=None must be the agent's number"),
    ("10.0.0.1:9093", "partition-id=-1", "partition-id=-1 must be the agent's number, a whole number >= 0"),
    # Flower drops a token without "=", and a misspelt key would leave the node without its data
    ("10.0.0.1:9093", "partition-id=0 garbage", "'garbage' is no key=value pair"),
    ("10.0.0.1:9093", "partition-id=0 data_path='/x.npz'",
     "node-config key 'data_path' is not read by dpadmm's clients; the keys are partition-id"),
])
def test_a_supernode_command_names_a_bad_address_or_node_config(superlink: str, node_config: str,
                                                                message: str) -> None:
    """Checked before the command is printed or run: on the device flower-supernode would retry a bad
    address forever, and the agent would refuse its partition only once the server asked."""
    with pytest.raises(ValueError, match=re.escape(message)):
        deploy.supernode_command(superlink, node_config, insecure=True)
    with pytest.warns(UserWarning, match="INSECURE deployment"):
        assert deploy.supernode_command("[fd00::1]:9092", NODE_CONFIG, insecure=True)[2] == "[fd00::1]:9092"


def test_insecure_is_explicit_and_warned() -> None:
    with pytest.warns(UserWarning, match="INSECURE deployment"):
        link = deploy.superlink_command(None, insecure=True)
    with pytest.warns(UserWarning, match="INSECURE deployment"):
        node = deploy.supernode_command("127.0.0.1:9093", NODE_CONFIG, insecure=True)
    with pytest.warns(UserWarning, match="INSECURE deployment"):
        block = deploy.connection_toml("test", "127.0.0.1:9093", None, insecure=True)
    for command in (link, node):
        assert command[-1] == "--insecure"
        assert not {"--ssl-certfile", "--root-certificates", "--enable-supernode-auth"} & set(command)
    assert tomllib.loads(block)["superlink"]["test"] == {"address": "127.0.0.1:9093", "insecure": True}


def test_connection_toml_escapes_and_refuses(tmp_path: Path) -> None:
    odd = tmp_path / 'a "quoted" \\ folder'
    odd.mkdir()
    ca = deploy.make_certificates(odd, ["127.0.0.1"]).ca_cert
    parsed = tomllib.loads(deploy.connection_toml("lab", "127.0.0.1:9093", ca))
    assert parsed == {"superlink": {"lab": {"address": "127.0.0.1:9093", "root-certificates": str(ca)}}}
    with pytest.raises(ValueError, match="'a.b' is not allowed"):
        deploy.connection_toml("a.b", "127.0.0.1:9093", ca)
    with pytest.raises(ValueError, match="ca_cert missing"):
        deploy.connection_toml("lab", "127.0.0.1:9093", None)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        deploy.connection_toml("lab", "127.0.0.1:9093", tmp_path / "nowhere")
    with pytest.raises(ValueError, match="address='bad' is not allowed; give the SuperLink's HOST:PORT"):
        deploy.connection_toml("lab", "bad", ca)


# --- the CLI --------------------------------------------------------------------------------------------


def test_cli_certs_and_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "certs"
    assert main(["deploy", "certs", "--out", str(out), "--hosts", "127.0.0.1,localhost", "--days", "30"]) == 0
    printed = capsys.readouterr().out
    for name in ("ca.crt", "server.crt", "server.key"):
        assert str(out / name) in printed
    assert "copy" in printed and "every device" in printed
    server = _load_cert(out / "server.crt")
    assert server.not_valid_after_utc < datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=31)
    assert main(["deploy", "certs", "--out", str(out), "--hosts", "127.0.0.1"]) == 2
    assert "dpadmm: error:" in capsys.readouterr().err

    keys = tmp_path / "keys"
    assert main(["deploy", "keys", "--out", str(keys), "--names", "node-0,node-1"]) == 0
    printed = capsys.readouterr().out
    for name in ("node-0", "node-1"):
        pub = keys / f"{name}.pub"
        assert pub.is_file() and f"flwr supernode register {pub} <connection-name>" in printed
    assert main(["deploy", "keys", "--out", str(keys), "--names", "node-1"]) == 2
    assert "node-1" in capsys.readouterr().err
    assert main(["deploy", "certs", "--out", str(tmp_path / "x"), "--hosts", ","]) == 2
    assert "hosts is empty" in capsys.readouterr().err


def test_cli_connection_is_read_by_flower(certs: deploy.Certificates, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.cli.config_utils import load_certificate_in_connection
    from flwr.cli.flower_config import read_superlink_connection

    home = tmp_path / "flwr-home"
    args = ["deploy", "connection", "--name", "lab", "--address", "127.0.0.1:9093",
            "--ca-cert", str(certs.ca_cert), "--flwr-home", str(home)]
    assert main(args) == 0
    config = tomllib.loads((home / "config.toml").read_text())
    assert config["superlink"]["default"] == "lab"
    assert config["superlink"]["lab"] == {"address": "127.0.0.1:9093",
                                          "root-certificates": str(certs.ca_cert.resolve())}
    before = (home / "config.toml").read_text()
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "[superlink.lab]" in err and str(home / "config.toml") in err
    assert (home / "config.toml").read_text() == before

    # A second connection is appended; $FLWR_HOME is the default home.
    monkeypatch.setenv("FLWR_HOME", str(home))
    assert main(["deploy", "connection", "--name", "loop", "--address", "127.0.0.1:9093", "--insecure"]) == 0
    assert "INSECURE deployment" in capsys.readouterr().err

    connection = read_superlink_connection("lab")
    assert connection.address == "127.0.0.1:9093"
    assert connection.root_certificates == str(certs.ca_cert.resolve()) and not connection.insecure
    assert load_certificate_in_connection(connection) == certs.ca_cert.read_bytes()
    assert read_superlink_connection().name == "lab"  # the default
    loop = read_superlink_connection("loop")
    assert loop.insecure and loop.root_certificates is None

    (home / "config.toml").write_text("[superlink\n")
    assert main(["deploy", "connection", "--name", "x", "--address", "a:1", "--insecure"]) == 2
    assert "not valid TOML" in capsys.readouterr().err


def test_cli_prints_commands(certs: deploy.Certificates, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    folder = certs.ca_cert.parent
    assert main(["deploy", "superlink", "--certs", str(folder), "--port", "9999", "--print"]) == 0
    out, err = capsys.readouterr()
    assert shlex.split(out) == deploy.superlink_command(folder, port=9999) and err == ""
    (key,) = deploy.make_node_keys(tmp_path / "keys", ["node-0"])
    assert main(["deploy", "supernode", "--superlink", "10.0.0.1:9093", "--node-config", NODE_CONFIG,
                 "--ca-cert", str(certs.ca_cert), "--key", str(key), "--print"]) == 0
    out, err = capsys.readouterr()
    node, runtime = out.splitlines()  # the SuperNode, and the device's runtime that answers its messages
    assert shlex.split(node) == deploy.supernode_command("10.0.0.1:9093", NODE_CONFIG, ca_cert=certs.ca_cert,
                                                         private_key=key)
    assert "--isolation process --host 127.0.0.1 --port 9094" in node
    assert shlex.split(runtime) == ["dpadmm", "node", "serve", "--runtime-api-address", "127.0.0.1:9094"]
    assert err == ""
    assert main(["deploy", "connection", "--name", "lab", "--address", "a:1", "--ca-cert", str(certs.ca_cert),
                 "--flwr-home", str(tmp_path / "home"), "--print"]) == 0
    assert "[superlink.lab]" in capsys.readouterr().out and not (tmp_path / "home").exists()


def test_cli_insecure_warns_once_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "superlink", "--insecure", "--print"]) == 0
    out, err = capsys.readouterr()
    assert shlex.split(out)[-1] == "--insecure"
    assert err.count(deploy.INSECURE_WARNING) == 1 and err.startswith("dpadmm: warning: INSECURE")
    assert main(["deploy", "supernode", "--superlink", "h:1", "--node-config", "partition-id=1", "--insecure",
                 "--print"]) == 0
    assert capsys.readouterr().err.count(deploy.INSECURE_WARNING) == 1


def test_a_fresh_supernode_command_warns_only_what_its_user_can_act_on() -> None:
    """In a process of its own (typer and click imported on the way, as on a device): the insecure warning
    alone, not click's deprecations addressed to typer's developers."""
    script = Path(sys.executable).with_name("dpadmm")
    command = [str(script), "deploy", "supernode", "--superlink", "h:1", "--node-config", "partition-id=1",
               "--insecure", "--print"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == f"dpadmm: warning: {deploy.INSECURE_WARNING}\n", done.stderr


def test_cli_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = [
        (["deploy", "superlink", "--print"], "certs missing"),
        (["deploy", "superlink", "--certs", str(tmp_path / "none"), "--print"], "ca.crt"),
        (["deploy", "superlink", "--certs", str(tmp_path), "--port", "70000", "--print"], "port=70000"),
        (["deploy", "supernode", "--superlink", "h:1", "--node-config", "partition-id=1", "--print"],
         "--ca-cert and --key missing"),
        (["deploy", "connection", "--name", "x", "--address", "a:1", "--flwr-home", str(tmp_path)],
         "ca_cert missing"),
        (["deploy", "connection", "--name", "a.b", "--address", "a:1", "--insecure", "--print"],
         "'a.b' is not allowed"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("dpadmm: error:") and message in err, (argv, err)


@pytest.mark.slow  # 7 s: a real SuperLink's start
def test_cli_execs_a_real_secure_superlink(tmp_path: Path, flwr_env: dict[str, str]) -> None:
    """`deploy superlink` becomes flower-superlink (same pid), serves our certificate, and `flwr` reaches it.

    The registration goes through the written connection (address and root-certificates) with a
    `deploy keys` public key. SuperNodes joining and being refused are in test_deployment.py (slow).
    """
    script = str(Path(sys.executable).with_name("dpadmm"))
    certs = deploy.make_certificates(tmp_path / "certs", ["127.0.0.1"])
    (key,) = deploy.make_node_keys(tmp_path / "keys", ["node-0"])
    (port,) = free_ports(1)
    assert main(["deploy", "connection", "--name", "lab", "--address", f"127.0.0.1:{port}",
                 "--ca-cert", str(certs.ca_cert), "--flwr-home", flwr_env["FLWR_HOME"]]) == 0
    log = tmp_path / "superlink.log"
    with open(log, "wb") as out:
        link = subprocess.Popen([script, "deploy", "superlink", "--certs", str(certs.ca_cert.parent),
                                 "--host", "127.0.0.1", "--port", str(port),
                                 "--database", str(tmp_path / "state.db")],
                                env=flwr_env, stdout=out, stderr=subprocess.STDOUT)
    try:
        client = ssl.create_default_context(cafile=str(certs.ca_cert))
        deadline = time.monotonic() + 60
        while True:
            assert link.poll() is None, log.read_text(errors="replace")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as sock, \
                        client.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
                    served = x509.load_der_x509_certificate(tls.getpeercert(binary_form=True))
                break
            except (ConnectionRefusedError, TimeoutError):
                assert time.monotonic() < deadline, log.read_text(errors="replace")
                time.sleep(0.2)
        assert served == _load_cert(certs.server_cert)
        # exec, not a child: the pid we started is the SuperLink itself.
        assert b"flower-superlink" in Path(f"/proc/{link.pid}/cmdline").read_bytes()
        flwr = str(Path(sys.executable).with_name("flwr"))
        registered = subprocess.run([flwr, "supernode", "register", f"{key}.pub", "lab", "--format", "json"],
                                    env=flwr_env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert registered.returncode == 0, registered.stdout + registered.stderr
        assert json.loads(registered.stdout)["success"] is True
    finally:
        link.terminate()
        link.wait(timeout=30)


# --- the data files of a deployment: nothing is written that no run could use ---------------------


def _adult_with_nan(folder: Path, binary_dir: Path) -> Path:
    """A copy of the real UCI Adult files whose training line 17 has age nan."""
    lines = head(binary_dir / "adult" / "adult.data.gz", 40_000)
    lines[16] = b"nan" + lines[16][lines[16].index(b","):]
    write_gz(folder / "adult.data.gz", lines)
    shutil.copy(binary_dir / "adult" / "adult.test.gz", folder / "adult.test.gz")
    return folder


@pytest.mark.parametrize(("agents", "samples", "message"), [
    (2, 100, "agents=2 is not allowed; give at least 3"),  # 004 needs a connected graph of 3 or more
    (0, 100, "agents=0 is not allowed; give at least 3"),
    (3, 0, "samples=0 is not allowed; it must be >= 1"),  # an agent with no sample
    (3, 20_000, "agents=3 x samples=20000 = 60000 rows, but adult has 30162 training rows"),
])
def test_agent_files_refuse_a_run_that_cannot_be(tmp_path: Path, binary_dir: Path, agents: int, samples: int,
                                                 message: str) -> None:
    out = tmp_path / "agents"
    with pytest.raises(ValueError, match=re.escape(message)):
        deploy.agent_files(binary_dir / "adult", agents, samples, 0, out)
    assert not out.exists()


def test_agent_files_refuse_bad_data_and_write_good_files(tmp_path: Path, binary_dir: Path) -> None:
    bad = _adult_with_nan(tmp_path / "adult", binary_dir)
    with pytest.raises(DataError, match=re.escape(f"{bad / 'adult.data.gz'} line 17: age is nan; allowed: "
                                                  "finite numbers")):
        deploy.agent_files(bad, 3, 5, 0, tmp_path / "none")
    assert not (tmp_path / "none").exists()
    paths = deploy.agent_files(binary_dir / "adult", 3, 5, 0, tmp_path / "good")
    assert [p.name for p in paths] == ["agent-0.npz", "agent-1.npz", "agent-2.npz"]
    for path in paths:  # what a device reads: its 5 samples of 14 columns in [0, 1], labels 0/1
        x, y = load_node_data(path, num_classes=2)
        assert x.shape == (5, 14) and set(y.tolist()) <= {0, 1}


@pytest.mark.parametrize(("parties", "message"), [
    ("60,60", "parties='60,60' cover 120 columns but the data set has 123; give widths that sum to 123"),
    ("100,30", "parties='100,30' cover 130 columns but the data set has 123"),
    ("0,123", "parties='0,123' is not allowed; give comma-separated positive column counts"),
    ("", "parties='' is not allowed"),
])
def test_vertical_files_refuse_widths_that_do_not_cover_the_columns(tmp_path: Path, binary_dir: Path,
                                                                    parties: str, message: str) -> None:
    out = tmp_path / "vertical"
    with pytest.raises(ValueError, match=re.escape(message)):
        deploy.vertical_files("a9a", binary_dir / "a9a", parties, out)
    assert not out.exists()


def test_vertical_files_refuse_bad_data(tmp_path: Path, binary_dir: Path) -> None:
    lines = head(binary_dir / "a9a" / "a9a.gz", 200)
    lines[16] = lines[16].rstrip(b"\n") + b" 124:1\n"
    path = write_gz(tmp_path / "a9a" / "a9a.gz", lines)
    shutil.copy(binary_dir / "a9a" / "a9a.t.gz", tmp_path / "a9a" / "a9a.t.gz")
    with pytest.raises(DataError, match=re.escape(f"{path} line 17: feature index 124 is beyond the declared "
                                                  "width 123 (allowed: 1..123)")):
        deploy.vertical_files("a9a", tmp_path / "a9a", "66,57", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["agents", "--agents", "2"], "agents=2 is not allowed; give at least 3"),
    (["agents", "--samples", "0"], "samples=0 is not allowed"),
    (["vertical", "--parties", "60,60"], "parties='60,60' cover 120 columns but the data set has 123"),
])
def test_cli_refuses_files_no_run_could_use(tmp_path: Path, binary_dir: Path,
                                            capsys: pytest.CaptureFixture[str], argv: list[str], message: str
                                            ) -> None:
    data = binary_dir / ("adult" if argv[0] == "agents" else "a9a")
    out = tmp_path / "out"
    assert main(["deploy", *argv, "--data-dir", str(data), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpadmm: error: ") and message in err and err.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize(("dataset", "agents", "partition", "pixels"), [
    ("default", 4, "dirichlet:0.5", True),  # the embedded MNIST sample, dealt with label skew
    ("femnist", 3, "contiguous", False),  # LEAF's values are no whole pixels: written as floats
])
def test_partition_files_hold_the_simulations_agents(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest, dataset: str,
        agents: int, partition: str, pixels: bool) -> None:
    """`dpadmm deploy partitions` writes each DP-IADMM agent's file: what the ClientApp reads from it is the
    simulation's agent of the same run config, and it prints each node's node config."""
    data_dir = str(request.getfixturevalue("femnist_dir")) if dataset == "femnist" else ""
    out = tmp_path / "partitions"
    argv = ["deploy", "partitions", "--dataset", dataset, "--num-agents", str(agents), "--partition",
            partition, "--partition-seed", "3", "--out", str(out)]
    argv += ["--data-dir", data_dir] if data_dir else []
    assert main(argv) == 0
    printed = capsys.readouterr().out
    config = RunConfig(dataset=dataset, data_dir=data_dir, num_agents=agents, partition=partition,
                       partition_seed=3)
    total = load_for(config).num_train
    for p in range(agents):
        path = out / f"agent-{p}.npz"
        node_config = {"partition-id": p, "data-path": str(path.resolve()), "num-samples-total": total}
        assert (f"  agent {p}'s device only: --node-config \"partition-id={p} data-path='{path.resolve()}' "
                f"num-samples-total={total}\"") in printed
        with np.load(path) as held:
            assert (held["x"].dtype == np.uint8) == pixels
        device = agent_data_for(config, node_config, num_classes=load_for(config).num_classes)
        simulated = agent_data(load_for(config), config, [p])
        assert device.total == simulated.total == total
        assert torch.equal(device.x, simulated.x) and torch.equal(device.y, simulated.y)
    assert f"iadmm.num-agents={agents} iadmm.partition='{partition}' iadmm.partition-seed=3" in printed
    assert main(argv) == 2  # the files exist: refused, kept
    assert "agent-0.npz exists; give an empty --out folder" in capsys.readouterr().err


def test_partition_files_refuse_a_run_that_cannot_be(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "partitions"
    assert main(["deploy", "partitions", "--partition", "shards", "--out", str(out)]) == 2
    assert "partition='shards' is not allowed" in capsys.readouterr().err
    assert main(["deploy", "partitions", "--dataset", "default", "--data-dir", str(tmp_path), "--out",
                 str(out)]) == 2
    assert "is not read by dataset='default'" in capsys.readouterr().err
    assert not out.exists()
