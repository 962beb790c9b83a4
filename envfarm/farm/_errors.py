"""Farm-specific errors, each on its branch of the tree in ``envfarm.errors``."""

from __future__ import annotations

from envfarm.errors import ErrorKind, LeaseError


class TaskNotFound(LeaseError):
    """The env has no task with that index."""

    kind = ErrorKind.not_found
    status_code = 404


class BadRequest(LeaseError):
    """The request body is not valid JSON or does not match the schema."""

    kind = ErrorKind.invalid_request
    status_code = 422


class PayloadTooLarge(LeaseError):
    """The request body is over the farm's size limit."""

    kind = ErrorKind.invalid_request
    status_code = 413
