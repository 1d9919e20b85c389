from portal.roles import can_read_cost_reports, is_admin


def navigation(request) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"nav": {}}
    return {"nav": {"is_admin": is_admin(user), "can_read_reports": can_read_cost_reports(user)}}
