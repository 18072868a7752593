"""gantry.sched: the scheduling policy engine shared by the scheduler service and the simulator.

Placement core: a :class:`Cluster` of node arrays, a task's :class:`Demand`, and policies that
answer ``choose(cluster, demand) -> Placement | None`` (:class:`PlacementPolicy`):
:class:`RandomPolicy`, :class:`BestFitPolicy`, :class:`FgdPolicy` (ATC'23) and
:class:`GantryPolicy`, the production one. :func:`inflate` / :func:`run_arrivals` run the FGD
paper's workload-inflation experiment.

Around it: the job spec (:func:`parse_job`), queues with quotas, cohort borrowing and DRF
(:class:`QueueBook`), run-time prediction (:class:`DurationPredictor`), trusted pools for
sensitive data (:func:`eligible_pools`), job traces (:func:`load_jobs_csv`) and the
discrete-event simulator (:func:`simulate`) that replays traces through the same policies.
"""

from gantry.sched.cluster import GPU_MILLI, Cluster, load_nodes_csv
from gantry.sched.demand import Demand, load_pods_csv
from gantry.sched.fragmentation import Workload, fragmentation, model_pressure, stranded
from gantry.sched.inflation import InflationResult, inflate, run_arrivals
from gantry.sched.packing import FgdPolicy, GantryPolicy
from gantry.sched.placement import (
    BestFitPolicy,
    Placement,
    PlacementPolicy,
    RandomPolicy,
    feasible_nodes,
)
from gantry.sched.pools import DataSensitivity, Pool, eligible_pools
from gantry.sched.predict import DurationPredictor, JobFeatures
from gantry.sched.queues import Admission, Amount, QueueBook, QueueConfig, load_queues
from gantry.sched.simulate import ORDERINGS, SimResult, Simulator, simulate
from gantry.sched.spec import TrainingJob, parse_job
from gantry.sched.traces import TraceJob, jobs_from_alibaba, load_jobs_csv, parse_jobs_csv

__all__ = [
    "GPU_MILLI",
    "ORDERINGS",
    "Admission",
    "Amount",
    "BestFitPolicy",
    "Cluster",
    "DataSensitivity",
    "Demand",
    "DurationPredictor",
    "FgdPolicy",
    "GantryPolicy",
    "InflationResult",
    "JobFeatures",
    "Placement",
    "PlacementPolicy",
    "Pool",
    "QueueBook",
    "QueueConfig",
    "RandomPolicy",
    "SimResult",
    "Simulator",
    "TraceJob",
    "TrainingJob",
    "Workload",
    "eligible_pools",
    "feasible_nodes",
    "fragmentation",
    "inflate",
    "jobs_from_alibaba",
    "load_jobs_csv",
    "load_nodes_csv",
    "load_pods_csv",
    "load_queues",
    "model_pressure",
    "parse_job",
    "parse_jobs_csv",
    "run_arrivals",
    "simulate",
    "stranded",
]
