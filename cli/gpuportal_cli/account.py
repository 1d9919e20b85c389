"""``gpuportal login`` (the stored URL and token), the API client made from them, ``gpuportal teams``."""

from __future__ import annotations

import getpass

from gpuportal_cli import config as config_mod
from gpuportal_cli.client import ApiError, Client
from gpuportal_cli.exit_codes import EXIT_AUTH, EXIT_OK, CliError
from gpuportal_cli.output import _err, _json_or_empty, _out, _table


def _client(args) -> Client:
    try:
        cfg = config_mod.load()
    except config_mod.ConfigError as exc:
        raise CliError(str(exc)) from None
    if not cfg.url or not cfg.token:
        raise CliError("Not logged in: run `gpuportal login` (or set GPUPORTAL_URL and GPUPORTAL_TOKEN).", EXIT_AUTH)
    return Client(cfg.url, cfg.token, timeout=args.timeout, on_retry=lambda line: _err(f"gpuportal: {line}"))


def cmd_login(args) -> int:
    stored = config_mod.load()
    url = args.url or stored.url
    if not url:
        url = input("Portal URL (e.g. https://gpu.example.org): ").strip()
    url = config_mod.normalise_url(url)
    if not url:
        raise CliError("A portal URL is needed.")
    token = args.token
    if not token:
        _err(f"Create a token at {url}/account/tokens/ and paste it here.")
        token = getpass.getpass("API token: ").strip()
    if not token:
        raise CliError("A token is needed.")
    client = Client(url, token, timeout=args.timeout)
    try:
        page = client.get("teams/")
    except ApiError as exc:
        if exc.status in (401, 403):
            raise CliError(f"The portal at {url} refused this token: {exc.detail}", EXIT_AUTH) from None
        raise
    path = config_mod.save(config_mod.Config(url=url, token=token))
    teams = [t.get("slug", "") for t in (page.get("results", []) if isinstance(page, dict) else page)]
    _out(f"Logged in to {url}; saved in {path}.")
    _out(f"Your teams: {', '.join(teams)}" if teams else "You are in no team yet: ask a team manager to add you.")
    return EXIT_OK


def cmd_teams(args) -> int:
    client = _client(args)
    teams = list(client.paginate("teams/"))
    if _json_or_empty(teams, as_json=args.json, empty="You are in no team yet: ask a team manager to add you."):
        return EXIT_OK
    rows = [[t.get("slug", ""), t.get("name", ""), t.get("slurm_account", ""), t.get("role") or "", "yes" if t.get("active", True) else "no"] for t in teams]
    _out(_table(rows, ["TEAM", "NAME", "SLURM ACCOUNT", "ROLE", "ACTIVE"]))
    return EXIT_OK
