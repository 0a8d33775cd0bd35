"""A conversation as the question of the ``chat`` family: an OpenAI ``messages`` list of text.

- :class:`Conversation`: the messages (system, earlier user/assistant turns, the new user
  turn), each ``{"role", "content"[, "name"]}`` with string content; :attr:`Conversation.text`
  is the last user turn (a trace's ``question``), :meth:`Conversation.key` a canonical hash of
  the whole list (how the replay endpoint finds a conversation's recorded replies).
- :func:`conversation_of`: the one parser of messages (a request's, at the HTTP edge, or a
  file's), checked and normalised (text parts joined); a :class:`ConversationError` names the
  message and what cannot be passed on (a role, an image, audio, a tool call).
- :func:`check_size`: the one check of a conversation's size against a server's limit.
- :func:`prompt_text`, :func:`as_conversation`: a step's prompt (a question string or a
  conversation) as display text, or as a conversation (a string is one user turn);
  :func:`request_text`: all of it as one text (what a verifier reads the reply against).

Contract: docs/design.md, sections "Conversations" and "Trace schema `ccpo.trace/v1`".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: the roles every model of a ladder takes (OpenAI-compatible servers all accept these)
ROLES: tuple[str, ...] = ("system", "user", "assistant")

#: parts and fields of an OpenAI message that are not text, as an error names them
_NOT_TEXT = {
    "image_url": "an image",
    "input_image": "an image",
    "input_audio": "audio",
    "audio": "audio",
    "file": "a file",
    "tool_calls": "a tool call",
    "function_call": "a function call",
    "tool_call_id": "a tool result",
}


class ConversationError(ValueError):
    """Messages a chat ladder cannot pass on unchanged (the message says which and why)."""


@dataclass(frozen=True)
class Conversation:
    """An OpenAI ``messages`` list of text, as the models of a chat ladder receive it."""

    messages: tuple[dict[str, str], ...]

    @property
    def text(self) -> str:
        """The last user turn (the question a trace and an answer record show)."""
        return next(m["content"] for m in reversed(self.messages) if m["role"] == "user")

    def as_list(self) -> list[dict[str, str]]:
        """The messages as a new list of new dicts (safe to extend or serialise)."""
        return [dict(m) for m in self.messages]

    def key(self) -> str:
        """SHA-256 of the canonical JSON of the messages: equal iff the conversations are."""
        return conversation_key(self.messages)

    @property
    def size(self) -> int:
        """Characters of text the models receive (and bill) in all the messages: each one's
        content and ``name`` (what ``check_size`` bounds)."""
        return sum(len(m["content"]) + len(m.get("name", "")) for m in self.messages)

    @property
    def roles(self) -> list[str]:
        """The role of each message, in order."""
        return [m["role"] for m in self.messages]


def conversation_key(messages: Sequence[dict[str, Any]]) -> str:
    """SHA-256 of ``messages`` as canonical JSON (sorted keys, no spaces, UTF-8)."""
    blob = json.dumps(list(messages), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def _content(m: dict[str, Any], where: str) -> str:
    c = m.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        texts = []
        for j, part in enumerate(c):
            kind = part.get("type", "text") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                what = _NOT_TEXT.get(str(kind), f"a part of type {kind!r}")
                raise ConversationError(
                    f"{where}.content[{j}]: {what} cannot be passed on; a chat ladder sends "
                    "text only"
                )
            texts.append(part["text"])
        return "".join(texts)
    raise ConversationError(f"{where}.content: no text (a string is required)")


def conversation_of(messages: Any, where: str = "messages") -> Conversation:
    """``messages`` checked and normalised: each a ``system``, ``user`` or ``assistant`` message
    of text (a list of text parts is joined into one string; ``name`` is kept), the last the
    user's new turn. :class:`ConversationError` names the first problem."""
    if not isinstance(messages, list | tuple) or not messages:
        raise ConversationError(f"{where}: a non-empty list of messages is required")
    out = []
    for i, m in enumerate(messages):
        at = f"{where}[{i}]"
        if not isinstance(m, dict):
            raise ConversationError(f"{at}: a message object is required")
        role = m.get("role")
        if role not in ROLES:
            raise ConversationError(
                f"{at}: role {role!r} cannot be passed on; a chat ladder passes "
                f"{', '.join(ROLES)} messages"
            )
        for k, v in m.items():
            if k in ("role", "content") or v is None:
                continue
            if k == "name" and isinstance(v, str):
                continue
            what = _NOT_TEXT.get(k, f"the field {k!r}")
            raise ConversationError(
                f"{at}.{k}: {what} cannot be passed on; a chat ladder sends text only"
            )
        msg = {"role": role, "content": _content(m, at)}
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        out.append(msg)
    if out[-1]["role"] != "user":
        raise ConversationError(
            f"{where}: the last message must be the user's new turn (it is {out[-1]['role']!r})"
        )
    return Conversation(tuple(out))


def check_size(conv: Conversation, max_chars: int, where: str = "messages") -> Conversation:
    """``conv`` itself when its :attr:`~Conversation.size` is at most ``max_chars`` (a server's
    ``server.max_conversation_chars``), else a :class:`ConversationError` saying both."""
    if conv.size > max_chars:
        raise ConversationError(
            f"{where}: {conv.size} characters in {len(conv.messages)} messages, more than the "
            f"{max_chars} this server accepts (server.max_conversation_chars)"
        )
    return conv


def as_conversation(prompt: str | Conversation) -> Conversation:
    """``prompt`` as a conversation: itself, or a string as one user turn."""
    if isinstance(prompt, Conversation):
        return prompt
    return Conversation(({"role": "user", "content": prompt},))


def prompt_text(prompt: str | Conversation) -> str:
    """The text a prompt shows: a question itself, a conversation's last user turn."""
    return prompt.text if isinstance(prompt, Conversation) else prompt


def request_text(prompt: str | Conversation | Sequence[dict[str, Any]]) -> str:
    """The whole request a reply answers, as one text: a question itself; a conversation of
    one user turn, that turn; a longer one, each message as ``role: content``, blank lines
    between (what a verify step's verifier is shown)."""
    if isinstance(prompt, str):
        return prompt
    messages = prompt.messages if isinstance(prompt, Conversation) else tuple(prompt)
    if len(messages) == 1 and messages[0]["role"] == "user":
        return messages[0]["content"]
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages)
