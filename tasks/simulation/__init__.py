"""The simulation harness: everything about *simulating* federated training under
attack, never part of a factory a user deploys.

  attacks       corrupted-set selection and update attacks (classes, by name)
  client_work   what a selected client computes: FedAvg, Ditto, personalized RFA,
                any `tff.learning.templates.ClientWorkProcess`
  rounds        `Round`, one round of any TFF client work and aggregator with the
                per-client updates in Python for an attack (public; docs/tasks.md)
  loop          `Simulation`, the one round loop (sampling, seeding, corruption,
                evaluation around a `Round`)
  evaluation    clean test metrics, per-client statistics
  experiment    runs a simulation with checkpoints, metrics CSV and TensorBoard
  ledger        finished runs' final results in a small CSV committed beside a table
  sweep         aggregators × attacks × ρ × seeds, tables and plots
"""
