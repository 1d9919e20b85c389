from __future__ import annotations

import zoneinfo

from django import forms


class ProfileForm(forms.Form):
    time_zone = forms.CharField(
        max_length=64,
        required=False,
        help_text="An IANA name such as Asia/Shanghai; empty: the site's time zone. Pages show times in it.",
    )
    notify_job_end = forms.BooleanField(required=False, label="Email me when my jobs end")

    def clean_time_zone(self) -> str:
        name = self.cleaned_data["time_zone"].strip()
        if name:
            try:
                zoneinfo.ZoneInfo(name)
            except (zoneinfo.ZoneInfoNotFoundError, ValueError):
                raise forms.ValidationError(f"Unknown time zone {name!r}: use an IANA name such as Asia/Shanghai.") from None
        return name
