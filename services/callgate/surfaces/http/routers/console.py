"""The approval console: static files shipped in the package (ADR 0018)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

STATIC = Path(__file__).resolve().parent.parent / "static"

router = APIRouter(include_in_schema=False)


@router.get("/")
def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8")


@router.get("/invocations/{invocation_id}")
def invocation_page(invocation_id: str) -> FileResponse:
    """The path form of ``/#invocation=<id>``: the console opens that invocation (the id
    is read by the page, after sign-in, through the API)."""
    return index()
