"""The policy endpoint (grpo_core/outside/endpoint/): an OpenAI SDK client's two-turn conversation becomes one training row
whose trained tokens are the sampled ones; bad input on every route gets an OpenAI-style error; a closed gate
waits for the update, then refuses."""
from __future__ import annotations

import json

import httpx
import pytest

pytestmark = pytest.mark.slow

TOKEN = "test-token"


@pytest.fixture(scope="module")
def served(tiny_model, tmp_path_factory):
    """The endpoint in front of a `grpo serve` process (the external placement's engine; its own process, so the
    test process holds no vLLM engine)."""
    from transformers import AutoTokenizer

    from grpo_core.outside.endpoint.policy import EnginePolicy
    from grpo_core.outside.endpoint.recorder import EpisodeRecorder
    from grpo_core.outside.endpoint.server import EndpointServer, EndpointSettings, PolicyEndpoint
    from grpo_core.engine.rollout.server import ServerSampler
    from tests.vllm_server import Server

    process = Server(tiny_model, tmp_path_factory.mktemp("serve") / "serve.log",
                     extra=["--kv-cache-mb", "64", "--max-model-len", "256"])
    process.wait_ready()
    engine = ServerSampler(process.url, tag="endpoint-test")
    engine.serve_base(0)  # serves version 0 of this "run" (as a run's first sync does)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    endpoint = PolicyEndpoint(EnginePolicy(engine, max_model_len=256), EpisodeRecorder(tokenizer),
                              EndpointSettings(model_name="tiny", max_tokens=12, token=TOKEN, wait_s=0.3))
    server = EndpointServer(endpoint).start()
    try:
        yield server, engine, tokenizer
    finally:
        server.stop()
        process.stop()


def test_a_two_turn_conversation_from_the_openai_sdk_is_one_row_of_the_sampled_tokens(served):
    from openai import OpenAI

    from grpo_core.outside.endpoint.policy import episode_rows
    from grpo_core.pipeline.inbox import validate

    server, engine, tokenizer = served
    client = OpenAI(base_url=server.url, api_key=TOKEN)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    messages = [{"role": "user", "content": "What is 12 + 30?"}]
    first = client.chat.completions.create(model="tiny", messages=messages, temperature=1.0, seed=3, logprobs=True,
                                           extra_headers={"X-Episode-Id": "ep-1"})
    one = first.choices[0]
    messages += [{"role": "assistant", "content": one.message.content},
                 {"role": "user", "content": "Check it and answer again."}]
    second = client.chat.completions.create(model="tiny", messages=messages, seed=4,
                                            extra_body={"episode_id": "ep-1"})
    two = second.choices[0]
    first_ids, second_ids = one.model_extra["token_ids"], two.model_extra["token_ids"]
    assert first_ids and second_ids and first.model_extra["policy_version"] == 0
    assert [c.logprob for c in one.logprobs.content] == pytest.approx(
        [lp for lp in served[1].score_tokens([first.model_extra["prompt_token_ids"] + first_ids],
                                             [len(first.model_extra["prompt_token_ids"])])[0]], abs=1e-3)
    # the second prompt continues the first with the tokens sampled, not the answer's text encoded again
    prompt_1, prompt_2 = first.model_extra["prompt_token_ids"], second.model_extra["prompt_token_ids"]
    assert prompt_2[:len(prompt_1) + len(first_ids)] == prompt_1 + first_ids

    done = httpx.post(f"{server.url}/episodes/ep-1/finish", json={"reward": 1.0},
                      headers={"Authorization": f"Bearer {TOKEN}"})
    assert done.status_code == 200, done.text
    assert done.json()["turns"] == 2 and done.json()["policy_tokens"] == len(first_ids) + len(second_ids)
    finished = server.endpoint.finished[-1]
    table = validate(episode_rows([[finished]]), "ep-1", group_size=1)
    row = table.to_pylist()[0]
    response, mask = row["response_token_ids"], row["response_mask"]
    assert row["prompt_token_ids"] == prompt_1 and row["reward"] == 1.0
    assert prompt_1 + response[:len(prompt_2) - len(prompt_1)] == prompt_2  # the row is the conversation's tokens
    trained = [t for t, m in zip(response, mask) if m]
    assert trained == first_ids + second_ids  # what the learner trains on is what the sampler drew
    policy_logprobs = [lp for lp, m in zip(row["sampler_logprobs"], mask) if m]
    assert len(policy_logprobs) == len(trained) and all(lp <= 0.0 for lp in policy_logprobs)
    stats = server.endpoint.recorder.stats
    assert stats.later_turns >= 1 and stats.retokenized_differs <= stats.later_turns


def test_atropos_generate_route_gives_tokens_and_logprobs_as_its_vllm_server_type_reads_them(served):
    """atroposlib's ``server_type: vllm`` posts to ``<base without /v1>/generate`` and reads
    ``logprobs[sample][position][0] = {"<token id>": logprob}`` and ``finish_reasons``."""
    server, engine, tokenizer = served
    prompt = tokenizer.encode("What is 2 + 5?")
    out = httpx.post(server.url.removesuffix("/v1") + "/generate",
                     json={"prompt": {"prompt_token_ids": prompt}, "logprobs": 0, "n": 2, "max_tokens": 8,
                           "temperature": 1.0, "seed": 5}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert out.status_code == 200, out.text
    doc = out.json()
    ids = [[int(next(iter(item[0]))) for item in sample] for sample in doc["logprobs"]]  # as atroposlib parses it
    logprobs = [[next(iter(item[0].values())) for item in sample] for sample in doc["logprobs"]]
    assert ids == doc["token_ids"] and len(ids) == 2 and all(ids) and len(doc["finish_reasons"]) == 2
    assert logprobs[0] == pytest.approx(engine.score_tokens([prompt + ids[0]], [len(prompt)])[0], abs=1e-3)
    assert doc["prompt_token_ids"] == prompt and doc["policy_version"] == 0


def _post(server, path: str, body, token: str | None = TOKEN, raw: bool = False) -> httpx.Response:
    url = (server.url.removesuffix("/v1") if path == "/generate" else server.url) + path  # /generate is at the root
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if raw:
        return httpx.post(url, content=body, headers={**headers, "Content-Type": "application/json"})
    return httpx.post(url, json=body, headers=headers)


@pytest.mark.parametrize("path,body,status,param,code", [
    ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, 401, None, "invalid_api_key"),
    ("/chat/completions", b"{not json", 400, None, "invalid_json"),
    ("/chat/completions", [1, 2], 400, None, "invalid_request"),
    ("/chat/completions", {}, 400, "messages", "invalid_request"),
    ("/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role",
     "invalid_request"),
    ("/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages[0].content", "invalid_request"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 0}, 400, "n", "invalid_request"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, 400,
     "temperature", "invalid_request"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": True}, 400, "stream",
     "unsupported_parameter"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "x"}], "model": "gpt-9"}, 404, "model",
     "model_not_found"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "x" * 2000}]}, 400, "messages",
     "context_length_exceeded"),
    ("/completions", {"prompt": [1, 2, 10**9]}, 400, "prompt", "invalid_request"),
    ("/completions", {"prompt": 42}, 400, "prompt", "invalid_request"),
    ("/completions", {"prompt": "a", "stop": ["\n"]}, 400, "stop", "unsupported_parameter"),
    ("/completions", {"prompt": "a", "max_tokens": 0}, 400, "max_tokens", "invalid_request"),
    ("/episodes/nobody/finish", {"reward": 1.0}, 404, "episode_id", "unknown_episode"),
    ("/nowhere", {}, 404, None, "not_found"),
    ("/generate", {"prompt": "text"}, 400, "prompt", "invalid_request"),
    # garbage on every route
    ("/completions", b"\xff\xfe{", 400, None, "invalid_json"),
    ("/completions", {"prompt": [1, -3]}, 400, "prompt", "invalid_request"),
    ("/generate", b"{", 400, None, "invalid_json"),
    ("/generate", "a string", 400, None, "invalid_request"),
    ("/generate", {"prompt": {"prompt_token_ids": [1, 10**9]}}, 400, "prompt", "invalid_request"),
    ("/generate", {"prompt": {"prompt_token_ids": [1]}, "n": "many"}, 400, "n", "invalid_request"),
    ("/generate", {"prompt": {"prompt_token_ids": [1]}, "max_tokens": -1}, 400, "max_tokens", "invalid_request"),
    ("/episodes/nobody/finish", b"[", 400, None, "invalid_json"),
    ("/episodes/nobody/finish", {"reward": "NaN"}, 400, "reward", "invalid_request"),
    ("/episodes/nobody/finish", {"reward": 1.0, "group": 7}, 400, "group", "invalid_request"),
])
def test_bad_requests_get_openai_style_errors(served, path, body, status, param, code):
    server = served[0]
    token = None if code == "invalid_api_key" else TOKEN
    out = _post(server, path, body, token=token, raw=isinstance(body, bytes))
    assert out.status_code == status, out.text
    error = out.json()["error"]
    assert error["code"] == code and error["param"] == param and error["message"]
    assert error["type"] == "invalid_request_error"


def test_an_episode_must_continue_its_history_and_a_reward_must_be_a_number(served):
    server = served[0]
    first = _post(server, "/chat/completions", {"messages": [{"role": "user", "content": "1 + 1?"}],
                                               "episode_id": "ep-2", "max_tokens": 4})
    assert first.status_code == 200, first.text
    rewritten = _post(server, "/chat/completions", {
        "messages": [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "edited"},
                     {"role": "user", "content": "sure?"}], "episode_id": "ep-2"})
    assert rewritten.status_code == 400 and rewritten.json()["error"]["code"] == "episode_history_mismatch"
    assert rewritten.json()["error"]["param"] == "messages[1]"
    two = _post(server, "/chat/completions", {"messages": [{"role": "user", "content": "x"}], "episode_id": "ep-3",
                                              "n": 2})
    assert two.status_code == 400 and two.json()["error"]["param"] == "n"
    for bad in ("x", float("nan"), True):
        out = httpx.post(f"{server.url}/episodes/ep-2/finish", content=json.dumps({"reward": bad}),
                         headers={"Authorization": f"Bearer {TOKEN}"})
        assert out.status_code == 400 and out.json()["error"]["param"] == "reward", out.text
    assert "ep-2" in server.endpoint.recorder.open_episodes()  # a refused finish leaves the episode open


def test_a_closed_gate_waits_for_the_update_then_refuses_and_a_stopping_run_refuses_at_once(served):
    import threading

    from grpo_core.outside.endpoint.recorder import RequestError
    from grpo_core.outside.endpoint.server import PolicyGate

    server = served[0]
    body = {"prompt": "1 + 1 =", "max_tokens": 2}
    gate, settings = server.endpoint.gate, server.endpoint.settings
    gate.close("sync to version 1")
    try:
        out = _post(server, "/completions", body)  # never reopened within wait_s
        assert out.status_code == 503 and out.json()["error"]["code"] == "policy_updating"
        assert out.headers["Retry-After"] == "1" and "sync to version 1" in out.json()["error"]["message"]
        settings.wait_s = 60.0
        threading.Timer(0.5, gate.reopen).start()  # the update ends while the call waits
        assert _post(server, "/completions", body).status_code == 200
    finally:
        settings.wait_s = 0.3
        gate.reopen()
    stopping = PolicyGate()
    stopping.stop("the run finished")
    with pytest.raises(RequestError, match="the run is stopping") as refused:
        stopping.wait(60.0)
    assert refused.value.status == 503 and refused.value.code == "run_stopping"


def test_an_episode_given_up_is_discarded_not_left_open(served):
    """A failed rollout's client drops its episode (DELETE /v1/episodes/<id>): it is no longer open, cannot be
    finished, and a second discard is refused as unknown."""
    server, _, _ = served
    auth = {"Authorization": f"Bearer {TOKEN}"}
    answer = httpx.post(f"{server.url}/chat/completions", headers={**auth, "X-Episode-Id": "gone-1"},
                        json={"messages": [{"role": "user", "content": "What is 2 + 2?"}]}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert "gone-1" in server.endpoint.recorder.open_episodes()
    dropped = httpx.delete(f"{server.url}/episodes/gone-1", headers=auth, timeout=30)
    assert dropped.status_code == 200 and dropped.json() == {"episode_id": "gone-1", "discarded": True, "turns": 1}
    assert "gone-1" not in server.endpoint.recorder.open_episodes()
    assert server.endpoint.recorder.stats.discarded >= 1
    again = httpx.delete(f"{server.url}/episodes/gone-1", headers=auth, timeout=30)
    assert again.status_code == 404 and again.json()["error"]["code"] == "unknown_episode"
    finish = httpx.post(f"{server.url}/episodes/gone-1/finish", headers=auth, json={"reward": 1.0}, timeout=30)
    assert finish.status_code == 404
    assert httpx.delete(f"{server.url}/episodes/gone-1", timeout=30).status_code == 401  # the token, as everywhere


def test_an_episode_takes_one_call_at_a_time(served):
    """Two calls on one episode at once, or one planned before the other's answer was recorded, would fork the
    episode the learner trains on: the second is refused (409)."""
    from grpo_core.outside.endpoint.recorder import RequestError
    from grpo_core.engine.rollout.sampler import Sample

    recorder = served[0].endpoint.recorder
    messages = [{"role": "user", "content": "1 + 2?"}]
    first, twin = recorder.plan_chat(messages, "ep-busy"), recorder.plan_chat(messages, "ep-busy")
    with recorder.turn(first):
        with pytest.raises(RequestError, match="another call in flight") as busy:
            with recorder.turn(twin):
                pass
        recorder.record(first, Sample(token_ids=[5, 6], logprobs=[-0.1, -0.2], text="x", finish_reason="length"), 0)
    assert busy.value.status == 409 and busy.value.code == "episode_busy"
    with pytest.raises(RequestError, match="another call in flight"):
        with recorder.turn(twin):  # planned before the first answer was recorded
            pass
    with recorder.turn(recorder.plan_chat(messages + [{"role": "assistant", "content": "x"},
                                                      {"role": "user", "content": "sure?"}], "ep-busy")):
        pass  # planned on the recorded state: goes through


def test_seeds_up_to_64_bits_are_sampled_by_vllm_and_one_beyond_is_refused_at_the_door(served):
    """Issue 53: a seed above 64 bits reached vLLM (503, samplers left unusable). The door's range is what vLLM
    samples with; a refused seed leaves the policy serving."""
    server = served[0]
    chat = {"messages": [{"role": "user", "content": "1 + 2?"}], "max_tokens": 3}
    top = _post(server, "/chat/completions", {**chat, "seed": 2**63 - 1})
    assert top.status_code == 200, top.text
    beyond = _post(server, "/chat/completions", {**chat, "seed": 1180591620717411303424})
    assert beyond.status_code == 400 and beyond.json()["error"]["param"] == "seed", beyond.text
    again = _post(server, "/chat/completions", {**chat, "seed": 2**63 - 1})
    assert again.status_code == 200 and again.json()["choices"][0]["token_ids"] == top.json()["choices"][0]["token_ids"]


def test_a_turn_one_token_short_of_the_context_gets_one_token_and_one_at_the_context_is_refused(served):
    """Issue 53: a multi-turn episode whose next prompt reached exactly the context must be refused at the door,
    not by vLLM; one token short, the answer is clamped to that token, and vLLM takes it."""
    server, _, _ = served
    recorder, context = server.endpoint.recorder, server.endpoint.policy.max_model_len
    messages = [{"role": "user", "content": "What is 12 + 30?"}]
    first = _post(server, "/chat/completions", {"messages": messages, "episode_id": "ep-room", "max_tokens": 8})
    assert first.status_code == 200, first.text
    messages = messages + [{"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]}]

    def next_turn(tokens: int) -> list[dict]:
        for size in range(context):
            trial = messages + [{"role": "user", "content": "x" * size}]
            if len(recorder.plan_chat(trial, "ep-room").prompt_ids) == tokens:
                return trial
        raise AssertionError(f"no next turn of {tokens} tokens")

    full = _post(server, "/chat/completions", {"messages": next_turn(context), "episode_id": "ep-room"})
    assert full.status_code == 400 and full.json()["error"]["code"] == "context_length_exceeded", full.text
    last = _post(server, "/chat/completions", {"messages": next_turn(context - 1), "episode_id": "ep-room",
                                               "max_tokens": 50})
    assert last.status_code == 200, last.text
    assert last.json()["usage"]["prompt_tokens"] == context - 1 and last.json()["usage"]["completion_tokens"] == 1
    for ids, status in (([19] * (context - 1), 200), ([19] * context, 400)):
        out = _post(server, "/completions", {"prompt": ids, "max_tokens": 4})
        assert out.status_code == status, out.text
