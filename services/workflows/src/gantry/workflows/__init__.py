"""The workflows service: pipelines of steps (data, train, evaluate, gated canary deploy) with
outputs passed between them, cron schedules with concurrency policies, durable runs that a
restart continues, traced step by step with their jobs and lineage. See docs/workflows.md."""
