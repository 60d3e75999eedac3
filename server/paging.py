"""Listing replies page by page, each within the size a gRPC client accepts.

ListStudies, ListTrials, ListMeasurements and GetParetoFront take ``page_size`` and
``page_token`` and answer with ``next_page_token`` (AIP-158's shape). A page holds at most
``page_size`` items (at most ``MAX_PAGE_SIZE``) and ends early where the next item would
take the reply past ``limits.REPLY_BYTES``; it always holds one item at least, and every
item fits (``server.limits`` bounds them). A request without ``page_size`` is a client
written before paging: it gets every item in one reply while they fit, and otherwise an
INVALID_ARGUMENT naming ``page_size`` instead of a partial list it would take for the whole.

A page token is opaque to clients: the listing it continues (a digest of the method and the
request's filters, so a token is never applied to another listing) and a cursor, the last
trial id of the page (listings of trials: trials created meanwhile come later) or the
number of items so far (studies and measurements, which are never deleted). Items are read
from storage ``_CHUNK`` at a time while a page fills, so a page of small items does not cost
a read of the whole listing, nor one of large items a read of ``page_size`` of them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf.message import Message

from server.limits import REPLY_BYTES
from tuner.errors import ValidationError

#: Items one page holds at most; a larger ``page_size`` means this many.
MAX_PAGE_SIZE = 10_000
_CHUNK = 256  # items read from storage at a time
_ITEM_OVERHEAD = 6  # an item's field tag and length in the reply (at most 1 + 5 bytes)
_TOKEN_ROOM = 256  # bytes kept for the reply's next_page_token (under 100)

_Item = TypeVar("_Item")


@dataclass(frozen=True)
class Page:
    """Which page a listing request asks for.

    Attributes:
        size: Items the page may hold; 0: every item in one reply (a client written before
            paging).
        cursor: Where the page starts: after this trial id, or at this many items.
        listing: Digest of the method and filters the request lists.
    """

    size: int
    cursor: int
    listing: str


def page_of(request: Any, method: str, *filters: object) -> Page:
    """The page ``request`` (with ``page_size`` and ``page_token``) asks for.

    Args:
        request: A listing request.
        method: The RPC's name.
        filters: What else the request asks (study, statuses, ...); a token is accepted
            only by a request with the same.

    Raises:
        ValidationError: A negative ``page_size``, or a ``page_token`` that is not one of
            this listing's.
    """
    if request.page_size < 0:
        raise ValidationError(
            "page_size", f"got {request.page_size}", f"1 to {MAX_PAGE_SIZE} (0: all in one)"
        )
    text = json.dumps([method, *filters], default=str, separators=(",", ":"))
    listing = hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:16]
    cursor = _cursor(request.page_token, listing) if request.page_token else 0
    return Page(min(request.page_size, MAX_PAGE_SIZE), cursor, listing)


def fill(
    page: Page,
    fetch: Callable[[int, int], Sequence[_Item]],
    to_proto: Callable[[_Item], Message],
    advance: Callable[[int, _Item], int],
    what: str,
) -> tuple[list[Any], str]:
    """The page's items as wire messages, and the token of the next page ("" at the end).

    Args:
        page: From ``page_of``.
        fetch: ``fetch(cursor, n)``: at most ``n`` items from ``cursor`` on, in order.
        to_proto: An item's wire form.
        advance: The cursor after an item (its trial id, or the cursor plus one).
        what: The items, for the error ("the trials of study 'x'").

    Raises:
        ValidationError: ``page.size`` is 0 and the items do not fit in one reply.
    """
    out: list[Any] = []
    used, cursor = 0, page.cursor
    while True:
        want = _CHUNK if not page.size else min(_CHUNK, page.size - len(out) + 1)
        items = fetch(cursor, want)
        for item in items:
            if page.size and len(out) == page.size:
                return out, _token(page.listing, cursor)
            message = to_proto(item)
            size = message.ByteSize() + _ITEM_OVERHEAD
            if out and used + size > REPLY_BYTES - _TOKEN_ROOM:
                if not page.size:
                    raise ValidationError(
                        "page_size",
                        f"unset, and {what} take more than {REPLY_BYTES:,} bytes, more than "
                        "one reply carries",
                        "page_size > 0, and page_token to read the rest page by page "
                        "(TunerClient does)",
                    )
                return out, _token(page.listing, cursor)
            out.append(message)
            used += size
            cursor = advance(cursor, item)
        if len(items) < want:
            return out, ""


def check_reply(estimate: int, field_: str, what: str, allowed: str) -> None:
    """Refuse a request whose reply could take more than ``REPLY_BYTES`` (``estimate``, an
    upper bound), before it changes anything: a write whose reply the client cannot read
    leaves it not knowing what was stored, and a retry would store it twice.

    Raises:
        ValidationError: naming ``field_``.
    """
    if estimate > REPLY_BYTES:
        raise ValidationError(
            field_,
            f"{what} would make a reply of about {estimate:,} bytes, more than a reply "
            f"carries ({REPLY_BYTES:,})",
            allowed,
        )


def _token(listing: str, cursor: int) -> str:
    data = json.dumps({"l": listing, "c": cursor}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _cursor(token: str, listing: str) -> int:
    """The cursor of a page token of ``listing``."""
    allowed = "empty, or the next_page_token of the previous page of the same request"
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        made_for, cursor = data["l"], data["c"]
    except (binascii.Error, ValueError, TypeError, KeyError):
        raise ValidationError("page_token", "is not a page token of this server", allowed) from None
    if made_for != listing:
        raise ValidationError(
            "page_token", "continues another listing (another study, filter or method)", allowed
        )
    if isinstance(cursor, bool) or not isinstance(cursor, int) or cursor < 0:
        raise ValidationError("page_token", "is not a page token of this server", allowed)
    return cursor
