"""xdist workers' OpenMP threads wait asleep (harness.run.cores), unless the caller chose a policy."""

from conformance.harness.run import cores


def test_a_worker_of_several_sleeps_its_waiting_threads():
    assert cores.sharing({"PYTEST_XDIST_WORKER_COUNT": "2"})


def test_a_lone_process_or_a_chosen_policy_is_left_alone():
    assert not cores.sharing({})
    assert not cores.sharing({"PYTEST_XDIST_WORKER_COUNT": "1"})
    assert not cores.sharing({"PYTEST_XDIST_WORKER_COUNT": "2", cores.WAIT_POLICY: "ACTIVE"})


def test_this_run_s_workers_have_it():
    """Under ``-n 2`` or more, the plugin set the policy before any kernel's library loaded."""
    import os

    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if count > 1:
        assert os.environ.get(cores.WAIT_POLICY), "pytest_configure did not set OMP_WAIT_POLICY in this worker"
