"""A routing policy's rules, compiled once per key bundle and checked on each request.

A key whose policy has no rules has no `RuleSet` at all, so its requests pay nothing. Only
`deny_models` is decided when the bundle is compiled (it shapes the chains); the other kinds
read the request body in the route's own format (`proxy.documents`).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import msgspec

from proxy import multipart
from proxy.documents import Shape, links, output_bound, texts, tools
from proxy.errors import ProxyError, invalid
from vkgate.errors import ErrorCode
from vkgate.wire import OutputCap, PolicyRule

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
_URL = re.compile(r"\bhttps?://[^\s<>\"'`\\)\]}]+", re.IGNORECASE)


class PolicyViolation(ProxyError):
    """403 `policy_violation`: the rule that refused, and the request field it refused."""

    def __init__(self, rule: str, message: str, param: str) -> None:
        super().__init__(
            ErrorCode.POLICY_VIOLATION,
            f"rule {rule!r} of this key's routing policy refuses the request: {message}",
            param=param,
            # Anthropic's error object has no `param`: both go in the error's own fields.
            details={"rule": rule, "param": param},
        )
        self.rule = rule


def _globs(patterns: Iterable[str], *, case: bool = True) -> re.Pattern[str]:
    flags = 0 if case else re.IGNORECASE
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns), flags)


@dataclass(frozen=True, slots=True)
class _Names:
    """`allow_tools` / `deny_tools`: function names by glob."""

    rule: str
    pattern: re.Pattern[str]
    allow: bool

    def refuses(self, name: str) -> bool:
        return (self.pattern.match(name) is None) is self.allow


@dataclass(frozen=True, slots=True)
class _Domains:
    """`allow_url_domains` / `deny_url_domains`: a plain domain stands for itself and every
    subdomain; a glob (`*.example.com`) is matched as written. Hosts are compared lowercased."""

    rule: str
    exact: frozenset[str]
    pattern: re.Pattern[str] | None
    allow: bool

    def matches(self, host: str) -> bool:
        if self.pattern is not None and self.pattern.match(host):
            return True
        parts = host.split(".")
        return any(".".join(parts[i:]) in self.exact for i in range(len(parts)))

    def refuses(self, host: str) -> bool:
        return self.matches(host) is not self.allow


def _domains(rule: PolicyRule, values: list[str], allow: bool) -> _Domains:
    plain = [v.lower().strip(".") for v in values if not any(c in v for c in "*?[")]
    globs = [v.lower() for v in values if any(c in v for c in "*?[")]
    return _Domains(rule.name, frozenset(plain), _globs(globs) if globs else None, allow)


def _host(url: str) -> str | None:
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return None
    return host.rstrip(".") if host else None


class RuleSet:
    """A policy's rules, ready to check requests against."""

    __slots__ = ("_cap", "_denied_models", "_domains", "_params", "_tools")

    def __init__(self, rules: Iterable[PolicyRule]) -> None:
        self._denied_models: list[tuple[str, re.Pattern[str]]] = []
        self._tools: list[_Names] = []
        self._domains: list[_Domains] = []
        self._params: list[tuple[str, tuple[str, ...]]] = []
        self._cap: tuple[str, OutputCap] | None = None
        for rule in rules:
            values = rule.values
            if isinstance(values, OutputCap):
                if rule.kind == "max_output_tokens" and (
                    self._cap is None or values.limit < self._cap[1].limit
                ):
                    self._cap = (rule.name, values)
            elif rule.kind == "deny_models":
                self._denied_models.append((rule.name, _globs(values)))
            elif rule.kind in ("allow_tools", "deny_tools"):
                self._tools.append(_Names(rule.name, _globs(values), rule.kind == "allow_tools"))
            elif rule.kind in ("allow_url_domains", "deny_url_domains"):
                self._domains.append(_domains(rule, values, rule.kind == "allow_url_domains"))
            elif rule.kind == "deny_params":
                self._params.append((rule.name, tuple(values)))
            # A kind this proxy does not know (a newer control plane's) is left out.

    @property
    def denies_models(self) -> bool:
        return bool(self._denied_models)

    @property
    def reads_requests(self) -> bool:
        """Whether a request's body has anything to answer to (deny_models alone has not)."""
        return bool(self._tools or self._domains or self._params or self._cap)

    def model_rule(self, model: str) -> str | None:
        """The `deny_models` rule that refuses `model` (an alias or an upstream model)."""
        for name, pattern in self._denied_models:
            if pattern.match(model):
                return name
        return None

    def check(self, shape: Shape, body: bytes, content_type: bytes | None) -> bytes | None:
        """Refuse the request (`PolicyViolation`) or let it through: None as it is, or a new
        body whose output bound was capped."""
        if shape is Shape.UPLOAD:
            if self._params:
                form = multipart.parse(content_type, body)
                # A list goes as repeated `name[]` fields: the rule names the parameter.
                self._check_params({part.name.removesuffix("[]"): True for part in form.parts})
            return None
        try:
            doc = _decode(body)
        except (msgspec.DecodeError, RecursionError):
            raise invalid("request body is not valid JSON") from None
        self._check_params(doc)
        for rule in self._tools:
            for name in tools(shape, doc):
                if rule.refuses(name):
                    raise PolicyViolation(rule.rule, f"tool {name!r} is not allowed", "tools")
        if self._domains:
            self._check_links(shape, doc)
        if self._cap is not None:
            return self._capped(shape, doc, *self._cap)
        return None

    def _check_params(self, doc: Any) -> None:
        if not isinstance(doc, Mapping):
            return
        for rule, params in self._params:
            for param in params:
                if _present(doc, param):
                    raise PolicyViolation(rule, f"parameter {param!r} is not allowed", param)

    def _check_links(self, shape: Shape, doc: Any) -> None:
        urls = list(links(shape, doc))
        for container, key in texts(shape, doc):
            urls.extend(_URL.findall(container[key]))
        for url in urls:
            host = _host(url)
            if host is None:
                continue
            for rule in self._domains:
                if rule.refuses(host.lower()):
                    raise PolicyViolation(
                        rule.rule, f"links to {host!r} are not allowed", _content_param(shape)
                    )

    @staticmethod
    def _capped(shape: Shape, doc: Any, rule: str, cap: OutputCap) -> bytes | None:
        bound = output_bound(shape, doc)
        if bound is None:
            return None
        container, field, param = bound
        asked = container.get(field)
        if isinstance(asked, int) and not isinstance(asked, bool) and asked <= cap.limit:
            return None
        if cap.action != "cap":
            what = "names no" if asked is None else f"asks {asked} output tokens, over the"
            raise PolicyViolation(rule, f"the request {what} limit of {cap.limit}", param)
        container[field] = cap.limit
        return _encode(doc)


def _present(doc: Mapping[str, Any], path: str) -> bool:
    """Whether the body holds `path` (`logit_bias`, or dotted: `generationConfig.seed`)."""
    value: Any = doc
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False
        value = value[part]
    return True


_CONTENT_PARAM = {
    Shape.CHAT: "messages",
    Shape.MESSAGES: "messages",
    Shape.RESPONSES: "input",
    Shape.EMBEDDINGS: "input",
    Shape.IMAGES: "prompt",
    Shape.SPEECH: "input",
    Shape.GEMINI: "contents",
    Shape.GEMINI_EMBED: "contents",
}


def _content_param(shape: Shape) -> str:
    return _CONTENT_PARAM.get(shape, "body")


def model_denied(alias: str, rule: str) -> PolicyViolation:
    return PolicyViolation(rule, f"model {alias!r} is denied", "model")


def rules_of(rules: list[PolicyRule]) -> RuleSet | None:
    """The compiled rules, or None for a policy that has none: such keys pay nothing."""
    return RuleSet(rules) if rules else None
