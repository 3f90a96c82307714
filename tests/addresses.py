"""Addresses at the limits of RFC 5321 as they go on the wire, for enqueue and worker tests.

An internationalised domain is sent in its IDNA form: each label below is 18
characters as written and 63 octets (the most a label may have) as sent.
"""

from __future__ import annotations

from outbox.validation import suppression_key

# 18 characters (of the range Django's validator allows), 63 octets in IDNA form.
WIDE_LABEL = "한ü日龥क〇ꀀ豈日กᄀ〇ꙮힰ한豈ꙮü"
assert len(WIDE_LABEL.encode("idna")) == 63

# 308 characters, as a sign-up form would take it; 848 octets on the wire.
TOO_LONG_ON_THE_WIRE = "x" * 64 + "@" + ".".join([WIDE_LABEL] * 12) + ".example-shop.io"
assert len(TOO_LONG_ON_THE_WIRE) == 308
assert len(suppression_key(TOO_LONG_ON_THE_WIRE)) == 848

# The longest address RFC 5321 allows: 64 octets before the @, and a path
# ("<" address ">") of 256 octets, the domain counted in its IDNA form.
LONGEST_LEGAL = "x" * 64 + "@" + f"{WIDE_LABEL}.{WIDE_LABEL}." + "a" * 61
assert len(suppression_key(LONGEST_LEGAL)) + 2 == 256
# One octet more, in the ASCII label: too long.
ONE_OCTET_TOO_LONG = LONGEST_LEGAL + "a"
# A local part of 65 octets.
LOCAL_PART_TOO_LONG = "x" * 65 + "@example.com"
