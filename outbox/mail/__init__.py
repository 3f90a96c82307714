"""The mail side: the message a worker sends, and where and how it is handed over.

``message`` (each recipient's copy), ``message_id`` (the per-copy Message-ID),
``failures`` (what an exception means: retry, fail, or in doubt),
``handover`` (SEND_TIMEOUT over a whole send, and a connection lost after the
final dot), ``sendmail`` (the sendmail backend), ``targets`` (the default
delivery target and its connection), ``mailers`` (a mailer per email) and
``valve`` (the staging valve: who may get a copy, checked on each one before it leaves).
"""
