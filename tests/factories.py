from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from accounting.models import Booking
from jobs.spec import output_files
from tests.support import stored_request
from portal.models import Membership, NodeInfo, Profile, Role, Team


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda o: f"{o.username}@example.org")
    password = factory.django.Password("pw-for-tests")

    @factory.post_generation
    def profile(obj, create, extracted, **kwargs):
        if create:
            Profile.objects.get_or_create(user=obj)


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team
        django_get_or_create = ("slug",)

    name = factory.Sequence(lambda n: f"Team {n}")
    slug = factory.Sequence(lambda n: f"team{n}")
    slurm_account = factory.LazyAttribute(lambda o: o.slug)


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    team = factory.SubFactory(TeamFactory)
    user = factory.SubFactory(UserFactory)
    role = Role.MEMBER


class QuotaFactory(factory.django.DjangoModelFactory):
    """An APPROVED any-type quota for the current calendar month (billing time zone) unless told."""

    class Meta:
        model = "accounting.Quota"

    team = factory.SubFactory(TeamFactory)
    gpu_type = ""
    period_start = factory.LazyFunction(lambda: _month()[0])
    period_end = factory.LazyFunction(lambda: _month()[1])
    gpu_hours = 1000
    state = "approved"
    justification = "test quota"
    approved_at = factory.LazyFunction(lambda: __import__("django.utils.timezone", fromlist=["now"]).now())


def _month():
    from accounting.calendar import current_month

    return current_month()


class NodeFactory(factory.django.DjangoModelFactory):
    """A node as a cluster sync records it: idle, 4 a100 GPUs, in partition gpu."""

    class Meta:
        model = NodeInfo
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"node-{n:02d}")
    state = "IDLE"
    partitions = factory.LazyFunction(lambda: ["gpu"])
    gpu_type = "a100"
    gpus_total = 4
    cpus_total = 32
    memory_mb = 256000
    seen_at = factory.LazyFunction(timezone.now)


class JobFactory(factory.django.DjangoModelFactory):
    """A portal job row (ACCEPTED unless told), as job_submit would store it; no Slurm involved."""

    class Meta:
        model = "jobs.Job"

    id = factory.LazyFunction(uuid.uuid4)
    team = factory.SubFactory(TeamFactory)
    submitter = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"job-{n}")
    script = "#!/bin/bash\necho hi\n"
    partition = "gpu"
    gpu_type = "a100"
    gpus = 1
    time_limit_minutes = 60
    workdir = "/tmp"
    array = ""
    submit_dir = factory.LazyAttribute(lambda o: o.workdir)
    # where its output goes, as job_submit decides it (jobs.spec.output_files)
    output_pattern = factory.LazyAttribute(lambda o: output_files(workdir=o.workdir, array=o.array)[0])
    error_pattern = factory.LazyAttribute(lambda o: output_files(workdir=o.workdir, array=o.array)[1])
    estimated_gpu_hours = factory.LazyAttribute(lambda o: Decimal(o.gpus * o.time_limit_minutes) / 60)
    request = factory.LazyAttribute(lambda o: stored_request(o))


class BookingFactory(factory.django.DjangoModelFactory):
    """An APPROVED booking of 4 a100 GPUs for the next two hours (no Slurm reservation) unless told."""

    class Meta:
        model = Booking

    id = factory.LazyFunction(uuid.uuid4)
    team = factory.SubFactory(TeamFactory)
    gpu_type = "a100"
    gpus = 4
    start = factory.LazyFunction(timezone.now)
    end = factory.LazyAttribute(lambda o: o.start + dt.timedelta(hours=2))
    status = "approved"
    approved_at = factory.LazyAttribute(lambda o: o.start)
    reservation_name = factory.LazyAttribute(lambda o: Booking.reservation_name_for(o.id))
