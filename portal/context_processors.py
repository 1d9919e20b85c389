from django.urls import Resolver404, resolve

from portal.roles import can_read_cost_reports, is_admin

# Pages that other issues add (bookings, quotas): the main menu links to each once its URL resolves.
UPCOMING_PAGES = {"bookings": "/accounting/bookings/", "budget": "/accounting/budget/"}


def _resolves(path: str) -> bool:
    try:
        resolve(path)
    except Resolver404:
        return False
    return True


def navigation(request) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"nav": {}}
    return {
        "nav": {
            "is_admin": is_admin(user),
            "can_read_reports": can_read_cost_reports(user),
            **{f"has_{name}": _resolves(path) for name, path in UPCOMING_PAGES.items()},
        }
    }


def csp(request) -> dict:
    """``csp_nonce``: the nonce of this response's Content-Security-Policy (inline scripts carry it)."""
    return {"csp_nonce": getattr(request, "csp_nonce", "")}
