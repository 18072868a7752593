"""The scheduler service: queues, quotas, placement, preemption and nodes, over NATS and gRPC."""
