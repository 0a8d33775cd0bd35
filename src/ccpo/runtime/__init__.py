"""The deployed agent: a trained policy + live endpoints (``ccpo ask`` / ``ccpo serve``).

``ConformalAgent`` (:mod:`ccpo.runtime.agent`) is the Python API; the HTTP server
(:mod:`ccpo.runtime.server`) needs the optional extra ``serve`` and is imported on demand.
"""

from ccpo.runtime.agent import ConformalAgent, RequestBudgetExceeded
from ccpo.runtime.answer_set import AnswerSet, RoundLog
from ccpo.runtime.config import DeployConfig, ServerConfig, load_deploy_config

__all__ = [
    "AnswerSet",
    "ConformalAgent",
    "DeployConfig",
    "RequestBudgetExceeded",
    "RoundLog",
    "ServerConfig",
    "load_deploy_config",
]
