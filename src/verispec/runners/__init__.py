"""Model runners: the interface the engine and the drafters use to run a model (base.py), the
backend registry (registry.py), one module per backend with its built-in cost curve
(torch_runner.py, llamacpp.py), and the cost curves' common machinery (costs.py)."""

from verispec.runners.base import BatchItem, ModelRunner, RunnerCapabilities
from verispec.runners.registry import RunnerConfig, build_runner, check_options

__all__ = ["BatchItem", "ModelRunner", "RunnerCapabilities", "RunnerConfig", "build_runner", "check_options"]
