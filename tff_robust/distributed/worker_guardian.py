"""Stops a process's TFF `worker_binary` children after it dies, even by SIGKILL.

`tff_robust.distributed.runtime.worker_binaries_stopped(even_when_killed=True)` starts this file as
a small separate Python process (stdlib only, run by path so that it does not import
TensorFlow):

  python /path/to/worker_guardian.py TOKEN     # stdin: a pipe the watched process holds

and puts `TFF_ROBUST_GUARDIAN=TOKEN` in the watched process's environment, which every
worker_binary it starts inherits. When the pipe reaches end of file (the watched
process closed it, or died: the kernel closes a dead process's pipes, whatever killed
it), the guardian kills the running worker_binary processes whose environment holds the
token, and exits.

Why this design: TFF starts its workers itself (`subprocess.Popen` in its executor
factory), so they cannot be given `prctl(PR_SET_PDEATHSIG)` without patching TFF; a
process killed by SIGKILL runs no code of its own, so someone else has to act; and once
it is dead its workers are re-parented, so they are found by the inherited token rather
than by parent pid (which is also safe against pid reuse and finds workers started at
any time). The end of file arrives at the moment of death, with no polling.
"""

import os
import signal
import sys

ENVIRONMENT_VARIABLE = 'TFF_ROBUST_GUARDIAN'
_BINARY_NAME = b'worker_binary'


def _read(path: str) -> bytes:
  with open(path, 'rb') as f:
    return f.read()


def marked_workers(token: str) -> list[int]:
  """Pids of the running worker_binary processes started with `token` in their
  environment (by a process inside `worker_binaries_stopped(even_when_killed=True)`)."""
  mark = f'{ENVIRONMENT_VARIABLE}={token}'.encode()
  pids = []
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      if (_BINARY_NAME in _read(f'/proc/{entry}/cmdline') and
          mark in _read(f'/proc/{entry}/environ').split(b'\0')):
        pids.append(int(entry))
    except OSError:  # Ended meanwhile, or another user's process.
      continue
  return pids


def main(argv: list[str]) -> int:
  if len(argv) != 2:
    print(f'usage: {argv[0]} TOKEN (stdin: the watched process\'s pipe)', file=sys.stderr)
    return 2
  token = argv[1]
  while sys.stdin.buffer.read(4096):  # Nothing is sent: this waits for end of file.
    pass
  for pid in marked_workers(token):
    try:
      os.kill(pid, signal.SIGKILL)  # Their driver is gone: nothing to shut down cleanly.
    except ProcessLookupError:
      pass
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
