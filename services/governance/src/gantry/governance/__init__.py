"""The data-governance service."""
