from __future__ import annotations

import zoneinfo

from django.utils import timezone


class UserTimezoneMiddleware:
    """Show times in the user's own time zone (profile), else the site's TIME_ZONE."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        tz_name = ""
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            profile = getattr(user, "profile", None)
            tz_name = profile.time_zone if profile else ""
        if tz_name:
            try:
                timezone.activate(zoneinfo.ZoneInfo(tz_name))
            except (zoneinfo.ZoneInfoNotFoundError, ValueError):
                timezone.deactivate()
        else:
            timezone.deactivate()
        return self.get_response(request)
