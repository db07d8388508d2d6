"""Operator arguments as given in the DAG file or rendered from a template.

A templated argument (``"{{ params.max_rows }}"``) is a string until the task runs, and a
rendered one is a string too unless the DAG renders native objects: the operators check
what they can when the DAG is parsed and convert and check the rest when the task runs,
with the argument's name in the error."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

UNSET = (None, "", "None")


def templated(*values: Any) -> bool:
    """Whether any of ``values`` is a template not rendered yet."""
    return any(isinstance(v, str) and "{{" in v for v in values)


def number(value: Any, kind: type, name: str, *, minimum: float | None = None) -> Any:
    """``value`` as ``kind`` (``int`` or ``float``); ``None``, ``""`` or ``"None"``: ``None``.
    An integer must be whole (``"10"`` yes, ``2.5`` and ``True`` no); ``minimum``: the
    least value allowed."""
    if value is None or (isinstance(value, str) and value.strip() in UNSET):
        return None
    what = "an integer" if kind is int else "a number"
    if minimum is not None:
        what += f" of at least {minimum:g}"
    if isinstance(value, bool) or (kind is int and isinstance(value, float)):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    try:
        out = kind(value.strip()) if isinstance(value, str) else kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be {what}, got {value!r}") from None
    if minimum is not None and out < minimum:
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return out


def flag(value: Any, name: str) -> bool:
    """``value`` as a boolean: ``True``/``False``, or ``"true"``/``"false"`` (``"1"``,
    ``"yes"``, ``"0"``, ``"no"``; ``""`` and ``"None"`` are false)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("true", "1", "yes"):
            return True
        if text in ("false", "0", "no", "", "none"):
            return False
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return bool(value)


def checked(value: Any, convert, *args, **kwargs) -> Any:
    """``convert(value, …)`` now, when ``value`` is not a template; a template is kept (it
    is converted when the task runs)."""
    return value if templated(value) else convert(value, *args, **kwargs)


def mapping(value: Any, name: str, what: str = "a mapping") -> Mapping | None:
    """``value`` as a mapping: a mapping, or its rendering as text (JSON, or the Python
    literal a Jinja template renders a dict param to). ``None`` / ``""``: ``None``."""
    if value is None or (isinstance(value, str) and value.strip() in UNSET):
        return None
    if isinstance(value, str):
        import ast
        import json

        try:
            value = json.loads(value)
        except ValueError:
            try:
                value = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError):
                raise ValueError(f"{name} must be {what}, got {value!r}") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return value


def columns_per_table(value: Any, name: str) -> dict[str, list[str]]:
    """``value`` as ``{"schema.table": ["col", ...]}`` (see :func:`mapping`); a table's
    columns may be one name. ``None`` / ``""``: ``{}``."""
    value = mapping(value, name, "a mapping of table to key columns") or {}
    return {str(t): [c] if isinstance(c, str) else [str(x) for x in c] for t, c in value.items()}


def rendered_options(value: Any, cls: type, name: str = "options") -> Any:
    """``value`` as ``cls`` (a job's options, e.g. ``MergeOptions``): the object itself, or a
    mapping of its fields, rendered text included (a DAG's ``"{{ params.merge }}"``): a
    field given as text is read as its type says (a number, ``"true"``/``"false"``, a list as
    ``"a b"`` or ``"a,b"``, a mapping as JSON or a Python literal). ``None``, ``""`` and
    ``"None"`` (the whole value or a field): not given."""
    import types
    import typing

    if value is None or (isinstance(value, str) and value.strip() in UNSET):
        return None
    if isinstance(value, cls):
        return value
    given = mapping(value, name, f"a {cls.__name__} or a mapping of its fields") or {}
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for key, v in given.items():
        if isinstance(v, str) and v.strip() in UNSET:
            continue
        if isinstance(v, str):
            hint = hints.get(key)
            union = typing.get_origin(hint) in (typing.Union, types.UnionType)
            kinds = [a for a in (typing.get_args(hint) if union else (hint,)) if a is not type(None)]
            kind = kinds[0] if len(kinds) == 1 else None  # a union with str (an LSN, a time): as given
            origin = typing.get_origin(kind) or kind
            if origin in (tuple, frozenset, list):
                v = [t for t in v.replace(",", " ").split() if t]
            elif isinstance(origin, type) and issubclass(origin, Mapping):
                v = mapping(v, key)
            elif origin is bool:
                v = flag(v, key)
            elif origin in (int, float):
                v = number(v, origin, key)
        out[key] = v
    return cls.of(out)


def options_or_fields(owner: str, options: Any, cls: type | None = None, **fields: Any) -> Any:
    """A job's options for an operator that takes them whole (``options``: an object or a
    mapping, templated, see :func:`rendered_options`) or as its own arguments (``fields``;
    ``None`` means not given): giving both is a :class:`ValueError` naming the arguments.
    Without ``cls`` (when the DAG is parsed) only that check is made and ``None`` returned."""
    given = sorted(k for k, v in fields.items() if v is not None)
    if options is not None and not (isinstance(options, str) and options.strip() in UNSET) and given:
        raise ValueError(f"{owner}: give options or its separate arguments ({', '.join(given)}), not both")
    if cls is None:
        return None
    return rendered_options(options, cls) or cls.of(**{k: v for k, v in fields.items() if v is not None})
