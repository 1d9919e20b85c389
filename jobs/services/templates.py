"""Job templates: create and delete (personal, team, site)."""

from __future__ import annotations

import os
from typing import Any

from django.db import IntegrityError, transaction

from jobs.choices import TemplateScope
from jobs.job_fields import FIELDS, TEMPLATE_FIELDS, given_fields
from jobs.models import JobTemplate
from jobs.spec import CONTROL_CHARS_RE, ENV_NAME_RE, MAX_ENV_ENTRIES, MAX_SCRIPT_BYTES, _as_int
from portal.exceptions import ApplicationError, Conflict
from portal.models import Team
from portal.roles import is_admin, is_manager, is_member


def template_defaults() -> dict:
    """What a template keeps of a field not given (jobs.job_fields.TEMPLATE_FIELDS): its column's default."""
    return {name: JobTemplate._meta.get_field(name).get_default() for name in TEMPLATE_FIELDS}


def job_template_create(
    *, user, scope: str, name: str, team: Team | None = None, description: str = "", **spec_fields: Any
) -> JobTemplate:
    """Save a template. Personal: for the user. Team: members of the team (a team the user cannot
    see: "No such team."). Site: admins only (403). ``spec_fields``: the job fields a template keeps
    (jobs.job_fields.TEMPLATE_FIELDS; another name is a TypeError; one not given: its column's
    default). The spec is checked like a submission except against the inventory (templates outlive
    partitions)."""
    spec = given_fields(TEMPLATE_FIELDS, spec_fields, what="job_template_create")
    spec |= {key: value for key, value in template_defaults().items() if key not in spec_fields}
    if scope not in TemplateScope.values:
        raise ApplicationError("Unknown scope.", errors={"scope": [f"Use one of: {', '.join(TemplateScope.values)}."]})
    owner = None
    if scope == TemplateScope.PERSONAL:
        owner, team = user, None
    elif scope == TemplateScope.TEAM:
        if team is None or not is_member(user, team):
            raise ApplicationError("No such team.", errors={"team": ["No such team (or you are not a member)."]})
    else:
        team = None
        if not is_admin(user):
            raise ApplicationError("Only admins may create site templates.", errors={"scope": ["Admins only."]}, status_code=403)
    errors: dict[str, list[str]] = {}
    name = (name or "").strip()
    if not name or len(name) > 128:
        errors["name"] = ["Required, at most 128 characters."]
    script = spec["script"]
    if not isinstance(script, str) or not script.strip() or "\x00" in script or len(script.encode()) > MAX_SCRIPT_BYTES:
        errors["script"] = ["A non-empty script without NUL bytes, at most 1 MiB."]
    for key in TEMPLATE_FIELDS:  # the numbers: required where the column is not nullable
        if FIELDS[key].kind in ("int", "time"):
            spec[key] = _as_int(spec[key], key, errors, required=not JobTemplate._meta.get_field(key).null)
    workdir = spec["workdir"] = spec["workdir"] or ""
    if workdir and (not os.path.isabs(workdir) or "%" in workdir or CONTROL_CHARS_RE.search(workdir)):
        errors["workdir"] = ["Give an absolute path without '%' or control characters."]
    environment = spec["environment"] = spec["environment"] or {}
    if not isinstance(environment, dict) or len(environment) > MAX_ENV_ENTRIES or any(
        not isinstance(k, str) or not ENV_NAME_RE.match(k) or not isinstance(v, str) or "\x00" in v for k, v in environment.items()
    ):
        errors["environment"] = ["NAME: value pairs (names of letters, digits and '_'; string values without NUL)."]
    gpu_type = spec["gpu_type"] = spec["gpu_type"] or ""
    if gpu_type and (len(gpu_type) > 32 or CONTROL_CHARS_RE.search(gpu_type)):
        errors["gpu_type"] = ["At most 32 characters."]
    partition = spec["partition"] = spec["partition"] or ""
    if partition and (len(partition) > 64 or CONTROL_CHARS_RE.search(partition)):
        errors["partition"] = ["At most 64 characters."]
    if errors:
        raise ApplicationError(f"The template cannot be saved: {next(iter(errors.values()))[0]}", errors=errors)
    template = JobTemplate(scope=scope, owner=owner, team=team, created_by=user, name=name, description=description or "", **spec)
    try:
        with transaction.atomic():
            template.save()
    except IntegrityError:
        raise Conflict("A template with this name exists already.", errors={"name": ["Already used in this scope."]}) from None
    return template


def job_template_delete(*, user, template: JobTemplate) -> None:
    """Delete a template: personal by its owner; team by its creator or a team manager; site by
    admins. Admins may delete any. Others: 403."""
    allowed = is_admin(user)
    if template.scope == TemplateScope.PERSONAL:
        allowed = allowed or template.owner_id == user.pk
    elif template.scope == TemplateScope.TEAM:
        allowed = allowed or template.created_by_id == user.pk or is_manager(user, template.team_id)
    if not allowed:
        raise ApplicationError("You may not delete this template.", status_code=403)
    template.delete()
