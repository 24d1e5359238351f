"""Building blocks of the API's schema: the wire-format base model, CEL rules and immutability,
and the string types (quantities, DNS labels, label values, qualified names, mount paths) with their
patterns, checked by the CRD and, identically, by the models in Python.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, TypeGuard

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo


class ApiModel(BaseModel):
    """Wire-format base: camelCase names, unknown fields rejected (the CRD rejects them too)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


def cel(*rules: tuple[str, str] | tuple[str, str, str]) -> dict[str, Any]:
    """`json_schema_extra` for CEL rules given as (rule, message) or (rule, message, fieldPath).

    fieldPath (e.g. ".procsPerNode") makes the API server report the rejection at that field
    rather than at the object holding the rule.
    """
    out = []
    for rule, message, *field_path in rules:
        item = {"rule": rule, "message": message}
        if field_path:
            item["fieldPath"] = field_path[0]
        out.append(item)
    return {"x-kubernetes-validations": out}


def immutable(what: str, why: str = "") -> dict[str, Any]:
    """A transition rule on a field that exists in every version of the object (oldSelf is set on update)."""
    return cel(("self == oldSelf", _immutable_message(what, why)))


def _immutable_message(what: str, why: str = "") -> str:
    return f"{what} is immutable{f' ({why})' if why else ''}; create a new job to change it"


def immutable_optional(field: str, what: str, why: str) -> tuple[str, str, str]:
    """A transition rule, on the object holding the optional `field`, that it is neither set,
    unset nor changed (a rule on the field itself is not evaluated when it is added or removed)."""
    self_, old = f"self.{field}", f"oldSelf.{field}"
    return (
        f"has({self_}) == has({old}) && (!has({self_}) || {self_} == {old})",
        _immutable_message(what, why),
        f".{field}",
    )


def _int_to_str(value: Any) -> Any:
    # YAML `cpu: 180` is an integer; Kubernetes quantities accept both spellings (and 180.0, as
    # OpenAPI's `integer` does).
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if not -(2**63) <= value < 2**63:  # the API server reads a larger JSON integer as a float
            raise ValueError("an integer quantity must fit in 64 bits; write it as a string")
        return str(value)
    return value


_QUANTITY_SUFFIX = "(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P)?$"


def _quantity_field(pattern: str, minimum: int) -> FieldInfo:
    """The schema of a quantity whose number matches `pattern` and is at least `minimum`."""
    return Field(
        pattern=pattern + _QUANTITY_SUFFIX,
        max_length=32,
        # minimum: the integer spelling is bounded too (the pattern sees only strings).
        json_schema_extra={"x-kubernetes-int-or-string": True, "minimum": minimum},
    )


#: A Kubernetes resource quantity ("180", "1800Gi", "500m"); an integer is accepted too (int-or-string).
Quantity = Annotated[str, _quantity_field(r"^[0-9]+(\.[0-9]+)?", 0), BeforeValidator(_int_to_str)]
#: A quantity greater than zero (a volume's capacity).
PositiveQuantity = Annotated[
    str,
    _quantity_field(r"^([0-9]*[1-9][0-9]*(\.[0-9]+)?|[0-9]+\.[0-9]*[1-9][0-9]*)", 1),
    BeforeValidator(_int_to_str),
]
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DnsLabel = Annotated[str, Field(pattern=DNS_LABEL_PATTERN, max_length=63)]

#: A label value: at most 63 characters, alphanumeric at both ends, `-_.` inside (or empty).
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LabelValue = Annotated[str, Field(pattern=LABEL_VALUE_PATTERN, max_length=63)]
#: No whitespace at either end (Go's unicode.IsSpace, as the API server checks a container image).
TRIMMED_PATTERN = r"^[^\t\n\v\f\r\x{85}\p{Z}]([^\n]*[^\t\n\v\f\r\x{85}\p{Z}])?$"
#: A label or annotation key: an optional DNS-subdomain prefix (at most 253 characters) and "/",
#: then a name of at most 63 characters. The CRD checks keys with CEL (a map's keys have no schema),
#: the models with the same expression in Python (no backslashes: it is quoted into CEL as is).
QUALIFIED_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


def qualified_name_cel(expr: str) -> str:
    """The CEL expression that the string `expr` is a qualified name (QUALIFIED_NAME_PATTERN)."""
    return f"{expr}.matches('{QUALIFIED_NAME_PATTERN}') && {expr}.indexOf('/') <= 253"


def qualified_name_error(key: str) -> str | None:
    """Why `key` is not a valid label/annotation key (None when it is)."""
    if re.fullmatch(QUALIFIED_NAME_PATTERN, key) and key.find("/") <= 253:
        return None
    return (
        f"{key!r} is not a valid key: an optional DNS-subdomain prefix and '/', then at most 63 "
        "characters, alphanumeric at both ends, '-', '_' or '.' inside"
    )


def string_schema(description: str, pattern: str, max_length: int) -> dict[str, Any]:
    """A string field of an open (dict) item, as the CRD declares it; `matches_string_schema` checks it
    in Python."""
    return {"type": "string", "description": description, "maxLength": max_length, "pattern": pattern}


def matches_string_schema(value: object, pattern: str, max_length: int) -> TypeGuard[str]:
    """What the CRD's `pattern` and `maxLength` say of a field inside an open (dict) item."""
    return isinstance(value, str) and len(value) <= max_length and re.fullmatch(pattern, value) is not None


def check_qualified_keys(mapping: dict[str, Any]) -> dict[str, Any]:
    """A map's validator: every key is a qualified name (what keys_are_qualified_names has the CRD check)."""
    for key in mapping:
        error = qualified_name_error(key)
        if error:
            raise ValueError(error)
    return mapping


def keys_are_qualified_names(what: str) -> dict[str, Any]:
    """The CEL rule that every key of the map `what` is a qualified name."""
    return cel(
        (
            f"self.all(k, {qualified_name_cel('k')})",
            f"{what} keys must be qualified names: an optional DNS-subdomain prefix and '/', then at most "
            "63 characters, alphanumeric at both ends, '-', '_' or '.' inside",
        )
    )


#: An absolute path without ':' (a container runtime splits mount specs at ':').
MOUNT_PATH_PATTERN = r"^/[^:]*$"
