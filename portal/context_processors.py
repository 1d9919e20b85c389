from portal.roles import can_read_cost_reports, is_admin

# The main menu's entries and the views (URL names, "namespace:name"; a prefix) each is current on.
MENU_SECTIONS = {
    "dashboard": ("dashboard",), "jobs": ("jobs:",), "clusters": ("cluster-status",),
    "bookings": ("accounting:bookings", "accounting:booking-"), "budget": ("accounting:budget",),
    "teams": ("team-list", "team-detail"), "reports": ("accounting:reports",),
}  # fmt: skip


def _section(request) -> str:
    """The main menu's entry the page belongs to ("" for none): from the view the URL resolved to."""
    match = getattr(request, "resolver_match", None)
    name = match.view_name if match is not None else ""
    return next((section for section, views in MENU_SECTIONS.items() if name.startswith(views)), "")


def navigation(request) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"nav": {}}
    return {
        "nav": {"is_admin": is_admin(user), "can_read_reports": can_read_cost_reports(user), "section": _section(request)}
    }


def csp(request) -> dict:
    """``csp_nonce``: the nonce of this response's Content-Security-Policy (inline scripts carry it)."""
    return {"csp_nonce": getattr(request, "csp_nonce", "")}
