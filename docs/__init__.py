"""Documentation pages; `docs.examples` holds code they show (importable from the
repository root, e.g. `--task=docs.examples.my_task:build_task`)."""
