"""One registry class for every extension axis.

The axes: layer → hook factors, layer → detection layout, normalisation → its axis,
symmetry → kernel, matcher name → matcher.

A :class:`Registry` maps keys to values in registration order. A key is a class, or for a
class of an optional package that must never be imported here (Hugging Face
``transformers``), its qualified name ``"pkg.module.Class"``.

**The subclass rule** (one rule for every registry): :meth:`Registry.lookup` walks the
class's MRO and returns the value of the nearest registered class, by class or by qualified
name, *whose* ``forward`` *the class inherits*. A subclass that overrides ``forward`` may
compute anything (permute around a norm, add a residual), so it is not matched unless it is
registered itself; classes without a ``forward`` (symmetries) always inherit. The dynamic
``FSDP<Class>`` subclass that ``fully_shard`` makes adds no ``forward``, so it resolves to
``Class``.

Registering a key twice raises unless ``replace=True``: a silent overwrite would change
what a built-in layer or family means for every later caller.

A registry made with ``any_key=True`` takes any hashable key (a function, a method name) and
is read by :meth:`Registry.get`, by the key itself (detection's function and method tables).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

__all__ = ["Registry", "qualname"]

V = TypeVar("V")
# a class or a qualified name (with any_key=True: any hashable key)
Key = type | str | Hashable


def qualname(cls: type) -> str:
    """``"pkg.module.Class"``: the name a class of an optional package is registered by."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _inherits_forward(sub: type, base: type) -> bool:
    return getattr(sub, "forward", None) is getattr(base, "forward", None)


class Registry(Generic[V]):
    """An ordered table ``class (or qualified name) → value`` with one lookup rule.

    Args:
        what: what a value is, for errors (``"hook handler"``, ``"kernel"``).
        register_with: the public call that registers one, for errors
            (``"noetherflow.stats.register_layer(cls, LayerHandler(...))"``).
        flag: the keyword of that call that replaces an entry (``"overwrite"``).
        any_key: keys need not be classes or names (functions, method names); read them
            with :meth:`get`.

    Example:
        >>> from torch import nn
        >>> reg: Registry[str] = Registry("label", register_with="reg.register(cls, label)")
        >>> reg.register(nn.Linear, "dense")
        >>> class Sub(nn.Linear): ...
        >>> reg.lookup(Sub), reg.lookup(nn.ReLU)
        ('dense', None)
    """

    def __init__(
        self, what: str, *, register_with: str, flag: str = "replace", any_key: bool = False
    ) -> None:
        self.what = what
        self.register_with = register_with
        self.flag = flag
        self.any_key = any_key
        self._entries: dict[Key, V] = {}
        self._resolved: dict[type, tuple[type, V] | None] = {}  # lookup cache by class
        self._named: dict[type, None] = {}  # classes a name key has matched, in order

    def register(self, key: Key, value: V, *, replace: bool = False) -> None:
        """Add ``key → value``.

        Raises:
            TypeError: ``key`` is neither a class nor a qualified name.
            ValueError: ``key`` is registered already and ``replace`` is False.
        """
        if not (isinstance(key, Hashable) if self.any_key else isinstance(key, type | str)):
            raise TypeError(f"{self.what} registry: key {key!r} is not a class or a name.")
        if key in self._entries and not replace:
            raise ValueError(
                f"{_name(key)} has a {self.what} already; pass {self.flag}=True to replace it."
            )
        self._entries[key] = value
        self._resolved.clear()

    def unregister(self, key: Key) -> None:
        """Remove ``key`` (tests, or a plug-in that is unloaded); a missing key is an error."""
        if key not in self._entries:
            raise KeyError(f"{_name(key)} has no {self.what} to remove.")
        del self._entries[key]
        self._resolved.clear()

    def match(self, cls: type) -> tuple[type, V] | None:
        """``(registered class, value)`` for ``cls`` by the subclass rule, or None."""
        if cls in self._resolved:
            return self._resolved[cls]
        hit: tuple[type, V] | None = None
        for c in cls.__mro__:
            key: Key = c if c in self._entries else qualname(c)
            if key not in self._entries or not _inherits_forward(cls, c):
                continue
            if isinstance(key, str):
                self._named[c] = None
            hit = (c, self._entries[key])
            break
        self._resolved[cls] = hit
        return hit

    def get(self, key: Key) -> V | None:
        """The value registered under ``key`` itself (no subclass rule), or None."""
        try:
            return self._entries.get(key)
        except TypeError:  # an unhashable key is registered nowhere
            return None

    def lookup(self, cls: type) -> V | None:
        """The value for ``cls`` by the subclass rule (module docstring), or None."""
        hit = self.match(cls)
        return None if hit is None else hit[1]

    def __getitem__(self, cls: type) -> V:
        """Like :meth:`lookup`, raising a KeyError that names the class and the fix."""
        hit = self.match(cls)
        if hit is None:
            raise KeyError(
                f"{cls.__name__} has no {self.what} (nor a base class whose forward it "
                f"inherits); register one with {self.register_with}."
            )
        return hit[1]

    def __contains__(self, key: object) -> bool:
        """``key`` itself is registered (a class or a name; no subclass rule)."""
        return key in self._entries

    def __iter__(self) -> Iterator[Key]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> list[tuple[Key, V]]:
        """``(key, value)`` in registration order."""
        return list(self._entries.items())

    def values(self) -> list[V]:
        """The values in registration order."""
        return list(self._entries.values())

    def classes(self) -> list[type]:
        """The registered classes, and the classes seen so far that a name key matched."""
        seen = [k for k in self._entries if isinstance(k, type)]
        return seen + [c for c in self._named if c not in seen]


def _name(key: Key) -> str:
    return key if isinstance(key, str) else getattr(key, "__name__", repr(key))
