"""Record each trace's question embedding (``ccpo traces embed``), for a router that reads it.

:func:`embed_traces` sends the questions (a chat trace's last user turn: the text the live
router sees, :func:`ccpo.traces.conversation.prompt_text`) to an OpenAI-compatible
``/embeddings`` endpoint in batches, and returns the traces with ``question_embedding`` set
(:class:`ccpo.traces.schema.QuestionEmbedding`; numbers rounded to :data:`DIGITS` digits). A
batch that fails is asked once more, then the run stops with the endpoint's error: nothing is
written half embedded. At serve time the same endpoint is asked per question, and a failure
there never blocks an answer (:mod:`ccpo.runtime.agent`; docs/design.md, "Routing").

Main names: :func:`embed_traces`, :func:`question_vector`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ccpo.errors import CCPOError
from ccpo.llm.client import Endpoint, LLMCallError, LLMClient
from ccpo.traces.schema import QuestionEmbedding, Trace

DIGITS = 6
"""Decimal digits kept of each embedding number (the file stays small; cosines move < 1e-5)."""


def question_vector(vector: Sequence[float]) -> list[float]:
    """An embedding as recorded: every number rounded to :data:`DIGITS` digits."""
    return [round(float(x), DIGITS) for x in vector]


async def embed_traces(
    client: LLMClient,
    endpoint: Endpoint,
    traces: Sequence[Trace],
    batch: int = 32,
    timeout: float = 60.0,
    tick: Callable[[int], None] | None = None,
) -> list[Trace]:
    """``traces`` with their question's embedding by ``endpoint.model`` (module docstring);
    ``tick(k)`` after each batch of ``k``. Raises :class:`CCPOError` naming the endpoint's
    error when a batch fails twice."""
    out: list[Trace] = []
    for i in range(0, len(traces), batch):
        part = traces[i : i + batch]
        texts = [tr.question for tr in part]
        vectors = None
        for attempt in (1, 2):
            try:
                vectors = await client.embed(endpoint, texts, timeout)
                break
            except LLMCallError as e:
                if attempt == 2:
                    raise CCPOError(
                        f"embeddings of questions {i + 1}-{i + len(part)} failed twice ({e}); "
                        "nothing written"
                    ) from None
        assert vectors is not None
        if len({len(v) for v in vectors}) != 1 or not vectors[0]:
            raise CCPOError(f"{endpoint.where}: embeddings of unequal or zero length")
        for tr, v in zip(part, vectors, strict=True):
            emb = QuestionEmbedding(model=endpoint.model, vector=question_vector(v))
            out.append(tr.model_copy(update={"question_embedding": emb}))
        if tick is not None:
            tick(len(part))
    if out and len({len(t.question_embedding.vector) for t in out}) != 1:  # type: ignore[union-attr]
        raise CCPOError(f"{endpoint.where}: embeddings of unequal length across batches")
    return out
