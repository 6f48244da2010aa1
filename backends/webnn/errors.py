"""DOMException classes of the WebNN spec, as Python exceptions.

JS ``TypeError`` is Python's own ``TypeError``; the spec's DOMException names become
subclasses of :class:`DOMException` so a caller can catch them by the spec's name.
"""


class DOMException(Exception):
    """Base of the DOMException-named errors (``name`` as in WebIDL)."""

    name = "DOMException"


class InvalidStateError(DOMException):
    """An object used after destroy(), or in a state where the call is not allowed."""

    name = "InvalidStateError"


class OperationError(DOMException):
    """The operation failed on the device (e.g. a stateful cache capacity overflow)."""

    name = "OperationError"


class NotSupportedError(DOMException):
    """The backend cannot do what was asked (data type, feature)."""

    name = "NotSupportedError"


class DataError(DOMException):
    """Data that cannot be represented (e.g. an int64 value outside the int32 range)."""

    name = "DataError"
