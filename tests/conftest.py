"""The shared fixture world and test-only settings.

World: teams ``vision`` (manager ``bob``, member ``alice``) and ``nlp`` (manager ``dave``, member
``carol``); ``outsider`` in no team; ``admin`` (staff); ``finn`` (finance group). Tests run on
PostgreSQL (DATABASE_URL, set by ``make test``); Celery runs tasks eagerly unless a test asks for the
real worker (``celery_worker`` fixture in tests/jobs)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from portal.models import Role
from tests.factories import MembershipFactory, QuotaFactory, TeamFactory, UserFactory
from tests.support import (
    CACHE_KEY_PREFIX,
    DEFAULT_RELEASE,
    SLURM_TARGET_IDS,
    SLURM_TARGETS,
    cache_clear,
    cache_test_location,
    skip_unless_ci,
    use_slurm_target,
)
from tests.workers import (  # noqa: F401  (ROOT and _use_broker: other test modules import them from here)
    ROOT,
    WORKER_BROKER_URL,
    WORKER_QUEUE,
    _start_worker,
    _stop_worker,
    _use_broker,
    _worker_settle,
)


def pytest_configure(config):
    # Settings are loaded before any conftest runs, so a default cannot be set here: refuse SQLite.
    if django_settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        pytest.exit(
            "The tests run on PostgreSQL: use `make test`, or set "
            "DATABASE_URL=postgres://gpuportal@127.0.0.1:5432/gpuportal (scripts/services up prints it).",
            returncode=4,
        )

# ---------------------------------------------------------------- test tiers
#
# `make test-fast` runs `-m fast`: the pure and database tests (PostgreSQL, Redis as the cache), no
# Slurm cluster, Celery worker, Chromium or other local service. The markers below are given by the
# module (pytestmark) or, so that no test can slip into the fast tier by forgetting one, derived from
# the fixtures a test uses and the directory it is in. Every test without one of them is "fast".
# ``fake`` (the gateway contract on tests/fakes.py) is fast too: it names what the test runs on.

SLOW_MARKERS = ("slurm", "k8s", "celery", "browser", "faults", "external", "fuzz", "process")
_FIXTURE_MARKERS = {
    "cluster": "slurm",
    "k8s_portal": "k8s",
    "k8s_namespace": "k8s",
    "k8s_cluster": "k8s",
    "k8s_worker": "k8s",
    "k8s_admin": "k8s",
    "k8s_more_namespaces": "k8s",
    "jobs_sync_loop": "celery",
    "real_worker": "celery",
    "celery_worker_process": "celery",
    "ldap_directory_uri": "external",
    "oidc_provider": "external",
    "page": "browser",
    "browser": "browser",
    "supervised": "process",  # scripts/supervise and the processes it restarts (tests/jobs/test_demo.py)
    "server_install": "process",  # pip resolving the three distributions (tests/test_packaging.py)
}
_DIRECTORY_MARKERS = {"browser": "browser", "faults": "faults", "bench": "slurm", "fuzz": "fuzz"}


def pytest_collection_modifyitems(config, items):
    tests_root = Path(__file__).resolve().parent
    for item in items:
        try:
            top = Path(item.fspath).resolve().relative_to(tests_root).parts[0]
        except ValueError:
            top = ""
        wanted = {_FIXTURE_MARKERS[name] for name in getattr(item, "fixturenames", ()) if name in _FIXTURE_MARKERS}
        if top in _DIRECTORY_MARKERS:
            wanted.add(_DIRECTORY_MARKERS[top])
        for name in sorted(wanted):
            if item.get_closest_marker(name) is None:
                item.add_marker(getattr(pytest.mark, name))
        if not any(item.get_closest_marker(name) for name in SLOW_MARKERS):
            item.add_marker(pytest.mark.fast)
    # Last: tests that run Slurm's runaway-job fix (`sacctmgr -i show runawayjobs`, issue 42). slurmdbd then
    # sets its roll-ups back (here, 2026-12-06, to 2026-11-30 00:00, a Monday: seemingly the week's start) and redoes
    # them at its next hourly roll-up; until then sreport's hours are not what the reconciliation tests of
    # the same shared clusters compare with (the clean-clone CI run of 716ae31 failed 9 of them so).
    items.sort(key=lambda item: item.get_closest_marker("runaway_fix") is not None)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """A test database of this run's own (test_gpuportal_p<pid>), so that several runs on one machine
    (developers, CI, benchmarks) never fight over one database. GPUPORTAL_TEST_DB_SUFFIX fixes it."""
    from pytest_django.fixtures import _set_suffix_to_test_databases

    _set_suffix_to_test_databases(os.environ.get("GPUPORTAL_TEST_DB_SUFFIX") or f"p{os.getpid()}")


ROLES = ("anonymous", "outsider", "member", "manager", "admin", "finance")


@pytest.fixture(autouse=True)
def _test_settings(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.CELERY_TASK_EAGER_PROPAGATES = True
    settings.STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    # the test client scrapes /metrics from 127.0.0.1 (the default allows no address: the token)
    settings.METRICS_ALLOWED_IPS = ["127.0.0.1", "::1"]
    # inventories written by hand (no policy read from Slurm) estimate without the overrun past the
    # time limit, so their figures stay round; the overrun's own tests (tests/jobs/test_estimate_overrun.py)
    # and every real cluster's read policy include it
    settings.SLURM_OVERRUN_SECONDS_UNREAD = 0
    from portal.project.celery import app

    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    yield


@pytest.fixture(autouse=True)
def _fast_tier_runs_no_slurm_command(request, settings):
    """A test of the fast tier runs no Slurm command: SLURM_BIN_DIR names a directory that does not
    exist, so each one fails at once (SlurmUnavailable, "cannot be run"), as with the cluster
    unreachable, instead of answering by luck (``sinfo --version`` needs no controller) or waiting
    SLURM_TIMEOUT (it does when slurm.conf is missing). Tests that need Slurm carry a slower marker."""
    if request.node.get_closest_marker("fast") is None:
        yield
        return
    import portal.slurm as slurm

    settings.SLURM_BIN_DIR = "/nonexistent-slurm-bin"
    slurm.reset_gateway()
    yield
    slurm.reset_gateway()


@pytest.fixture
def _test_homes():
    """A directory of this test's own where any user may create theirs (mode 1777, as /tmp), removed
    with everything in it (root removes what the users made) when the test ends: a user's default
    directory made by one test, as root or as that user, is never met by another, whatever the
    order or the worker (issue 43)."""
    import shutil
    import tempfile

    base = tempfile.mkdtemp(prefix="gpuportal-test-homes-")
    os.chmod(base, 0o1777)
    yield base
    shutil.rmtree(base)  # not ignore_errors: what a test leaves that root cannot remove fails it


@pytest.fixture(autouse=True)
def _fast_tier_default_dirs_are_the_tests_own(request, settings):
    """A fast test creates no directory in the host's homes: the users' default directory
    (JOB_DEFAULT_WORKDIR, created by the relay when missing, as the user) is under _test_homes."""
    if request.node.get_closest_marker("fast") is not None:
        settings.JOB_DEFAULT_WORKDIR = os.path.join(request.getfixturevalue("_test_homes"), "{user}")
    yield


@pytest.fixture(scope="session", autouse=True)
def _test_cache():
    """The tests' Redis database and a key prefix of this run's own (tests.support.CACHE_KEY_PREFIX):
    concurrent runs and the demo do not count or clear each other's throttle buckets. Set once for
    the session (a cache configured per test would open a connection pool per test)."""
    from django.conf import settings as django_settings
    from django.test.utils import override_settings

    default = django_settings.CACHES["default"]
    location = cache_test_location(default["LOCATION"])
    caches = {"default": {**default, "LOCATION": location, "KEY_PREFIX": CACHE_KEY_PREFIX}}
    with override_settings(CACHES=caches):
        yield


@pytest.fixture(autouse=True)
def _clear_cache(_test_cache):
    """Throttle counters and idempotency keys live in the (real, Redis) cache: start each test clean
    (this run's keys only: tests.support.cache_clear). So does the relay drain's coalescing flag
    (on the broker's Redis, portal.outbox), and each process's copies of the inventory and the rate
    book (portal/snapshots.py) hold the last test's rows."""
    from jobs.services import relay_drain_key
    from portal.outbox import coalesced_done
    from portal.snapshots import snapshots_forget

    cache_clear()
    coalesced_done(relay_drain_key())
    snapshots_forget()
    yield


class World:
    """Attribute access to the fixture world's objects."""

    def __init__(self):
        """The same rows as the factories make one by one (UserFactory's profile, TeamFactory,
        MembershipFactory, QuotaFactory), written in one bulk insert per table: about a dozen
        statements instead of 75 and thirty savepoints, for every test that uses the world (issue 43)."""
        from django.contrib.auth import get_user_model

        from accounting.models import Quota
        from portal.models import Membership, Profile, Team

        self.vision, self.nlp = Team.objects.bulk_create([
            TeamFactory.build(slug="vision", name="Vision", slurm_account="vision"),
            TeamFactory.build(slug="nlp", name="NLP", slurm_account="nlp"),
        ])  # fmt: skip
        users = [UserFactory.build(username=name) for name in ("alice", "bob", "carol", "dave", "outsider", "finn")]
        users.insert(5, UserFactory.build(username="admin", is_staff=True, is_superuser=True))
        get_user_model().objects.bulk_create(users)
        Profile.objects.bulk_create([Profile(user=user) for user in users])  # and user.profile is cached, as the factory's
        self.alice, self.bob, self.carol, self.dave, self.outsider, self.admin, self.finn = users
        self.finn.groups.add(finance_group())
        Membership.objects.bulk_create([
            MembershipFactory.build(team=self.vision, user=self.alice, role=Role.MEMBER),
            MembershipFactory.build(team=self.vision, user=self.bob, role=Role.MANAGER),
            MembershipFactory.build(team=self.nlp, user=self.carol, role=Role.MEMBER),
            MembershipFactory.build(team=self.nlp, user=self.dave, role=Role.MANAGER),
        ])  # fmt: skip
        # generous approved GPU quotas (QUOTA_NO_QUOTA_POLICY=blocked refuses jobs of teams without
        # one), from a year ago to a year ahead; tests of quotas approve newer ones, which win
        start, end = _world_quota_period()
        Quota.objects.bulk_create([
            QuotaFactory.build(team=team, gpu_hours=1_000_000, period_start=start, period_end=end, justification="fixture world")
            for team in (self.vision, self.nlp)
        ])  # fmt: skip

    def user_for(self, role: str):
        """The user playing a role of the permission matrix, relative to team vision."""
        return {
            "anonymous": None,
            "outsider": self.outsider,
            "member": self.alice,
            "manager": self.bob,
            "admin": self.admin,
            "finance": self.finn,
        }[role]


def finance_group() -> Group:
    """The finance group as its data migration (portal 0002) makes it. A transactional test ends with
    a flush that removes rows data migrations made; in a run whose order is shuffled (make test-fast),
    the next test in that worker may be any test, so whoever needs the group makes sure of it: one
    query when it is there."""
    from django.contrib.auth.models import Permission
    from django.contrib.contenttypes.models import ContentType

    group, created = Group.objects.get_or_create(name="finance")
    if created:
        content_type, _ = ContentType.objects.get_or_create(app_label="portal", model="team")
        permission, _ = Permission.objects.get_or_create(
            content_type=content_type, codename="view_cost_reports", defaults={"name": "Can read cost reports of every team"}
        )
        group.permissions.add(permission)
    return group


def _world_quota_period():
    from accounting.selectors import current_month

    first, _ = current_month()
    return first.replace(year=first.year - 1), first.replace(year=first.year + 1)


@pytest.fixture
def world(db) -> World:
    return World()


@pytest.fixture
def api_client_for(world):
    """api_client_for("member") → an APIClient logged in as that role (anonymous: not logged in)."""

    def make(role: str) -> APIClient:
        client = APIClient()
        user = world.user_for(role)
        if user is not None:
            client.force_authenticate(user=user)
        return client

    return make


@pytest.fixture
def client_for(world, client):
    """client_for("manager") → Django's test client logged in as that role."""
    from django.test import Client

    def make(role: str) -> Client:
        c = Client()
        user = world.user_for(role)
        if user is not None:
            c.force_login(user)
        return c

    return make


# ---------------------------------------------------------------- no Slurm for unit tests


@pytest.fixture
def use_gateway(unix_users):
    """``use_gateway(gateway)``: get_gateway() answers ``gateway`` until the test ends (the one way
    tests choose the gateway: portal.slurm.use_gateway). Returns the gateway. With the world's
    members as Unix users (``unix_users``): a relay through any gateway resolves its submitter's ids
    on the submit host, so a test run alone on a new machine relays as it does after another test
    created them (2026-12-07: tests/jobs/test_forgotten_running.py alone failed SUBMIT_FAILED)."""
    import contextlib

    from portal import slurm

    with contextlib.ExitStack() as stack:
        yield lambda gateway: stack.enter_context(slurm.use_gateway(gateway))


@pytest.fixture
def relays(monkeypatch):
    """Record relay/cancel enqueues instead of running them: unit, security and fuzz tests never
    reach Slurm. ``calls["relay"]`` gets job ids, ``calls["relay_batch"]`` lists of ids,
    ``calls["cancel_task"]`` (job id, index) of an array task cancelled alone,
    ``calls["drain"]`` one None per relay drain published (a single-job submit, the sweeper). The
    drain's stand-in clears the drain's coalescing flag as a drain that ran at once would, so every
    enqueue is recorded (tests/jobs/test_relay_drain.py tests the coalescing itself)."""
    from jobs import tasks
    from jobs.services import relay_drain_key
    from portal.outbox import coalesced_done

    def drain():
        calls["drain"].append(None)
        coalesced_done(relay_drain_key())

    calls: dict[str, list] = {"relay": [], "relay_batch": [], "drain": [], "cancel": [], "cancel_task": []}
    monkeypatch.setattr(tasks.job_relay, "delay", lambda job_id: calls["relay"].append(job_id))
    monkeypatch.setattr(tasks.job_relay_batch, "delay", lambda job_ids: calls["relay_batch"].append(job_ids))
    monkeypatch.setattr(tasks.job_relay_drain, "delay", drain)
    monkeypatch.setattr(tasks.job_cancel_relay, "delay", lambda job_id: calls["cancel"].append(job_id))
    monkeypatch.setattr(tasks.job_array_task_cancel_relay, "delay", lambda job_id, index: calls["cancel_task"].append((job_id, index)))
    return calls


@pytest.fixture
def inventory_small(db):
    """One partition 'gpu' (default) on one 4×a100 node, as a cluster sync would record it."""
    from django.utils import timezone

    from portal.models import NodeInfo, PartitionInfo
    from portal.snapshots import snapshots_forget

    now = timezone.now()
    PartitionInfo.objects.create(name="gpu", is_default=True, state="UP", default_time_minutes=60, max_time_minutes=600,
                                 node_names=["a100-01"], seen_at=now)  # fmt: skip
    NodeInfo.objects.create(name="a100-01", state="IDLE", partitions=["gpu"], gpu_type="a100", gpus_total=4,
                            cpus_total=32, memory_mb=256000, seen_at=now)  # fmt: skip
    snapshots_forget()  # the rows are as a sync committed them before the test, not the test's own change


# ---------------------------------------------------------------- the local Slurm cluster



def _cluster_reachable() -> str | None:
    from portal.slurm import SlurmError, get_gateway

    try:
        get_gateway().ping()
    except SlurmError as exc:
        return str(exc)
    return None


class SlurmTarget:
    """One backend on one local cluster: ``backend`` (cli, pyslurm), ``release`` (22.05, 25.11) and
    the ``scripts/cluster`` options that address that cluster (``cluster_args``)."""

    def __init__(self, backend: str, release: str):
        self.backend, self.release = backend, release
        self.cluster_args = [] if release == DEFAULT_RELEASE else ["--slurm", release]

    def __repr__(self) -> str:
        return f"{self.backend}-{self.release}"


@pytest.fixture(params=SLURM_TARGETS, ids=SLURM_TARGET_IDS)
def slurm_target(request, settings):
    """Runs the test once per backend and cluster (cli on 22.05 and 25.11, pyslurm on 25.11):
    settings point get_gateway() at it. Skips (fails under CI) when that cluster or pyslurm is missing."""
    import portal.slurm as slurm

    use_slurm_target(settings, *request.param)
    yield SlurmTarget(*request.param)
    slurm.reset_gateway()


@pytest.fixture
def unix_users():
    """The fixture world's members as Unix users of this host (the submit host has them; building
    the sbatch request resolves their uid/gid). Created once when missing (root; idempotent)."""
    from portal.unix import unix_user_ensure

    return {name: unix_user_ensure(name) for name in ("alice", "bob", "carol", "dave")}


@pytest.fixture
def cluster(request, world):
    """The local Slurm cluster ready for the fixture world: inventory synced, Unix users for the
    members, teams mirrored to Slurm associations. Skips when the cluster is not up. With
    ``slurm_target`` among the test's fixtures, that backend on that cluster."""
    from portal.services import cluster_sync, team_mirror
    from portal.unix import unix_user_ensure

    if "slurm_target" in request.fixturenames:
        request.getfixturevalue("slurm_target")

    problem = _cluster_reachable()
    if problem:
        skip_unless_ci(f"local Slurm cluster not reachable (scripts/cluster up): {problem}")
    cluster_sync()
    for name in ("alice", "bob", "carol", "dave"):
        unix_user_ensure(name)
    team_mirror(team=world.vision)
    team_mirror(team=world.nlp)
    return world


# ---------------------------------------------------------------- the local Kubernetes cluster


@pytest.fixture(scope="session")
def k8s_portal():
    """The kubernetes client as the portal has it: GPUPORTAL_K8S_KUBECONFIG (scripts/k8s up writes the
    local cluster's, its service account's). Skips (fails under CI) when the cluster does not answer."""
    from kubernetes import client, config

    path = django_settings.GPUPORTAL_K8S_KUBECONFIG
    if not path or not Path(path).exists():
        skip_unless_ci(f"local Kubernetes cluster not set up (scripts/k8s up): no kubeconfig {path!r}")
    api = config.new_client_from_config(config_file=path)
    try:
        client.VersionApi(api).get_code(_request_timeout=5)
    except Exception as exc:  # noqa: BLE001 — whatever the reason, the test cannot run
        skip_unless_ci(f"local Kubernetes cluster not answering (scripts/k8s up): {exc}")
    yield api
    api.close()


@pytest.fixture
def k8s_namespace(k8s_portal):
    """A team namespace of this test's own, made as a site's admin makes one (`scripts/k8s namespace`:
    the portal's service account gets its rights there), deleted afterwards with all it holds."""
    import uuid

    from kubernetes import client, config

    name = f"gpuportal-test-{uuid.uuid4().hex[:10]}"
    subprocess.run([str(ROOT / "scripts" / "k8s"), "namespace", name], check=True, capture_output=True, timeout=60)
    yield name
    admin_config = Path(django_settings.GPUPORTAL_K8S_KUBECONFIG).with_name("admin.kubeconfig")
    with config.new_client_from_config(config_file=str(admin_config)) as admin:
        client.CoreV1Api(admin).delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def k8s_admin(k8s_portal):
    """The local cluster's admin client (admin.kubeconfig beside the portal's): what a site's admin does
    by hand in a test — RBAC removed and restored, a quota of Jobs."""
    from kubernetes import config

    admin_config = Path(django_settings.GPUPORTAL_K8S_KUBECONFIG).with_name("admin.kubeconfig")
    with config.new_client_from_config(config_file=str(admin_config)) as admin:
        yield admin


@pytest.fixture
def k8s_more_namespaces(k8s_admin):
    """``k8s_more_namespaces(n)``: n more team namespaces made as k8s_namespace's (scripts/k8s
    namespace), deleted afterwards with all they hold."""
    import uuid

    from kubernetes import client

    made = []

    def make(count: int) -> list[str]:
        names = [f"gpuportal-test-{uuid.uuid4().hex[:10]}" for _ in range(count)]
        subprocess.run([str(ROOT / "scripts" / "k8s"), "namespace", *names], check=True, capture_output=True, timeout=60)
        made.extend(names)
        return names

    yield make
    for name in made:
        client.CoreV1Api(k8s_admin).delete_namespace(name, propagation_policy="Background")


K8S_CLUSTER = "gpuportal-k8s"


@pytest.fixture
def k8s_cluster(settings, world, k8s_namespace):
    """The local Kubernetes cluster as a configured cluster beside the default Slurm one (GPUPORTAL_CLUSTERS:
    kind=kubernetes, the portal's kubeconfig), recorded and its inventory synced (its GPU nodes), with
    the fixture world's vision team given this test's namespace as its account there and its members'
    Unix users. Yields the cluster's GPUPORTAL_CLUSTERS text (what a worker is started with)."""
    import portal.slurm as slurm
    from portal.services import cluster_row, cluster_sync, clusters_record
    from portal.models import TeamClusterAccount
    from portal.slurm import ClusterConfig
    from portal.unix import unix_user_ensure

    default = ClusterConfig(settings.SLURM_CLUSTER, settings.SLURM_BACKEND, settings.SLURM_CONF, settings.SLURM_BIN_DIR)
    kube = ClusterConfig(K8S_CLUSTER, "kubernetes", kind="kubernetes", kubeconfig=settings.GPUPORTAL_K8S_KUBECONFIG)
    settings.GPUPORTAL_CLUSTERS = (default, kube)
    slurm.reset_gateway()
    clusters_record()
    cluster_sync(cluster=K8S_CLUSTER)
    TeamClusterAccount.objects.create(team=world.vision, cluster=cluster_row(K8S_CLUSTER), slurm_account=k8s_namespace)
    for name in ("alice", "bob"):
        unix_user_ensure(name)
    text = ";".join(
        f"name={c.name},conf={c.slurm_conf},bin={c.bin_dir}" + (f",kind=kubernetes,kubeconfig={c.kubeconfig}" if c.is_kubernetes else f",backend={c.backend}")
        for c in (default, kube)
    )  # fmt: skip
    yield text
    slurm.reset_gateway()


@pytest.fixture
def k8s_worker(k8s_cluster, celery_workers, transactional_db, settings):
    """A real Celery worker whose portal serves the Kubernetes cluster too (k8s_cluster's
    GPUPORTAL_CLUSTERS): tasks sent during the test go to it, as real_worker's do."""
    with _tasks_to(celery_workers({"SLURM_BACKEND": "cli", "SLURM_CLUSTER": "with-k8s", "GPUPORTAL_CLUSTERS": k8s_cluster}),
                   settings) as queue:  # fmt: skip
        yield queue


# ---------------------------------------------------------------- a real Celery worker


@pytest.fixture(scope="session")
def celery_workers(django_db_setup, django_db_blocker):
    """Real Celery workers, one per Slurm target (the default cluster from the environment, or
    ``slurm_target``'s backend and cluster), each on a queue of its own; started on first use and
    stopped (by their own pids) at the end of the session, before the test database is dropped.
    ``celery_workers(slurm_env)`` -> the queue of the worker with that Slurm environment."""
    workers: dict[tuple, tuple] = {}

    def worker_for(slurm_env: dict[str, str]) -> str:
        key = tuple(sorted(slurm_env.items()))
        if key not in workers:
            name = "jobs-tests" if not slurm_env else f"jobs-tests-{slurm_env['SLURM_BACKEND']}-{slurm_env['SLURM_CLUSTER']}"
            queue = WORKER_QUEUE if not slurm_env else f"{WORKER_QUEUE}-{slurm_env['SLURM_BACKEND']}-{slurm_env['SLURM_CLUSTER']}"
            workers[key] = (queue, *_start_worker(name, queue, slurm_env))
        return workers[key][0]

    try:
        yield worker_for
    finally:
        for _queue, proc, log in workers.values():
            _stop_worker(proc, log)


@pytest.fixture
def real_worker(request, celery_workers, transactional_db, settings):
    """Send tasks to a real worker for this test (eager mode off, dedicated queue and broker): the one
    for this test's ``slurm_target`` when it has one, else the one for the environment's cluster."""

    slurm_env = {}
    if "slurm_target" in request.fixturenames:
        request.getfixturevalue("slurm_target")
        slurm_env = {name: str(getattr(settings, name)) for name in
                     ("SLURM_BACKEND", "SLURM_CONF", "SLURM_CLUSTER", "SLURM_BIN_DIR")}  # fmt: skip
    with _tasks_to(celery_workers(slurm_env), settings) as queue:
        yield queue


@contextlib.contextmanager
def _tasks_to(queue: str, settings):
    """Tasks sent meanwhile go to the real worker of ``queue`` (eager mode off, the workers' broker);
    afterwards its work is let settle and the test's own setup comes back."""
    from portal.project.celery import app

    saved = app.conf.task_always_eager, app.conf.broker_url, app.conf.task_default_queue
    settings.CELERY_TASK_ALWAYS_EAGER = False
    app.conf.task_always_eager = False
    app.conf.task_default_queue = queue
    _use_broker(WORKER_BROKER_URL)
    try:
        yield queue
        _worker_settle(queue)
    finally:
        app.conf.task_always_eager, _, app.conf.task_default_queue = saved
        _use_broker(saved[1])


@pytest.fixture
def jobs_sync_loop(real_worker):
    """Celery beat does not run in tests: call jobs_sync() every second while the test runs, in a
    thread with its own database connection (closed at the end)."""
    import threading

    from django.db import connection

    from jobs.services import jobs_sync

    stop = threading.Event()

    def loop():
        try:
            while not stop.wait(1.0):
                jobs_sync()
        finally:
            connection.close()

    thread = threading.Thread(target=loop, name="jobs-sync-loop", daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(timeout=30)


# ---------------------------------------------------------------- transactional tests


@pytest.fixture(autouse=True)
def _finance_group_after_flush(request):
    """A transactional test starts with the finance group there even when the test before it in this
    worker was transactional too (its flush removed it)."""
    marker = request.node.get_closest_marker("django_db")
    transactional = "transactional_db" in request.fixturenames or bool(marker and marker.kwargs.get("transaction"))
    if transactional:
        request.getfixturevalue("transactional_db")
        finance_group()
    yield


@pytest.fixture(scope="session")
def ldap_directory_uri() -> str:
    """The URI of the tests' slapd (`scripts/services ldap`, run by `make test`): the directory of
    scripts/ldap/test-directory.ldif. Missing: skipped (failed under CI)."""
    uri = os.environ.get("GPUPORTAL_TEST_LDAP_URI", "")
    if not uri:
        skip_unless_ci("no test LDAP directory: run `eval \"$(scripts/services ldap)\"` (make test does)")
    return uri


class OidcProvider:
    """The tests' OpenID provider process (tests/oidc_provider, django-oauth-toolkit)."""

    CLIENT_ID, CLIENT_SECRET = "gpuportal-test", "gpuportal-test-secret"

    def __init__(self, port: int):
        self.url = f"http://127.0.0.1:{port}"

    def environment(self) -> dict[str, str]:
        """What a site's environment would say to use this provider."""
        return {
            "OIDC_RP_CLIENT_ID": self.CLIENT_ID,
            "OIDC_RP_CLIENT_SECRET": self.CLIENT_SECRET,
            "OIDC_OP_AUTHORIZATION_ENDPOINT": f"{self.url}/o/authorize/",
            "OIDC_OP_TOKEN_ENDPOINT": f"{self.url}/o/token/",
            "OIDC_OP_USER_ENDPOINT": f"{self.url}/o/userinfo/",
            "OIDC_OP_JWKS_ENDPOINT": f"{self.url}/o/.well-known/jwks.json",
            "OIDC_OP_LOGOUT_ENDPOINT": f"{self.url}/o/logout/",
        }


@pytest.fixture
def oidc_provider(live_server):
    """A real OpenID provider in a second process, its client registered for this live server's
    callback and login page; stopped (by its pid) after the test."""
    import socket
    import urllib.request

    from tests.support import wait_for

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    root = Path(__file__).resolve().parents[1]
    environ = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.oidc_provider.serve", str(port), f"{live_server.url}/oidc/callback/",
         f"{live_server.url}/login/"],
        cwd=root, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    provider = OidcProvider(port)

    def answers() -> bool:
        if process.poll() is not None:
            pytest.fail(f"the OpenID provider exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{provider.url}/o/.well-known/openid-configuration", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    try:
        wait_for(answers, timeout=60)
        yield provider
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)
