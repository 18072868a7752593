"""Audit: (being built)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()

__all__ = ["router"]
