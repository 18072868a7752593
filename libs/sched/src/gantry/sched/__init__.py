"""gantry.sched: the scheduling policy engine shared by the scheduler service and the simulator."""
