"""The viewer's web app: Starlette routes rendering Jinja templates, its own CSS and JS as static files.

Starlette (already installed with FastAPI, a base dependency) and Jinja2 are small, maintained and typed; the
pages are rendered on the server (a step of 512 episodes is one table page, a conversation one document), so
the browser needs no framework: a few KB of the viewer's own JavaScript, no CDN, nothing fetched from
anywhere but the viewer itself.

Routes: ``/`` (the run, or an episodes file's episodes), ``/step/N`` and ``/eval/NAME`` (a listing: sortable,
searchable by task text, paginated on the server), ``/step/N/episode/K`` and ``/eval/NAME/episode/K`` (one
episode); anything unknown is a 404 page.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from rllm.viewer.sources import Listing, Source, mean_reward, step_rewards, summarize
from rllm.viewer.views import PAGE_SIZE, Page, curves, episode_view, first_page, guard_values, listing_page

logger = logging.getLogger(__name__)

_HERE = Path(__file__).parent


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def create_app(source: Source) -> Starlette:
    """The app serving ``source`` (``rllm.viewer.sources.open_source``)."""
    templates = Jinja2Templates(directory=str(_HERE / "templates"))
    title = source.path.name or str(source.path)

    def render(request: Request, name: str, status: int = 200, **context: Any) -> Response:
        return templates.TemplateResponse(request, name, {"title": title, "source": source, **context},
                                          status_code=status)

    def listing_of(request: Request) -> Listing:
        listing = source.listing(request.path_params["kind"], request.path_params["key"])
        if listing is None:
            raise HTTPException(404, f"no {request.path_params['kind']} {request.path_params['key']!r} in {title}")
        return listing

    def page_of(request: Request, listing: Listing) -> Page:
        query = request.query_params.get("q", "").strip()
        sort, order = request.query_params.get("sort", "index"), request.query_params.get("order", "asc")
        number = _int(request.query_params.get("page"), 1)
        if query or sort != "index" or order != "asc":
            return listing_page(listing.index.summaries(), page=number, query=query, sort=sort, order=order)
        page = first_page(len(listing.index))  # file order: only this page's lines are read
        page.page = min(max(number, 1), page.pages)
        start = (page.page - 1) * PAGE_SIZE
        page.rows = [summarize(i, listing.index.read(i)) for i in range(start, min(start + PAGE_SIZE, page.total))]
        return page

    async def home(request: Request) -> Response:
        if not source.is_run:
            (listing,) = source.evaluations.values()
            return render(request, "listing.html", listing=listing, page=page_of(request, listing))
        metrics = source.metrics()
        rewards = step_rewards(metrics)
        steps = [(number, listing, rewards.get(number)) for number, listing in source.steps().items()]
        steps = [(n, listing, reward if reward is not None else mean_reward(listing)) for n, listing, reward in steps]
        return render(request, "run.html", curves=curves(metrics), guards=guard_values(metrics), steps=steps,
                      evaluations=list(source.evaluations.values()), metric_rows=len(metrics))

    async def listing(request: Request) -> Response:
        listing = listing_of(request)
        return render(request, "listing.html", listing=listing, page=page_of(request, listing))

    async def episode(request: Request) -> Response:
        listing = listing_of(request)
        number = _int(request.path_params["number"], -1)
        try:
            item = listing.index.read(number)
        except IndexError:
            raise HTTPException(404, f"{listing.title} has no episode {number} (it has {len(listing.index)})") from None
        except ValueError as error:
            raise HTTPException(422, f"{listing.title}, episode {number}: {error}") from None
        return render(request, "episode.html", listing=listing, number=number, total=len(listing.index),
                      episode=episode_view(item))

    async def http_error(request: Request, error: Exception) -> Response:
        status = error.status_code if isinstance(error, HTTPException) else 500
        detail = error.detail if isinstance(error, HTTPException) else "the viewer failed on this page"
        if status == 500:
            logger.error("viewer: %s failed", request.url.path, exc_info=error)
        return render(request, "error.html", status=status, status_code=status, detail=detail)

    routes = [
        Mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static"),  # before /{kind}/{key}
        Route("/", home),
        Route("/{kind:str}/{key:str}", listing),
        Route("/{kind:str}/{key:str}/episode/{number:str}", episode),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: http_error})
