"""The small agent: how the embedded model answers from what it read.

One home for the policy that makes a 135M model useful (issue 41), above the agent loop it
steers and below :mod:`drvenus.stack`, which assembles it:

- :mod:`~drvenus.small.levers`: the typed, frozen levers (:class:`Levers`) and the embedded
  preset's (:data:`EMBEDDED_LEVERS`); a lever that does not exist fails where levers are made
- :mod:`~drvenus.small.preset`: when the embedded preset applies (one rule, ``is_embedded``),
  its agent budgets, search depth, hybrid retrieval and grammar builder
- :mod:`~drvenus.small.grammar`: each constrained turn's grammar, built from the turn's state
  (:class:`drvenus.protocol.state.TurnState`, kept by the agent loop)
- :mod:`~drvenus.small.spans`: answer spans, answer shapes, focus sentences, the first query
- :mod:`~drvenus.small.reader`: the span readers behind one interface (``SpanReader``): the
  linear reader (weights in ``reader.json``) and, chosen by the ``span_reader`` lever, the
  neural one (:mod:`drvenus.small.neural`)
- :mod:`~drvenus.small.compare`: which of two things a question names came first or has
  more, by the years and amounts read (the ``choice_compare`` lever)
- :mod:`~drvenus.small.heavy`: Heavy mode's synthesis choices and the reader's evidence scores

``protocol/`` stays the protocol alone and imports nothing from here (tests/test_layout.py).
"""
