"""The one exception type users see as a one-line message instead of a traceback."""


class DraftsmithError(Exception):
    """A problem the user can act on: the message names the problem and the fix.

    The command line prints ``error: <message>`` (:func:`error_line`) and exits with status 2; library callers can
    catch it. Subclass it per area so tests can be specific."""


class ConfigError(DraftsmithError, ValueError):
    """A bad configuration value or combination."""


class DataError(DraftsmithError, ValueError):
    """A missing, unreadable or malformed data file."""


class ArtefactError(DraftsmithError, ValueError):
    """A missing, corrupt or mismatched artefact."""


class TokenizerMismatchError(DraftsmithError, ValueError):
    """A draft whose tokenizer or vocabulary does not match the target's."""


class UnsupportedModelError(DraftsmithError, ValueError):
    """A model whose layout draftsmith does not know how to run layer by layer."""


class ProposerError(DraftsmithError, ValueError):
    """A proposer broke the draft contract (malformed draft, target cache left inconsistent)."""


class EngineError(DraftsmithError, RuntimeError):
    """A serving engine (vLLM) is missing, broken, or failed on a request."""


class OutputError(DraftsmithError):
    """An output that cannot be written: a bad path, no permission, a read-only or full disk, another run writing
    it. The message says what was kept."""


def error_line(err: BaseException) -> str:
    """``error: <message>`` on one line whatever the message holds (a user's setting name with a line break in it)."""
    return "error: " + " ".join(str(err).splitlines())
