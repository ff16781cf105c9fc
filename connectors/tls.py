"""TLS for the connectors' clients (MySQL/MariaDB and Kafka): one way to build a verifying context, and
certificate failures turned into errors that say which setting to change.

A certificate that does not verify is a configuration error, not an outage: waiting does not fix it, so
it raises :class:`TlsVerificationError` (a :class:`~connectors.exceptions.ConfigurationError`: the
connector stops with status 2 and the message) instead of being retried forever as "server away".
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from connectors.exceptions import ConfigurationError

# OpenSSL's X509_V_ERR_* codes for a certificate that is not for the host asked for.
_HOSTNAME_MISMATCH_CODES = frozenset({62, 64})  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH
_EXPIRED_CODES = frozenset({9, 10})  # X509_V_ERR_CERT_NOT_YET_VALID, X509_V_ERR_CERT_HAS_EXPIRED


def require_readable(setting: str, path: Path | None) -> None:
    """ValueError naming ``setting`` when ``path`` is given but cannot be read (a typo, a missing mount)."""
    if path is None:
        return
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise ValueError(f"{setting}={path}: {exc.strerror or exc}; set it to a readable PEM file") from None


class TlsVerificationError(ConfigurationError):
    """The server's certificate did not verify (wrong CA, another host's certificate, expired)."""


def client_context(
    *,
    cafile: Path | None,
    certfile: Path | None = None,
    keyfile: Path | None = None,
    key_password: str | None = None,
    verify: bool = True,
    check_hostname: bool = True,
    context_class: type[ssl.SSLContext] = ssl.SSLContext,
) -> ssl.SSLContext:
    """A client-side TLS context: the server's certificate checked against ``cafile`` (the system's CAs
    when None), its name checked unless ``check_hostname`` is False, and a client certificate when
    ``certfile`` is given. ``verify=False`` encrypts without checking anything (MySQL's ``required``)."""
    context = context_class(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if verify:
        if cafile is not None:
            context.load_verify_locations(cafile=str(cafile))
        else:
            context.load_default_certs(ssl.Purpose.SERVER_AUTH)
        context.check_hostname = check_hostname
        context.verify_mode = ssl.CERT_REQUIRED
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if certfile is not None:
        context.load_cert_chain(
            str(certfile), keyfile=str(keyfile) if keyfile is not None else None, password=key_password
        )
    return context


def explain_verification(
    service: str,
    where: str,
    reason: str,
    *,
    verify_code: int | None,
    ca_setting: str,
    cafile: Path | None,
    host_setting: str,
    hostname_hint: str,
) -> str:
    """What a user reads when ``service`` at ``where`` presented a certificate that did not verify:
    the reason, and the setting that fixes it."""
    if verify_code in _HOSTNAME_MISMATCH_CODES or "mismatch" in reason.lower():
        return (
            f"the {service} certificate at {where} is not for the name freshkey connects to ({reason}): "
            f"connect by a name the certificate carries ({host_setting}), or {hostname_hint}"
        )
    if verify_code in _EXPIRED_CODES or "expired" in reason.lower():
        return f"the {service} certificate at {where} is expired or not valid yet ({reason}): renew it"
    trusted = f"{ca_setting}={cafile}" if cafile is not None else f"the system's CAs ({ca_setting} unset)"
    return (
        f"the {service} certificate at {where} does not verify against {trusted} ({reason}): set "
        f"{ca_setting} to the CA certificate (PEM) that signed the server's certificate"
    )


class MySQLClientContext(ssl.SSLContext):
    """An SSLContext for pymysql (``ssl=``) whose verification failures raise
    :class:`TlsVerificationError` naming the settings to change, instead of pymysql's retriable
    "Can't connect" (error 2003). ``describe`` is set by :func:`mysql_context`."""

    describe: dict[str, Any]

    def wrap_socket(self, sock: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().wrap_socket(sock, *args, **kwargs)
        except ssl.SSLCertVerificationError as exc:
            raise TlsVerificationError(
                explain_verification(
                    "MySQL server's",
                    str(self.describe.get("where", "?")),
                    str(exc.verify_message or exc.reason or exc),
                    verify_code=exc.verify_code,
                    ca_setting="FRESHKEY_MYSQL_SSL_CA",
                    cafile=self.describe.get("cafile"),
                    host_setting="FRESHKEY_MYSQL_HOST",
                    hostname_hint="set FRESHKEY_MYSQL_SSL_MODE=verify-ca to check the CA only",
                )
            ) from None
