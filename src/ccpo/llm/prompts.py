"""Prompt templates: base agent (CoT, ReAct, a chat conversation), guide, LLM-as-policy and
LLM-EXIT.

The guide, LLM-as-policy and LLM-EXIT templates follow the paper's appendix word for word
(the policy template names the guide model instead of "GPT-4o" and takes the target coverage
1−α instead of a fixed 0.9). The base-agent prompts and the ReAct few-shot examples are this
project's own, written in the style of ReAct (Yao et al. 2023): ``Thought / Action /
Observation`` lines with ``search[entity]``, ``lookup[keyword]``, ``finish[answer]``.

Bump :data:`PROMPT_VERSION` whenever a template changes (it is written into trace metadata,
and any change of text changes the cache keys anyway). The free-text verdict prompt of the
``verdict`` signal and of a verify step (:func:`free_verdict_messages`,
:func:`verify_messages`, our own words) has its own version, :data:`FREE_VERDICT_VERSION`,
recorded with every verdict it produced.
"""

from __future__ import annotations

from dataclasses import dataclass

from ccpo.traces.answers import family_of
from ccpo.traces.conversation import Conversation, as_conversation, request_text

PROMPT_VERSION = "ccpo-prompts/1"


@dataclass
class PastRound:
    """What the base agent sees of an earlier round."""

    reasoning: str
    answer: str
    feedback: str | None  # the guide's reply, verbatim ("Yes" / "No [..]"); None: no reviewer


# ----------------------------------------------------------------------------- base: CoT
COT_SYSTEM = "You are a careful expert. Reason step by step, then commit to one final answer."

COT_INSTRUCTION = {
    "mmlu": (
        "Answer the multiple-choice question below. Think step by step, then write the final "
        "answer on the last line as 'Answer: X', where X is one of A, B, C or D."
    ),
    "mcq": (
        "Answer the multiple-choice question below. Think step by step, then write the final "
        "answer on the last line as 'Answer: X', where X is the letter of one option."
    ),
    "exact": (
        "Answer the question below. Think step by step, then write the final answer on the "
        "last line as 'Answer: <answer>', exactly as it should be returned."
    ),
    "number": (
        "Solve the problem below. Think step by step, then write the final answer on the last "
        "line as 'Answer: <number>' (the number alone, no units)."
    ),
    "default": (
        "Answer the question below. Think step by step, then write the final answer on the "
        "last line as 'Answer: <short answer>' (a few words, no explanation)."
    ),
}


def cot_instruction(task: str, family: str | None = None) -> str:
    """The CoT instruction of a task: MMLU's own, else its family's (mcq, exact, number),
    else the short-answer one."""
    if task == "mmlu":
        return COT_INSTRUCTION["mmlu"]
    fam = family_of(task, family)
    return COT_INSTRUCTION[fam if fam in ("mcq", "exact", "number") else "default"]


HISTORY_HEADER_NO_REVIEW = (
    "Your earlier attempts at this question are shown below. Check them and give your own "
    "best answer."
)

HISTORY_HEADER = (
    "Your earlier attempts at this question, each followed by a reviewer's verdict "
    "('Yes' = judged correct, 'No [answer]' = judged wrong, with the reviewer's answer). The "
    "reviewer can be wrong. Use them, then give your own best answer."
)


def format_history(history: list[PastRound], react: bool = False) -> str:
    if not history:
        return ""
    reviewed = any(h.feedback is not None for h in history)
    parts = [HISTORY_HEADER if reviewed else HISTORY_HEADER_NO_REVIEW]
    for i, h in enumerate(history, start=1):
        text = f"--- Attempt {i} ---\n{h.reasoning.strip()}"
        if not react:
            text += f"\nAnswer: {h.answer}"
        if h.feedback is not None:
            text += f"\nReviewer: {h.feedback.strip()}"
        parts.append(text)
    return "\n\n".join(parts) + "\n\n"


def cot_messages(
    task: str, question: str, history: list[PastRound], family: str | None = None
) -> list[dict[str, str]]:
    instr = cot_instruction(task, family)
    user = f"{instr}\n\n{format_history(history)}Question: {question}\n"
    return [{"role": "system", "content": COT_SYSTEM}, {"role": "user", "content": user}]


# ----------------------------------------------------------------------------- base: chat
def chat_messages(prompt: str | Conversation, system: str | None = None) -> list[dict[str, str]]:
    """The messages of a ``chat`` step: the conversation unchanged (a question string is one
    user turn), with the step's own ``system`` prompt, if it has one, in front (added, never
    substituted: a system message of the conversation stays where it is)."""
    own = [{"role": "system", "content": system}] if system is not None else []
    return own + as_conversation(prompt).as_list()


# ----------------------------------------------------------------------------- base: ReAct
REACT_INSTRUCTION = (
    "Solve a question answering task with interleaving Thought, Action, Observation steps. "
    "Thought reasons about the current situation. Action is one of three types:\n"
    "(1) search[entity]: searches for the entity and returns the first paragraph of its page "
    "if it exists (otherwise the closest pages).\n"
    "(2) lookup[keyword]: returns the next sentence containing keyword in the current page.\n"
    "(3) finish[answer]: returns the answer and finishes the task. The answer should be short "
    "(a name, a date, yes/no, a few words).\n"
    "Write exactly one Thought and one Action per step, then stop and wait for the "
    "Observation.\nHere are some examples."
)

REACT_EXAMPLES = """\
Question: In which city was the architect of the Sydney Opera House born?
Thought 1: I need the architect of the Sydney Opera House, then the architect's birthplace.
Action 1: search[Sydney Opera House]
Observation 1: [Sydney Opera House] The Sydney Opera House is a multi-venue performing arts \
centre in Sydney, Australia. It was designed by the Danish architect Jørn Utzon.
Thought 2: The architect is Jørn Utzon. Now I need his birthplace.
Action 2: search[Jørn Utzon]
Observation 2: [Jørn Utzon] Jørn Oberg Utzon was a Danish architect, best known for the \
Sydney Opera House. He was born in Copenhagen and grew up in Aalborg.
Thought 3: Jørn Utzon was born in Copenhagen.
Action 3: finish[Copenhagen]

Question: Are the rivers Danube and Rhine both longer than 1,000 kilometres?
Thought 1: I need the length of each river.
Action 1: search[Danube]
Observation 1: [Danube] The Danube is the second-longest river in Europe. It flows through \
Central and Eastern Europe to the Black Sea.
Thought 2: The first paragraph gives no length. I can look up the length.
Action 2: lookup[km]
Observation 2: (Result 1 / 1) Its length is about 2,850 km.
Thought 3: The Danube is about 2,850 km long. Now the Rhine.
Action 3: search[Rhine]
Observation 3: [Rhine] The Rhine is a river that begins in the Swiss Alps and flows into the \
North Sea; it is about 1,230 km long.
Thought 4: Both are longer than 1,000 km, so the answer is yes.
Action 4: finish[yes]
"""


def react_messages(
    question: str, history: list[PastRound], scratchpad: str
) -> list[dict[str, str]]:
    user = (
        f"{REACT_INSTRUCTION}\n\n{REACT_EXAMPLES}\n"
        f"{format_history(history, react=True)}"
        f"Question: {question}\n{scratchpad}"
    )
    return [{"role": "user", "content": user}]


# ----------------------------------------------------------------------------- guide
GUIDE_TEMPLATE = (
    "Evaluate the answer.\n"
    '- If correct, reply "Yes".\n'
    '- If incorrect, reply "No [correct answer]" (only the correct answer, nothing else).\n'
    "Q: {question}\n"
    "A: {answer}\n"
    "Your response:"
)


def guide_messages(question: str, reasoning: str, answer: str) -> list[dict[str, str]]:
    """The paper's guide template; ``A:`` holds the base reasoning and its final answer."""
    shown = f"{reasoning.strip()}\nFinal answer: {answer}" if reasoning.strip() else answer
    return [{"role": "user", "content": GUIDE_TEMPLATE.format(question=question, answer=shown)}]


# ----------------------------------------------------------------------------- free-text verdict
FREE_VERDICT_VERSION = "ccpo-free-verdict/1"

FREE_VERDICT_TEMPLATE = (
    "You review a reply written for a user's request. Accept it only if it does what the "
    "request asks: correct, complete enough to use, and on topic. A refusal or an evasive "
    "reply is not acceptable unless the request should be refused.\n\n"
    "Request:\n{question}\n\n"
    "Reply:\n{reply}\n\n"
    'Is the reply acceptable? Answer with one word, "Yes" or "No".'
)


def free_verdict_messages(question: str, reply: str) -> list[dict[str, str]]:
    """The ``verdict`` signal's prompt: a rung's judge says Yes/No on a free-text reply."""
    return [
        {"role": "user", "content": FREE_VERDICT_TEMPLATE.format(question=question, reply=reply)}
    ]


def verify_messages(question: str | Conversation, reply: str) -> list[dict[str, str]]:
    """A verify step's prompt: the free-text verdict prompt on ``reply``, the request being the
    question, or the whole conversation (:func:`ccpo.traces.conversation.request_text`)."""
    return free_verdict_messages(request_text(question), reply)


# ----------------------------------------------------------------------------- LLM-as-policy
POLICY_SYSTEM = (
    "You are a decision-making assistant. When given:\n"
    "• A question\n"
    "• An answer from a base model\n"
    '• A judgement from a {guide} model in the format "agreement (yes/no), gpt_answer"\n'
    "• An uncertainty score from the {guide} model\n\n"
    "Your job is to pick one of these actions:\n"
    "1. Use the base model's answer.\n"
    "2. Use the {guide} model's answer.\n"
    "3. Go to the next round (neither answer is acceptable).\n\n"
    "Your goal is to maintain high decision quality and approximately {coverage:g} coverage "
    "over accepted answers.\n\n"
    'Output only the action number ("1", "2", or "3") and nothing else.'
)

POLICY_USER = (
    "Question: {question}\n\n"
    "Base answer: {base_ans}\n\n"
    "{guide} judgement (agreement, answer): {judgement}\n\n"
    "{guide} uncertainty: {uncertainty}\n\n"
    "Action:"
)


def policy_messages(
    question: str,
    base_answer: str,
    verdict: str | None,
    guide_answer: str,
    uncertainty: float | None,
    guide_name: str,
    coverage: float = 0.9,
) -> list[dict[str, str]]:
    judgement = f"{verdict or 'unknown'}, {guide_answer}"
    unc = "unavailable" if uncertainty is None else f"{uncertainty:.4f}"
    return [
        {"role": "system", "content": POLICY_SYSTEM.format(guide=guide_name, coverage=coverage)},
        {
            "role": "user",
            "content": POLICY_USER.format(
                question=question,
                base_ans=base_answer,
                guide=guide_name,
                judgement=judgement,
                uncertainty=unc,
            ),
        },
    ]


# ----------------------------------------------------------------------------- LLM-EXIT
EXIT_TEMPLATE = (
    "You will be given a question and its historical answers. You must decide whether to "
    "exit.\n\n"
    "Instructions:\n"
    "Evaluate the current answer history and determine whether it meets any of the following "
    "conditions:\n"
    "1. The recent responses are repetitive, or no valid answer has been given.\n"
    "2. The most recent answer is correct, and no further attempts are necessary.\n\n"
    "Input:\n"
    "Question: {question}\n"
    "Previous Answers: {answers}\n\n"
    "Output:\n"
    "Exactly one of [EXIT] or [CONTINUE], and nothing else.\n"
    "Answer:"
)


def exit_messages(question: str, answers: list[str]) -> list[dict[str, str]]:
    listed = "; ".join(f"({i}) {a or '(no answer)'}" for i, a in enumerate(answers, start=1))
    return [{"role": "user", "content": EXIT_TEMPLATE.format(question=question, answers=listed)}]
