"""What every job's options object shares (:class:`JobOptions`): made from an object, a
mapping (a DAG's rendered params) or keywords, and read back as keywords; and a parameter's
0.1 name accepted for one release (:func:`renamed_parameter`). The objects
themselves live with their jobs (``drain/options.py``, ``merge/options.py``); this is the
bottom layer, beside :mod:`airflow_pgcdc.errors`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

__all__ = ["JobOptions", "names", "publications_argument", "renamed_field", "renamed_parameter"]

Opts = TypeVar("Opts", bound="JobOptions")


class JobOptions:
    """A mixin for a job's frozen options dataclass."""

    job: str = "the job"

    @classmethod
    def of(cls: type[Opts], options: Opts | Mapping[str, Any] | None = None, /, **fields: Any) -> Opts:
        """``options`` (an object of this class, or a mapping of its fields), or ``fields``;
        ``None`` values mean the default; a name that is not a field is a :class:`TypeError`,
        and so is giving both."""
        if options is not None and fields:
            raise TypeError(f"give {cls.job}'s options or its fields ({', '.join(sorted(fields))}), not both")
        if isinstance(options, cls):
            return options
        given = dict(options if options is not None else fields)
        unknown = sorted(set(given) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f"{cls.job} has no option {', '.join(map(repr, unknown))}")
        return cls(**{k: v for k, v in given.items() if v is not None})

    def _put(self, name: str, value: Any) -> None:
        """Set a field of the frozen object while it normalizes itself (``__post_init__``)."""
        object.__setattr__(self, name, value)

    @staticmethod
    def _names(value: Any) -> tuple:
        """One name or several, as a tuple (``"a"`` → ``("a",)``)."""
        return names(value)

    def fields(self) -> dict[str, Any]:
        """The options that differ from their defaults, as keywords."""
        out = {}
        for f in dataclasses.fields(self):
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
            if getattr(self, f.name) != default:
                out[f.name] = getattr(self, f.name)
        return out


def names(value: Any) -> tuple:
    """One name or several (any iterable), as a tuple: ``"a"`` → ``("a",)``, ``None`` → ``()``."""
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def renamed_parameter(call: str, name: str, value: Any, old_name: str, old: Any, *, required: str | None = None,
                      stacklevel: int = 3) -> Any:
    """A library call's parameter ``name``, or its 0.1 name ``old_name`` (accepted for one
    release with a :class:`DeprecationWarning`); both is a :class:`TypeError` naming ``call``,
    and so is neither when ``required`` says what is missing."""
    import warnings

    if old is not None:
        if value is not None:
            raise TypeError(f"{call}() got both {name!r} and its old name {old_name!r}: give {name!r} only")
        warnings.warn(f"{call}({old_name}=...) is now {call}({name}=...); {old_name!r} goes in the next release",
                      DeprecationWarning, stacklevel=stacklevel)
        return old
    if value is None and required is not None:
        raise TypeError(f"{call}() missing {required}: give {name!r}")
    return value


def renamed_field(call: str, fields: dict[str, Any], name: str, value: Any, old_name: str, *,
                  required: str | None = None) -> Any:
    """:func:`renamed_parameter` for an old name that a call receives among its ``**fields``
    (taken out of them): the deprecated names stay accepted without lengthening the
    signature. For use directly in the library call (the warning points at its caller)."""
    return renamed_parameter(call, name, value, old_name, fields.pop(old_name, None), required=required,
                             stacklevel=4)


def publications_argument(call: str, publications: Sequence[str] | str | None, fields: dict[str, Any], *,
                          required: bool = False) -> tuple[str, ...]:
    """A library call's ``publications`` (one name or several), or its 0.1 name
    ``publication`` taken out of ``fields`` (warns); ``()`` when none was given, a
    :class:`TypeError` then where ``required``."""
    value = renamed_parameter(call, "publications", publications, "publication", fields.pop("publication", None),
                              required="the publication(s)" if required else None, stacklevel=4)
    given = names(value)
    if required and not given:
        raise TypeError(f"{call}() needs at least one publication")
    return given
