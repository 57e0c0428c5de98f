import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fakehost import FakeHost  # noqa: E402

from cosched.hostfs import HostFS  # noqa: E402


@pytest.fixture
def fake(tmp_path):
    return FakeHost(tmp_path)


@pytest.fixture
def fs(fake):
    return HostFS(fake.root)
