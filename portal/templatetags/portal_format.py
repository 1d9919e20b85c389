from django import template

register = template.Library()


@register.filter
def percent(value, digits: int = 1) -> str:
    """0.00087 → "0.1 %"; None → "–". One decimal by default, so small shares do not read as 0 %."""
    if value is None or value == "":
        return "–"
    return f"{float(value) * 100:.{int(digits)}f} %"
