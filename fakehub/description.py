"""GitHub's REST description as a router and request validator: every request is matched to an
operation and checked against its parameters and body schema."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from fakehub import schema

# Path parameters that may hold slashes (git refs, file paths, label names).
_SLASHY = {"path", "ref", "branch", "name"}


class ValidationFailed(Exception):
    """A request that does not match the description: GitHub answers 422."""

    def __init__(self, errors: list[dict[str, str]]) -> None:
        super().__init__("; ".join(f"{e['field']}: {e['message']}" for e in errors))
        self.errors = errors


@dataclass(frozen=True)
class Operation:
    method: str
    template: str
    operation_id: str
    pattern: re.Pattern[str]
    path_params: dict[str, dict[str, Any]]
    query_params: dict[str, dict[str, Any]]
    body_schema: dict[str, Any] | None
    body_required: bool
    responses: dict[str, dict[str, Any]] = field(repr=False)

    def response_schema(self, status: int, content_type: str = "application/json") -> Any:
        return _response_schema(self.operation_id, status, content_type)


@functools.cache
def _response_schema(operation_id: str, status: int, content_type: str) -> Any:
    content = operation(operation_id).responses.get(str(status), {}).get("content", {})
    found = content.get(content_type)
    return None if found is None else schema.openapi30_to_jsonschema(found["schema"])


def _pattern(template: str) -> re.Pattern[str]:
    def param(match: re.Match[str]) -> str:
        name = match.group(1)
        return f"(?P<{name}>.+?)" if name in _SLASHY else f"(?P<{name}>[^/]+)"

    return re.compile("^" + re.sub(r"\{(\w+)\}", param, template) + "$")


def _operation(template: str, method: str, op: dict[str, Any]) -> Operation:
    params = [p for p in op.get("parameters", []) if "name" in p]
    body = op.get("requestBody")
    body_schema = None
    if body is not None:
        body_schema = schema.openapi30_to_jsonschema(body["content"]["application/json"]["schema"])
    return Operation(
        method=method.upper(),
        template=template,
        operation_id=op["operationId"],
        pattern=_pattern(template),
        path_params={p["name"]: p for p in params if p["in"] == "path"},
        query_params={p["name"]: p for p in params if p["in"] == "query"},
        body_schema=body_schema,
        body_required=bool(body and body.get("required")),
        responses=op["responses"],
    )


@functools.cache
def operations() -> tuple[Operation, ...]:
    doc = schema.load_document(schema.REST_DESCRIPTION)
    ops = [
        _operation(template, method, op)
        for template, methods in doc["paths"].items()
        for method, op in methods.items()
        if method in {"get", "post", "patch", "put", "delete"}
    ]
    # Most literal text first, so /commits/{ref}/check-runs wins over /commits/{ref}.
    ops.sort(key=lambda o: -len(re.sub(r"\{\w+\}", "", o.template)))
    return tuple(ops)


def operation(operation_id: str) -> Operation:
    return next(o for o in operations() if o.operation_id == operation_id)


def match(method: str, path: str) -> tuple[Operation, dict[str, str]] | None:
    """The operation for a request and its raw path parameters; None when GitHub has no such
    endpoint (a path that matches with another method is still None: GitHub answers 404)."""
    for op in operations():
        found = op.pattern.match(path)
        if found and op.method == method:
            return op, found.groupdict()
    return None


def _coerce(name: str, raw: str, param: dict[str, Any]) -> Any:
    kind = param.get("schema", {}).get("type", "string")
    if kind == "integer":
        if not re.fullmatch(r"-?\d+", raw):
            raise ValidationFailed([_invalid(name, f"{raw!r} is not an integer")])
        return int(raw)
    if kind == "boolean":
        return raw.lower() == "true"
    return raw


def _invalid(name: str, message: str) -> dict[str, str]:
    return {"field": name, "code": "invalid", "message": message}


@functools.cache
def _param_validator(operation_id: str, name: str) -> Any:
    op = operation(operation_id)
    param = op.path_params.get(name) or op.query_params[name]
    return schema.validator_for(schema.openapi30_to_jsonschema(param.get("schema", {})))


def _check_param(op: Operation, name: str, value: Any) -> None:
    errors = schema.schema_errors(_param_validator(op.operation_id, name), value)
    if errors:
        raise ValidationFailed([_invalid(name, errors[0]["message"])])


def validate_params(
    op: Operation, path_params: dict[str, str], query: dict[str, str]
) -> dict[str, Any]:
    """Typed path and query parameters; unknown query parameters are ignored, as GitHub does."""
    values: dict[str, Any] = {}
    for name, param in op.path_params.items():
        values[name] = _coerce(name, path_params[name], param)
        _check_param(op, name, values[name])
    for name, param in op.query_params.items():
        if name in query:
            values[name] = _coerce(name, query[name], param)
            _check_param(op, name, values[name])
        elif "default" in param.get("schema", {}):
            values[name] = param["schema"]["default"]
    return values


@functools.cache
def _body_validator(operation_id: str) -> Any:
    op = operation(operation_id)
    return schema.validator_for(op.body_schema or {})


def validate_body(op: Operation, body: Any) -> None:
    if op.body_schema is None:
        return
    if body is None:
        if op.body_required:
            raise ValidationFailed([{"field": "(body)", "code": "missing", "message": "no body"}])
        return
    errors = schema.schema_errors(_body_validator(op.operation_id), body)
    if errors:
        raise ValidationFailed(errors)
