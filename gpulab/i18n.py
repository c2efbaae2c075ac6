"""What the ``gpulab`` command says to a person, in the user's language: zh-CN or English.

Code, identifiers and logs are English; the CLI's messages (its errors, progress
lines and table headers, and the library's lines it prints through ``say``
callbacks) follow the locale. A message is marked where it is written, with an
English msgid and ``str.format`` fields for everything that is not prose
(names, commands, paths, numbers), which a translation keeps as they are::

    from gpulab.i18n import _, ngettext
    say(_("cluster up in {seconds:.1f} s: {summary}", seconds=took, summary=summary))
    ngettext("{n} lab rule is broken", "{n} lab rules are broken", n)
    KINDS = {"gpu-unhealthy": N_("one GPU reports Xid 79")}  # data; shown as _(KINDS[kind])

The catalog is GNU gettext's: ``gpulab/locale/zh_CN/LC_MESSAGES/gpulab.po``
(msgids in English). ``tools/messages.py`` (``make messages``) brings it in line
with the marked messages (Babel extracts them), and ``tests/unit/test_i18n.py``
fails when a marked message has no translation or the catalog holds one that
no code uses. The ``.po`` is compiled to ``.mo`` by Babel in memory, the first
time a Chinese message is wanted, and read by the standard library's
:class:`gettext.GNUTranslations`: there is no compiled file to build at install
time or to drift from its source.

The language is picked as gettext picks one: the first of ``LANGUAGE`` (a
colon-separated list of preferences), ``LC_ALL``, ``LC_MESSAGES`` and ``LANG``
that is set and not empty; within it, the first language there is a catalog for.
``zh_CN``, ``zh`` and every other ``zh_*`` read the zh_CN catalog; English,
the msgids' own language, needs none; ``C`` (or ``POSIX``) and nothing known
mean English. The environment is read on every call, so a process that changes
it (a lesson's ``setup()``, a test's ``CliRunner(env=...)``) is answered in the
new language.
"""

from __future__ import annotations

import gettext
import io
import os
import unicodedata
from collections.abc import Mapping
from functools import cache
from pathlib import Path

DOMAIN = "gpulab"
LOCALE_DIR = Path(__file__).resolve().parent / "locale"
CHINESE = "zh_CN"
ENGLISH = "en"
# The environment variables gettext reads for the language of messages, in its order.
LANGUAGE_VARIABLES = ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG")


def catalog_path(language: str = CHINESE) -> Path:
    """The ``.po`` source of a language's messages."""
    return LOCALE_DIR / language / "LC_MESSAGES" / f"{DOMAIN}.po"


def language(environ: Mapping[str, str] | None = None) -> str:
    """``"zh_CN"`` or ``"en"``: the language of messages, chosen from the environment as gettext chooses."""
    env = os.environ if environ is None else environ
    wanted = next((env[name] for name in LANGUAGE_VARIABLES if env.get(name)), "")
    for entry in wanted.split(":"):
        lang = entry.split(".", 1)[0].split("@", 1)[0]  # zh_CN.UTF-8@stroke -> zh_CN
        if lang in ("C", "POSIX"):
            break
        if lang == "zh" or lang.startswith("zh_"):
            return CHINESE
        if lang == ENGLISH or lang.startswith("en_"):
            break
    return ENGLISH


@cache
def _translations(language: str) -> gettext.NullTranslations:
    """The compiled catalog of ``language``; English (the msgids) has none."""
    if language == ENGLISH:
        return gettext.NullTranslations()
    from babel.messages.mofile import write_mo
    from babel.messages.pofile import read_po

    with open(catalog_path(language), "rb") as po:
        catalog = read_po(po, locale=language, domain=DOMAIN)
    mo = io.BytesIO()
    write_mo(mo, catalog)  # fuzzy entries are left out: they read as their English msgid
    mo.seek(0)
    return gettext.GNUTranslations(mo)


def _(message: str, /, **fields: object) -> str:
    """``message`` in the user's language, its ``{fields}`` filled in (``str.format``)."""
    text = _translations(language()).gettext(message)
    return text.format(**fields) if fields else text


def N_(message: str, /) -> str:
    """Mark ``message`` for the catalog where it is data (a table of descriptions); ``_(value)`` translates it
    where it is shown. Returns it unchanged."""
    return message


def ngettext(singular: str, plural: str, n: int, /, **fields: object) -> str:
    """The form of a message for the count ``n`` (a field, ``{n}``, of both forms), in the user's language."""
    return _translations(language()).ngettext(singular, plural, n).format(n=n, **fields)


def cells(text: str) -> int:
    """How many terminal cells ``text`` takes: a Chinese character (East Asian wide or fullwidth) takes two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def pad(text: str, width: int, right: bool = False) -> str:
    """``text`` in a column ``width`` terminal cells wide, left-aligned (``right``: right-aligned), so that
    translated table headers line up with their columns."""
    fill = " " * max(0, width - cells(text))
    return fill + text if right else text + fill
