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


class TeamIdlePolicyForm(forms.Form):
    """The team page's idle-GPU policy form (its managers'); the bounds are checked by the service
    (portal.services.team_idle_policy_set), whose errors land beside these fields."""

    enabled = forms.BooleanField(required=False, label="Policy on",
                                 help_text="Off: no job of the team is warned or cancelled for idle GPUs.")  # fmt: skip
    threshold_percent = forms.DecimalField(max_digits=5, decimal_places=2, label="Idle under (%)",
                                           help_text="A GPU whose utilisation is under this is idle.")  # fmt: skip
    warn_minutes = forms.DecimalField(max_digits=8, decimal_places=2, label="Warn after (minutes)",
                                      help_text="Every GPU of a job idle this long: its submitter is warned (e-mail, webhook, job page).")  # fmt: skip
    cancel_minutes = forms.DecimalField(max_digits=8, decimal_places=2, label="Then cancel after (minutes)",
                                        help_text="Still idle this long after the warning: the portal cancels the job.")  # fmt: skip
