"""The other half of the suite's rule (tests/kinds.py): a functional test may start servers."""

import sys

from tests import kinds


def test_a_functional_test_may_start_servers(request):
    sys.audit("subprocess.Popen", "/bin/tritonserver", ["/bin/tritonserver"], None, None)
    assert request.node.nodeid not in kinds.spawns
