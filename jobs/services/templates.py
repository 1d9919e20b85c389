"""Job templates: create and delete (personal, team, site)."""

from __future__ import annotations

import os

from django.db import IntegrityError, transaction

from jobs.choices import TemplateScope
from jobs.models import JobTemplate
from jobs.spec import CONTROL_CHARS_RE, ENV_NAME_RE, MAX_ENV_ENTRIES, MAX_SCRIPT_BYTES, _as_int
from portal.exceptions import ApplicationError, Conflict
from portal.models import Team
from portal.roles import is_admin, is_manager, is_member


def job_template_create(
    *,
    user,
    scope: str,
    name: str,
    script: str,
    team: Team | None = None,
    description: str = "",
    partition: str = "",
    gpu_type: str = "",
    gpus: int = 1,
    nodes: int = 1,
    cpus_per_gpu: int | None = None,
    memory_gb: int | None = None,
    time_limit_minutes: int | None = None,
    workdir: str = "",
    environment: dict | None = None,
) -> JobTemplate:
    """Save a template. Personal: for the user. Team: members of the team (a team the user cannot
    see: "No such team."). Site: admins only (403). The spec is checked like a submission except
    against the inventory (templates outlive partitions)."""
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
    if not isinstance(script, str) or not script.strip() or "\x00" in script or len(script.encode()) > MAX_SCRIPT_BYTES:
        errors["script"] = ["A non-empty script without NUL bytes, at most 1 MiB."]
    for key, value, required in (
        ("gpus", gpus, True), ("nodes", nodes, True), ("cpus_per_gpu", cpus_per_gpu, False),
        ("memory_gb", memory_gb, False), ("time_limit_minutes", time_limit_minutes, False),
    ):  # fmt: skip
        _as_int(value, key, errors, required=required)
    if workdir and (not os.path.isabs(workdir) or "%" in workdir or CONTROL_CHARS_RE.search(workdir)):
        errors["workdir"] = ["Give an absolute path without '%' or control characters."]
    environment = environment or {}
    if not isinstance(environment, dict) or len(environment) > MAX_ENV_ENTRIES or any(
        not isinstance(k, str) or not ENV_NAME_RE.match(k) or not isinstance(v, str) or "\x00" in v for k, v in environment.items()
    ):
        errors["environment"] = ["NAME: value pairs (names of letters, digits and '_'; string values without NUL)."]
    if gpu_type and (len(gpu_type) > 32 or CONTROL_CHARS_RE.search(gpu_type)):
        errors["gpu_type"] = ["At most 32 characters."]
    if partition and (len(partition) > 64 or CONTROL_CHARS_RE.search(partition)):
        errors["partition"] = ["At most 64 characters."]
    if errors:
        raise ApplicationError(f"The template cannot be saved: {next(iter(errors.values()))[0]}", errors=errors)
    template = JobTemplate(
        scope=scope, owner=owner, team=team, created_by=user, name=name, description=description or "",
        script=script, partition=partition or "", gpu_type=gpu_type or "", gpus=int(gpus), nodes=int(nodes),
        cpus_per_gpu=int(cpus_per_gpu) if cpus_per_gpu not in (None, "") else None, memory_gb=memory_gb, time_limit_minutes=time_limit_minutes,
        workdir=workdir or "", environment=environment,
    )  # fmt: skip
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
