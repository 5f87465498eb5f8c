"""The policy endpoint's door (issue 53, "no request takes a run down"): each finding of the hostile client test as a
test, answered with an OpenAI-style refusal naming the field, or kept with its reason, never a 500 or a dead run.

No engine: the real tokenizer (the tiny model's), the real recorder, groups and inbox on a run folder, the real
HTTP server; what a sampler would answer is given to the recorder as the engine hands it over (a ``Sample``). The
policy behind the door is ``DoorPolicy``: a call that reaches it is stopped there with what the engine would have
been given (``PolicyReached``), so a test sees both that the door let a call through and exactly what it passed.
The Atropos pulls' rules are at the end."""
from __future__ import annotations

import json
import math
import os
import socket
import stat
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pyarrow.parquet as pq
import pytest

from grpo_core.outside.endpoint import requests as door
from grpo_core.outside.endpoint.requests import RequestError
from grpo_core.outside.endpoint.sampling import SamplingRequest
from grpo_core.engine.rollout.sampler import Sample

TOKEN = "door-token"
CONTEXT = 112  # the policy's context in these tests: the finding's multi-turn episode reached exactly it
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CHAT = {"messages": [{"role": "user", "content": "1 + 1?"}]}


class PolicyReached(Exception):
    def __init__(self, prompt_ids: list[int], request: SamplingRequest):
        super().__init__(f"the door let a call through: {len(prompt_ids)} prompt tokens, {request}")
        self.prompt_ids, self.request = prompt_ids, request


class DoorPolicy:
    """The policy behind the door: what reaches it is what the engine would be given, and stops here."""
    max_model_len = CONTEXT

    def sample(self, prompt_ids: list[int], request: SamplingRequest):
        raise PolicyReached(list(prompt_ids), request)


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def _endpoint(tokenizer, sink=None, **settings):
    from grpo_core.outside.endpoint.recorder import EpisodeRecorder
    from grpo_core.outside.endpoint.server import EndpointSettings, PolicyEndpoint

    return PolicyEndpoint(DoorPolicy(), EpisodeRecorder(tokenizer),
                          EndpointSettings(model_name="tiny", max_tokens=8, token=TOKEN, wait_s=0.3, **settings),
                          sink=sink)


@pytest.fixture(scope="module")
def served(tokenizer):
    from grpo_core.outside.endpoint.server import EndpointServer

    server = EndpointServer(_endpoint(tokenizer, max_body_bytes=256 * 1024)).start()  # chunked tests stay small
    try:
        yield server
    finally:
        server.stop()


def _url(server, path: str) -> str:
    return (server.url.removesuffix("/v1") if path in ("/generate", "/health") else server.url) + path


def _post(server, path: str, body=None, raw: bytes | None = None, headers: dict | None = None) -> httpx.Response:
    headers = {**AUTH, **(headers or {})}
    if raw is not None:
        return httpx.post(_url(server, path), content=raw, headers={**headers, "Content-Type": "application/json"},
                          timeout=60)
    return httpx.post(_url(server, path), json=body, headers=headers, timeout=60)


def _refused(response: httpx.Response, status: int, param: str | None, code: str = "invalid_request") -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code), error
    assert error["type"] == "invalid_request_error" and error["message"]
    return error["message"]


def _record_turn(endpoint, episode_id: str, messages: list[dict], answer: list[int], finish: str = "stop"):
    """One turn of an episode as the endpoint records it: planned on the recorded state, the sampler's answer."""
    plan = endpoint.recorder.plan_chat(messages, episode_id)
    with endpoint.recorder.turn(plan):
        endpoint.recorder.record(plan, Sample(token_ids=answer, logprobs=[-0.5] * len(answer), text="t",
                                              finish_reason=finish), 0)
    return plan


# ---------------------------------------------------------------------------------------- 1. seeds
@pytest.mark.parametrize("path,body", [
    ("/chat/completions", {**CHAT, "seed": 1180591620717411303424}),  # the finding: above 64 bits
    ("/chat/completions", {**CHAT, "seed": -1}),
    ("/chat/completions", {**CHAT, "seed": 2**63 - 1, "n": 2}),  # the second sample's seed would be 2**63
    ("/chat/completions", {**CHAT, "seed": "7"}),
    ("/completions", {"prompt": "1 + 1 =", "seed": 2**64}),
    ("/generate", {"prompt": {"prompt_token_ids": [19, 283]}, "seed": 2**63}),
])
def test_a_seed_outside_what_vllm_takes_is_refused_at_the_door(served, path, body):
    _refused(_post(served, path, body), 400, "seed")


def test_a_seed_within_64_bits_for_every_sample_passes_the_door(tokenizer):
    endpoint = _endpoint(tokenizer)
    for seed, n in ((0, 1), (2**63 - 1, 1), (2**63 - 2, 2)):
        with pytest.raises(RequestError) as reached:
            endpoint.chat_completions({**CHAT, "seed": seed, "n": n}, {})
        assert isinstance(reached.value.__cause__, PolicyReached)
        assert reached.value.__cause__.request.seed == seed


# ------------------------------------------------------------------------- 2. numbers that are not finite
@pytest.mark.parametrize("raw,param", [
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', "temperature"),
    (b'{"messages": [{"role": "user", "content": "x"}], "top_p": NaN}', "top_p"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": Infinity}', "temperature"),
    (b'{"messages": [{"role": "user", "content": "x"}], "top_p": -Infinity}', "top_p"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": 1e999}', "temperature"),
    (b'{"prompt": "x", "max_tokens": ' + b"9" * 401 + b"}", "max_tokens"),
])
def test_numbers_that_are_not_finite_or_fit_no_field_are_refused_naming_it(served, raw, param):
    _refused(_post(served, "/chat/completions" if b"messages" in raw else "/completions", raw=raw), 400, param)


def test_a_huge_integer_or_nan_reward_is_a_400_not_a_500(served):
    for raw in (b'{"reward": ' + b"9" * 401 + b"}", b'{"reward": NaN}', b'{"reward": -Infinity}'):
        _refused(_post(served, "/episodes/nobody/finish", raw=raw), 400, "reward")


def test_the_field_rules_check_values_that_never_were_json():
    """A training service reusing the rules may hand them Python values: NaN never passes a range check."""
    for name in ("temperature", "top_p"):
        with pytest.raises(RequestError) as refused:
            door.sampling_fields({name: math.nan}, max_tokens=8, temperature=1.0, top_p=1.0)
        assert refused.value.param == name
    with pytest.raises(RequestError, match="integers must fit"):
        door.check_values({"n": 10**30})
    with pytest.raises(RequestError) as refused:
        door.reward(10**400, door.MAX_ABS_REWARD)
    assert refused.value.param == "reward"


# ------------------------------------------------------------------------------------------ 3. rewards
def test_a_reward_beyond_the_bound_is_refused_not_clipped_and_the_episode_stays_open(tokenizer, tmp_path):
    from grpo_core.outside.endpoint.groups import EpisodeGroups
    from grpo_core.run.storage import RunStore

    endpoint = _endpoint(tokenizer, sink=EpisodeGroups(RunStore(str(tmp_path), "run"), 4))
    _record_turn(endpoint, "big-0", CHAT["messages"], [19, 2])
    for reward in (1e308, -1e6 - 1, 10**7):
        with pytest.raises(RequestError) as refused:
            endpoint.finish("big-0", {"reward": reward, "group": "g"})
        assert refused.value.param == "reward" and "EndpointSettings.max_abs_reward" in str(refused.value)
    assert "big-0" in endpoint.recorder.open_episodes()
    assert endpoint.finish("big-0", {"reward": 1e6, "group": "g"})["reward"] == 1e6  # the bound itself is taken


def test_a_group_whose_statistics_overflow_is_kept_as_rejected_with_its_reason(tokenizer, tmp_path):
    """The finding: four episodes with reward 1e308 overflowed the group's advantages to NaN and killed the run.
    With a bound raised that far (a service's own setting), the complete group goes to inbox/rejected instead."""
    from grpo_core.outside.endpoint.groups import EpisodeGroups
    from grpo_core.pipeline.inbox import REJECTED, ready_items
    from grpo_core.run.storage import RunStore

    store = RunStore(str(tmp_path), "run")
    endpoint = _endpoint(tokenizer, sink=EpisodeGroups(store, 4), max_abs_reward=1e308)
    answers = []
    for i in range(4):
        _record_turn(endpoint, f"huge-{i}", CHAT["messages"], [19 + i, 2])
        answers.append(endpoint.finish(f"huge-{i}", {"reward": 1e308, "group": "g-huge"}))
    assert [a["inbox_item"] for a in answers] == [None] * 4 and [a["group_rejected"] for a in answers[:3]] == [None] * 3
    fate = answers[3]["group_rejected"]
    assert fate["field"] == "reward" and "float32" in fate["error"] and fate["group"] == "g-huge"
    assert ready_items(store) == []
    kept = pq.read_table(store.local_path(f"{REJECTED}/{fate['item']}.parquet")).to_pylist()
    assert [r["episode_id"] for r in kept] == [f"huge-{i}" for i in range(4)] and kept[0]["reward"] == 1e308
    assert store.get_json_file(f"{REJECTED}/{fate['item']}.error.json") == fate


# ----------------------------------------------------------------------------------------- 4. stop lists
@pytest.mark.parametrize("stop", [["\n"] * 20_000, "x" * 100_000, [["deep"]]])
def test_stop_sequences_are_refused_whatever_their_size(served, stop):
    _refused(_post(served, "/chat/completions", {**CHAT, "stop": stop}), 400, "stop", "unsupported_parameter")


# ------------------------------------------------------------------------------------ 5. prompt length
def _grown_episode(endpoint, tokenizer, episode_id: str, prompt_tokens: int) -> list[dict]:
    """An episode whose next turn's prompt -- the tokens the engine would be given -- is ``prompt_tokens`` long: the
    first turn answered with a long sampled turn cut by its budget, then a short user message."""
    first = _record_turn(endpoint, episode_id, CHAT["messages"], [90] * 40, finish="length")
    messages = CHAT["messages"] + [{"role": "assistant", "content": "t"}]
    for size in range(0, 200):
        trial = messages + [{"role": "user", "content": "x" * size}]
        if len(endpoint.recorder.plan_chat(trial, episode_id).prompt_ids) == prompt_tokens:
            return trial
    raise AssertionError(f"no next turn of {prompt_tokens} tokens after a first prompt of {len(first.prompt_ids)}")


def test_a_later_turn_that_leaves_no_room_for_an_answer_is_refused_and_one_token_of_room_clamps(tokenizer):
    endpoint = _endpoint(tokenizer)
    full = _grown_episode(endpoint, tokenizer, "ep-full", CONTEXT)  # the finding: prompt 112, context 112
    with pytest.raises(RequestError) as refused:
        endpoint.chat_completions({"messages": full, "episode_id": "ep-full"}, {})
    assert (refused.value.status, refused.value.param, refused.value.code) == (400, "messages",
                                                                               "context_length_exceeded")
    last = _grown_episode(endpoint, tokenizer, "ep-last", CONTEXT - 1)
    with pytest.raises(RequestError) as reached:
        endpoint.chat_completions({"messages": last, "episode_id": "ep-last", "max_tokens": 50}, {})
    given = reached.value.__cause__
    assert isinstance(given, PolicyReached)
    plan = endpoint.recorder.plan_chat(last, "ep-last")
    assert given.prompt_ids == plan.prompt_ids and len(given.prompt_ids) == CONTEXT - 1
    assert given.request.max_tokens == 1  # clamped to the room left
    for ids in ([19] * CONTEXT, [10**9] * (CONTEXT + 5)):  # counted before anything else (the vocabulary here)
        with pytest.raises(RequestError) as refused:
            endpoint.completions({"prompt": ids}, {})
        assert (refused.value.param, refused.value.code) == ("prompt", "context_length_exceeded")


def test_text_obviously_too_long_is_refused_before_it_is_rendered(tokenizer):
    """5 million characters take seconds to render and tokenise here (the finding: 10 MB, 34.8 s); the door measures
    them first."""
    endpoint = _endpoint(tokenizer)
    text = "x" * 5_000_000
    for call, body, param in ((endpoint.chat_completions, {"messages": [{"role": "user", "content": text}]},
                               "messages"),
                              (endpoint.chat_completions, {"messages": [{"role": "user", "content": [
                                  {"type": "text", "text": text}]}]}, "messages"),
                              (endpoint.completions, {"prompt": text}, "prompt")):
        started = time.perf_counter()
        with pytest.raises(RequestError) as refused:
            call(body, {})
        assert time.perf_counter() - started < 1.0
        assert (refused.value.param, refused.value.code) == (param, "context_length_exceeded")
        assert "characters" in str(refused.value)


def test_the_character_bound_never_refuses_a_text_that_fits(tokenizer):
    """However a text tokenises, it is at least len/bound tokens: so a text over the bound cannot fit."""
    bound = door.chars_per_token_bound(tokenizer)
    longest = sorted(tokenizer.get_vocab(), key=len)[-20:]
    texts = ["".join(longest) * 50, " " * 5000, "x" * 5000, "<|im_start|>" * 300, "\u1100\u1161\u11a8" * 500,
             "e\u0301" * 1000, "\U0001f642" * 500, "안녕하세요 " * 300, "\n\n\t " * 900]
    for text in texts:
        tokens = len(tokenizer.encode(text, add_special_tokens=False))
        assert len(text) <= tokens * bound, (text[:40], len(text), tokens, bound)
    door.prompt_size("prompt", "x" * ((CONTEXT - 1) * bound), CONTEXT, bound)  # at the bound: left to the tokenizer


# ------------------------------------------------------------------------------ 6. size, depth, surrogates
ROUTES = [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("POST", "/generate"),
          ("POST", "/v1/episodes/ep-x/finish"), ("DELETE", "/v1/episodes/ep-x"), ("GET", "/v1/models")]


def _raw_exchange(server, head: str, chunks=()) -> tuple[int, dict]:
    """An HTTP/1.1 request written by hand (a body that is never sent, or sent chunked), and the answer."""
    with socket.create_connection((server.host, server.port), timeout=30) as sock:
        sock.sendall(head.encode())
        try:
            for chunk in chunks:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed: what it answered is read below
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head_bytes, body = data.split(b"\r\n\r\n", 1)
        length = int(next(line.split(b":")[1] for line in head_bytes.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        while len(body) < length:
            body += sock.recv(65536)
    return int(head_bytes.split()[1]), json.loads(body)


@pytest.mark.parametrize("method,path", ROUTES)
def test_a_body_declared_over_the_limit_is_refused_413_before_a_byte_of_it_is_read(served, method, path):
    """The 2 GB body is declared, never sent: the answer can only come before reading it."""
    status, doc = _raw_exchange(served, f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                                        "Content-Type: application/json\r\nContent-Length: 2000000000\r\n\r\n")
    assert status == 413 and doc["error"]["code"] == "request_too_large", doc


def test_a_chunked_body_is_refused_once_it_passes_the_limit(served):
    limit = served.endpoint.settings.max_body_bytes
    chunks = [b" " * 65536] * (limit // 65536 + 2)
    status, doc = _raw_exchange(served, f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                                        f"{TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\n", chunks)
    assert status == 413 and doc["error"]["code"] == "request_too_large", doc


def test_the_default_body_limit_takes_a_long_context_as_token_ids():
    from grpo_core.outside.endpoint.server import EndpointSettings

    ids = json.dumps({"prompt": {"prompt_token_ids": [151_643] * 131_072}}).encode()  # 128k ids of 6 digits
    assert len(ids) < EndpointSettings(model_name="m", max_tokens=1).max_body_bytes


@pytest.mark.parametrize("raw,status,param,code", [
    (b"[" * 100_000 + b"]" * 100_000, 400, None, "invalid_json"),  # the finding: RecursionError, 500
    (b'{"messages": ' + b"[" * 40 + b"]" * 40 + b"}", 400, "messages", "invalid_request"),
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400, "messages[0].content", "invalid_request"),
    (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "a\\udfffb"}]}]}', 400,
     "messages[0].content[0].text", "invalid_request"),
    (b'{"\\ud800": 1, "messages": []}', 400, "\\ud800", "invalid_request"),  # shown escaped
])
def test_json_too_deep_or_holding_a_lone_surrogate_is_a_400(served, raw, status, param, code):
    _refused(_post(served, "/chat/completions", raw=raw), status, param, code)


# ---------------------------------------------------------------------------------------- 7. the token
@pytest.mark.parametrize("value", ["Bearer jéton".encode("latin-1"), b"Bearer \xff\xfe", b"\xc3\xa9", None,
                                   b"Bearer wrong"])
def test_a_non_ascii_missing_or_wrong_token_is_401(served, value):
    headers = {} if value is None else {"Authorization": value}
    out = httpx.get(_url(served, "/models"), headers=headers, timeout=30)
    _refused(out, 401, None, "invalid_api_key")
    assert httpx.get(_url(served, "/models"), headers=AUTH, timeout=30).status_code == 200


def test_a_non_ascii_token_is_compared_as_bytes(tokenizer):
    endpoint = _endpoint(tokenizer)
    endpoint.settings.token = "jéton"
    assert endpoint.authorized({"authorization": "Bearer jéton"})
    assert not endpoint.authorized({"authorization": "Bearer jeton"})
    assert not endpoint.authorized({"authorization": "Bearer j\udcc3ton"})


# ------------------------------------------------------------------------------------------------ 8. ids
@pytest.mark.parametrize("header,body", [("a/b", None), (None, "a/b"), (None, ""), (None, "x" * 129),
                                         (None, "ep 1"), (None, "ep\n1"), (None, 7), ("é", None)])
def test_an_episode_id_outside_the_safe_alphabet_is_refused_before_it_is_opened(served, header, body):
    headers = {} if header is None else {"X-Episode-Id": header.encode("utf-8")}
    payload = CHAT if body is None else {**CHAT, "episode_id": body}
    _refused(_post(served, "/chat/completions", payload, headers=headers), 400, "episode_id")
    assert served.endpoint.recorder.open_episodes() == []


def test_ids_as_the_drivers_and_clients_make_them_pass_and_a_bad_group_name_is_refused(served):
    for value in (str(uuid.uuid4()), uuid.uuid4().hex, "verifiers-1a2b3c4d-17-0", "openenv-1a2b3c4d-3", "ep:1.2_x",
                  "x" * 128):
        assert door.identifier(value, "episode_id", "an episode id") == value
    _refused(_post(served, "/episodes/nobody/finish", {"reward": 1.0, "group": "a/b"}), 400, "group")
    _refused(_post(served, "/episodes/no%20body/finish", {"reward": 1.0}), 400, "episode_id")


# ------------------------------------------------------------------------- 9. a group that cannot be trained
def test_a_group_of_episodes_from_different_prompts_is_kept_as_rejected_and_the_finish_answers(tokenizer, tmp_path):
    from grpo_core.outside.endpoint.groups import EpisodeGroups
    from grpo_core.outside.endpoint.server import EndpointServer
    from grpo_core.pipeline.inbox import REJECTED, ready_items
    from grpo_core.run.storage import RunStore

    store = RunStore(str(tmp_path), "run")
    server = EndpointServer(_endpoint(tokenizer, sink=EpisodeGroups(store, 2))).start()
    try:
        plans = [_record_turn(server.endpoint, f"mixed-{i}", [{"role": "user", "content": f"{i} + 1?"}], [19, 2])
                 for i in range(2)]
        first = _post(server, "/episodes/mixed-0/finish", {"reward": 1.0, "group": "g-mixed"})
        last = _post(server, "/episodes/mixed-1/finish", {"reward": 0.0, "group": "g-mixed"})
    finally:
        server.stop()
    assert first.status_code == 200 and first.json()["group_rejected"] is None
    assert last.status_code == 200, last.text
    fate = last.json()["group_rejected"]
    assert last.json()["inbox_item"] is None
    assert (fate["row"], fate["field"], fate["episode_ids"]) == (1, "prompt_token_ids", ["mixed-0", "mixed-1"])
    assert "another prompt" in fate["error"] and fate["source"] == "policy endpoint"
    assert ready_items(store) == []  # nothing trained on, nothing lost:
    kept = pq.read_table(store.local_path(f"{REJECTED}/{fate['item']}.parquet")).to_pylist()
    assert [r["prompt_token_ids"] for r in kept] == [p.prompt_ids for p in plans]
    assert [r["reward"] for r in kept] == [1.0, 0.0] and [r["response_token_ids"] for r in kept] == [[19, 2]] * 2


def test_a_group_the_run_folder_cannot_take_stays_whole_and_the_finish_can_be_tried_again(tokenizer, tmp_path,
                                                                                          monkeypatch):
    """A storage fault while the completed group is written: the finish that completed it answers 503 (the episode
    open again, its group's other episodes kept), and the same finish tried again writes the whole group."""
    from grpo_core.outside.endpoint.groups import EpisodeGroups
    from grpo_core.outside.endpoint.server import EndpointServer
    from grpo_core.pipeline.inbox import ready_items
    from grpo_core.run.storage import RunStore, StorageError

    store = RunStore(str(tmp_path), "run")
    server = EndpointServer(_endpoint(tokenizer, sink=EpisodeGroups(store, 2))).start()
    put_bytes, faults = store.put_bytes, []

    def failing_once(rel_path, data):
        if not faults:
            faults.append(rel_path)
            raise StorageError(f"{rel_path}: the object store did not answer")
        return put_bytes(rel_path, data)

    try:
        for i in range(2):
            _record_turn(server.endpoint, f"kept-{i}", CHAT["messages"], [19 + i, 2])
        assert _post(server, "/episodes/kept-0/finish", {"reward": 1.0, "group": "g-kept"}).status_code == 200
        monkeypatch.setattr(store, "put_bytes", failing_once)
        refused = _post(server, "/episodes/kept-1/finish", {"reward": 0.0, "group": "g-kept"})
        error = refused.json()["error"]
        assert (refused.status_code, error["code"], error["type"]) == (503, "storage_unavailable", "server_error")
        assert "did not answer" in error["message"] and "finish it again" in error["message"], error
        assert server.endpoint.recorder.open_episodes() == ["kept-1"] and ready_items(store) == []
        again = _post(server, "/episodes/kept-1/finish", {"reward": 0.0, "group": "g-kept"})
    finally:
        server.stop()
    assert again.status_code == 200, again.text
    item = again.json()["inbox_item"]
    assert faults and ready_items(store) == [item]
    rows = pq.read_table(store.local_path(f"inbox/{item}.parquet")).to_pylist()
    assert [(r["episode_id"], r["reward"]) for r in rows] == [("kept-0", 1.0), ("kept-1", 0.0)]


# --------------------------------------------------------------------------------------------- 10. /health
def test_health_answers_while_every_worker_thread_waits_on_a_closed_gate(tokenizer):
    """60 calls wait (up to 6 s each) for a weight update: more than the worker threads (40); /health is not one of
    them. Queued behind them it would answer after 5 s at least; the bound, 3 s, leaves room for a loaded machine
    (1.6 s seen with the other test worker busy)."""
    from grpo_core.outside.endpoint.server import EndpointServer

    server = EndpointServer(_endpoint(tokenizer)).start()
    server.endpoint.settings.wait_s = 6.0
    server.endpoint.gate.close("a weight update")
    try:
        with ThreadPoolExecutor(60) as pool:
            waiting = [pool.submit(_post, server, "/completions", {"prompt": "1 + 1 =", "max_tokens": 2})
                       for _ in range(60)]
            time.sleep(1.0)  # all 60 sent; the thread pool's 40 are taken
            started = time.perf_counter()
            health = httpx.get(_url(server, "/health"), timeout=30)
            took = time.perf_counter() - started
            codes = [w.result().status_code for w in waiting]
    finally:
        server.stop()
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert took < 3.0, f"/health took {took:.2f} s behind the waiting calls"
    assert codes == [503] * 60  # they waited the update out and were refused with Retry-After


# ---------------------------------------------------------------------------------------- 11. endpoint.json
def test_the_endpoint_file_is_never_readable_by_others_while_it_is_written(tmp_path):
    """A watcher stats every entry of the run folder in a tight loop while the file is written 300 times (its
    temporary name included), with umask 0: a file ever created more open than 0600 would be seen."""
    from grpo_core.outside.endpoint.owner_file import write_owner_only
    from grpo_core.run.storage import RunStore

    store = RunStore(str(tmp_path), "run")
    folder = os.path.dirname(store.local_path("endpoint.json"))
    os.makedirs(folder, exist_ok=True)
    seen, open_to_others, done = [0], [], threading.Event()

    def watch():
        while not done.is_set():
            for entry in os.scandir(folder):
                try:
                    mode = entry.stat(follow_symlinks=False).st_mode
                except FileNotFoundError:
                    continue  # renamed away meanwhile
                seen[0] += 1
                if stat.S_IMODE(mode) & 0o077:
                    open_to_others.append((entry.name, oct(stat.S_IMODE(mode))))

    watcher = threading.Thread(target=watch)
    old_umask = os.umask(0)
    watcher.start()
    try:
        for i in range(300):
            write_owner_only(store, "endpoint.json", json.dumps({"token": f"secret-{i}"}).encode())
    finally:
        done.set()
        watcher.join()
        os.umask(old_umask)
    assert open_to_others == [] and seen[0] > 0
    assert stat.S_IMODE(os.stat(store.local_path("endpoint.json")).st_mode) == 0o600
    assert json.loads(store.get_bytes("endpoint.json")) == {"token": "secret-299"}
    assert sorted(os.listdir(folder)) == ["endpoint.json"]  # no temporary file left behind


# ------------------------------------------------------------------------------------- 12. Atropos pulls
def _atropos_group(ledger, scores=(1.0, 0.0)) -> dict:
    from grpo_core.outside.atropos.groups import MASKED

    prompt, seqs = [1, 2, 3], []
    for i in range(2):
        answer = [10 + i, 11 + i, 12]
        logprobs = [-0.1 * (k + 1) for k in range(3)]
        ledger.record(prompt, answer, logprobs, "stop", 3)
        seqs.append((prompt + answer, [MASKED] * 3 + answer, [1.0] * 3 + logprobs))
    return {"tokens": [s[0] for s in seqs], "masks": [s[1] for s in seqs], "scores": list(scores),
            "inference_logprobs": [s[2] for s in seqs], "overrides": None, "group_overrides": {}}


def _deep(levels: int):
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("change,sequence,field,words", [
    (lambda g: g["scores"].__setitem__(0, 1e308), 0, "scores", "outside"),  # the finding's reward, as a score
    (lambda g: g["scores"].__setitem__(1, 10**400), 1, "scores", "digits"),  # float() of it would raise
    (lambda g: g["scores"].__setitem__(1, -1e7), 1, "scores", "outside"),
    (lambda g: g["scores"].__setitem__(0, math.inf), 0, "scores", "not a finite number"),
    (lambda g: g["inference_logprobs"][0].__setitem__(4, math.nan), 0, "inference_logprobs", "sampled that token"),
    (lambda g: g["inference_logprobs"][1].__setitem__(3, 10**400), 1, "inference_logprobs", "sampled that token"),
    (lambda g: g["inference_logprobs"][1].__setitem__(3, True), 1, "inference_logprobs", "sampled that token"),
    (lambda g: [g[k][0].extend(g[k][0][-1:] * 60) for k in ("tokens", "masks")], 0, "tokens", "at most 64"),
    (lambda g: g.__setitem__("overrides", [{"x": _deep(40)}, {}]), None, "overrides", "deeper than"),
    (lambda g: g.__setitem__("overrides", [{"t": math.nan}, {}]), None, "overrides", "finite"),
    (lambda g: g.__setitem__("group_overrides", {"s": "\ud800"}), None, "group_overrides", "surrogate"),
    (lambda g: g.__setitem__("messages", _deep(5000)), None, "messages", "deeper than"),
])
def test_an_atropos_group_with_an_unbounded_or_unreadable_value_is_refused_with_its_reason(change, sequence, field,
                                                                                         words):
    from grpo_core.outside.atropos.groups import GroupLimits, GroupRefused, group_rows
    from grpo_core.outside.endpoint.ledger import SampledLedger

    ledger = SampledLedger()
    group = _atropos_group(ledger)
    change(group)
    with pytest.raises(GroupRefused) as refused:
        group_rows(group, GroupLimits(group_size=2, vocab_size=100, max_sequence_len=64), ledger, str)
    assert (refused.value.sequence, refused.value.field) == (sequence, field)
    assert words in refused.value.reason


def test_scores_at_the_bound_are_taken():
    from grpo_core.outside.atropos.groups import GroupLimits, group_rows
    from grpo_core.outside.endpoint.ledger import SampledLedger

    ledger = SampledLedger()
    table = group_rows(_atropos_group(ledger, scores=(1e6, -10**6)), GroupLimits(2, 100), ledger, str)
    assert table.column("reward").to_pylist() == [1e6, -1e6]


class _BrokenBatches(BaseHTTPRequestHandler):
    """An API server's replies as a hostile environment could make them: a /batch too deep to parse, then a
    usable group."""
    replies: list[bytes] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        body = self.replies.pop(0) if self.path == "/batch" and self.replies else b'{"batch": null}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_batch_that_cannot_be_read_is_refused_and_the_pulls_go_on(tmp_path):
    from grpo_core.outside.atropos.client import AtroposClient, Registration
    from grpo_core.outside.atropos.groups import GroupLimits
    from grpo_core.outside.atropos.source import AtroposSource
    from grpo_core.outside.endpoint.ledger import SampledLedger
    from grpo_core.outside.source import Supervisor

    ledger = SampledLedger()
    good = _atropos_group(ledger)
    _BrokenBatches.replies = [b'{"batch": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                              json.dumps({"batch": [good]}).encode()]
    http = ThreadingHTTPServer(("127.0.0.1", 0), _BrokenBatches)
    threading.Thread(target=http.serve_forever, daemon=True).start()

    class Sink:  # the inbox's side of a pull, kept in memory
        def __init__(self):
            self.tables, self.refusals = [], []

        def accepted(self, table):
            self.tables.append(table)

        def refused(self, group, error):
            self.refusals.append((group, error))

    sink = Sink()
    source = AtroposSource(client=AtroposClient(f"http://127.0.0.1:{http.server_address[1]}"),
                           registration=Registration("t", "grpo", 2, 64, str(tmp_path), -1, 0, 10),
                           limits=GroupLimits(2, 100), ledger=ledger, decode=str, api=None,
                           envs=Supervisor([], 0), wait_s=30.0, api_timeout_s=5.0, poll_s=0.01)
    try:
        assert source.limits.max_sequence_len == 64  # the registered context bounds every sequence
        stats = source.fill(1, sink, lambda table: None, lambda: len(sink.tables))
    finally:
        source.client.close()
        http.shutdown()
    assert (stats.groups, stats.refused) == (1, 1)
    text, error = sink.refusals[0]
    assert text.startswith('{"batch": [[[') and "nested deeper" in error.reason
    assert sink.tables[0].num_rows == 2


def test_the_closing_summary_names_the_episodes_a_dead_client_left_open(tokenizer, capsys):
    """A client that died mid-episode never finishes nor discards it: the run's closing line names it (and says
    none when there is none), so a lost episode is never silent."""
    from grpo_core.outside.endpoint.server import EndpointServer
    from tasks.endpoint import close_endpoint

    server = EndpointServer(_endpoint(tokenizer)).start()
    _record_turn(server.endpoint, "dead-client-1", CHAT["messages"], [5, 6])
    _record_turn(server.endpoint, "dead-client-2", CHAT["messages"], [7])
    close_endpoint(server)
    line = capsys.readouterr().out
    assert "2 episode(s) left open by their clients, not trained on: dead-client-1, dead-client-2" in line
    quiet = EndpointServer(_endpoint(tokenizer)).start()
    close_endpoint(quiet)
    assert "no episode left open" in capsys.readouterr().out
