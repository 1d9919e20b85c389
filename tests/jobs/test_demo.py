"""jobs.demo.seed: site templates, idempotent."""

import io

import pytest

from jobs.demo import SITE_TEMPLATES, seed
from jobs.models import JobTemplate


@pytest.mark.django_db
def test_seed_creates_site_templates_once():
    out = io.StringIO()
    assert seed(stdout=out) == len(SITE_TEMPLATES)
    assert seed(stdout=out) == 0
    assert JobTemplate.objects.filter(scope="site", name="PyTorch DDP, 1 node, 4 GPUs", gpus=4, nodes=1).count() == 1
