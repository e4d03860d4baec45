"""What a name typed by the user (a project, a chat title) may be, checked in one place.

The rules, and why:
- Surrounding whitespace is trimmed and each run of inner whitespace (a pasted line break, a
  tab) becomes one space: a name is one line in the sidebar, and that is what the user meant.
- Empty (after trimming) is refused: an unnamed row cannot be told apart from the others.
- Longer than NAME_MAX_CHARS is refused, not cut: a silent cut could make two names equal or
  drop the part that mattered; the error says how long it was so it can be shortened.
- Other control characters (NUL, ESC, bell ...) and the bidirectional overrides are refused, not
  stripped: they are never typed on purpose, they break exports and can make a name display as
  something else (U+202E turns the text around); the error names the character.
"""

from __future__ import annotations

import re
import unicodedata

NAME_MAX_CHARS = 200

# Bidirectional embedding/override/isolate controls: format characters (category Cf) that change
# how the surrounding text is shown. Other Cf characters (the zero-width joiner in emoji) are fine.
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_WHITESPACE_RUN = re.compile(r"\s+")


class InvalidNameError(ValueError):
    """Base for a refused name; `str()` is a sentence for the user."""


class EmptyNameError(InvalidNameError):
    pass


class NameTooLongError(InvalidNameError):
    pass


class NameControlCharacterError(InvalidNameError):
    pass


def clean_name(text: str, what: str = "name") -> str:
    """`text` as a name (rules in the module docstring), or a InvalidNameError saying what is wrong.
    `what` words the message ("project name", "chat title")."""
    if not isinstance(text, str):
        raise TypeError(f"{what} must be text, not {type(text).__name__}")
    name = _WHITESPACE_RUN.sub(" ", text).strip()
    if not name:
        raise EmptyNameError(f"The {what} is empty; type at least one letter or digit.")
    for ch in name:
        if unicodedata.category(ch) == "Cc" or ch in _BIDI_CONTROLS:
            # Cc characters have no Unicode name; the bidi controls do (RIGHT-TO-LEFT OVERRIDE)
            named = f" ({unicodedata.name(ch)})" if unicodedata.name(ch, "") else ""
            raise NameControlCharacterError(
                f"The {what} contains the control character U+{ord(ch):04X}{named}; remove it."
            )
    if len(name) > NAME_MAX_CHARS:
        raise NameTooLongError(
            f"The {what} is {len(name):,} characters long; the limit is {NAME_MAX_CHARS}."
        )
    return name
