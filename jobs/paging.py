"""The job list's pages, on the page and the API: keyset pages (portal.paging) in the list's order
(jobs.filters.list_ordering), so that a deep page costs what the first does (issue 39;
bench/bench_year_pages.py measures both on a year of jobs)."""

from __future__ import annotations

from django.conf import settings
from rest_framework.pagination import BasePagination
from rest_framework.response import Response

from jobs.filters import list_ordering
from portal.paging import KeysetPage, keyset_page

CURSOR_PARAM = "cursor"


def job_list_page(jobs, *, ordering: str | None, cursor: str | None, size: int) -> KeysetPage:
    """One page of the (visible, filtered) jobs in the list's order, from ``cursor`` (None: the first)."""
    field, descending = list_ordering(ordering)
    return keyset_page(jobs, field=field, descending=descending, cursor=cursor or None, size=size)


class JobCursorPagination(BasePagination):
    """``GET /api/v1/jobs/``: ``{"next", "previous", "results"}``, ``next``/``previous`` the links of the
    neighbouring pages (a ``cursor`` parameter), ``page_size`` rows (PAGE_SIZE) a page. No count: it
    would read every visible job on every request."""

    page_size = settings.REST_FRAMEWORK["PAGE_SIZE"]

    def paginate_queryset(self, queryset, request, view=None):
        self.request = request
        self.page = job_list_page(queryset, ordering=request.query_params.get("ordering"),
                                  cursor=request.query_params.get(CURSOR_PARAM), size=self.page_size)  # fmt: skip
        return self.page.rows

    def _link(self, cursor: str | None) -> str | None:
        return (
            None
            if cursor is None
            else self.request.build_absolute_uri(page_query(self.request.query_params, cursor))
        )

    def get_paginated_response(self, data):
        return Response({"next": self._link(self.page.next_cursor), "previous": self._link(self.page.previous_cursor),
                         "results": data})  # fmt: skip

    def get_paginated_response_schema(self, schema):
        link = {"type": "string", "nullable": True, "format": "uri"}
        return {"type": "object", "required": ["results"],
                "properties": {"next": link, "previous": link, "results": schema}}  # fmt: skip

    def get_schema_operation_parameters(self, view):
        return [{"name": CURSOR_PARAM, "required": False, "in": "query", "schema": {"type": "string"},
                 "description": "The page: the `next` or `previous` link of the page before (absent: the first page)."}]  # fmt: skip


def page_query(params, cursor: str | None) -> str:
    """The query string of another page of the same list: its filters and order, that page's cursor."""
    query = params.copy()
    query.pop(CURSOR_PARAM, None)
    if cursor is not None:
        query[CURSOR_PARAM] = cursor
    return "?" + query.urlencode()
