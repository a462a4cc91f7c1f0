"""GitHub's API descriptions: locating them, reading OpenAPI schemas as JSON Schema, completing
partial objects so they carry every property a schema requires."""

from __future__ import annotations

import copy
import functools
import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema

REST_DESCRIPTION = "rest-api-subset.json"
WEBHOOK_SCHEMAS = "webhook-schemas.json"
WEBHOOK_EXAMPLES = "webhook-examples.json"

# Placeholder values for required properties the caller did not supply, by JSON Schema format.
EPOCH = "2024-01-01T00:00:00Z"
_FORMAT_DEFAULTS = {
    "date-time": EPOCH,
    "uri": "https://fakehub.invalid/",
    "uri-template": "https://fakehub.invalid/{placeholder}",
    "email": "nobody@fakehub.invalid",
}


PACKAGED = Path(__file__).resolve().parent / "github"


def github_dir() -> Path:
    """Where GitHub's descriptions live: $FAKEHUB_GITHUB_DIR if set, else the gzipped copies
    packaged with fakehub (fakehub/github/, taken unchanged from GitHub's published files)."""
    explicit = os.environ.get("FAKEHUB_GITHUB_DIR")
    return Path(explicit) if explicit else PACKAGED


@functools.cache
def load_document(name: str) -> dict[str, Any]:
    path = github_dir() / name
    packed = path.with_name(name + ".gz")
    if path.is_file():
        text = path.read_text(encoding="utf-8")
    elif packed.is_file():
        text = gzip.decompress(packed.read_bytes()).decode("utf-8")
    else:
        raise FileNotFoundError(
            f"fakehub needs GitHub's description {path}; set FAKEHUB_GITHUB_DIR to its folder"
        )
    doc: dict[str, Any] = json.loads(text)
    return doc


def webhook_examples() -> list[tuple[str, dict[str, Any]]]:
    """(event, payload) for every example delivery GitHub documents, in its order."""
    events: Any = load_document(WEBHOOK_EXAMPLES)
    return [(event["name"], example) for event in events for example in event["examples"]]


def openapi30_to_jsonschema(schema: Any) -> Any:
    """OpenAPI 3.0 `nullable: true` becomes a JSON Schema type that admits null."""
    if isinstance(schema, list):
        return [openapi30_to_jsonschema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: openapi30_to_jsonschema(value) for key, value in schema.items()}
    if out.pop("nullable", False):
        if "type" in out:
            out["type"] = [out["type"], "null"]
            if "enum" in out and None not in out["enum"]:
                out["enum"] = [*out["enum"], None]
        else:
            out = {"anyOf": [{"type": "null"}, out]}
    return out


def validator_for(schema: dict[str, Any], root: dict[str, Any] | None = None) -> Any:
    """A validator without format checks; `root` holds the components that `$ref`s point into."""
    if root is not None:
        schema = {**schema, "components": root["components"]}
    return jsonschema.Draft202012Validator(schema)


def error_field(error: jsonschema.ValidationError) -> str:
    """The dotted name of the property an error is about (the missing one for `required`)."""
    parts = [str(part) for part in error.absolute_path]
    if error.validator == "required" and isinstance(error.message, str):
        missing = error.message.split("'")[1] if "'" in error.message else ""
        parts.append(missing)
    return ".".join(parts) or "(body)"


def schema_errors(validator: Any, instance: Any) -> list[dict[str, str]]:
    """GitHub-style `errors` entries naming each offending field, most specific first."""
    found: list[dict[str, str]] = []
    for error in sorted(validator.iter_errors(instance), key=lambda e: e.path):
        for leaf in _leaves(error):
            code = "missing_field" if leaf.validator == "required" else "invalid"
            found.append({"field": error_field(leaf), "code": code, "message": leaf.message})
    return found


def _leaves(error: jsonschema.ValidationError) -> Iterator[jsonschema.ValidationError]:
    best = jsonschema.exceptions.best_match([error, *error.context]) if error.context else error
    yield best


class Completer:
    """Fills in the required properties a partial object lacks, following a schema.

    Supplied values win; what is missing gets a neutral value (null where the schema allows it,
    else the first enum member, an empty string, 0, false, [] or a completed object)."""

    def __init__(self, root: dict[str, Any] | None = None) -> None:
        self.root = root

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in schema and self.root is not None:
            node: Any = self.root
            for part in schema["$ref"].removeprefix("#/").split("/"):
                node = node[part]
            schema = node
        return schema

    def complete(self, schema: dict[str, Any], value: Any) -> Any:
        return self._fill(schema, copy.deepcopy(value))

    def _fill(self, schema: dict[str, Any], value: Any) -> Any:
        schema = self.resolve(schema)
        if "allOf" in schema:
            for part in schema["allOf"]:
                value = self._fill(part, value)
            return value
        for key in ("oneOf", "anyOf"):
            if key in schema:
                return self._fill(self._branch(schema[key], value), value)
        if value is None:
            return None
        kind = _types(schema)
        if isinstance(value, dict) and ("object" in kind or "properties" in schema):
            return self._fill_object(schema, value)
        if isinstance(value, list) and "items" in schema:
            return [self._fill(schema["items"], item) for item in value]
        return value

    def _fill_object(self, schema: dict[str, Any], value: dict[str, Any]) -> dict[str, Any]:
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                value[name] = self.default(props.get(name, {}))
        for name, item in value.items():
            if name in props and isinstance(item, dict | list):
                value[name] = self._fill(props[name], item)
        return value

    def _branch(self, branches: list[dict[str, Any]], value: Any) -> dict[str, Any]:
        resolved = [self.resolve(b) for b in branches]
        wanted = _json_type(value)
        for branch in resolved:
            kind = _types(branch)
            composite = not kind and any(k in branch for k in ("oneOf", "anyOf", "allOf"))
            if wanted in kind or composite or (wanted == "object" and "properties" in branch):
                return branch
        return resolved[0]

    def default(self, schema: dict[str, Any]) -> Any:
        schema = self.resolve(schema)
        kind = _types(schema)
        if "null" in kind or schema.get("nullable"):
            return None
        for key in ("oneOf", "anyOf"):
            if key in schema:
                branches = [self.resolve(b) for b in schema[key]]
                if any("null" in _types(b) for b in branches):
                    return None
                return self.default(branches[0])
        if "allOf" in schema:
            merged: dict[str, Any] = {}
            for part in schema["allOf"]:
                made = self.default(part)
                if isinstance(made, dict):
                    merged.update(made)
            return merged
        if "enum" in schema:
            return schema["enum"][0]
        if "const" in schema:
            return schema["const"]
        return self._default_of_type(schema, kind)

    def _default_of_type(self, schema: dict[str, Any], kind: set[str]) -> Any:
        if "object" in kind or "properties" in schema:
            return self._fill_object(schema, {})
        if "array" in kind:
            return []
        if "integer" in kind or "number" in kind:
            return 0
        if "boolean" in kind:
            return False
        return _FORMAT_DEFAULTS.get(schema.get("format", ""), "")


def _types(schema: dict[str, Any]) -> set[str]:
    kind = schema.get("type", [])
    return {kind} if isinstance(kind, str) else set(kind)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"
