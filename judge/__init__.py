"""envfarm's judge: sandboxed verifier execution, format rules and the LLM judge.

    from judge import VerifierSandbox, Judge, reward_for, check_format

Outcomes, verdicts and rewards are contracts (``envfarm.verdict``), re-exported here.
"""

from envfarm.models import Criteria, parse_raw_response
from envfarm.verdict import REWARDS, Outcome, Verdict, reward_for
from judge._verifier_code import VerifierSpec, detect
from judge.core import (
    Judge,
    JudgeConfig,
    JudgeRequest,
    JudgeResponse,
    VerifierCode,
    code_only_verdict,
)
from judge.format_rules import FormatChecker, FormatReport, FormatRule, check_format
from judge.llm_judge import AnswerParseError, LLMJudge, LLMVerdict, parse_llm_verdict
from judge.sandbox import (
    SandboxConfig,
    VerifierErrorKind,
    VerifierResult,
    VerifierSandbox,
)
from judge.trajectory import Message, ToolSchema, Trajectory

__all__ = [
    "REWARDS",
    "AnswerParseError",
    "Criteria",
    "FormatChecker",
    "FormatReport",
    "FormatRule",
    "Judge",
    "JudgeConfig",
    "JudgeRequest",
    "JudgeResponse",
    "LLMJudge",
    "LLMVerdict",
    "Message",
    "Outcome",
    "SandboxConfig",
    "ToolSchema",
    "Trajectory",
    "Verdict",
    "VerifierCode",
    "VerifierErrorKind",
    "VerifierResult",
    "VerifierSandbox",
    "VerifierSpec",
    "check_format",
    "code_only_verdict",
    "detect",
    "parse_llm_verdict",
    "parse_raw_response",
    "reward_for",
]
