"""`TomlSettings`: the base of edgerun's settings classes (the backend's and the gateway's).

Sources, highest first: constructor arguments (a CLI's flags), `EDGERUN_*` environment variables
(nested with `__`, e.g. `EDGERUN_ENGINE__NUM_KV_BLOCKS=4096`), the TOML file named by
`EDGERUN_CONFIG`, then the subclass's defaults. The object is frozen: built once at start-up and
passed down. In `contracts` because the gateway and the backends both build on it.

A value refused at start-up is never printed back: pydantic's errors name the setting and the
problem but leave out the input (`hide_input_in_errors`), since it may be a secret (a key, a token,
a salt, a Redis URL's password) and start-up errors land in logs. Secrets are `SecretStr`, whose
repr is masked too.
"""

from __future__ import annotations

import os

from pydantic import SecretStr
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource


class TomlSettings(BaseSettings):
    """Base for edgerun's settings classes: env vars plus an optional TOML file."""

    model_config = SettingsConfigDict(
        env_prefix="EDGERUN_", env_nested_delimiter="__", frozen=True, extra="ignore", hide_input_in_errors=True
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        toml_file = os.environ.get("EDGERUN_CONFIG")
        if toml_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return cls.arrange_sources(tuple(sources), env_settings)

    @classmethod
    def arrange_sources(
        cls, sources: tuple[PydanticBaseSettingsSource, ...], env_settings: PydanticBaseSettingsSource
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """A subclass's hook over the sources above, highest first (`env_settings` is the environment's)."""
        return sources


MIN_SECRET_CHARS = 16


def check_secret(value: SecretStr | None, name: str) -> SecretStr | None:
    """A configured secret must be long enough to resist guessing; None (not set) passes."""
    if value is not None and len(value.get_secret_value()) < MIN_SECRET_CHARS:
        raise ValueError(
            f"{name} must be at least {MIN_SECRET_CHARS} characters: generate one with `openssl rand -hex 32`"
        )
    return value
