r"""Where a round of the main job spends its time, by phase.

Runs the main job (`tasks.binaries.main_job`, its flags and defaults; by default a
subset of its runs, into a temporary directory) with a timer around each phase of a
round, and prints one table: seconds in each phase over all rounds, per round, and
its share of the whole.

  .venv/bin/python -m benchmarks.round_profile
  .venv/bin/python -m benchmarks.round_profile --aggregators=gm --attacks=omniscient \
      --rhos=0.1 --cprofile=30

Phases (nested timers are subtracted from their parent, so the shares add up):

*   setup: building each run's simulation (the aggregator's and the evaluation's
    tracing; the client work is built once per task), resuming its directory.
*   client datasets: the task's `client_dataset` calls (building the `tf.data`
    pipelines, the data attack's poisoning).
*   training: the client work's TFF computation (serializing the datasets and the
    model into TFF's executor, local SGD, the updates back to numpy).
*   attack: the update attack on the round's numpy updates.
*   aggregation: the aggregator's `next` on the round's updates.
*   server update: TFF's optimizer finalizer applying the aggregate.
*   evaluation: the global model on the clean test data (every `--eval_period`).
*   metrics + checkpoints: the metrics row and the round's checkpoint.
*   other: the rest of the runs (sampling, the non-finite checks, flattening the
    metrics, the progress bar) and of the sweep (fingerprints, the report).

`--cprofile=N` also prints the N functions of largest cumulative time (cProfile over
the same runs; it slows Python-heavy phases, so the table is then less exact).
"""

import collections
import contextlib
import cProfile
import functools
import io
import pstats
import sys
import tempfile
import time

from absl import flags

from tasks.binaries import exit_status
from tasks.binaries import main_job
from tasks.binaries import sweep_flags

FLAGS = flags.FLAGS
_CPROFILE = flags.DEFINE_integer('cprofile', 0, 'Also print this many functions of '
                                 'largest cumulative time (0: no cProfile).')
# A representative slice of the main job by default: every aggregator under the
# omniscient attack at ρ = 0.1 (the update attack's round trip), 30 rounds each.
FLAGS.set_default('attacks', ['omniscient'])
FLAGS.set_default('rhos', ['0.1'])
FLAGS.set_default('output_dir', '')
# One process: the phases are timed in this one.
FLAGS.set_default('parallel_runs', 1)

PHASES = ('setup', 'client datasets', 'training', 'attack', 'aggregation',
          'server update', 'evaluation', 'metrics + checkpoints', 'other')


class PhaseTimer:
  """Exclusive wall time per phase: time inside a nested phase counts for it only."""

  def __init__(self):
    self.seconds = collections.Counter()
    self.rounds = 0
    self._stack = []

  @contextlib.contextmanager
  def phase(self, name: str):
    start = time.perf_counter()
    self._stack.append(0.0)
    try:
      yield
    finally:
      elapsed = time.perf_counter() - start
      nested = self._stack.pop()
      self.seconds[name] += elapsed - nested
      if self._stack:
        self._stack[-1] += elapsed

  def timed(self, name: str, function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
      with self.phase(name):
        return function(*args, **kwargs)
    return wrapper


class _TimedProcess:
  """A finalizer process whose `next` is timed (TFF's processes keep `next` in a
  read-only property)."""

  def __init__(self, process, timer: PhaseTimer, name: str):
    self._process = process
    self.next = timer.timed(name, process.next)

  def initialize(self):
    return self._process.initialize()


def install(timer: PhaseTimer) -> None:
  """Wraps the phases of the simulation harness with `timer`."""
  # pylint: disable=g-import-not-at-top,protected-access
  from tasks.simulation import checkpoints
  from tasks.simulation import client_work as client_work_lib
  from tasks.simulation import experiment
  from tasks.simulation import loop
  from tasks.simulation import rounds
  from tasks.simulation import sweep
  sweep._train_run = timer.timed('setup', sweep._train_run)
  experiment._train = timer.timed('other', experiment._train)
  experiment._run = timer.timed('metrics + checkpoints', experiment._run)
  checkpoints.save = timer.timed('metrics + checkpoints', checkpoints.save)
  loop.Simulation.evaluate = timer.timed('evaluation', loop.Simulation.evaluate)

  original_round = loop.Simulation.run_round

  def run_round(self, state, round_num):
    timer.rounds += 1
    return original_round(self, state, round_num)

  loop.Simulation.run_round = run_round

  original_train = client_work_lib.ProcessClientWork.train

  def train(self, state, model_weights, client_ids, client_dataset, learning_rate):
    with timer.phase('training'):
      return original_train(self, state, model_weights, client_ids,
                            timer.timed('client datasets', client_dataset),
                            learning_rate)

  client_work_lib.ProcessClientWork.train = train

  original_init = rounds.Round.__init__

  def round_init(self, *args, **kwargs):
    original_init(self, *args, **kwargs)
    self.aggregate = timer.timed('aggregation', self.aggregate)
    if hasattr(self, '_server_next'):  # The server update, in process or not.
      self._server_next = timer.timed('server update', self._server_next)
    else:  # Before the in-process path (the revision profiled as "before").
      self.server_update = _TimedProcess(self.server_update, timer, 'server update')

  rounds.Round.__init__ = round_init

  original_next = rounds.Round.next

  def round_next(self, *args, attack=None, **kwargs):
    if attack is not None and 'attack_round' not in vars(attack):  # Once an attack.
      attack.attack_round = timer.timed('attack', attack.attack_round)
    return original_next(self, *args, attack=attack, **kwargs)

  rounds.Round.next = round_next


def table(timer: PhaseTimer, total: float) -> str:
  """The markdown table of the phases."""
  other = total - sum(timer.seconds[p] for p in PHASES if p != 'other')
  seconds = collections.Counter(timer.seconds)
  seconds['other'] = other
  n = max(timer.rounds, 1)
  lines = [f'{timer.rounds} rounds in {total:.1f} s ({total / n * 1000:.0f} ms per '
           'round, everything included):', '',
           '| phase | s | ms per round | share |', '|---|---:|---:|---:|']
  for phase in PHASES:
    lines.append(f'| {phase} | {seconds[phase]:.2f} | {seconds[phase] / n * 1000:.1f} '
                 f'| {seconds[phase] / total:.1%} |')
  return '\n'.join(lines)


def main(argv):
  timer = PhaseTimer()
  install(timer)
  with tempfile.TemporaryDirectory() as scratch:
    if not FLAGS.output_dir:
      FLAGS.output_dir = scratch
    profiler = cProfile.Profile() if _CPROFILE.value else None
    start = time.perf_counter()
    # The main job prints its page first (stdout stays a file: TFF's worker
    # inherits it).
    if profiler:
      profiler.runcall(main_job.main, argv)
    else:
      main_job.main(argv)
    total = time.perf_counter() - start
  print('\nPhases of the rounds above (benchmarks.round_profile):\n')
  print(table(timer, total))
  if profiler:
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats('cumulative').print_stats(
        _CPROFILE.value)
    print(out.getvalue(), file=sys.stderr)


if __name__ == '__main__':
  exit_status.run(main, header=sweep_flags.print_sweep_header)
