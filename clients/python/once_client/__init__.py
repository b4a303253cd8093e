"""A thin client of once's protocol: effects exactly once over queues that
deliver at least once, with the rules applied by a once server.

    from once_client import Client, Intent, do

    c = Client("http://127.0.0.1:7070", token)
    receipt = do(c, Intent("order-981", 0, "send_email", "ada@example.com", {"subject": "hi"}),
                 lambda attempt: send(attempt.provider_key))

Policy is what a claim carries for a kind the server does not pin;
Verifier (Client.verify, Client.verify_once) answers the server's
questions about dead claims of a kind a client verifies; once_client.aio
is the same over asyncio. README.md says more.

Standard library only; Python 3.9 or later. docs/protocol.md describes the
protocol.
"""

from .client import (  # noqa: F401
    AwaitingApproval,
    BadRequest,
    CannotTell,
    Claimed,
    Client,
    Conflict,
    Failed,
    Fenced,
    FingerprintMismatch,
    Forbidden,
    InFlight,
    Intent,
    InvalidIntent,
    KeyMismatch,
    Landed,
    LeaseSpent,
    NeedsVerifier,
    NoSuchQuestion,
    NotClientVerified,
    NotFound,
    NotLanded,
    NotRecorded,
    OnceError,
    OutcomeUnknown,
    Permanent,
    Policy,
    PolicyPinned,
    Question,
    Replayed,
    ResultNotJSON,
    ResultTooLarge,
    RetryLater,
    Review,
    Run,
    StoreUnavailable,
    TooLarge,
    Unauthorized,
    Unreachable,
    Verifier,
    cannot_tell,
    dispose,
    do,
    landed,
    not_landed,
    write_token,
)
from .keys import JSON_NULL, NotJSON, Refused, check_json, key_of  # noqa: F401
