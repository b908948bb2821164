"""Named registries (placements, norms, activations, optimizers, ...), each serving one config field.

A registry is the single source of its allowed names: config validation and the code that looks a
name up report an unknown one through the same message (`errors.not_allowed`).
"""

from typing import Generic, TypeVar

from normstudy import errors

T = TypeVar("T")


class Registry(Generic[T]):
  """name -> definition for the config field `field` (e.g. "model.placement")."""

  def __init__(self, field: str):
    self.field = field
    self._items: dict[str, T] = {}

  def register(self, name: str, item: T) -> T:
    if name in self._items:
      raise ValueError(f"{self.field}: {name!r} is already registered")
    self._items[name] = item
    return item

  def names(self) -> tuple[str, ...]:
    return tuple(sorted(self._items))

  def registered(self) -> list[T]:
    """The definitions in the order they were registered."""
    return list(self._items.values())

  def items(self):
    return [(name, self._items[name]) for name in self.names()]

  def __contains__(self, name) -> bool:
    return name in self._items

  def get(self, name: str) -> T:
    try:
      return self._items[name]
    except (KeyError, TypeError):
      raise errors.not_allowed(self.field, name, self.names()) from None
