"""Issue 38 item 4: what one relay drain round costs in queries — a fixed number whatever the round's
size (the worker's CPU per job at 100 submissions/s is the round's own cost divided by its jobs:
bench/results.md, "the POST's CPU (nineteenth session)" and the twentieth session)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job, JobDependency, JobEvent
from jobs.services import job_relay_batch_run, job_relay_drain_run, job_submit

# transactional: the relay runs in autocommit, as on a worker (inside a test's transaction every
# statement would be wrapped in savepoints that production never sends)
pytestmark = pytest.mark.django_db(transaction=True)

# Queries of one drain round (fake gateway, the submitter without Unix ids: no other statement),
# as django_assert_num_queries counts them:
#   1  the claim: ONE statement that claims the waiting jobs (UPDATE … WHERE id IN (SELECT … ORDER BY
#      created_at LIMIT n FOR UPDATE SKIP LOCKED) RETURNING *) and reads them back with their
#      submitter, profile and cluster (jobs.services.relay._claim_statement; was BEGIN, the UPDATE,
#      COMMIT and a SELECT with three joins: 4)
#   1  the recording: ONE statement that updates the rows still claimed, adds their events and returns
#      each one's cancel request as its lock read it (_record_statement; was BEGIN, SELECT … FOR
#      UPDATE, the bulk UPDATE, the events' INSERT, COMMIT: 5)
# A drain of one round then claims twice more before it ends: the empty claim, and the last look
# after it clears its coalescing flag (1 each; were 3 each).
ROUND_QUERIES = 2
DRAIN_OF_ONE_ROUND_QUERIES = ROUND_QUERIES + 2  # was 15


@pytest.fixture
def fake(use_gateway, settings):
    from tests.fakes import FakeGateway

    gateway = use_gateway(FakeGateway())
    settings.SLURM_SUBMIT_AS_USER = False  # no Unix accounts needed for the fake
    return gateway


def _submit(world, n: int, name: str) -> list[Job]:
    return [
        job_submit(user=world.alice, team=world.vision, name=f"{name}-{i}", script="#!/bin/bash\ntrue\n",
                   partition="debug", gpus=1, time_limit_minutes=2)[0]
        for i in range(n)
    ]  # fmt: skip


def _statements(captured) -> list[str]:
    return [" ".join(query["sql"].split())[:40] for query in captured.captured_queries]


@pytest.mark.parametrize("n", [1, 3, 12])
def test_a_drain_round_costs_a_fixed_number_of_queries_whatever_its_size(
    world, inventory, relays, fake, django_assert_num_queries, n
):
    jobs = _submit(world, n, "q")
    with django_assert_num_queries(DRAIN_OF_ONE_ROUND_QUERIES) as captured:
        result = job_relay_drain_run()
    assert (result["rounds"], result["submitted"]) == (1, n)
    statements = _statements(captured)
    # the breakdown above, in order: claim + read, recording, the empty claim, the last look
    assert statements[0].startswith('WITH c AS (UPDATE jobs_job SET relay_tok'), statements
    assert statements[1].startswith("WITH v AS (SELECT * FROM json_populate_r"), statements
    assert statements[2] == statements[3] == statements[0], statements
    # and it did what the five statements did: each job PENDING with its Slurm id, its event, no claim left
    rows = Job.objects.filter(pk__in=[job.pk for job in jobs])
    assert {(row.state, row.relay_token, row.relay_attempts) for row in rows} == {(JobState.PENDING, None, 1)}
    assert sorted(rows.values_list("slurm_job_id", flat=True)) == sorted(entry.job_id for entry in fake.queue_entries)
    assert JobEvent.objects.filter(job__in=jobs, state=JobState.PENDING, reason="Submitted to Slurm").count() == n


def test_the_claim_reads_the_jobs_as_select_related_would(world, inventory, relays, fake, django_assert_num_queries):
    """The claimed jobs come with their submitter, the submitter's profile and the cluster: the
    round's per-job work (the stored request, the Unix name, the gateway of the cluster) costs no query."""
    from jobs.services.relay import _claim_waiting, _submission_for
    from jobs.workdirs import cluster_username

    world.alice.profile.unix_username = "alice_unix"
    world.alice.profile.save()
    (job,) = _submit(world, 1, "r")
    stored = Job.objects.get(pk=job.pk).request
    with django_assert_num_queries(1):
        token, (claimed,) = _claim_waiting(10)
        assert (claimed.pk, claimed.relay_token, claimed.relay_attempts) == (job.pk, token, 1)
        assert claimed.request == stored and isinstance(stored, dict)  # the JSON field decoded
        assert cluster_username(claimed.submitter) == "alice_unix"  # the profile came with it
        assert claimed.cluster.name == job.cluster.name
        _submission_for(claimed, ensure_dirs=False)


def test_a_row_recorded_meanwhile_is_left_alone_by_the_recording(world, inventory, relays, fake):
    """The recording's UPDATE is conditional, as the SELECT … FOR UPDATE it replaces: a row no longer
    claimed with the run's token (the sync adopted it by its tag) is neither written nor given an event."""
    jobs = _submit(world, 2, "s")
    real_submit = fake.submit

    def submit_and_adopted_meanwhile(submission):
        slurm_id = real_submit(submission)
        if dict(submission.command_line).get("comment") == jobs[0].slurm_tag:
            Job.objects.filter(pk=jobs[0].pk).update(state=JobState.PENDING, slurm_job_id=slurm_id, relay_token=None)
        return slurm_id

    fake.submit = submit_and_adopted_meanwhile
    result = job_relay_batch_run([str(job.pk) for job in jobs], threads=1)
    assert (result["submitted"], result["already_recorded"]) == (1, 1)
    assert JobEvent.objects.filter(job=jobs[0], state=JobState.PENDING).count() == 0
    assert JobEvent.objects.filter(job=jobs[1], state=JobState.PENDING).count() == 1


def test_the_claims_condition_holds_a_child_on_kubernetes_until_its_parent_ended(world, inventory, relays):
    """jobs.dependencies.relay_ready_sql, the claim's condition: a child waits while a parent has no
    Slurm id; on Slurm it is claimed once the parent has one (Slurm holds it: afterok), on a
    Kubernetes cluster (no dependencies) only once the parent has ended."""
    from jobs.services.relay import _claim_waiting
    from portal.models import Cluster

    parent, child = _submit(world, 2, "d")
    JobDependency.objects.create(job=child, parent=parent)
    Job.objects.filter(pk=parent.pk).update(relay_started_at=timezone.now())  # held by another relay: not claimable
    assert _claim_waiting(10)[1] == []  # the parent waits for its Slurm id: so does the child
    Job.objects.filter(pk=parent.pk).update(state=JobState.PENDING, slurm_job_id=4001)
    kubernetes = Cluster.objects.create(name="k8s-claim", kind="kubernetes")
    Job.objects.filter(pk=child.pk).update(cluster=kubernetes)
    assert _claim_waiting(10)[1] == []  # on Kubernetes a live parent still holds it
    Job.objects.filter(pk=parent.pk).update(state=JobState.COMPLETED)
    assert [job.pk for job in _claim_waiting(10)[1]] == [child.pk]
    Job.objects.filter(pk=child.pk).update(relay_token=None, relay_started_at=None, cluster=parent.cluster,
                                           state=JobState.ACCEPTED)  # fmt: skip
    Job.objects.filter(pk=parent.pk).update(state=JobState.PENDING)
    assert [job.pk for job in _claim_waiting(10)[1]] == [child.pk]  # on Slurm: claimed, sent with afterok
