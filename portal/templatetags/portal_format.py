from django import template

from portal.slurm.parsing import exit_signal_text

register = template.Library()


@register.filter
def percent(value, digits: int = 1) -> str:
    """0.00087 → "0.1 %"; None → "–". One decimal by default, so small shares do not read as 0 %."""
    if value is None or value == "":
        return "–"
    return f"{float(value) * 100:.{int(digits)}f} %"


@register.filter
def stamp(value, seconds: str = "") -> str:
    """A time as every page shows it: in the viewer's zone (UserTimezoneMiddleware) with the zone's
    name, "2026-12-03 15:22 CET" (``|stamp:"s"`` adds seconds); None → "–"."""
    from django.utils import dateformat, timezone

    if value is None or value == "":
        return "–"
    if timezone.is_aware(value):
        value = timezone.localtime(value)
    return dateformat.format(value, "Y-m-d H:i:s T" if seconds else "Y-m-d H:i T")


@register.filter
def duration(seconds) -> str:
    """Whole seconds as "2 h 05 min", "4 min 09 s", "12 s"; None → "–"."""
    if seconds is None or seconds == "":
        return "–"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {secs:02d} s"
    return f"{secs} s"


@register.filter
def signal(number) -> str:
    """The signal half of a job's sacct ExitCode in words (portal.slurm.parsing.exit_signal_text)."""
    return exit_signal_text(number)
