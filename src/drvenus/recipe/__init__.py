"""The embedded recipe's training data: questions from the built-in corpus (single-hop,
two-hop, distant supervision over the deepresearcher mix) with the evaluation bucket split, and a
scripted teacher that answers them with the real tools in protocol turns (``build``)."""

from drvenus.recipe.articles import RESERVED_COUNT, Article, is_reserved, load_articles
from drvenus.recipe.questions import Question

__all__ = ["RESERVED_COUNT", "Article", "Question", "is_reserved", "load_articles"]
