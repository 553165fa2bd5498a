"""absl-flag binaries (`python -m tasks.binaries.<name>`): train, sweep, main_job.
`flag_groups` defines the flags they share; no binary imports another.

Importing this package, before any binary imports TensorFlow, keeps TensorFlow's C++
INFO and WARNING lines (over a hundred per run) off stderr unless the user set
TF_CPP_MIN_LOG_LEVEL; a help request also drops the ERROR lines of the CUDA plugins
(nothing runs, so no error of TensorFlow's can matter).
"""

import os
import sys

_HELP_FLAGS = ('help', 'helpshort', 'helpfull', 'helpxml', '?')


def _asks_for_help(argv) -> bool:
  return any(arg.lstrip('-').split('=')[0] in _HELP_FLAGS
             for arg in argv[1:] if arg.startswith('-'))


os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3' if _asks_for_help(sys.argv) else '2')
