"""The service's refusals, in the two shapes the SDK reads: an HTTP status with a JSON body at the door (the SDK
raises at once for a 4xx that is not 408/409/429), and ``{"error", "category"}`` as a future's result for a request
accepted and then refused (the SDK raises ``tinker.RequestFailedError`` and does not retry)."""
from __future__ import annotations


class TinkerRequestError(ValueError):
    """A request the service refuses; ``field`` names what is wrong (``data[2].loss_fn_inputs["weights"]``)."""

    def __init__(self, message: str, field: str | None = None, status: int = 400, category: str = "user"):
        super().__init__(message)
        self.field, self.status, self.category = field, status, category

    def body(self) -> dict:
        return {"detail": str(self), "field": self.field}


def not_found(what: str, ident: str, field: str) -> TinkerRequestError:
    return TinkerRequestError(f"no {what} {ident!r} on this server", field=field, status=404)
