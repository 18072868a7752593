"""gantry.training_agent: the node agent that runs training workers on every node.

It registers the node's devices (NVML / torch; CPU worker slots where there is no GPU) with
the scheduler, takes placements over NATS, launches one worker process per placed rank with
the rendezvous environment, streams logs, progress and step metrics, checkpoints and stops
workers on preemption, restarts crashed gangs from their last checkpoint, renews data grants
and registers finished models with lineage. See docs/training-agent.md.
"""
