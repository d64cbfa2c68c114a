"""Runs the three official Python clients against a live assay server.

Usage: ASSAY_URL=http://127.0.0.1:PORT ASSAY_KEY=sk-assay-... python run_clients.py
Prints one JSON report on stdout; test/clients/clients.test.ts asserts on it.
Each client is called exactly as its own docs and source say: base URL, API
key, its method names, and nothing else that changes a request: no `model`
(typesafe-sdk sends its default `jev-latest`, both Bespoke clients
`nimble-latest`) and typesafe-sdk's default compression (zstd for bodies of
1 KiB or more: the venv has the `typesafe-sdk[zstd]` extra). Only transport
settings differ from the defaults: retries are off, so every status is the
server's first answer, and timeouts are long enough for CPU inference on
busy cores.
"""

import json
import os
import traceback

URL = os.environ["ASSAY_URL"]
KEY = os.environ["ASSAY_KEY"]
STATE = "Order #1182 arrived two weeks late and the box was crushed. I want my money back."
# A support thread of about 6 KB: typesafe-sdk compresses it (zstd) on the wire.
LARGE_STATE = "\n\n".join(
    f"Message {i + 1} from the customer: order #{1182 + i} was promised for Monday and arrived on "
    f"{['Thursday', 'Friday', 'Saturday'][i % 3]}; the box was crushed and {['a mug', 'two plates', 'the lid'][i % 3]} "
    "broke. Support said a refund would follow within five working days, and nothing has happened since. "
    "I have been a customer for six years and this is the third late delivery this quarter."
    for i in range(16)
)
MOOD = ["very unhappy", "unhappy", "neutral", "happy", "very happy"]
report = {}


def answers_summary(answers):
    out = {}
    for name, a in answers.items():
        d = a.model_dump() if hasattr(a, "model_dump") else dict(a)
        out[name] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in d.items()}
        # JSON keys must be strings (typesafe-sdk parses score maps to int keys).
        for k in ("legend", "probabilities"):
            if k in out[name]:
                out[name][k] = {str(kk): vv for kk, vv in out[name][k].items()}
    return out


def section(name):
    def wrap(fn):
        try:
            report[name] = fn()
        except Exception as e:  # recorded, asserted by the test
            report[name] = {"crashed": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
        return fn

    return wrap


@section("typesafe-sdk")
def typesafe():
    from typesafe_sdk import Choice, Noul, RetryPolicy, Score, TypeSafeClient, TypeSafeUnprocessableEntityError

    out = {}
    with TypeSafeClient(api_key=KEY, base_url=URL, retry=RetryPolicy(max_retries=0), timeout=120) as client:
        r = client.system_one(
            state=STATE,
            questions={
                "refund": Noul(instructions="The customer asks for a refund."),
                "topic": Choice(instructions="What is the message about?", criteria={"delivery": "shipping and delivery", "billing": None}),
                "mood": Score(instructions="How satisfied is the customer?", criteria=MOOD),
            },
            extra_headers={"x-request-id": "typesafe-req-1"},
        )
        out["model"] = r.model
        out["usage"] = r.usage.model_dump()
        out["answers"] = answers_summary(r.answers)
        out["nouls"] = sorted(r.nouls)
        out["choices"] = sorted(r.choices)
        out["scores"] = sorted(r.scores)
        out["request_id"] = r.request_id
        # Without a caller id: the server's own, read from the header the SDK knows.
        r2 = client.system_one(state={"text": STATE}, questions={"q": {"type": "noul", "instructions": "Is it about a delivery?"}})
        out["generated_request_id"] = r2.request_id
        out["generated_header"] = r2.raw_http_response.headers.get("x-request-id")
        # A large state: the SDK compresses the body (the server's log says what arrived).
        r3 = client.system_one(
            state=LARGE_STATE,
            questions={
                "late": Noul(instructions="The customer says a delivery was late."),
                "topic": Choice(instructions="What is the thread about?", criteria={"delivery": "late or damaged deliveries", "billing": None}),
            },
            extra_headers={"x-request-id": "typesafe-large-1"},
        )
        out["large"] = {
            "model": r3.model,
            "answers": answers_summary(r3.answers),
            "usage": r3.usage.model_dump(),
            "request_id": r3.request_id,
            "body_bytes": len(LARGE_STATE.encode()),
        }
        try:
            # The 422 on a compressed body too.
            client.system_one(state=LARGE_STATE, questions={"q": Noul(instructions="x")}, model="no-such-model", extra_headers={"x-request-id": "typesafe-422"})
            out["error"] = "no exception"
        except TypeSafeUnprocessableEntityError as e:
            out["error"] = {"class": type(e).__name__, "status": e.status, "request_id": e.request_id, "message": str(e), "body": e.body}
        models = client.models.list()
        out["models"] = [m.name for m in models.models]
    return out


@section("bespokelabs")
def bespoke():
    import bespokelabs
    from bespokelabs import BespokeLabs

    out = {}
    client = BespokeLabs(api_key=KEY, base_url=URL, max_retries=0, timeout=120)
    questions = {
        "refund": {"type": "noul", "instructions": "The customer asks for a refund."},
        "topic": {"type": "choice", "instructions": "What is the message about?", "criteria": {"delivery": "shipping and delivery", "billing": None}},
        "mood": {"type": "score", "instructions": "How satisfied is the customer?", "criteria": MOOD},
    }
    r = client.nimble.system_one(state=STATE, questions=questions)
    out["model"] = r.model
    out["usage"] = r.usage.model_dump()
    out["answers"] = answers_summary(r.answers)
    out["nouls"] = sorted(r.nouls)
    raw = client.nimble.with_raw_response.system_one(state=STATE, questions={"q": questions["refund"]}, extra_headers={"x-request-id": "bespoke-req-1"})
    out["raw_request_id"] = raw.headers.get("x-request-id")
    out["raw_sdk_request_id"] = raw.headers.get("x-sdk-request-id")
    out["raw_parsed_model"] = raw.parse().model
    try:
        client.nimble.system_one(state=STATE, questions={"q": questions["refund"]}, model="no-such-model", extra_headers={"x-request-id": "bespoke-422"})
        out["error"] = "no exception"
    except bespokelabs.UnprocessableEntityError as e:
        out["error"] = {"class": type(e).__name__, "status": e.status_code, "request_id": e.response.headers.get("x-request-id"), "body": e.body}
    return out


@section("bespokelabs-nimble")
def nimble():
    from bespokelabs.nimble import APIStatusError, Choice, Nimble, Noul, Score

    out = {}
    with Nimble(base_url=URL, api_key=KEY, max_retries=0) as client:
        r = client.system_one(
            state=STATE,
            questions={
                "refund": Noul(instructions="The customer asks for a refund."),
                "topic": Choice(instructions="What is the message about?", criteria={"delivery": "shipping and delivery", "billing": None}),
                "mood": Score(instructions="How satisfied is the customer?", criteria=MOOD),
            },
        )
        out["model"] = r.model
        out["usage"] = r.usage.model_dump()
        out["answers"] = answers_summary(r.answers)
        out["request_id"] = r.request_id
        out["header_request_id"] = r.raw_http_response.headers.get("x-request-id")
        try:
            client.system_one(state=STATE, questions={"q": Noul(instructions="x")}, model="no-such-model")
            out["error"] = "no exception"
        except APIStatusError as e:
            out["error"] = {"class": type(e).__name__, "status": e.status_code, "request_id": e.request_id, "body": e.response.json()}
        out["models"] = [m["name"] for m in client.models().models]
        out["limits"] = client.limits().model_dump()
        out["health"] = client.health().model_dump()
    return out


print(json.dumps(report))
