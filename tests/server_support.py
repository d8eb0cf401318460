"""Helpers for tests/test_server_*.py: a real store from real text, stubs, a self-signed TLS CA."""
from __future__ import annotations

import datetime
import ipaddress
import json
import random
import sys
import urllib.request
from pathlib import Path

import grpc
import numpy as np

from builder.tokenizer import tokenizer_info
from builder.writer import write_datastore
from protos.draftstore.v1 import draftstore_pb2_grpc as pb_grpc

# Real Python source as the corpus: code repeats itself, so drafts have depth and counts > 1.
CORPUS_MODULES = ("json/decoder.py", "json/encoder.py", "argparse.py", "textwrap.py",
                  "string.py", "shlex.py", "fnmatch.py", "glob.py")
HELD_OUT_MODULES = ("configparser.py", "csv.py")
# Test clients reconnect quickly, so a poll loop sees a server as soon as it listens.
FAST_RECONNECT = [("grpc.initial_reconnect_backoff_ms", 20), ("grpc.min_reconnect_backoff_ms", 20),
                  ("grpc.max_reconnect_backoff_ms", 100)]


def stdlib(name: str) -> str:
    return (Path(json.__file__).parent.parent / name).read_text()


def encode(tokenizer, text: str) -> np.ndarray:
    return np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)


def build_store(path: Path, tokenizer, shard_tokens: int = 20_000, modules=CORPUS_MODULES
                ) -> list[np.ndarray]:
    """Each module's source split into ~40-line documents; -> the documents written."""
    docs = []
    for name in modules:
        lines = stdlib(name).splitlines(keepends=True)
        docs += [encode(tokenizer, "".join(lines[i:i + 40])) for i in range(0, len(lines), 40)]
    write_datastore(path, docs, tokenizer_info(tokenizer, "smollm2"), shard_tokens=shard_tokens)
    return docs


def sample_contexts(tokenizer, docs: list[np.ndarray], n: int, seed: int = 0) -> list[list[int]]:
    """Half cut from the corpus (long matches), half from held-out modules (short or none)."""
    rng = random.Random(seed)
    held = [encode(tokenizer, stdlib(m)) for m in HELD_OUT_MODULES]
    out = []
    for i in range(n):
        src = rng.choice(docs) if i % 2 == 0 else rng.choice(held)
        cut = rng.randint(1, len(src))
        out.append(src[max(0, cut - rng.randint(1, 40)):cut].tolist())
    return out


def stub_for(address: str, creds: grpc.ChannelCredentials | None = None, options=(),
             ) -> tuple[grpc.Channel, pb_grpc.DraftServiceStub]:
    options = list(options) + FAST_RECONNECT
    ch = (grpc.secure_channel(address, creds, options=options) if creds is not None
          else grpc.insecure_channel(address, options=options))
    return ch, pb_grpc.DraftServiceStub(ch)


def scrape(port: int) -> dict[str, float]:
    """Prometheus text from http://127.0.0.1:port/metrics as {'name{labels}': value}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def make_ca_and_cert(folder: Path) -> dict[str, Path]:
    """A self-signed CA, a server cert for localhost/127.0.0.1 and a client cert, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def cert(subject, key, issuer, issuer_key, ca: bool, sans=(), usage=None):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        if usage:
            b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    def write(stem: str, crt, key) -> None:
        (folder / f"{stem}.crt").write_bytes(crt.public_bytes(serialization.Encoding.PEM))
        (folder / f"{stem}.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = cert(name("draftstore test CA"), ca_key, name("draftstore test CA"), ca_key, True)
    write("ca", ca, ca_key)
    srv_key = ec.generate_private_key(ec.SECP256R1())
    sans = (x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    write("server", cert(name("localhost"), srv_key, ca.subject, ca_key, False, sans,
                         ExtendedKeyUsageOID.SERVER_AUTH), srv_key)
    cli_key = ec.generate_private_key(ec.SECP256R1())
    write("client", cert(name("decoder-node"), cli_key, ca.subject, ca_key, False, (),
                         ExtendedKeyUsageOID.CLIENT_AUTH), cli_key)
    return {k: folder / f"{k}.{ext}" for k in ("ca", "server", "client") for ext in ("crt",)} | {
        f"{k}_key": folder / f"{k}.key" for k in ("ca", "server", "client")}


def serve_command(store: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "datastore.serve_cli", str(store), *args]
