"""`kvtier serve`'s HTTP options beside the API: CORS, a proxy's root path, TLS, the access log.

Named as `vllm serve` names them (`--allowed-origins '["https://a.example"]'`, `--root-path`,
`--ssl-keyfile`, ...), with vLLM's defaults: every origin allowed, no credentials. CORS sits
outside the API-key check (`app.py`, `_add_middleware`), so a browser's preflight (OPTIONS, which
carries no key) is answered and a 401 still carries the headers the page needs to read it.
"""

from __future__ import annotations

import argparse
import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.config import ConfigError

_ANY = ("*",)


@dataclass(frozen=True)
class CorsOptions:
    """Starlette's CORSMiddleware settings; vLLM's defaults."""

    allowed_origins: tuple[str, ...] = _ANY
    allowed_methods: tuple[str, ...] = _ANY
    allowed_headers: tuple[str, ...] = _ANY
    allow_credentials: bool = False

    def middleware_kwargs(self) -> dict[str, Any]:
        return dict(allow_origins=list(self.allowed_origins), allow_methods=list(self.allowed_methods),
                    allow_headers=list(self.allowed_headers), allow_credentials=self.allow_credentials)


@dataclass(frozen=True)
class TLSOptions:
    """uvicorn's TLS settings: serve HTTPS when `certfile` and `keyfile` are given."""

    keyfile: Path | None = None
    certfile: Path | None = None
    ca_certs: Path | None = None
    cert_reqs: int = int(ssl.CERT_NONE)  # CERT_REQUIRED: clients must show a cert from ca_certs

    def __post_init__(self) -> None:
        if (self.keyfile is None) != (self.certfile is None):
            raise ConfigError("--ssl-keyfile and --ssl-certfile go together: give both or neither")
        if self.keyfile is None and (self.ca_certs is not None or self.cert_reqs != ssl.CERT_NONE):
            raise ConfigError("--ssl-ca-certs and --ssl-cert-reqs need --ssl-keyfile and --ssl-certfile")
        for name, path in (("--ssl-keyfile", self.keyfile), ("--ssl-certfile", self.certfile),
                           ("--ssl-ca-certs", self.ca_certs)):
            if path is not None and not path.is_file():
                raise ConfigError(f"{name}: no such file: {path}")

    def uvicorn_kwargs(self) -> dict[str, Any]:
        if self.keyfile is None:
            return {}
        return dict(ssl_keyfile=str(self.keyfile), ssl_certfile=str(self.certfile),
                    ssl_ca_certs=str(self.ca_certs) if self.ca_certs else None,
                    ssl_cert_reqs=self.cert_reqs)


def _json_list(flag: str):
    """An argparse type: a JSON list of strings, as vLLM's --allowed-* take."""

    def parse(text: str) -> tuple[str, ...]:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise argparse.ArgumentTypeError(f"{flag} takes a JSON list of strings, e.g. "
                                             f'\'["https://a.example"]\', got {text!r}')
        return tuple(value)

    return parse


def add_http_args(http: argparse._ArgumentGroup) -> None:
    """CORS, --root-path, TLS and the access log, on the HTTP group of `kvtier serve`."""
    for flag, what in (("--allowed-origins", "origins"), ("--allowed-methods", "methods"),
                       ("--allowed-headers", "request headers")):
        http.add_argument(flag, type=_json_list(flag), default=_ANY,
                          help=f'CORS: the {what} browsers may use, a JSON list (default ["*"])')
    http.add_argument("--allow-credentials", action="store_true",
                      help="CORS: let browsers send cookies and auth headers cross-origin")
    http.add_argument("--root-path", default="",
                      help="the path prefix a reverse proxy serves the API under and strips "
                      "(uvicorn's root_path; /openapi.json names it)")
    http.add_argument("--ssl-keyfile", type=Path, default=None, help="serve HTTPS with this private key")
    http.add_argument("--ssl-certfile", type=Path, default=None, help="... and this certificate chain")
    http.add_argument("--ssl-ca-certs", type=Path, default=None,
                      help="CA certificates to check client certificates against")
    http.add_argument("--ssl-cert-reqs", type=int, default=int(ssl.CERT_NONE), choices=(0, 1, 2),
                      help="client certificates: 0 not asked, 1 optional, 2 required (Python's ssl)")
    http.add_argument("--disable-uvicorn-access-log", action="store_true",
                      help="no log line per request")


def root_path_from_args(args: argparse.Namespace) -> str:
    root = args.root_path.rstrip("/")
    if root and not root.startswith("/"):
        raise ConfigError(f"--root-path must start with '/', got {args.root_path!r}")
    return root


def cors_from_args(args: argparse.Namespace) -> CorsOptions:
    return CorsOptions(allowed_origins=args.allowed_origins, allowed_methods=args.allowed_methods,
                       allowed_headers=args.allowed_headers, allow_credentials=args.allow_credentials)


def tls_from_args(args: argparse.Namespace) -> TLSOptions:
    return TLSOptions(keyfile=args.ssl_keyfile, certfile=args.ssl_certfile, ca_certs=args.ssl_ca_certs,
                      cert_reqs=args.ssl_cert_reqs)
