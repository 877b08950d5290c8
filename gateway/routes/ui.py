"""GET `/ui`: the chat playground, a static page that speaks the control protocol (`/generate`).

The page and its two assets are package data in `gateway/static/`; nothing is built and
nothing comes from another origin, which the Content-Security-Policy enforces.
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from gateway.http.openapi import TEXT, Op
from gateway.http.prepared import Whole, to_response

# The page and its assets are files: FileResponse streams them (with their ETag and length).
STATIC = Path(__file__).resolve().parent.parent / "static"
ASSETS = {  # the only files served: name -> media type
    "playground.js": "text/javascript; charset=utf-8",
    "playground.css": "text/css; charset=utf-8",
}
HEADERS = {
    # `ws:`/`wss:` because older browsers do not count a same-host WebSocket as 'self'.
    "Content-Security-Policy": (
        "default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


async def page(request: Request) -> Response:
    return FileResponse(
        STATIC / "playground.html", media_type="text/html; charset=utf-8", headers=HEADERS
    )


async def asset(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in ASSETS:
        return to_response(Whole(404, b"Not Found", "text/plain"))
    return FileResponse(STATIC / name, media_type=ASSETS[name], headers=HEADERS)


routes = [Route("/ui", page, methods=["GET"]), Route("/ui/{name}", asset, methods=["GET"])]
operations = [
    Op("get", "/ui", "The chat playground", None, {"text/html": TEXT}, None, ()),
    Op(
        "get",
        "/ui/{name}",
        "A playground asset",
        None,
        {"text/javascript": TEXT, "text/css": TEXT},
        None,
        (404,),
    ),
]
