"""`[target:]key=value` entries, as --aggregator_args and --attack_args take them."""

import ast
from typing import Any, Optional, Sequence


def split_entry(entry: str) -> tuple[str, str, Optional[str]]:
  """`[target:]key=value` as (target or '', key, value or None without '=')."""
  head, sep, text = entry.partition('=')
  target, _, key = head.rpartition(':')
  return target, key, text if sep else None


def parse(entries: Sequence[str], name: str, known_names: Sequence[str],
                     untargeted: bool = True) -> dict[str, Any]:
  """The keyword arguments of `name` in `[target:]key=value` entries (entries without
  a target apply to `name` too unless `untargeted` is False).

  Raises:
    ValueError: for an entry that is not `[target:]key=value`, or an unknown target.
  """
  kwargs = {}
  for entry in entries:
    target, key, text = split_entry(entry)
    if target and target not in known_names:
      raise ValueError(f'entry {entry!r} targets unknown {target!r}; known: '
                       f'{", ".join(known_names)}.')
    if text is None or not key.isidentifier():
      raise ValueError(f'entry {entry!r} is not [name:]key=value.')
    if (target or not untargeted) and target != name:
      continue
    try:
      kwargs[key] = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      kwargs[key] = text  # A bare string, e.g. covariance=diagonal.
  return kwargs
