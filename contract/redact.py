"""Credentials inside URLs and query strings: found by parsing (urllib.parse), redacted.

A URL carries a credential in its userinfo (`redis://:pw@host`, `https://key@host`,
`https://user:pw@host`) or in a query or fragment parameter whose name says it is one
(`?token=`, `?password=`, `&api_key=`, `X-Amz-Signature=`, `sig=`). `redact_text` replaces
each such value with `[redacted]` wherever it appears in a text (an environment value, a log
line, a request line); `has_credentials` says whether it would change anything. Pure."""

from __future__ import annotations

import re
import urllib.parse

REDACTED = "[redacted]"

# Words that make a parameter name a credential's: matched against the name's words
# (split on anything not a letter or digit) and against its end ("accesstoken", "apikey").
SECRET_WORDS = frozenset(
    {
        "token", "secret", "password", "passwd", "pwd", "pass", "key", "apikey", "auth",
        "credential", "credentials", "signature", "sig", "session", "cookie", "jwt",
    }
)  # fmt: skip
SECRET_ENDINGS = ("token", "secret", "password", "passwd", "key", "signature", "credential")

# scheme://rest, up to whitespace or a quote/bracket that would end it in text.
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>`]+")
# name=value after "?", "&", ";" or "#": a query or fragment parameter, in a URL or not.
_PARAM = re.compile(r"(?P<lead>[?&;#])(?P<name>[^=&;#?\s\"'<>]+)=(?P<value>[^&;#\s\"'<>]*)")


def secret_name(name: str) -> bool:
    """Whether a query parameter called `name` holds a credential."""
    lowered = urllib.parse.unquote_plus(name).lower()
    words = {word for word in re.split(r"[^a-z0-9]+", lowered) if word}
    return bool(words & SECRET_WORDS) or lowered.endswith(SECRET_ENDINGS)


def redact_url(url: str) -> str:
    """`url` with its userinfo and secret-named query and fragment values redacted."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # e.g. an unbalanced "[" in the host: redact what looks like userinfo
        return _redact_params(re.sub(r"(?<=://)[^/?#]*@", REDACTED + "@", url, count=1))
    netloc = parts.netloc
    if "@" in netloc:
        netloc = REDACTED + "@" + netloc.rpartition("@")[2]
    query = _redact_query(parts.query)
    fragment = _redact_query(parts.fragment)
    if (netloc, query, fragment) == (parts.netloc, parts.query, parts.fragment):
        return url
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


def redact_query(query: str) -> str:
    """A query string (`a=1&token=x`, no leading "?") with secret-named values redacted."""
    return _redact_query(query)


def redact_text(text: str) -> str:
    """Every URL in `text`, and every `?name=value` outside one, with credentials redacted."""
    return _redact_params(_URL.sub(lambda found: redact_url(found.group()), text))


def has_credentials(text: str) -> bool:
    """Whether `text` holds a URL userinfo or a secret-named parameter value."""
    return redact_text(text) != text


def _redact_query(query: str) -> str:
    if "=" not in query:
        return query
    pieces = []
    for piece in re.split(r"([&;])", query):
        name, eq, value = piece.partition("=")
        if eq and value and value != REDACTED and secret_name(name):
            piece = f"{name}={REDACTED}"
        pieces.append(piece)
    return "".join(pieces)


def _redact_params(text: str) -> str:
    def one(found: re.Match[str]) -> str:
        name, value = found.group("name"), found.group("value")
        if not value or value == REDACTED or not secret_name(name):
            return found.group()
        return f"{found.group('lead')}{name}={REDACTED}"

    return _PARAM.sub(one, text)
