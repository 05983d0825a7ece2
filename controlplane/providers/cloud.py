"""The cloud kinds' own fields: which kind takes which, how they are checked, how the credential
is sealed.

- `bedrock`: `region` (required); AWS keys `aws_access_key_id` + `aws_secret_access_key`
  (+ `aws_session_token`), or none, and then the proxy's own AWS credential chain. No API key.
- `vertex_ai`: `project` and `location` (required); a service account's JSON key
  (`service_account_json`), or none, and then the proxy's own Google credentials. No API key.
- `gemini`: an API key, like the other kinds; none of the fields above.

Non-secret fields are kept in the provider's `settings`; the credential is sealed as one JSON
document (`credentials_encrypted`, AES-GCM bound to the provider's id), never returned.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import msgspec
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from controlplane.errors import invalid
from controlplane.models import Provider
from controlplane.providers.schemas import ProviderCreate, ProviderKind, ProviderUpdate
from controlplane.security import Cipher
from vkgate.wire import header_safe

SETTINGS: dict[ProviderKind, tuple[str, ...]] = {
    ProviderKind.BEDROCK: ("region",),
    ProviderKind.VERTEX_AI: ("project", "location"),
}
AWS_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
SERVICE_ACCOUNT = "service_account_json"
SECRETS: dict[ProviderKind, tuple[str, ...]] = {
    ProviderKind.BEDROCK: AWS_KEYS,
    ProviderKind.VERTEX_AI: (SERVICE_ACCOUNT,),
}
_OWNERS = {name: kind for kind, names in (*SETTINGS.items(), *SECRETS.items()) for name in names}
"""Each cloud field, and the one kind that takes it."""
NO_API_KEY = {
    ProviderKind.BEDROCK: "AWS keys (aws_access_key_id, aws_secret_access_key) or the proxy's "
    "own AWS credentials",
    ProviderKind.VERTEX_AI: "a service account (service_account_json) or the proxy's own "
    "Google credentials",
}
_SERVICE_ACCOUNT_KEYS = ("client_email", "private_key", "token_uri")


class Cloud(msgspec.Struct):
    """A provider's cloud fields after a create or an update, checked."""

    settings: dict[str, str]
    credentials: dict[str, str] | None
    """The credential to seal; None: none stored."""


def _given(data: ProviderCreate | ProviderUpdate, name: str) -> Any:
    value = getattr(data, name)
    return None if value is msgspec.UNSET else value


def _refuse_foreign(kind: ProviderKind, data: ProviderCreate | ProviderUpdate) -> None:
    """A field of another kind is refused, naming the kind it belongs to."""
    for name, owner in _OWNERS.items():
        if owner is not kind and _given(data, name) is not None:
            raise invalid(f"{name} is a field of provider kind {owner}, not {kind}", param=name)


def check_create(data: ProviderCreate) -> Cloud:
    kind = data.kind
    _refuse_foreign(kind, data)
    if kind in NO_API_KEY and data.api_key is not None:
        raise invalid(
            f"provider kind {kind} takes no api_key: it is authenticated by {NO_API_KEY[kind]}",
            param="api_key",
        )
    settings: dict[str, str] = {}
    for name in SETTINGS.get(kind, ()):
        value = _given(data, name)
        if value is None:
            raise invalid(f"provider kind {kind} needs {name}", param=name)
        settings[name] = value
    credentials = _credentials(kind, {name: _given(data, name) for name in SECRETS.get(kind, ())})
    return Cloud(settings, credentials)


def check_update(
    kind: ProviderKind, row: Provider, data: ProviderUpdate
) -> tuple[Cloud, list[str]]:
    """The provider's cloud fields with the update applied, and the names of those it changed;
    the credential is replaced as a whole, or cleared by `null` (`credentials` is among the
    changed names then; otherwise the returned credential means nothing)."""
    _refuse_foreign(kind, data)
    if kind in NO_API_KEY and _given(data, "api_key") is not None:
        raise invalid(
            f"provider kind {kind} takes no api_key: it is authenticated by {NO_API_KEY[kind]}",
            param="api_key",
        )
    changed: list[str] = []
    settings = dict(row.settings)
    for name in SETTINGS.get(kind, ()):
        value = getattr(data, name)
        if value is msgspec.UNSET:
            continue
        if value is None:
            raise invalid(f"provider kind {kind} needs {name}", param=name)
        settings[name] = value
        changed.append(name)
    secrets = SECRETS.get(kind, ())
    given = {name: getattr(data, name) for name in secrets}
    if all(value is msgspec.UNSET for value in given.values()):
        return Cloud(settings, None), changed
    fields = {name: None if value is msgspec.UNSET else value for name, value in given.items()}
    changed.append("credentials")
    return Cloud(settings, _credentials(kind, fields)), changed


def _credentials(kind: ProviderKind, fields: dict[str, Any]) -> dict[str, str] | None:
    if kind is ProviderKind.BEDROCK:
        return _aws_keys(fields)
    if kind is ProviderKind.VERTEX_AI and fields.get(SERVICE_ACCOUNT) is not None:
        return {SERVICE_ACCOUNT: _service_account(fields[SERVICE_ACCOUNT])}
    return None


def _aws_keys(fields: dict[str, str | None]) -> dict[str, str] | None:
    key_id, secret, token = (fields.get(name) for name in AWS_KEYS)
    if key_id is None and secret is None and token is None:
        return None
    if key_id is None or secret is None:
        missing = "aws_access_key_id" if key_id is None else "aws_secret_access_key"
        raise invalid(
            "stored AWS keys need both aws_access_key_id and aws_secret_access_key "
            "(and aws_session_token only with them)",
            param=missing,
        )
    keys = {"aws_access_key_id": key_id, "aws_secret_access_key": secret}
    if token is not None:
        keys["aws_session_token"] = token
    for name, value in keys.items():
        if not header_safe(value) or value != value.strip():
            raise invalid(
                f"{name} must not hold spaces or line breaks: was it pasted with a newline?",
                param=name,
            )
    return keys


def _service_account(value: str | dict[str, Any]) -> str:
    """The service account's JSON key, checked as far as can be without calling Google (its
    key must load: a pasted key cut short is refused now, not at its first request)."""
    param = SERVICE_ACCOUNT
    info = value
    if isinstance(value, str):
        try:
            info = json.loads(value)
        except ValueError:
            raise invalid(f"{param} is not JSON", param=param) from None
    if not isinstance(info, dict) or info.get("type") != "service_account":
        raise invalid(
            f'{param} must be a service account\'s JSON key ("type": "service_account")',
            param=param,
        )
    for name in _SERVICE_ACCOUNT_KEYS:
        if not isinstance(info.get(name), str) or not info[name]:
            raise invalid(f"{param} has no {name}", param=f"{param}.{name}")
    token_uri = urlsplit(info["token_uri"])
    if token_uri.scheme not in ("https", "http") or not token_uri.hostname:
        raise invalid(f"{param}.token_uri is not an http(s) URL", param=f"{param}.token_uri")
    try:
        load_pem_private_key(info["private_key"].encode(), password=None)
    except (ValueError, TypeError):
        # Nothing of the key is repeated.
        raise invalid(
            f"{param}.private_key is not an unencrypted PEM private key",
            param=f"{param}.private_key",
        ) from None
    return json.dumps(info, sort_keys=True)


def seal(cipher: Cipher, provider_id: str, credentials: dict[str, str] | None) -> bytes | None:
    if not credentials:
        return None
    return cipher.encrypt(
        json.dumps(credentials, sort_keys=True), context=f"{provider_id}:credentials"
    )


def open_credentials(cipher: Cipher, row: Provider) -> dict[str, str]:
    if row.credentials_encrypted is None:
        return {}
    credentials: dict[str, str] = json.loads(
        cipher.decrypt(row.credentials_encrypted, context=f"{row.id}:credentials")
    )
    return credentials


def stored_or_workload(row: Provider) -> str | None:
    """What `cloud_credentials` says of a provider: None for the kinds without one."""
    if row.kind not in SECRETS:
        return None
    return "stored" if row.credentials_encrypted is not None else "workload"
