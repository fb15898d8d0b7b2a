"""Secure deployment helpers: a development CA, SuperNode keys, and the Flower commands.

A Flower deployment is one SuperLink (the server machine) and one SuperNode per device.
dpadmm deploys it **secure by default**:

- TLS: the SuperLink serves HTTPS with a certificate signed by a CA that every SuperNode
  and the ``flwr`` CLI trust (``--root-certificates``). :func:`make_certificates` creates a
  *development* CA and a server certificate for the given host names and addresses; in
  production use your organisation's CA instead, the commands stay the same.
- SuperNode authentication: the SuperLink runs with ``--enable-supernode-auth`` and only
  accepts SuperNodes whose public key an operator registered (``flwr supernode register``).
  :func:`make_node_keys` creates the P-384 key pairs Flower expects (OpenSSH format).

:func:`superlink_command` and :func:`supernode_command` build the ``flower-superlink`` and
``flower-supernode`` command lines with those settings. Insecure mode (no TLS, no
authentication) is only produced with ``insecure=True``, and then with a warning: it sends
the model, the duals and each agent's z_p in clear text and lets any process join.

For ADMM sharing (001, vertical learning) :func:`vertical_files` cuts a data set into the files
a deployment starts from: one per party with its column block, and the server's labels; for 004
(decentralised local DP) :func:`agent_files` writes one file of samples per agent; for DP-IADMM
:func:`partition_files` writes one file per agent, its block of the simulation's partition.
"""

from __future__ import annotations

import datetime
import ipaddress
import re
import shlex
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dpadmm.files import write_atomic

INSECURE_WARNING = (
    "INSECURE deployment: no TLS and no SuperNode authentication. The global model, every "
    "lambda_p and z_p travel in clear text, and any process that reaches the port can join as an "
    "agent. Use this only on a trusted loopback or test network."
)
CERT_DAYS = 365
# A node key's file name, and a connection name (a TOML bare key, so `[superlink.<name>]` is one table).
_BARE_NAME = re.compile(r"[A-Za-z0-9._-]+")
_CONNECTION_NAME = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class Certificates:
    """Paths of a development CA and the SuperLink's certificate and key (PEM)."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def make_certificates(out: str | Path, hosts: Sequence[str], days: int = CERT_DAYS) -> Certificates:
    """A development CA (``ca.crt``) and a SuperLink certificate (``server.crt``, ``server.key``).

    ``hosts`` are the names and IP addresses the SuperNodes use to reach the SuperLink (every
    one goes into the certificate's subject alternative names, which TLS checks). Keys are
    ECDSA P-384. The CA's private key is not kept: nothing else is ever signed with it, so it
    cannot leak. Existing files are refused rather than overwritten (a new CA would lock out
    every device that trusts the old one).
    """
    hosts = [h.strip() for h in hosts if h.strip()]
    if not hosts:
        raise ValueError("hosts is empty: give the SuperLink's host names or IP addresses, e.g. 127.0.0.1")
    for host in hosts:
        _check_host("hosts", host)
    if days < 1:
        raise ValueError(f"days={days} is not allowed; it must be >= 1")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = Certificates(out / "ca.crt", out / "server.crt", out / "server.key")
    existing = [str(p) for p in (paths.ca_cert, paths.server_cert, paths.server_key) if p.exists()]
    if existing:
        raise FileExistsError(f"{', '.join(existing)} already exist; remove them or choose another folder")
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dpadmm development CA")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     key_cert_sign=True, crl_sign=True, encipher_only=False,
                                     decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA384())
    )
    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name).public_key(server_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days))
        .add_extension(_san(hosts), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    pem = serialization.Encoding.PEM
    write_atomic(paths.server_key, server_key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                            serialization.NoEncryption()), private=True)
    write_atomic(paths.server_cert, server_cert.public_bytes(pem))
    write_atomic(paths.ca_cert, ca_cert.public_bytes(pem))
    return paths


def make_node_keys(out: str | Path, names: Sequence[str]) -> list[Path]:
    """One SuperNode key pair per name: ``<name>`` (private, mode 0600) and ``<name>.pub``.

    Flower's SuperNode authentication wants an ECDSA key on a NIST curve in OpenSSH format
    (the format of ``ssh-keygen -t ecdsa -b 384``). Returns the private key paths; the
    ``.pub`` files are what the operator registers with ``flwr supernode register``.
    """
    if not names:
        raise ValueError("names is empty: give one name per SuperNode, e.g. node-0")
    # Every name is checked before the first key is written, so a bad list leaves no half-made set.
    for name in names:
        if not _BARE_NAME.fullmatch(name) or name.startswith("."):
            raise ValueError(f"node name {name!r} is not allowed; use letters, digits, '.', '-' and '_' "
                             "(not starting with '.')")
    repeated = sorted({name for name in names if list(names).count(name) > 1})
    if repeated:
        raise ValueError(f"node names {', '.join(repeated)} repeat; every SuperNode needs its own key")
    out = Path(out)
    existing = [str(p) for name in names for p in (out / name, out / (name + ".pub")) if p.exists()]
    if existing:
        raise FileExistsError(f"{', '.join(existing)} already exist; remove them or choose other names")
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names:
        path = out / name
        key = ec.generate_private_key(ec.SECP384R1())
        write_atomic(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                             serialization.NoEncryption()), private=True)
        write_atomic(path.with_name(name + ".pub"),
                     key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                   serialization.PublicFormat.OpenSSH) + b"\n")
        paths.append(path)
    return paths


def vertical_files(dataset: str, data_dir: str | Path, parties: str, out: str | Path) -> list[Path]:
    """The files of an ADMM-sharing deployment: ``party-<m>.npz`` for each of ``parties`` ("66,57") and the
    server's ``labels.npz``, cut from ``dataset`` in ``data_dir``, with ids = the row numbers
    (:func:`dpadmm.data.vertical.write_vertical_files`); the labels' path comes last.

    Outside a test the parties' data would already live apart; these files stand in for them, laid out
    as a deployment reads them, so that a deployment can be tried with the data sets of 001.

    Nothing is written unless a run could use the files: the family's configuration accepts ``dataset``
    and ``parties`` (at least one party, each at least one column), the loader accepts the data set,
    the widths cover its columns exactly and every file passes the checks its reader applies.
    """
    from dpadmm.data.vertical import load_vertical, write_vertical_files
    from dpadmm.sharing.config import SharingConfig

    widths = SharingConfig(dataset=dataset, parties=parties).widths
    return write_vertical_files(load_vertical(dataset, data_dir), widths, out)


def agent_files(data_dir: str | Path, agents: int, samples: int, seed: int, out: str | Path,
                partition: str = "contiguous") -> list[Path]:
    """The files of a 004 deployment: ``agent-<i>.npz`` for each of ``agents`` agents, its ``samples`` rows of
    UCI Adult in ``data_dir`` as the run of ``seed`` draws and ``partition`` deals them
    (:func:`dpadmm.decentral.problem.write_agent_files`), so that a deployment on them equals the
    simulation. Outside a test each agent's data would already live on its device.

    Nothing is written unless a run could use the files: the family's configuration accepts ``agents``,
    ``samples``, ``seed`` and ``partition`` on any graph (at least 3 agents, at least one sample each), the
    training set has ``agents`` x ``samples`` rows to draw, and its rows pass the checks a device applies to
    its file (:func:`dpadmm.data.node.check_samples`, with labels 0/1); those checks go row by row, so
    every agent's rows pass them too.
    """
    from dpadmm.data.adult import load_adult
    from dpadmm.data.node import check_samples
    from dpadmm.decentral.config import DecentralConfig
    from dpadmm.decentral.problem import write_agent_files

    # A complete graph adds no rule of its own; a random one adds only the edge count, which is the run's.
    DecentralConfig(agents=agents, samples=samples, seed=seed, graph="complete", partition=partition)
    dataset = load_adult(data_dir)
    check_samples(dataset.x_train.numpy(), dataset.y_train.numpy(), f"{data_dir} (UCI Adult's training rows)",
                  num_classes=2)
    return write_agent_files(dataset, agents, samples, seed, out, partition)


def partition_files(dataset: str, data_dir: str | Path, num_agents: int, out: str | Path,
                    partition: str = "contiguous", partition_seed: int = 0) -> tuple[list[Path], int]:
    """The files of a DP-IADMM deployment and I, its ``num-samples-total``: ``agent-<p>.npz`` for each of
    the run's agents (``num_agents``; 0: the data set's count), its block of ``dataset`` as the simulation
    deals it (:func:`dpadmm.iadmm.federation.load_for`, :meth:`dpadmm.data.Dataset.partition`), in the layout
    :func:`dpadmm.data.node.load_node_data` reads: ``x`` as uint8 pixels where the values are whole pixels
    (MNIST and its embedded sample), else float64 in [0, 1] (FEMNIST's), so that a device reads back exactly
    the simulation's samples, and ``y``. Outside a test each agent's data would already live on its device.

    Nothing is written unless a run could use the files: DP-IADMM's configuration accepts ``dataset``,
    ``data_dir``, ``num_agents``, ``partition`` and ``partition_seed``, the data set loads and is dealt, and
    no file of the set exists yet.
    """
    import numpy as np

    from dpadmm.data.checks import write_npz
    from dpadmm.iadmm.config import RunConfig
    from dpadmm.iadmm.federation import load_for

    config = RunConfig(dataset=dataset, data_dir=str(data_dir), num_agents=num_agents, partition=partition,
                       partition_seed=partition_seed)
    loaded = load_for(config)
    blocks = loaded.partition(config.num_agents)
    folder = Path(out).expanduser()
    paths = [folder / f"agent-{p}.npz" for p in range(config.num_agents)]
    taken = [str(p) for p in paths if p.exists()]
    if taken:
        raise FileExistsError(f"{taken[0]} exists; give an empty --out folder")
    folder.mkdir(parents=True, exist_ok=True)
    for path, block in zip(paths, blocks, strict=True):
        x = loaded.x_train[block].numpy()
        pixels = np.rint(x * 255.0)
        if np.array_equal(pixels / 255.0, x):  # what the reader computes from uint8: the same values
            x = pixels.astype(np.uint8)
        write_npz(path, x=x, y=loaded.y_train[block].numpy())
    return paths, loaded.num_train


def superlink_command(certs: str | Path | None, *, host: str = "0.0.0.0", port: int = 9093,
                      database: str | Path | None = None, insecure: bool = False) -> list[str]:
    """The ``flower-superlink`` command: TLS from ``certs`` and SuperNode authentication.

    ``database`` keeps the SuperLink's state (registered SuperNodes, runs) in a file, so a
    restarted SuperLink still knows the registered keys. The ServerApp runs in this
    environment (no runtime dependency installation).
    """
    _check_port(port)
    _check_host("host", host)
    command = ["flower-superlink", "--host", host, "--port", str(port),
               "--disable-runtime-dependency-installation"]
    if database is not None:
        command += ["--database", str(database)]
    if insecure:
        warnings.warn(INSECURE_WARNING, stacklevel=2)
        return [*command, "--insecure"]
    certs = _certs(certs)
    return [*command, "--ssl-ca-certfile", str(certs.ca_cert), "--ssl-certfile", str(certs.server_cert),
            "--ssl-keyfile", str(certs.server_key), "--enable-supernode-auth"]


def supernode_command(superlink: str, node_config: str, *, ca_cert: str | Path | None = None,
                      private_key: str | Path | None = None, port: int = 9094,
                      insecure: bool = False) -> list[str]:
    """The ``flower-supernode`` command for one device.

    ``superlink`` is ``host:port`` of the SuperLink, ``node_config`` the agent's node config
    (``partition-id=3 data-path='/data/agent.npz' num-samples-total=60000``), ``ca_cert``
    the CA that signed the SuperLink's certificate, ``private_key`` the node's registered
    key. ``port`` is the node's local runtime API (distinct per SuperNode on one machine), served on the
    device's loopback only. With ``--isolation process`` the SuperNode starts no ClientApp of its own: the
    device's runtime (:func:`runtime_command`) answers its messages with the installed dpadmm, never with
    the code of the run's FAB (:mod:`clients.runtime`).
    """
    _check_port(port)
    check_address(superlink)
    _check_node_config(node_config)
    command = ["flower-supernode", "--superlink", superlink, "--node-config", node_config,
               "--isolation", "process", "--host", "127.0.0.1", "--port", str(port)]
    if insecure:
        warnings.warn(INSECURE_WARNING, stacklevel=2)
        return [*command, "--insecure"]
    missing = [name for name, value in (("ca_cert", ca_cert), ("private_key", private_key)) if value is None]
    if missing:
        raise ValueError(f"{' and '.join(missing)} missing: a secure SuperNode needs the CA certificate and "
                         "its registered private key (or insecure=True, explicitly)")
    for path in (ca_cert, private_key):
        if not Path(str(path)).is_file():
            raise FileNotFoundError(f"{path} does not exist")
    return [*command, "--root-certificates", str(ca_cert), "--auth-supernode-private-key", str(private_key)]


def runtime_command(port: int = 9094) -> list[str]:
    """The device's runtime (``dpadmm node serve``) for the SuperNode whose runtime API is on ``port``: it
    answers that SuperNode's messages with the installed dpadmm (:mod:`clients.runtime`)."""
    _check_port(port)
    return ["dpadmm", "node", "serve", "--runtime-api-address", f"127.0.0.1:{port}"]


def connection_toml(name: str, address: str, ca_cert: str | Path | None, insecure: bool = False) -> str:
    """The ``[superlink.<name>]`` block of ``$FLWR_HOME/config.toml`` for ``flwr run . <name>``.

    ``name`` must be a TOML bare key: a dot would make ``[superlink.a.b]`` a nested table
    that ``flwr`` does not read as a connection. Values are written as escaped TOML strings,
    so a quote or backslash in a path cannot break the user's configuration file.
    """
    if not _CONNECTION_NAME.fullmatch(name):
        raise ValueError(f"connection name {name!r} is not allowed; use letters, digits, '-' and '_'")
    check_address(address, "address")
    lines = [f"[superlink.{name}]", f"address = {_toml_string(address)}"]
    if insecure:
        warnings.warn(INSECURE_WARNING, stacklevel=2)
        lines.append("insecure = true")
    else:
        if ca_cert is None:
            raise ValueError("ca_cert missing: the flwr CLI needs the CA certificate (or insecure=True)")
        if not Path(ca_cert).is_file():
            raise FileNotFoundError(f"{ca_cert} does not exist; create it with `dpadmm deploy certs`")
        lines.append(f"root-certificates = {_toml_string(str(Path(ca_cert).resolve()))}")
    return "\n".join(lines) + "\n"


def _toml_string(value: str) -> str:
    """``value`` as a TOML basic string (quotes, backslashes and control characters escaped)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    escaped = "".join(f"\\u{ord(c):04X}" if ord(c) < 0x20 or ord(c) == 0x7F else c for c in escaped)
    return f'"{escaped}"'


_ADDRESS = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?):(\d{1,5})")
_DNS_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}"
                       r"[A-Za-z0-9])?)*\.?")
# What a SuperNode's node config may hold: the keys dpadmm's clients read (Flower drops a token without "=")
NODE_KEYS = ("partition-id", "num-partitions", "data-path", "num-samples-total", "labels-path", "writer",
             "randomness", "state-dir")


SUPERLINK_ADDRESS = ("the SuperLink's HOST:PORT, e.g. 192.168.1.10:9092, superlink.example.org:9092 or "
                     "[fd00::1]:9092")
RUNTIME_API_ADDRESS = ("the SuperNode's runtime API, HOST:PORT with the port in 1..65535 (the SuperNode's "
                       "--port), e.g. 127.0.0.1:9094")


def check_address(address: str, name: str = "superlink", wanted: str = SUPERLINK_ADDRESS) -> None:
    """``host:port`` (an IPv6 host in brackets), the port in 1..65535: what flower-supernode (or the device's
    runtime, ``dpadmm node serve``) would only refuse after it started, on the device, or keep retrying.
    The error names ``name``, the value and ``wanted``."""
    match = _ADDRESS.fullmatch(address or "")
    if match is None or not 1 <= int(match.group(1)) <= 65535:
        raise ValueError(f"{name}={address!r} is not allowed; give {wanted}")


def _check_host(name: str, host: str) -> None:
    """An IP address or a DNS name: anything else would go into a certificate (or a bind address) that no
    client can ever match."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not (len(host) <= 253 and _DNS_NAME.fullmatch(host)):
            raise ValueError(f"{name}={host!r} is not allowed; give an IP address or a DNS name, e.g. "
                             "192.168.1.10 or superlink.example.org") from None


def _check_node_config(text: str) -> None:
    """The node config as Flower parses it (space-separated TOML ``key=value`` pairs), with the agent's
    ``partition-id`` a whole number >= 0: each dpadmm client answers the server with it."""
    from flwr.common.config import parse_config_args

    example = "e.g. \"partition-id=0 data-path='/data/agent-0.npz'\""
    try:
        config = parse_config_args([text])
        loose = [token for token in shlex.split(text) if "=" not in token]
    except Exception as err:  # noqa: BLE001 - click's exception (a TOML error below it): said as ours
        raise ValueError(f"node-config={text!r} is not allowed: Flower reads it as space-separated TOML "
                         f"key=value pairs, {example}") from err
    if loose:  # Flower drops them without a word
        raise ValueError(f"node-config={text!r} is not allowed: {loose[0]!r} is no key=value pair; {example}")
    unknown = sorted(set(config) - set(NODE_KEYS))
    if unknown:
        raise ValueError(f"node-config key {unknown[0]!r} is not read by dpadmm's clients; the keys are "
                         f"{', '.join(NODE_KEYS)}")
    partition = config.get("partition-id")
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise ValueError(f"node-config={text!r} is not allowed: partition-id={partition!r} must be the "
                         "agent's number, a whole number >= 0 (e.g. partition-id=0)")


def _check_port(port: int) -> None:
    if not 1 <= port <= 65535:
        raise ValueError(f"port={port} is not allowed; it must be in 1..65535")


def _certs(certs: str | Path | None) -> Certificates:
    if certs is None:
        raise ValueError("certs missing: a secure SuperLink needs the folder of make_certificates "
                         "(dpadmm deploy certs), or insecure=True, explicitly")
    folder = Path(certs)
    paths = Certificates(folder / "ca.crt", folder / "server.crt", folder / "server.key")
    missing = [str(p) for p in (paths.ca_cert, paths.server_cert, paths.server_key) if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{', '.join(missing)} missing; create them with `dpadmm deploy certs`")
    return paths
