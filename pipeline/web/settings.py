"""Settings of the worker's HTTP surface (``FRESHKEY_WORKER_WEB_TOKEN``, ``_WEB_SHOW_VALUES``,
``FRESHKEY_WORKER_FAUST_PAGES``)."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class WebSettings(BaseSettings):
    """Who may read the worker's pages, and what they show. Bind address and port stay in
    :class:`~pipeline.settings.WorkerSettings` (``FRESHKEY_WORKER_WEB_BIND``, ``_WEB_PORT``)."""

    model_config = SettingsConfigDict(
        env_prefix="FRESHKEY_WORKER_", extra="ignore", frozen=True, hide_input_in_errors=True
    )

    web_token: SecretStr | None = Field(
        None,
        description="Bearer token every route but /freshkey/health requires (Authorization: Bearer "
        "<token>; a browser logs in once at /freshkey/login or with ?token= and keeps a cookie). Unset: "
        "no authentication (bind FRESHKEY_WORKER_WEB_BIND to 127.0.0.1 then). At least 16 characters.",
    )
    web_show_values: bool = Field(
        False,
        description="Let /freshkey/verify show row values in its examples (by default only keys and "
        "versions: quoted values are replaced by <hidden>).",
    )
    faust_pages: bool = Field(
        False,
        description="Serve Faust's own pages (/router, /table, /graph, statistics at /); off by default: "
        "they show table contents and internals.",
    )

    @field_validator("web_token", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("web_token")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 16:
            raise ValueError("shorter than 16 characters: use a random token (openssl rand -hex 32)")
        if value is not None and not value.get_secret_value().isascii():
            raise ValueError("the token must be ASCII (openssl rand -hex 32)")
        return value


def web_settings(settings: object) -> WebSettings:
    """The web settings of ``settings`` (an ``AllSettings``) when it carries them (``.web``), else read from
    the environment (``FRESHKEY_WORKER_*``), with errors that name the variable."""
    found = getattr(settings, "web", None)
    if isinstance(found, WebSettings):
        return found
    from pipeline.config import load_settings

    return load_settings(WebSettings)
