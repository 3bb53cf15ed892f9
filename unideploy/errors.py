"""Errors that reach the user.

Every failure a user can cause or fix derives from :class:`UnideployError`; the CLI prints it as
one line (message plus hint) and exits non-zero, while anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations


class UnideployError(Exception):
    """A failure the user can act on. ``hint`` says what to do about it."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message

    def __reduce__(self) -> tuple[type, tuple[str, str | None]]:  # crosses process boundaries whole
        return type(self), (self.message, self.hint)


class InputError(UnideployError):
    """Bad user input: arguments, files, tensors that do not match a signature."""


class PackageError(UnideployError):
    """A package that is malformed, incomplete, tampered with or escapes its root."""


class MissingDependencyError(UnideployError):
    """A plug-in needs a package (or hardware) that is not present."""


class ExportError(UnideployError):
    """Conversion failed: unsupported operator, converter crash, invalid produced model."""

    exit_code = 1


class UntranslatableError(ExportError):
    """The source uses operators the ONNX conversion cannot take. A target that runs the source's own
    format (``--target ascend`` for MindIR) still serves it: the export goes on without ONNX."""


class ValidationError(UnideployError):
    """An artifact's outputs differ from the reference beyond tolerance."""

    exit_code = 1


class AccuracyBudgetError(UnideployError):
    """An optimized model lost more accuracy than the user allowed; nothing was written."""

    exit_code = 1


class NotFasterError(UnideployError):
    """An optimization made for speed measured slower than the model it would replace; nothing
    was written."""

    exit_code = 1


class RuntimeFailure(UnideployError):
    """The runtime itself failed on inputs that passed signature validation."""

    exit_code = 1


class RefusedValues(RuntimeFailure, InputError):
    """Values of the right dtype and shape that the model cannot take: a token id past its
    embedding table, an index out of range. Refused by the signature where it knows the table
    (``TensorSpec.table_rows``), else by the runtime's kernel: a failure whose cause is the request,
    so the client's to fix (400 / INVALID_ARGUMENT when served), and in a merged batch its own
    request's alone."""

    exit_code = InputError.exit_code

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(
            message, hint or "send values the model takes: token ids within its vocabulary, indices within their range"
        )


class RunOutOfMemory(RuntimeFailure, InputError):
    """A run that needs more memory than its engine may hold (the server's --max-run-memory, which
    caps what every model's runs hold at once): too large for this server now, so the request's
    to make smaller (400 / RESOURCE_EXHAUSTED when served), and in a merged batch run again in
    halves, which may fit. Without the cap a request whose work grows with its sizes or values (a
    transformer's attention over a long sequence, an output an input's value sizes) could take the
    machine's memory and the server with it."""

    exit_code = InputError.exit_code


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of a third-party exception that says something, for one-line messages
    (converters are verbose; MindSpore opens its errors with a rule of dashes)."""
    lines = [line.strip().removeprefix("- ") for line in str(exc).splitlines() if line.strip(" -=_*#\t")]
    if not lines:
        return type(exc).__name__
    if lines[0].endswith(":") and len(lines) > 1:  # a heading ("Kernel select failed:"): what follows says it
        return f"{lines[0]} {lines[1]}"[:limit]
    return lines[0][:limit]
