import os

from unideploy.environment import environment
from unideploy.quiet import quiet


def test_a_scoped_step_leaves_the_environment_as_it_found_it(monkeypatch):
    monkeypatch.setenv("UNIDEPLOY_T_KEPT", "user")
    monkeypatch.delenv("UNIDEPLOY_T_NEW", raising=False)
    monkeypatch.delenv("UNIDEPLOY_T_WRITTEN", raising=False)
    with environment(UNIDEPLOY_T_KEPT="step", UNIDEPLOY_T_NEW="step", UNIDEPLOY_T_WRITTEN=None):
        assert os.environ["UNIDEPLOY_T_KEPT"] == os.environ["UNIDEPLOY_T_NEW"] == "step"
        assert "UNIDEPLOY_T_WRITTEN" not in os.environ  # None: not set ...
        os.environ["UNIDEPLOY_T_WRITTEN"] = "by a converter's import"  # ... but what the step writes is undone
    assert os.environ["UNIDEPLOY_T_KEPT"] == "user"
    assert "UNIDEPLOY_T_NEW" not in os.environ and "UNIDEPLOY_T_WRITTEN" not in os.environ


def test_quiet_silences_tensorflow_only_while_it_runs(monkeypatch):
    monkeypatch.delenv("UNIDEPLOY_DEBUG", raising=False)
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    with quiet():
        assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "3"
    assert "TF_CPP_MIN_LOG_LEVEL" not in os.environ
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")  # a user's own level is kept, inside and after
    with quiet():
        assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "1"
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "1"
