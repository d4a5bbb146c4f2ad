import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Tests are tiny; one intra-op thread per xdist worker avoids oversubscribing 2 cores."""
    torch.set_num_threads(1)
