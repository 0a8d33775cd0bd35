"""Tasks: question loaders (MMLU, HotpotQA, generic JSONL), scorers and the search tool."""

from ccpo.llm.tasks.loaders import Passage, Question, load_questions
from ccpo.llm.tasks.scoring import score

__all__ = ["Passage", "Question", "load_questions", "score"]
