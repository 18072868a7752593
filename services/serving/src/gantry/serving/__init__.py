"""The serving service: registered models as Open Inference Protocol endpoints."""
