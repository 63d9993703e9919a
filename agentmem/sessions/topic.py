"""Topic switches: a session message far from the conversation's recent turns starts a new topic.

When the cosine similarity between a new message and the centroid of the session's last ``window`` user turns
falls below ``threshold``, the session drops its working KV and turns (``Session.reset``): the old topic stops
being mounted, and its turns stay long-term memories that recall can still bring back. Messages with fewer than
``min_words`` content words ("Go on.", "Thanks!") carry no topic and never trigger a switch.

Example:
    >>> import numpy as np
    >>> vecs = {"I love hiking in the Alps every summer": [1.0, 0.0], "Mountain trails near Chamonix are great": [0.9, 0.1],
    ...         "How do I file my quarterly tax return": [0.0, 1.0]}
    >>> det = TopicDetector(lambda texts: np.array([vecs[t] for t in texts]), threshold=0.2)
    >>> det.switched("How do I file my quarterly tax return", ["I love hiking in the Alps every summer",
    ...                                                          "Mountain trails near Chamonix are great"])
    True
    >>> det.switched("Still there?", ["I love hiking in the Alps every summer"])
    False
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from agentmem.text import content_words


class TopicDetector:
    """Decides whether a message leaves the topic of the recent turns (embedding similarity, no LLM).

    Args:
        embed: texts -> vectors (the store's embedder).
        threshold: a similarity below this is a switch.
        window: how many recent user turns define the current topic.
        min_words: messages with fewer content words never switch.
    """

    def __init__(self, embed: Callable[[list[str]], np.ndarray], *, threshold: float, window: int = 3,
                 min_words: int = 3) -> None:
        self._embed, self.threshold, self.window, self.min_words = embed, threshold, window, min_words
        self.last_similarity: float | None = None

    def similarity(self, message: str, recent: Sequence[str]) -> float:
        """Cosine between ``message`` and the centroid of the last ``window`` of ``recent`` (oldest first)."""
        texts = [message, *list(recent)[-self.window:]]
        vecs = np.asarray(self._embed(texts), dtype=np.float32)
        vecs /= np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
        centroid = vecs[1:].mean(axis=0)
        centroid /= max(float(np.linalg.norm(centroid)), 1e-12)
        return float(vecs[0] @ centroid)

    def switched(self, message: str, recent: Sequence[str]) -> bool:
        """True when ``message`` starts a new topic (never for a first message or a topic-less one)."""
        self.last_similarity = None
        if not recent or len(content_words(message)) < self.min_words:
            return False
        self.last_similarity = self.similarity(message, recent)
        return self.last_similarity < self.threshold


__all__ = ["TopicDetector"]
