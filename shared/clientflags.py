"""The flags every client of Echo spells the same way, and what they resolve to: the bearer token
(``--token-file`` or ``$RANKECHO_TOKEN``; ``--token`` where kept, visible to ``ps``) and TLS for the OTLP
producers (plaintext by default with a loud warning; ``--tls``, ``--ca-file``, ``--cert-file``,
``--key-file``; ``--insecure`` accepts plaintext quietly). The agent, ``rankecho stress`` and ``rankecho
sim`` share them; ``diagnose``, ``explain`` and ``query --mcp-url`` read the MCP token the same way.

Import-light (argparse and os only): the CLI modules import it at ``--help`` time. Usage::

    add_tls_options(parser)
    token = read_token(args.token_file, os.environ, token=args.token)
    if (warning := plaintext_warning("rankecho stress", args.endpoint, tls_wanted(args), args.insecure)):
        print(warning, file=sys.stderr)
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path

TOKEN_ENV = "RANKECHO_TOKEN"
MCP_TOKEN_ENV = "RANKECHO_MCP_TOKEN"
TOKEN_FLAG_HELP = (
    "bearer token on the command line: visible to every user of this machine in `ps`; prefer "
    f"--token-file or ${TOKEN_ENV}"
)
TLS_FLAGS_HINT = "pass --tls (system roots) or --ca-file FILE (a private CA)"


class TokenFileError(ValueError):
    """The token file could not be read; the message names the flag and the file."""


def add_token_options(p: argparse.ArgumentParser, *, token_flag: bool = False, env: str = TOKEN_ENV) -> None:
    """``--token-file`` (and, where it already existed, ``--token``)."""
    p.add_argument("--token-file", metavar="FILE", help=f"file holding Echo's bearer token (default: ${env})")
    if token_flag:
        p.add_argument("--token", help=TOKEN_FLAG_HELP)


def read_token(
    token_file: str | None,
    env: Mapping[str, str],
    env_names: Sequence[str] = (TOKEN_ENV,),
    *,
    token: str | None = None,
    flag: str = "--token-file",
) -> str | None:
    """The bearer token: ``token`` (a ``--token`` flag) if given, else the stripped content of
    ``token_file``, else the first non-empty of ``env_names``; None when there is none."""
    if token:
        return token
    if token_file:
        try:
            return Path(token_file).read_text(encoding="utf-8").strip() or None
        except OSError as exc:
            raise TokenFileError(f"cannot read {flag} {token_file}: {exc.strerror}") from exc
    return next((env[name].strip() for name in env_names if env.get(name, "").strip()), None)


def add_tls_options(p: argparse.ArgumentParser) -> None:
    """The OTLP producers' TLS flags (the agent's spelling): plaintext unless one of them asks for TLS."""
    p.add_argument(
        "--insecure",
        action="store_true",
        help="plaintext gRPC (the default) without the warning, even with a token",
    )
    p.add_argument("--tls", action="store_true", help="TLS with the system's root certificates")
    p.add_argument("--ca-file", metavar="FILE", help="CA bundle for Echo's certificate (implies TLS)")
    p.add_argument("--cert-file", metavar="FILE", help="client certificate for mutual TLS")
    p.add_argument("--key-file", metavar="FILE", help="client key for mutual TLS")


def tls_wanted(args: argparse.Namespace) -> bool:
    """TLS when ``--tls``, ``--ca-file`` or an ``https://`` endpoint asks for it, unless ``--insecure``."""
    asked = args.tls or args.ca_file or str(args.endpoint).startswith("https://")
    return bool(asked) and not args.insecure


def plaintext_warning(prog: str, endpoint: str, tls: bool, insecure: bool) -> str | None:
    """The loud warning a plaintext producer prints, unless TLS is on or ``--insecure`` accepted it."""
    if tls or insecure:
        return None
    return (
        f"{prog}: WARNING: plaintext gRPC to {endpoint}: the token and the data cross the network "
        f"unencrypted; {TLS_FLAGS_HINT} for TLS, or --insecure to accept plaintext without this warning"
    )
