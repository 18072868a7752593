"""gantry.audit: the audit service — a tamper-evident log of every Gantry event."""

__all__: list[str] = []
