"""TFF 0.87's local ServiceManagers and their finalizer in the interpreter's teardown
(standard library only: the worker side imports it through
`tff_robust.distributed.runtime`).

Each of TFF's local contexts keeps a `ServiceManager` (a class local to a TFF function)
that owns the context's worker_binary. Its finalizer looks up `subprocess.Popen`; run
in the interpreter's teardown, where `subprocess` is already None, it prints
"Exception ignored in: ... ServiceManager.__del__ ... 'NoneType' object has no
attribute 'Popen'" at exit. When it runs there depends on the modules' teardown
order, which importing a module can change (plain TFF scripts print it too): the
modules whose import did (`tff_robust.common.tff_private`, which every factory
imports, and `tasks.builders.task`) call `disarm_idle_managers_at_exit`.
"""

import atexit
import gc


def service_managers() -> list:
  """TFF's local ServiceManagers; a class local to a TFF function, so found among the
  live objects."""
  return [manager for manager in gc.get_objects()
          if type(manager).__name__ == 'ServiceManager' and hasattr(manager, '_process')]


def stop_nothing(manager) -> None:
  """The finalizer of a manager with nothing to stop."""
  del manager  # Its worker, if it started one, is stopped by whoever stopped it.


def disarm_idle_managers() -> None:
  """Replaces the finalizer of TFF's local ServiceManagers that started no worker (it
  has nothing to stop); a manager holding a worker keeps its own."""
  for manager in service_managers():
    if manager._process is None:  # pylint: disable=protected-access
      type(manager).__del__ = stop_nothing


def disarm_idle_managers_at_exit() -> None:
  """Registers `disarm_idle_managers` as an exit hook, once however often it is
  called: each run walks every live object (~0.2–0.5 s in a program that traced a
  model)."""
  atexit.unregister(disarm_idle_managers)
  atexit.register(disarm_idle_managers)


def skip_disarming_at_exit() -> None:
  """For a program about to end by `os._exit`, which runs no finalizer: the exit
  hook would walk the live objects for nothing."""
  atexit.unregister(disarm_idle_managers)
