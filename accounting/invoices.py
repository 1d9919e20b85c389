"""Monthly team invoices: the figures (jobs, GPU-hours, rates, totals) and a PDF of them.

The PDF is written by hand (PDF 1.4, built-in Courier font, A4 landscape, as many pages as needed):
no dependency, and an invoice is a table of text. Text outside Latin-1 is replaced by "?"."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from decimal import ROUND_HALF_UP, Decimal

from django.conf import settings

from accounting.selectors import billing_midnight, booking_charges, invoice_lines, jobs_by_uuid, next_month
from portal.models import Team

CENT = Decimal("0.01")
HOUR = Decimal(3600)


def invoice(*, team: Team, month: dt.date) -> dict:
    """One line per usage slice of the team in the month (a job crossing a month boundary or a rate
    change has one line per part), a summary per GPU type and rate, and totals. Two queries."""
    slices = list(invoice_lines(team=team, month=month))
    jobs = jobs_by_uuid(s.record.portal_job_uuid for s in slices)
    lines, summary = [], defaultdict(lambda: {"gpu_seconds": 0, "cost": Decimal(0)})
    for s in slices:
        record = s.record
        hours = Decimal(s.gpu_seconds) / HOUR
        lines.append({
            "job_id": record.job_id,
            "name": record.name,
            "user": record.unix_user,
            "partition": record.partition,
            "state": record.state,
            "gpu_type": s.gpu_type or "untyped",
            "gpus": s.gpus,
            "start": s.slice_start,
            "end": s.slice_end,
            "gpu_hours": hours.quantize(CENT, ROUND_HALF_UP),
            "price": s.price_per_gpu_hour,
            "cost": s.cost.quantize(CENT, ROUND_HALF_UP),
            "provisional": s.provisional,
            "portal_job": jobs.get(record.portal_job_uuid),
        })  # fmt: skip
        key = (s.gpu_type or "untyped", s.price_per_gpu_hour)
        summary[key]["gpu_seconds"] += s.gpu_seconds
        summary[key]["cost"] += s.cost
    total_cost = sum((s.cost for s in slices), Decimal(0)).quantize(CENT, ROUND_HALF_UP)
    bookings = booking_charges(start_at=billing_midnight(month), end_at=billing_midnight(next_month(month)), team=team)
    bookings_cost = sum((b["cost"] for b in bookings), Decimal(0)).quantize(CENT, ROUND_HALF_UP)
    return {
        "team": team,
        "month": month,
        "period_end": next_month(month) - dt.timedelta(days=1),
        "lines": lines,
        "summary": [
            {"gpu_type": t, "price": p, "gpu_hours": (Decimal(v["gpu_seconds"]) / HOUR).quantize(CENT, ROUND_HALF_UP),
             "cost": v["cost"].quantize(CENT, ROUND_HALF_UP)}
            for (t, p), v in sorted(summary.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0))
        ],  # fmt: skip
        "gpu_hours": (Decimal(sum(s.gpu_seconds for s in slices)) / HOUR).quantize(CENT, ROUND_HALF_UP),
        "usage_cost": total_cost,
        # Bookings: reserved GPU-hours charged whether used or not (BOOKING_CHARGE_MODE=reserved; usage
        # inside a booking then costs nothing above). With "used", lines are listed at cost 0.
        "bookings": bookings,
        "bookings_cost": bookings_cost,
        "booking_charge_mode": settings.BOOKING_CHARGE_MODE,
        "total": total_cost + bookings_cost,
        "provisional": any(s.provisional for s in slices),
        "currency": settings.DEFAULT_CURRENCY,
    }


def _money(value) -> str:
    return "-" if value is None else f"{value:,.2f}"


def invoice_text_lines(data: dict) -> list[str]:
    team, month = data["team"], data["month"]
    cur = data["currency"]
    out = [
        "gpuportal - GPU usage invoice",
        "",
        f"Team:     {team.name} (Slurm account {team.slurm_account})",
        f"Period:   {month:%Y-%m-%d} to {data['period_end']:%Y-%m-%d} ({settings.TIME_ZONE})",
        f"Currency: {cur}",
    ]
    if data["provisional"]:
        out.append("PROVISIONAL: jobs still running; figures will grow until they end.")
    out += ["", f"{'Job':>9} {'User':<12} {'Part.':<8} {'GPU':<6} {'#':>2} {'Start (UTC)':<16} {'GPU-h':>10} {'Rate':>8} {'Cost':>12}  Name"]
    out.append("-" * 110)
    for line in data["lines"]:
        out.append(
            f"{line['job_id']:>9} {line['user'][:12]:<12} {line['partition'][:8]:<8} {line['gpu_type'][:6]:<6} "
            f"{line['gpus']:>2} {line['start'].astimezone(dt.UTC):%Y-%m-%d %H:%M} {line['gpu_hours']:>10,.2f} "
            f"{_money(line['price']):>8} {_money(line['cost']):>12}  {line['name'][:30]}"
        )
    if not data["lines"]:
        out.append("(no GPU usage in this month)")
    out += ["-" * 110]
    if data["bookings"]:
        out += ["", f"Bookings (reserved GPU-hours, charge mode {data['booking_charge_mode']}):"]
        for b in data["bookings"]:
            out.append(
                f"  {b['booking'].reservation_name:<22} {b['gpus']:>2} x {b['gpu_type']:<6} {b['start'].astimezone(dt.UTC):%Y-%m-%d %H:%M}"
                f" - {b['end'].astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC {b['gpu_hours']:>10,.2f} GPU-h {_money(b['price']):>8} {_money(b['cost']):>12}"
            )
    out += ["", "Summary by GPU type and rate:"]
    for row in data["summary"]:
        out.append(f"  {row['gpu_type']:<8} {_money(row['price']):>8} {cur}/GPU-h  {row['gpu_hours']:>12,.2f} GPU-h  {_money(row['cost']):>14} {cur}")
    out += [
        "",
        f"GPU usage:       {data['gpu_hours']:>14,.2f} GPU-h  {_money(data['usage_cost']):>14} {cur}",
        f"Bookings:        {sum((b['gpu_hours'] for b in data['bookings']), Decimal(0)):>14,.2f} GPU-h  {_money(data['bookings_cost']):>14} {cur}",
        f"TOTAL:           {'':>20}  {_money(data['total']):>14} {cur}",
    ]
    return out


def _pdf_text(text: str) -> str:
    text = text.encode("latin-1", "replace").decode("latin-1")
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def pdf_from_lines(lines: list[str], *, title: str = "") -> bytes:
    """A PDF (A4 landscape, Courier 8 pt) holding the lines, paginated."""
    width, height, margin, leading, size = 842, 595, 36, 10, 8
    per_page = int((height - 2 * margin) // leading)
    pages = [lines[i : i + per_page] for i in range(0, len(lines), per_page)] or [[]]
    objects: list[bytes] = []

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)

    catalog = add(b"")  # filled below
    pages_obj = add(b"")
    font = add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Courier /Encoding /WinAnsiEncoding >>")
    page_ids = []
    for number, page in enumerate(pages, start=1):
        ops = [f"BT /F1 {size} Tf {leading} TL {margin} {height - margin} Td"]
        for text in page:
            ops.append(f"({_pdf_text(text)}) Tj T*")
        ops.append("ET")
        ops.append(f"BT /F1 7 Tf {width - margin - 60} {margin / 2} Td (page {number}/{len(pages)}) Tj ET")
        stream = "\n".join(ops).encode("latin-1")
        content = add(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
        page_ids.append(
            add(
                f"<< /Type /Page /Parent {pages_obj} 0 R /MediaBox [0 0 {width} {height}] "
                f"/Resources << /Font << /F1 {font} 0 R >> >> /Contents {content} 0 R >>".encode()
            )
        )
    objects[catalog - 1] = f"<< /Type /Catalog /Pages {pages_obj} 0 R >>".encode()
    kids = " ".join(f"{p} 0 R" for p in page_ids)
    objects[pages_obj - 1] = f"<< /Type /Pages /Kids [{kids}] /Count {len(page_ids)} >>".encode()
    info = add(f"<< /Title ({_pdf_text(title)}) /Producer (gpuportal) >>".encode("latin-1"))

    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for index, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % index + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root %d 0 R /Info %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1, catalog, info, xref,
    )  # fmt: skip
    return bytes(out)


def invoice_pdf(data: dict) -> bytes:
    return pdf_from_lines(invoice_text_lines(data), title=f"Invoice {data['team'].slug} {data['month']:%Y-%m}")
