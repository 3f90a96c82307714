"""The outbox's only uses of what Django, Python's email/smtplib, redis-py and anymail keep private.

One module per library, each for a use that has no public way, or whose
public way costs much more where it counts; each use is written down next to
its code, and ``tests/compat/test_private_uses.py`` fails loudly on a library version
that changed what it relies on. Nothing else in ``outbox/`` sets or reads a
library's private attribute (``tests/project/test_references.py`` checks it). This
is the bottom layer: it imports no other part of the outbox.
"""
