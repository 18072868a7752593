"""gantry.training: the training runtime that gives any PyTorch model the platform's features.

A user writes a :class:`Task` (a model, a loss and a dataset factory); the job spec points at
it and the runtime (``python -m gantry.training.run``, started by the node agent) does the
rest: distributed data parallel training or FSDP, mixed precision, gradient compression,
asynchronous encrypted checkpoints with exact resume, differentially private training,
progress reporting, and export of the finished model for the registry. See docs/training.md.
"""

from gantry.training.task import DataContext, Task
from gantry.training.trainer import Hooks, StepMetrics, Trainer, TrainingOptions, WorkerEnv

__all__ = ["DataContext", "Hooks", "StepMetrics", "Task", "Trainer", "TrainingOptions", "WorkerEnv"]
