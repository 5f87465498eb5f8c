"""The Tinker-compatible training service driven by the official ``tinker`` SDK, the server a ``grpo tinker serve``
process on the tiny model: each primitive against the same computation done here with transformers and peft
(logprobs, the summed loss, the weights after AdamW), LoRA and full fine-tuning, two clients kept apart, a checkpoint
restored bit for bit after the server was SIGKILLed, and bad requests refused naming the field."""
from __future__ import annotations

import json
import math
import os
import signal

import pytest
import tinker
import torch
from tinker import types

from tests.tinker_server import start_service

PROMPT = "What is 12 + 3?"
LR = 5e-3


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("tinker")
    proc = start_service(tiny_model, root)
    info = json.loads((root / "service.json").read_text())
    os.environ["TINKER_API_KEY"] = info["api_key"]
    os.environ["TINKER_TELEMETRY"] = "0"
    yield {"proc": proc, "root": root, "url": info["url"], "model": tiny_model}
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


@pytest.fixture(scope="module")
def client(server):
    with tinker.ServiceClient(base_url=server["url"]) as service_client:
        yield service_client


def _tokenizer(model: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def _datums(model: str, weighted: bool = True) -> tuple[list[types.Datum], list[list[int]]]:
    tok = _tokenizer(model)
    texts = [PROMPT, "What is 40 + 7? 47"]
    datums, sequences = [], []
    for k, text in enumerate(texts):
        ids = tok.encode(text)
        inputs = {"target_tokens": ids[1:]}
        if weighted:
            inputs["weights"] = [0.5 + 0.25 * ((i + k) % 3) for i in range(len(ids) - 1)]
        datums.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs=inputs))
        sequences.append(ids)
    return datums, sequences


def _reference(model: str, rank: int, seed: int):
    """The same model built here, independently: transformers + peft with the seed the client asked for."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
        if rank:
            net = get_peft_model(net, LoraConfig(r=rank, lora_alpha=32.0, lora_dropout=0.0, bias="none",
                                                 task_type="CAUSAL_LM",
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                 "up_proj", "down_proj"]))
    return net


def _logprobs(net, ids: list[int]) -> torch.Tensor:
    """log p(ids[i+1] | ids[:i+1]), one sequence at a time (no padding)."""
    x = torch.tensor([ids])
    logits = net(input_ids=x).logits.float()[0, :-1]
    return torch.log_softmax(logits, -1).gather(-1, x[0, 1:].unsqueeze(-1)).squeeze(-1)


def _values(tensor_data) -> list[float]:
    return [float(v) for v in tensor_data.tolist()]


@pytest.mark.parametrize("rank", [8, 0], ids=["lora", "full"])
def test_forward_backward_and_optim_step_equal_the_same_computation_done_directly(client, server, rank):
    datums, sequences = _datums(server["model"])
    trainer = client.create_lora_training_client(base_model=server["model"], rank=rank, seed=11).result()
    assert trainer.get_info().is_lora == (rank > 0)
    out = trainer.forward_backward(datums, "cross_entropy").result()
    net = _reference(server["model"], rank, seed=11)
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    total = 0.0
    for datum, ids, output in zip(datums, sequences, out.loss_fn_outputs):
        t = _logprobs(net, ids)
        assert _values(output["logprobs"]) == pytest.approx(t.tolist(), abs=2e-5)
        w = torch.tensor(datum.loss_fn_inputs["weights"].tolist())
        loss = -(t * w).sum()
        loss.backward()
        total += loss.item()
    assert out.metrics["loss:sum"] == pytest.approx(total, rel=1e-5)

    step = trainer.optim_step(types.AdamParams(learning_rate=LR, beta1=0.9, beta2=0.95, eps=1e-8,
                                               weight_decay=0.01)).result()
    optimizer.step()
    assert step.metrics["grad_norm"] > 0
    after = trainer.forward(datums, "cross_entropy").result()
    for ids, output in zip(sequences, after.loss_fn_outputs):
        with torch.no_grad():
            expected = _logprobs(net, ids).tolist()
        # Adam's first step divides each gradient by its own size, so a parameter whose gradient is near zero moves by
        # an amount set by the gradient's last bits, which the summation order (one batch there, a sequence at a time
        # here) and the CPU's vector width change: on 2 EPYC cores (AVX2) logprobs near -12.5 differed by 1.4e-4
        # (1.1e-5 relative) where an AVX-512 Xeon stayed within 5e-5. The step itself moves them by more than 1e-3.
        assert _values(output["logprobs"]) == pytest.approx(expected, rel=3e-5, abs=5e-5)
    moved = max(abs(a - b) for a, b in zip(_values(after.loss_fn_outputs[0]["logprobs"]),
                                           _values(out.loss_fn_outputs[0]["logprobs"])))
    assert moved > 1e-3  # the step changed the model, and the comparison above saw it


def test_importance_sampling_sums_minus_ratio_times_advantage(client, server):
    tok = _tokenizer(server["model"])
    ids = tok.encode(PROMPT)
    n = len(ids) - 1
    sampler_logprobs = [-1.0 - 0.1 * i for i in range(n)]
    advantages = [0.0] * 3 + [1.5, -0.5] * ((n - 3) // 2) + [1.0] * ((n - 3) % 2)
    datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                        loss_fn_inputs={"target_tokens": ids[1:], "logprobs": sampler_logprobs,
                                        "advantages": advantages})
    trainer = client.create_lora_training_client(base_model=server["model"], rank=8, seed=3).result()
    out = trainer.forward([datum], "importance_sampling").result()
    with torch.no_grad():
        t = _logprobs(_reference(server["model"], 8, 3), ids).tolist()
    expected = -sum(math.exp(ti - si) * a for ti, si, a in zip(t, sampler_logprobs, advantages))
    assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4)


def test_custom_loss_and_a_second_client_are_kept_apart(client, server):
    """forward_backward_custom (the SDK's forward + weighted cross_entropy) with -sum(logprobs * w) reaches the same
    weights as plain cross_entropy, on another client of the same server."""
    datums, sequences = _datums(server["model"])
    plain = client.create_lora_training_client(base_model=server["model"], rank=8, seed=5).result()
    custom = client.create_lora_training_client(base_model=server["model"], rank=8, seed=5).result()

    def loss_fn(data, logprobs_list):
        loss = sum(-(lp * torch.tensor(d.loss_fn_inputs["weights"].tolist())).sum()
                   for d, lp in zip(data, logprobs_list))
        return loss, {"custom": loss.item()}

    a = plain.forward_backward(datums, "cross_entropy").result()
    b = custom.forward_backward_custom(datums, loss_fn).result()
    assert b.metrics["loss:sum"] == pytest.approx(a.metrics["loss:sum"], rel=1e-5)
    adam = types.AdamParams(learning_rate=LR)
    plain.optim_step(adam).result()
    custom.optim_step(adam).result()
    after_a = plain.forward(datums, "cross_entropy").result().loss_fn_outputs
    after_b = custom.forward(datums, "cross_entropy").result().loss_fn_outputs
    for x, y in zip(after_a, after_b):
        assert _values(x["logprobs"]) == pytest.approx(_values(y["logprobs"]), abs=1e-5)
    # a third client on the same server saw none of it: its logprobs are the base model's
    fresh = client.create_lora_training_client(base_model=server["model"], rank=8, seed=5).result()
    base = fresh.forward(datums, "cross_entropy").result().loss_fn_outputs
    with torch.no_grad():
        expected = _logprobs(_reference(server["model"], 0, 0), sequences[0]).tolist()
    assert _values(base[0]["logprobs"]) == pytest.approx(expected, abs=2e-5)
    assert _values(after_a[0]["logprobs"]) != pytest.approx(expected, abs=1e-3)


@pytest.mark.filterwarnings("ignore:DEPRECATED. TrainingClient.load_state:FutureWarning")  # still served: the route
def test_each_step_is_a_row_of_the_clients_run_in_tensorboard_and_a_loaded_state_goes_on_from_its_step(client,
                                                                                                         server):
    """One row per optim_step at the client's step count, with what the forward_backward calls since the previous
    step added up to (a forward adds nothing); after load_state_with_optimizer of step 1, the next step is step 2
    again and its row replaces the earlier step 2's."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    datums, _ = _datums(server["model"])
    trainer = client.create_lora_training_client(base_model=server["model"], rank=8, seed=3).result()
    adam = types.AdamParams(learning_rate=LR)
    first = [trainer.forward_backward(datums, "cross_entropy").result() for _ in range(2)]
    trainer.forward(datums, "cross_entropy").result()
    trainer.optim_step(adam).result()
    path = trainer.save_state("one").result().path
    trainer.forward_backward(datums, "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=LR * 10)).result()  # the timeline the load goes back on
    trainer.load_state_with_optimizer(path).result()
    again = trainer.forward_backward(datums, "cross_entropy").result()
    step = trainer.optim_step(adam).result()

    model_id = path[len("tinker://"):].split("/")[0]
    events = EventAccumulator(str(server["root"] / model_id.replace(":", ".") / "tensorboard"))
    events.Reload()

    def curve(tag: str) -> dict[int, float]:
        return {e.step: e.value for e in events.Scalars(tag)}

    assert curve("loss_sum") == {1: pytest.approx(sum(r.metrics["loss:sum"] for r in first), rel=1e-6),
                                 2: pytest.approx(again.metrics["loss:sum"], rel=1e-6)}
    assert curve("forward_backward_calls") == {1: 2.0, 2: 1.0}
    assert curve("datums") == {1: 2.0 * len(datums), 2: 1.0 * len(datums)}
    assert curve("tokens")[2] == sum(len(d.loss_fn_inputs["target_tokens"].tolist()) for d in datums)
    assert curve("learning_rate") == {1: pytest.approx(LR), 2: pytest.approx(LR)}  # step 2 at 10x is gone
    assert curve("grad_norm")[2] == pytest.approx(step.metrics["grad_norm"], rel=1e-6)


@pytest.mark.filterwarnings("ignore:DEPRECATED. TrainingClient.load_state:FutureWarning")
def test_checkpoints_are_listed_described_and_deleted_through_the_sdks_rest_client(client, server):
    """The RestClient's routes: a client's training and sampler checkpoints listed oldest first with their paths and
    sizes (and every run's, the newest first), each described (its base model and what it trains), its run described,
    a checkpoint deleted (gone from the list, and a load_state of it refused); deleting one
    a sampling session reads, or one that does not exist, refused naming the field."""
    datums, _ = _datums(server["model"])
    trainer = client.create_lora_training_client(base_model=server["model"], rank=8, seed=4).result()
    trainer.forward_backward(datums, "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=LR)).result()
    state = trainer.save_state("a").result().path
    sampled = trainer.save_weights_for_sampler("s").result().path
    model_id = state[len("tinker://"):].split("/")[0]
    rest = tinker.RestClient(base_url=server["url"])

    listed = rest.list_checkpoints(model_id).result().checkpoints
    assert [(c.checkpoint_id, c.checkpoint_type, c.tinker_path) for c in listed] == [
        ("weights/a", "training", state), ("sampler_weights/s", "sampler", sampled)]
    assert all(c.size_bytes > 0 for c in listed)
    everyone = rest.list_user_checkpoints(limit=1000).result()  # every run's, the newest first
    mine = [c.tinker_path for c in everyone.checkpoints if c.tinker_path.startswith(f"tinker://{model_id}/")]
    assert mine == [sampled, state] and everyone.cursor.total_count == len(everyone.checkpoints)
    assert [c.tinker_path for c in rest.list_user_checkpoints(limit=1, offset=1).result().checkpoints] == \
        [everyone.checkpoints[1].tinker_path]
    for path in (state, sampled):  # what a client made from either trains
        info = rest.get_weights_info_by_tinker_path(path).result()
        assert (info.base_model, info.is_lora, info.lora_rank) == (server["model"], True, 8), path
        assert (info.train_attn, info.train_mlp, info.train_unembed) == (True, True, False), path
    run = rest.get_training_run(model_id).result()
    assert (run.training_run_id, run.is_lora, run.lora_rank) == (model_id, True, 8)
    assert (run.last_checkpoint.tinker_path, run.last_sampler_checkpoint.tinker_path) == (state, sampled)

    client.create_sampling_client(model_path=sampled).result()  # a sampling session now reads it
    with pytest.raises(tinker.BadRequestError, match="read by sampling session"):
        rest.delete_checkpoint_from_tinker_path(sampled).result()
    rest.delete_checkpoint_from_tinker_path(state).result()
    assert [c.checkpoint_id for c in rest.list_checkpoints(model_id).result().checkpoints] == ["sampler_weights/s"]
    with pytest.raises(tinker.NotFoundError, match="no such checkpoint"):
        trainer.load_state(state).result()
    with pytest.raises(tinker.NotFoundError, match="checkpoint_id|no checkpoint"):
        rest.delete_checkpoint(model_id, "weights/a").result()
    with pytest.raises(tinker.NotFoundError, match="training_run_id|no training run"):
        rest.list_checkpoints("s-none:train:0").result()
    with pytest.raises(tinker.NotFoundError, match="no checkpoint"):
        rest.get_weights_info_by_tinker_path(state).result()
    assert state not in [c.tinker_path for c in rest.list_user_checkpoints(limit=1000).result().checkpoints]
    full = client.create_lora_training_client(base_model=server["model"], rank=0, seed=4).result()  # a second run
    info = rest.get_weights_info_by_tinker_path(full.save_state("f").result().path).result()
    assert (info.is_lora, info.lora_rank, info.train_unembed) == (False, None, True)
    runs = rest.list_training_runs(limit=1000).result()
    assert model_id in [r.training_run_id for r in runs.training_runs]
    assert runs.cursor.total_count == len(runs.training_runs) >= 2
    assert runs.training_runs[0].is_lora is False  # the newest: the full fine-tuning client just made
    assert [r.training_run_id for r in rest.list_training_runs(limit=1, offset=1).result().training_runs] == \
        [runs.training_runs[1].training_run_id]
    with pytest.raises(tinker.BadRequestError, match="limit"):
        rest.list_training_runs(limit=0).result()


def test_sessions_are_listed_and_described_through_the_sdks_rest_client(server):
    """RestClient.list_sessions (the newest first, paged) and get_session (the training runs and sampling sessions
    the session made, its metadata as the client gave it); an unknown session and a bad access scope refused."""
    import httpx

    with tinker.ServiceClient(base_url=server["url"]) as earlier:
        before = earlier.create_lora_training_client(base_model=server["model"], rank=4, seed=1).result()
    with tinker.ServiceClient(base_url=server["url"], user_metadata={"team": "rl", "night": "3"}) as service:
        trainer = service.create_lora_training_client(base_model=server["model"], rank=4, seed=1).result()
        service.create_sampling_client(base_model=server["model"]).result()  # its session made before the listing
    session_id, earlier_id = (t.model_id.split(":")[0] for t in (trainer, before))
    rest = tinker.RestClient(base_url=server["url"])
    listed = rest.list_sessions(limit=1000).result().sessions
    assert listed[:2] == [session_id, earlier_id] and len(listed) == len(set(listed))
    assert rest.list_sessions(limit=1, offset=1).result().sessions == [earlier_id]
    assert not rest.get_session(earlier_id).result().user_metadata  # the SDK sends {} when given none
    info = rest.get_session(session_id).result()
    assert info.training_run_ids == [trainer.model_id]
    assert len(info.sampler_ids) == 1 and info.sampler_ids[0].startswith(f"{session_id}:sample:")
    assert info.user_metadata == {"team": "rl", "night": "3"}
    with pytest.raises(tinker.NotFoundError, match="s-none"):
        rest.get_session("s-none").result()
    key = {"X-API-Key": os.environ["TINKER_API_KEY"]}
    for path in ("sessions", f"sessions/{session_id}"):
        answer = httpx.get(f"{server['url']}/api/v1/{path}?access_scope=everyone", headers=key)
        assert answer.status_code == 400 and answer.json()["field"] == "access_scope", answer.text
    for labels, field in (({"user_metadata": {"n": 3}}, "user_metadata"),
                          ({"user_metadata": {str(i): "" for i in range(65)}}, "user_metadata"),
                          ({"user_metadata": {"k": "x" * 1025}}, "user_metadata"),
                          ({"user_metadata": {}, "display_name": "x" * 257}, "display_name")):
        made = httpx.post(f"{server['url']}/api/v1/create_session", headers=key,
                          json={"tags": [], "sdk_version": "x", **labels})
        assert made.status_code == 400 and made.json()["field"] == field, made.text


@pytest.mark.parametrize("rank", [8, 0], ids=["lora", "full"])
def test_sampling_reads_the_saved_weights_and_returns_their_logprobs(client, server, rank):
    datums, sequences = _datums(server["model"], weighted=False)
    trainer = client.create_lora_training_client(base_model=server["model"], rank=rank, seed=7).result()
    trainer.forward_backward(datums, "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=LR)).result()
    sampler = trainer.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints(sequences[0])
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=1234)
    first = sampler.sample(prompt, num_samples=3, sampling_params=params).result()
    again = sampler.sample(prompt, num_samples=3, sampling_params=params).result()
    assert len(first.sequences) == 3 and len({s.sequence_id for s in first.sequences}) == 3
    for seq in first.sequences:
        assert 1 <= len(seq.tokens) <= 6 and len(seq.logprobs) == len(seq.tokens)
        assert all(lp <= 0 for lp in seq.logprobs)
    assert [s.tokens for s in first.sequences] == [s.tokens for s in again.sequences]  # seeded
    # the sampler's prompt logprobs are the trained weights' (what the learner computes for the same tokens)
    scored = sampler.compute_logprobs(prompt).result()
    learner = trainer.forward([datums[0]], "cross_entropy").result().loss_fn_outputs[0]
    assert scored[0] is None
    assert scored[1:] == pytest.approx(_values(learner["logprobs"])[:len(scored) - 1], abs=2e-3)


def _top(logprobs: torch.Tensor, k: int) -> tuple[list[int], list[float]]:
    values, ids = logprobs.topk(k)
    return ids.tolist(), values.tolist()


def test_top_k_logprobs_of_the_prompt_and_the_samples_and_the_prompts_last_n(client, server):
    """topk_prompt_logprobs / topk_sample_logprobs: at each position the k most likely tokens, most likely first,
    those a plain transformers forward of the model gives; prompt_logprobs_last_n scores only the prompt's last N
    positions (the others None), each as the whole prompt's scoring gives it."""
    ids = _tokenizer(server["model"]).encode(PROMPT)
    sampler = client.create_sampling_client(base_model=server["model"]).result()
    params = types.SamplingParams(max_tokens=5, temperature=1.0, seed=11)
    prompt = types.ModelInput.from_ints(ids)
    full = sampler.sample(prompt, 2, params, include_prompt_logprobs=True, topk_prompt_logprobs=3,
                          topk_sample_logprobs=2).result()
    net = _reference(server["model"], 0, 0)

    with torch.no_grad():
        prompt_lp = torch.log_softmax(net(input_ids=torch.tensor([ids])).logits.float()[0], -1)
    topk = full.topk_prompt_logprobs
    assert len(topk) == len(ids) and topk[0] is None
    for i in range(1, len(ids)):
        want_ids, want_lp = _top(prompt_lp[i - 1], 3)
        assert [t for t, _ in topk[i]] == want_ids, i
        assert [lp for _, lp in topk[i]] == pytest.approx(want_lp, abs=2e-3)
    for seq in full.sequences:
        whole = ids + list(seq.tokens)
        with torch.no_grad():
            lp = torch.log_softmax(net(input_ids=torch.tensor([whole])).logits.float()[0], -1)
        assert len(seq.topk_logprobs) == len(seq.tokens)
        for t, (token, sampled, top) in enumerate(zip(seq.tokens, seq.logprobs, seq.topk_logprobs)):
            want_ids, want_lp = _top(lp[len(ids) + t - 1], 2)
            assert [i for i, _ in top] == want_ids and [v for _, v in top] == pytest.approx(want_lp, abs=2e-3)
            assert top[0][1] >= sampled - 1e-5  # the sampled token is at most the most likely one
            if token in want_ids:
                assert dict(top)[token] == pytest.approx(sampled, abs=1e-5)

    tail = sampler.sample(prompt, 1, params, include_prompt_logprobs=True, topk_prompt_logprobs=3,
                          prompt_logprobs_last_n=2).result()
    assert tail.prompt_logprobs[:-2] == [None] * (len(ids) - 2)
    assert tail.prompt_logprobs[-2:] == pytest.approx(full.prompt_logprobs[-2:], abs=1e-5)
    assert tail.topk_prompt_logprobs[:-2] == [None] * (len(ids) - 2)
    assert [[t for t, _ in row] for row in tail.topk_prompt_logprobs[-2:]] == \
        [[t for t, _ in row] for row in topk[-2:]]


@pytest.mark.e2e  # a server of its own: make test-e2e
def test_sampling_through_vllms_lora_adapters_reads_the_trained_weights(server, tmp_path):
    """--sample-adapters lora: snapshots served as vLLM LoRA adapters (not merged) give the learner's logprobs too."""
    proc = start_service(server["model"], tmp_path / "lora", "--sample-adapters", "lora")
    try:
        url = json.loads((tmp_path / "lora" / "service.json").read_text())["url"]
        with tinker.ServiceClient(base_url=url) as service_client:
            datums, sequences = _datums(server["model"], weighted=False)
            trainer = service_client.create_lora_training_client(base_model=server["model"], rank=8, seed=7).result()
            trainer.forward_backward(datums, "cross_entropy").result()
            trainer.optim_step(types.AdamParams(learning_rate=LR)).result()
            sampler = trainer.save_weights_and_get_sampling_client().result()
            prompt = types.ModelInput.from_ints(sequences[0])
            scored = sampler.compute_logprobs(prompt).result()
            learner = trainer.forward([datums[0]], "cross_entropy").result().loss_fn_outputs[0]
            base = service_client.create_sampling_client(base_model=server["model"]).result()
            untrained = base.compute_logprobs(prompt).result()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert scored[1:] == pytest.approx(_values(learner["logprobs"])[:len(scored) - 1], abs=2e-3)
    assert untrained[1:] != pytest.approx(scored[1:], abs=1e-3)  # the adapter was applied, not the base


@pytest.mark.e2e  # a second server, killed and started again: make test-e2e
def test_a_checkpoint_resumes_bit_for_bit_after_the_server_is_sigkilled(server, tmp_path):
    """save_state, two more steps; SIGKILL the server, start it again on the same folder; a new client from the
    checkpoint (with its optimizer) takes the same two steps: the same weights, byte for byte."""
    root = tmp_path / "kill"
    proc = start_service(server["model"], root)
    datums, _ = _datums(server["model"])
    adam = types.AdamParams(learning_rate=LR)
    try:
        url = json.loads((root / "service.json").read_text())["url"]
        service_client = tinker.ServiceClient(base_url=url)
        trainer = service_client.create_lora_training_client(base_model=server["model"], rank=8, seed=9).result()
        for _ in range(2):
            trainer.forward_backward(datums, "cross_entropy").result()
            trainer.optim_step(adam).result()
        path = trainer.save_state("mid").result().path
        for _ in range(2):
            trainer.forward_backward(datums, "cross_entropy").result()
            trainer.optim_step(adam).result()
        trainer.save_state("straight").result()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc = start_service(server["model"], root)
        url = json.loads((root / "service.json").read_text())["url"]
        resumed = tinker.ServiceClient(base_url=url).create_training_client_from_state_with_optimizer(path).result()
        for _ in range(2):
            resumed.forward_backward(datums, "cross_entropy").result()
            resumed.optim_step(adam).result()
        resumed.save_state("resumed").result()
    finally:
        proc.kill()
        proc.wait(timeout=30)
    model_dirs = {p.parents[2] for p in root.glob("*/weights/*/state.json")}
    straight = next(root.glob("*/weights/straight"))
    again = next(root.glob("*/weights/resumed"))
    assert len(model_dirs) == 2
    assert straight.parent.parent != again.parent.parent  # another session, on the restarted server
    assert (straight / "trainable.safetensors").read_bytes() == (again / "trainable.safetensors").read_bytes()
    assert json.loads((again / "state.json").read_text())["step"] == 4


def test_bad_requests_are_refused_naming_the_field(client, server):
    tok = _tokenizer(server["model"])
    ids = tok.encode(PROMPT)
    trainer = client.create_lora_training_client(base_model=server["model"], rank=8, seed=1).result()
    vocab = tok.vocab_size + len(tok.get_added_vocab())

    def refused(call) -> str:
        with pytest.raises((tinker.BadRequestError, tinker.NotFoundError, tinker.RequestFailedError)) as info:
            call().result()
        return str(info.value)

    outside = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                          loss_fn_inputs={"target_tokens": ids[1:-1] + [10**6]})
    assert "target_tokens" in refused(lambda: trainer.forward_backward([outside], "cross_entropy"))
    short = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs={"target_tokens": ids[1:-1]})
    assert "target_tokens" in refused(lambda: trainer.forward_backward([short], "cross_entropy"))
    no_adv = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                         loss_fn_inputs={"target_tokens": ids[1:], "logprobs": [0.0] * (len(ids) - 1)})
    assert "advantages" in refused(lambda: trainer.forward_backward([no_adv], "importance_sampling"))
    ok = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs={"target_tokens": ids[1:]})
    assert "stable_reinforce" in refused(lambda: trainer.forward_backward([ok], "stable_reinforce"))
    assert "vocabulary" in refused(lambda: trainer.forward_backward(
        [types.Datum(model_input=types.ModelInput.from_ints([vocab + 5]), loss_fn_inputs={"target_tokens": [1]})],
        "cross_entropy"))
    sampler = client.create_sampling_client(base_model=server["model"]).result()
    assert "seed" in refused(lambda: sampler.sample(types.ModelInput.from_ints(ids), 1, types.SamplingParams(
        max_tokens=2, seed=2**64)))
    assert "max_tokens" in refused(lambda: sampler.sample(types.ModelInput.from_ints(ids), 1, types.SamplingParams(
        max_tokens=10**6)))
    two = types.SamplingParams(max_tokens=2)
    assert "topk_sample_logprobs" in refused(lambda: sampler.sample(types.ModelInput.from_ints(ids), 1, two,
                                                                    topk_sample_logprobs=21))
    assert "topk_prompt_logprobs" in refused(lambda: sampler.sample(types.ModelInput.from_ints(ids), 1, two,
                                                                    topk_prompt_logprobs=-1))
    assert "prompt_logprobs_last_n" in refused(lambda: sampler.sample(
        types.ModelInput.from_ints(ids), 1, two, include_prompt_logprobs=True, prompt_logprobs_last_n=len(ids)))
    # the refused calls applied nothing: the client still trains from where it was
    assert trainer.forward_backward([ok], "cross_entropy").result().metrics["loss:sum"] > 0


def test_the_door_answers_json_naming_what_is_wrong(server):
    import httpx

    url = server["url"]
    key = {"X-API-Key": os.environ["TINKER_API_KEY"]}
    wrong = httpx.post(f"{url}/api/v1/create_session", json={}, headers={"X-API-Key": "tml-wrong"})
    assert wrong.status_code == 401 and "X-API-Key" in wrong.json()["detail"]
    unknown = httpx.post(f"{url}/api/v1/retrieve_future", json={"request_id": "999999"}, headers=key)
    assert unknown.status_code == 404 and "999999" in unknown.json()["detail"]
    missing = httpx.post(f"{url}/api/v1/get_info", json={"model_id": "s-none:train:0", "type": "get_info"},
                         headers=key)
    assert missing.status_code == 404 and "s-none:train:0" in missing.json()["detail"]
    garbage = httpx.post(f"{url}/api/v1/forward_backward", content=b"\xff\x00garbage", headers=key)
    assert garbage.status_code == 400 and "ForwardBackwardRequest" in garbage.json()["detail"]
    extra = httpx.post(f"{url}/api/v1/create_session", json={"tags": [], "user_metadata": {}, "sdk_version": "x", "bogus": 1},
                       headers=key)
    assert extra.status_code == 400 and extra.json()["field"] == "bogus"
    # what the SDK refuses before sending, refused here too: the last N prompt positions without prompt logprobs
    tail_only = {"prompt": {"chunks": [{"type": "encoded_text", "tokens": [5, 6, 7]}]}, "num_samples": 1,
                 "sampling_params": {"max_tokens": 1}, "base_model": server["model"], "topk_prompt_logprobs": 2,
                 "prompt_logprobs_last_n": 1, "type": "sample"}
    answer = httpx.post(f"{url}/api/v1/asample", json=tail_only, headers=key)
    assert answer.status_code == 400 and answer.json()["field"] == "prompt_logprobs_last_n", answer.text
    # the checkpoint routes: no way out of the run folder, paging that is no number
    runs = f"{url}/api/v1/training_runs"
    for outside in ("%2E%2E", ".", "s-none:sample:0"):
        answer = httpx.get(f"{runs}/{outside}/checkpoints", headers=key)
        assert answer.status_code == 404 and answer.json()["field"] == "training_run_id", (outside, answer.text)
    assert httpx.get(f"{runs}/s-1a:train:0%2F../checkpoints", headers=key).status_code == 404  # no such route
    for checkpoint in ("weights/%2E%2E", "weights/a/b", "bogus/a", "weights/"):
        answer = httpx.delete(f"{runs}/s-1a:train:0/checkpoints/{checkpoint}", headers=key)
        assert answer.status_code in (400, 404) and answer.json()["field"] == "checkpoint_id", (checkpoint, answer.text)
    for query, field in (("limit=x", "limit"), ("limit=0", "limit"), ("offset=-1", "offset"), ("limit=1001", "limit")):
        for listing in (runs, f"{url}/api/v1/checkpoints", f"{url}/api/v1/sessions"):
            answer = httpx.get(f"{listing}?{query}", headers=key)
            assert answer.status_code == 400 and answer.json()["field"] == field, (listing, query, answer.text)
    for body, field in (({"tinker_path": 5}, "tinker_path"), ({}, "tinker_path"), ({"tinker_path": "x", "y": 1}, "y"),
                        ({"tinker_path": "tinker://s-1a:train:0/weights/.."}, "tinker_path"),
                        ({"tinker_path": "tinker://../weights/a"}, "training_run_id"),
                        ({"tinker_path": "/etc/passwd"}, "tinker_path")):
        answer = httpx.post(f"{url}/api/v1/weights_info", json=body, headers=key)
        assert answer.status_code in (400, 404) and answer.json()["field"] == field, (body, answer.text)
    assert httpx.get(f"{url}/api/v1/healthz").json() == {"status": "ok"}


def test_a_step_the_metric_sinks_cannot_take_still_answers_as_taken(tiny_model, tmp_path):
    """The service in this process: the sinks fail on a step's row after the optimizer stepped; the step's answer is
    the step (a retry would step twice otherwise), and its row in requests.jsonl says why nothing was logged."""
    import asyncio

    from grpo_core.outside.tinker.service import ServiceSettings, TinkerService
    from grpo_core.outside.tinker.trainee import AdamStep

    service = TinkerService(ServiceSettings(base_model=tiny_model, root=tmp_path))
    try:
        session = service.create_session()["session_id"]

        def settled(request_id: str):
            return asyncio.run(service.futures.wait_async(request_id, 60.0))

        created = settled(service.create_model(session, 0, tiny_model, None, "adamw"))
        model = service.models[created.json["model_id"]]

        def full_disk(row: dict) -> None:
            raise OSError(28, "No space left on device")
        model.log.sinks.log = full_disk
        outcome = settled(service.optim_step(model.model_id, 0, AdamStep(1e-3, 0.9, 0.95, 1e-8, 0.0, 0.0)))
    finally:
        service.close()
    assert outcome.error is None and outcome.json["metrics"]["step"] == 1.0
    rows = [json.loads(line) for line in (tmp_path / model.model_id.replace(":", ".") / "requests.jsonl").open()]
    assert rows[-1]["op"] == "optim_step" and "No space left on device" in rows[-1]["metric_sinks_error"]
