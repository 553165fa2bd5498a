"""`python -m tff_robust.distributed --port=N ...`: one worker (see `worker_launcher`).

The launcher is standard library only and the package imports nothing, so TensorFlow
is never loaded for a worker.
"""

import sys

from tff_robust.distributed import worker_launcher

if __name__ == '__main__':
  sys.exit(worker_launcher.main(sys.argv))
