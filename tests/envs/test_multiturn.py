"""Multi-turn built-in environments: retry, tools, retrieval (BM25 + local search service)."""

from __future__ import annotations

import json
import math
import random
import socket
import threading
import time
import urllib.request

import pytest

from rlvr.envs.answers import AnswerCheck
from rlvr.envs.loading import load_environment
from rlvr.envs.multiturn import retrieval, retry, tools
from rlvr.envs.multiturn.retrieval import (
    BM25Index,
    RetrievalEnv,
    SearchClient,
    SearchService,
    load_corpus,
    make_corpus,
    tokenize,
)
from rlvr.envs.multiturn.retry import RetryEnv
from rlvr.envs.multiturn.tools import ToolCall, ToolEnv, bwrap_available, parse_tool_calls
from rlvr.errors import DataError, RewardError, SearchError
from rlvr.reward import Score, evaluate_reward
from rlvr.rollouts.episodes import new_state

PYTHON_SANDBOX = {"timeout_s": 5, "cpu_s": 2, "memory_mb": 256}


def convo(*replies: str, prompt: str = "q") -> list[dict[str, str]]:
    messages = [{"role": "user", "content": prompt}]
    messages += [{"role": "assistant", "content": r} for r in replies]
    return messages


def episode(env, row, replies, max_turns=10):
    """Drive ``env`` like the loop's multi-turn rollout: reply, interact, append, until [] or no reply left."""
    state = new_state(row["answer"], row.get("info"))
    messages = [{"role": "user", "content": row["prompt"]}]
    for reply in replies[:max_turns]:
        messages.append({"role": "assistant", "content": reply})
        state["turn"] += 1
        out = env.interact(messages, state)
        if not out:
            break
        messages.extend(out)
    return messages


# ---------------------------------------------------------------------------------- answer check


@pytest.mark.parametrize(
    ("fmt", "reply", "components"),
    [("boxed", "so \\boxed{82}", {"correct": 1.0, "parsed": 1.0}), ("boxed", "82", {"correct": 0.0, "parsed": 0.0}),
     ("boxed", "\\boxed{81}", {"correct": 0.0, "parsed": 1.0}), ("plain", " 82\n", {"correct": 1.0, "parsed": 1.0}),
     ("plain", "82 apples", {"correct": 0.0, "parsed": 1.0}), ("plain", "  ", {"correct": 0.0, "parsed": 0.0}),
     ("tags", "<answer>82</answer>", {"correct": 1.0, "parsed": 1.0}), ("tags", "82", {"correct": 0.0, "parsed": 0.0})],
)
def test_answer_check_formats(fmt, reply, components):
    assert AnswerCheck(fmt).components(convo(reply), "82") == components


def test_answer_check_inner_reward_and_bad_config():
    def inner(messages, answer):
        return Score.of(0.5, length=3.0)

    check = AnswerCheck(inner=inner, pass_threshold=0.5)
    components = check.components(convo("x"), "y")
    assert components == {"correct": 0.5, "inner/reward": 0.5, "inner/length": 3.0} and check.passed(components)
    assert AnswerCheck(inner=lambda m, a: None).components(convo("x"), "y") is None
    with pytest.raises(RewardError, match="bool"):
        AnswerCheck(inner=lambda m, a: True).components(convo("x"), "y")
    with pytest.raises(ValueError, match="answer_format"):
        AnswerCheck("latex")
    with pytest.raises(ValueError, match="inner"):
        AnswerCheck(inner="exact")


# ------------------------------------------------------------------------------------------ retry


def test_retry_transitions():
    env = RetryEnv(max_turns=3)
    retry = [{"role": "user", "content": "Wrong, try again."}]
    assert env.interact(convo("\\boxed{81}"), new_state("82", turn=1)) == retry
    assert env.interact(convo("no box"), new_state("82", turn=1)) == [{"role": "user", "content": "Wrong, try again."}]
    assert env.interact(convo("\\boxed{82}"), new_state("82", turn=1)) == []
    assert env.interact(convo("a", "b", "\\boxed{81}"), new_state("82", turn=3)) == []  # out of turns
    assert env.interact(convo("\\boxed{81}"), {"answer": "82"}) == [{"role": "user", "content": "Wrong, try again."}]
    assert RetryEnv(max_turns=1).interact(convo("\\boxed{81}"), new_state("82", turn=1)) == []
    with pytest.raises(ValueError, match="no 'answer'"):
        env.interact(convo("x"), {"turn": 1})


def test_retry_episode_pays_the_final_answer_and_counts_turns():
    env = RetryEnv(max_turns=3, retry_prompt="Again.")
    row = {"prompt": "37+45?", "answer": "82"}
    messages = episode(env, row, ["\\boxed{81}", "\\boxed{82}", "never sent"])
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[2]["content"] == "Again."
    score = env.reward_fn(messages, "82")
    assert isinstance(score, Score) and score.value == 1.0
    assert score.metrics == {"correct": 1.0, "parsed": 1.0, "turns": 2.0}
    messages = episode(env, row, ["\\boxed{1}", "\\boxed{2}", "\\boxed{3}", "never sent"])
    assert env.reward_fn(messages, "82").metrics == {"correct": 0.0, "parsed": 1.0, "turns": 3.0}


def test_retry_with_an_inner_reward_and_the_terse_variant():
    env = RetryEnv(inner=lambda messages, answer: 1.0 if "yes" in messages[-1]["content"] else 0.0)
    assert env.interact(convo("no"), new_state("_", turn=1)) != []
    assert env.interact(convo("yes"), new_state("_", turn=1)) == []
    assert env.reward_fn(convo("no", "yes"), "_").metrics == {"correct": 1.0, "turns": 2.0}
    short = retry.terse()
    assert short.check.answer_format == "plain" and short.max_turns == 2 and short.retry_prompt.isascii()
    rows = short.make_rows(5, seed=0)
    right = episode(short, rows[0], ["0", rows[0]["answer"]])
    assert right[2]["content"] == retry.TERSE_RETRY_PROMPT and short.reward_fn(right, rows[0]["answer"]).value == 1.0


def test_retry_loads_through_the_contract():
    loaded = load_environment("rlvr.envs.multiturn.retry", max_turns=2, answer_format="plain")
    assert loaded.multi_turn and loaded.make_rows is not None and loaded.name == "retry"
    assert loaded.interact(convo("3"), new_state("4", turn=1)) == [{"role": "user", "content": "Wrong, try again."}]
    assert evaluate_reward(loaded, convo("4"), "4").metrics == {"correct": 1.0, "parsed": 1.0, "turns": 1.0}
    with pytest.raises(ValueError, match="max_turns"):
        RetryEnv(max_turns=0)
    with pytest.raises(ValueError, match="retry_prompt"):
        RetryEnv(retry_prompt=" ")


# ------------------------------------------------------------------------------------------ tools


def test_parse_tool_calls_both_forms():
    text = ("first <tool>calculator: 2 + 3</tool> then <tool_call>{\"name\": \"python\", \"arguments\": "
            "{\"code\": \"print(1)\"}}</tool_call> and <TOOL>py:\n    x = 1\n    print(x)\n</TOOL>")
    assert parse_tool_calls(text) == [ToolCall("calculator", "2 + 3"), ToolCall("python", "print(1)"),
                                      ToolCall("py", "x = 1\nprint(x)")]
    assert parse_tool_calls('<tool_call>{"name": "calc", "arguments": "7*6"}</tool_call>') == [ToolCall("calc", "7*6")]
    assert parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>') == [
        ToolCall("calculator", "1+1")]
    assert parse_tool_calls("<t>c:12*34</t>", tag="t") == [ToolCall("c", "12*34")]
    assert parse_tool_calls("no call, <tool>unclosed") == [] and parse_tool_calls(None) == []
    bad = parse_tool_calls("<tool>just text</tool><tool_call>{not json}</tool_call>"
                           '<tool_call>{"arguments": "1"}</tool_call>')
    assert [c.error is not None for c in bad] == [True, True, True]
    assert "NAME: ARGS" in bad[0].error and "invalid JSON" in bad[1].error


@pytest.fixture(scope="module")
def tool_env() -> ToolEnv:
    if not bwrap_available():  # the sandbox refuses to run unisolated (tests/envs/test_sandbox.py checks that)
        pytest.skip("bubblewrap does not work on this machine (make system-deps)")
    return ToolEnv(sandbox=PYTHON_SANDBOX, answer_format="boxed")


def test_tool_env_dispatches_and_reports_errors_as_content(tool_env):
    state = new_state("5", turn=1)
    assert tool_env.interact(convo("<tool>calculator: 2+3</tool>"), state) == [
        {"role": "tool", "name": "calculator", "content": "5"}]
    assert tool_env.interact(convo("<tool>calc: 1/0</tool>"), state) == [
        {"role": "tool", "name": "calculator", "content": "error: ZeroDivisionError: division by zero"}]
    assert tool_env.interact(convo("<tool>calc: 9**9**9</tool>"), state)[0]["content"].startswith(
        "error: CalculatorError: result too large")
    assert tool_env.interact(convo("<tool>search: cats</tool>"), state) == [
        {"role": "tool", "name": "search", "content": "error: unknown tool 'search'; available: calculator, python"}]
    out = tool_env.interact(convo("<tool>python: print(6 * 7)</tool><tool>py: 1/0</tool>"), state)
    assert out == [{"role": "tool", "name": "python", "content": "42"},
                   {"role": "tool", "name": "python", "content": "error: ZeroDivisionError: division by zero"}]
    assert tool_env.interact(convo("the answer is \\boxed{5}"), state) == []
    assert tool_env.interact(convo("<tool>calc: 1</tool>"), new_state("5", turn=4)) == []  # out of turns
    many = tool_env.interact(convo("<tool>calc: 1</tool>" * 5), state)
    assert [m["content"] for m in many[:3]] == ["1", "1", "1"] and "too many tool calls" in many[3]["content"]


def test_tool_env_episode_reward_and_metrics(tool_env):
    row = {"prompt": "412*37?", "answer": "15244"}
    messages = episode(tool_env, row, ["<tool>calc: 412*/37</tool>", "<tool>calc: 412*37</tool>",
                                       "It is \\boxed{15244}.", "never sent"])
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert messages[2]["content"].startswith("error: CalculatorError: invalid syntax")
    score = tool_env.reward_fn(messages, "15244")
    assert score.value == 1.0
    assert score.metrics == {"correct": 1.0, "parsed": 1.0, "tool_calls": 2.0, "tool_errors": 1.0}
    unfinished = convo("<tool>calc: 1</tool>")  # the last message is still a call: no final answer
    assert tool_env.reward_fn(unfinished, "1").metrics == {"correct": 0.0, "parsed": 0.0, "tool_calls": 0.0,
                                                           "tool_errors": 0.0}
    assert tool_env.reward_fn(convo("\\boxed{7}"), "8").value == 0.0


def test_tool_env_custom_tools_and_config():
    def shout(args):
        if not args:
            raise ValueError("nothing to shout")
        return args.upper()

    env = ToolEnv(tools={"shout": shout, "calculator": None}, aliases={"s": "shout", "p": "python"},
                  answer_format="plain", reward=None)
    assert env.tools.keys() == {"shout", "calculator"} and env.aliases == {"s": "shout"}
    state = new_state("X", turn=1)
    assert env.interact(convo("<tool>s: hey</tool>"), state)[0] == {"role": "tool", "name": "shout", "content": "HEY"}
    assert env.interact(convo("<tool>shout:</tool>"), state)[0]["content"] == "error: ValueError: nothing to shout"
    assert env.format_call("s", "hi") == "<tool>s:hi</tool>"
    with pytest.raises(ValueError, match="unknown tool 'web'"):
        ToolEnv(tools=("web",))
    with pytest.raises(ValueError, match="string"):
        ToolEnv(tools="calculator")
    with pytest.raises(ValueError, match="tag"):
        ToolEnv(tag="<tool>")


def test_a_sandbox_config_without_the_python_tool_builds_no_sandbox():
    """A config that keeps its sandbox settings but drops the python tool (env_args from one TOML to
    another): no sandbox, and the environment still describes itself for run.json."""
    env = ToolEnv(tools=["calculator"], sandbox={"timeout_s": 5})
    assert env.sandbox is None and list(env.tools) == ["calculator"]
    assert env.describe()["isolation"] is None


def test_tool_env_terse_variant_solves_its_rows():
    env = tools.terse()
    row = env.make_rows(3, seed=0)[0]
    call = env.format_call("c", row["info"]["expression"])
    assert call.startswith("<t>c:") and len(call) <= 16
    messages = episode(env, row, [call, row["answer"]])
    assert messages[2] == {"role": "tool", "name": "calculator", "content": row["answer"]}
    assert env.reward_fn(messages, row["answer"]).metrics == {"correct": 1.0, "parsed": 1.0, "tool_calls": 1.0,
                                                              "tool_errors": 0.0}
    loaded = load_environment("rlvr.envs.multiturn.tools", tools=["calculator"], max_turns=2)
    assert loaded.multi_turn and loaded.name == "tools"


# -------------------------------------------------------------------------------------------- BM25

CORPUS = [
    {"id": "cat", "text": "The cat sat on the mat."},
    {"id": "dog", "text": "The dog chased the cat around the yard."},
    {"id": "zebra", "text": "A zebra is a striped horse."},
    {"id": "the", "text": "the the the the the"},
]


def test_tokenize():
    assert tokenize("The Code-of Kavo! x_y 42") == ["the", "code", "of", "kavo", "x", "y", "42"]
    assert tokenize("Éclair à 3") == ["éclair", "à", "3"] and tokenize(None) == []


def test_bm25_exact_term_ranks_first_and_idf_matters():
    index = BM25Index(CORPUS)
    assert [p["id"] for p in index.search("zebra", 3)] == ["zebra"]
    assert index.search("striped animal", 1)[0]["id"] == "zebra"
    # "the" is everywhere, so its idf is tiny; the rare "dog" decides, even against a passage of pure "the".
    assert index.idf("the") < index.idf("dog")
    assert index.search("the dog", 1)[0]["id"] == "dog"
    # "cat" is in two passages: the shorter one wins (length normalisation, b = 0.75).
    assert [p["id"] for p in index.search("cat", 2)] == ["cat", "dog"]
    assert index.search("unicorn", 3) == [] and len(index) == 4


def test_bm25_score_matches_the_formula():
    index = BM25Index([("a", "x y"), ("b", "y z z")])  # the defaults: k1 = 1.5, b = 0.75
    n, avgdl = 2, 2.5
    idf_z = math.log(1 + (n - 1 + 0.5) / (1 + 0.5))
    expected = idf_z * 2 * 2.5 / (2 + 1.5 * (1 - 0.75 + 0.75 * 3 / avgdl))
    assert index.search("z", 1) == [{"id": "b", "text": "y z z", "score": pytest.approx(expected)}]
    assert BM25Index([("a", "x y"), ("b", "y z z")], b=0.0).search("z")[0]["score"] != pytest.approx(expected)


def test_load_corpus_jsonl_and_text(tmp_path):
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text('{"id": 1, "text": "one"}\n\n{"id": "b", "text": "two"}\n')
    assert load_corpus(jsonl) == [retrieval.Passage("1", "one"), retrieval.Passage("b", "two")]
    text = tmp_path / "c.txt"
    text.write_text("first passage\n\nsecond passage\n")
    assert [(p.id, p.text) for p in load_corpus(text)] == [("1", "first passage"), ("3", "second passage")]
    for body, match in [('{"id": 1, "text": "a"}\n{"id": 1, "text": "b"}\n', "line 2: duplicate id '1'"),
                        ('{"id": 1, "text": "a"}\nnot json\n', "line 2: invalid JSON"),
                        ('{"id": 1}\n', "line 1: expected an object with a 'text'"), ("\n", "no passages")]:
        jsonl.write_text(body)
        with pytest.raises(DataError, match=match):
            load_corpus(jsonl)
    with pytest.raises(DataError, match="no such file"):
        load_corpus(tmp_path / "missing.jsonl")


# ----------------------------------------------------------------------------------------- service


@pytest.fixture(scope="module")
def service():
    with SearchService(index=BM25Index(CORPUS)) as svc:
        yield svc


def _post(url, body: bytes, timeout=5):
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_service_binds_loopback_and_answers(service):
    host, port = service.address
    assert host == "127.0.0.1" and port > 0 and service.url == f"http://127.0.0.1:{port}" and service.running
    client = SearchClient(service.url, timeout_s=5)
    assert client.health() == {"status": "ok", "passages": 4}
    passages = client.search("zebra", k=2)
    assert [p["id"] for p in passages] == ["zebra"] and passages[0]["text"] == "A zebra is a striped horse."
    assert passages[0]["score"] > 0
    assert len(client.search("the cat", k=2)) == 2


def test_service_rejects_bad_requests(service):
    url = service.url + "/search"
    assert _post(url, b"not json")[0] == 400
    assert _post(url, json.dumps({"query": 3}).encode()) == (400, {"error": "'query' must be a string"})
    assert _post(url, json.dumps({"query": "a", "k": 0}).encode())[0] == 400
    assert _post(url, json.dumps({"query": "a", "k": True}).encode())[0] == 400
    assert _post(url, json.dumps({"query": "x" * 2000}).encode())[0] == 400
    assert _post(service.url + "/nope", b"{}")[0] == 404
    with pytest.raises(SearchError, match=rf"{service.url}/search answered HTTP 400.*'k' must be an integer"):
        SearchClient(service.url).search("cat", k=10_000)


def test_service_refuses_non_loopback_hosts_and_needs_one_source(tmp_path):
    for host in ("0.0.0.0", "192.168.1.10", "example.com"):
        with pytest.raises(ValueError, match="loopback"):
            SearchService(index=BM25Index(CORPUS), host=host)
    with pytest.raises(ValueError, match="exactly one"):
        SearchService()
    with pytest.raises(RuntimeError, match="not started"):
        SearchService(index=BM25Index(CORPUS)).url  # noqa: B018


def test_stopped_service_gives_a_clear_error_naming_the_url():
    svc = SearchService(index=BM25Index(CORPUS)).start()
    url = svc.url
    svc.stop()
    svc.stop()  # idempotent
    assert not svc.running
    start = time.perf_counter()
    with pytest.raises(SearchError, match=rf"search service {url}/health is unreachable"):
        SearchClient(url, timeout_s=2).health()
    assert time.perf_counter() - start < 2.0


@pytest.fixture
def hung_url():
    """A server that accepts connections (the kernel's backlog does) and never answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=8) as sock:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_a_hung_service_gives_a_bounded_error(hung_url):
    start = time.perf_counter()
    with pytest.raises(SearchError, match=rf"search service {hung_url}/search did not answer within 0.3s"):
        SearchClient(hung_url, timeout_s=0.3).search("cat")
    assert time.perf_counter() - start < 1.5
    env = RetrievalEnv(service_url=hung_url, timeout_s=0.3)
    start = time.perf_counter()
    with pytest.raises(SearchError, match=hung_url):
        env.interact(convo("<search>cat</search>"), new_state("x", turn=1))
    assert time.perf_counter() - start < 1.5


def test_a_slow_drip_response_is_cut_at_the_deadline():
    """A server that keeps sending a byte at a time never resets the per-read timeout; the deadline still holds."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        stop = threading.Event()

        def drip():
            conn, _ = sock.accept()
            with conn:
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n")
                while not stop.is_set():
                    try:
                        conn.sendall(b" ")
                    except OSError:
                        return
                    time.sleep(0.05)

        thread = threading.Thread(target=drip, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        start = time.perf_counter()
        try:
            with pytest.raises(SearchError, match="did not answer within 0.5s"):
                SearchClient(url, timeout_s=0.5).health()
            assert time.perf_counter() - start < 2.0
        finally:
            stop.set()
            thread.join(2)


# -------------------------------------------------------------------------------------- retrieval


@pytest.fixture
def corpus_path(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in CORPUS))
    return path


def test_retrieval_env_end_to_end_with_its_own_service(corpus_path):
    with RetrievalEnv(corpus_path, k=2, answer_format="boxed") as env:
        assert env.service is not None and env.service.address[0] == "127.0.0.1"
        row = {"prompt": "What is striped?", "answer": "zebra"}
        messages = episode(env, row, ["<search>striped</search>", "<search>the cat</search>", "\\boxed{zebra}", "x"])
        assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
        assert messages[2] == {"role": "tool", "name": "search", "content": "[1] A zebra is a striped horse."}
        assert messages[4]["content"].splitlines() == ["[1] The cat sat on the mat.",
                                                       "[2] The dog chased the cat around the yard."]
        score = env.reward_fn(messages, "zebra")
        assert score.value == 1.0 and score.metrics == {"correct": 1.0, "parsed": 1.0, "searches": 2.0}
        assert env.reward_fn(convo("<search>x</search>"), "zebra").metrics == {"correct": 0.0, "parsed": 0.0,
                                                                              "searches": 0.0}
        empty = env.interact(convo("<search></search>"), new_state("z", turn=1))
        assert empty[0]["content"] == "error: empty search query"
        assert env.interact(convo("<search>unicorn</search>"), new_state("z", turn=1))[0]["content"] == "no results"
        assert env.interact(convo("<search>cat</search>"), new_state("z", turn=3)) == []  # out of turns
        service = env.service
    assert not service.running  # stopped on leaving the with block


def test_retrieval_env_on_a_shared_service_and_config(service, corpus_path):
    env = RetrievalEnv(service_url=service.url + "/", k=1, answer_format="plain")
    assert env.service is None and env.url == service.url
    out = env.interact(convo("<search>dog</search>"), new_state("x", turn=1))
    assert out == [{"role": "tool", "name": "search", "content": "[1] The dog chased the cat around the yard."}]
    env.close()
    assert service.running  # not ours to stop
    with pytest.raises(ValueError, match="exactly one"):
        RetrievalEnv()
    with pytest.raises(ValueError, match="exactly one"):
        RetrievalEnv(corpus_path, service_url=service.url)
    with pytest.raises(ValueError, match="k must be"):
        RetrievalEnv(service_url=service.url, k=0)


def test_retrieval_terse_variant_answers_its_rows():
    env = retrieval.terse(corpus_size=200, corpus_seed=3)
    try:
        corpus_file = env.service.index.passages
        assert len(corpus_file) == 200
        rows = env.make_rows(20, seed=5)
        for row in rows[:5]:
            name = row["info"]["name"]
            messages = episode(env, row, [f"<s>{name}</s>", row["answer"]])
            assert messages[2]["content"] == f"the code of {name} is {row['answer']}"
            assert env.reward_fn(messages, row["answer"]).metrics == {"correct": 1.0, "parsed": 1.0, "searches": 1.0}
            assert len(f"<s>{name}</s>") <= 16 and len(row["prompt"]) <= 20
        # Searching with the whole question finds the fact too: the name is the rare term.
        assert env.client.search(rows[0]["prompt"], 1)[0]["text"].endswith(rows[0]["answer"])
    finally:
        service = env.service
        env.close()
    assert not service.running


# ---------------------------------------------------------------------------------- procedural rows

ROW_MAKERS = [("retry", retry.make_rows), ("tools", tools.make_rows), ("retrieval", retrieval.make_rows)]


@pytest.mark.parametrize(("name", "make_rows"), ROW_MAKERS, ids=[n for n, _ in ROW_MAKERS])
def test_rows_are_deterministic_prefix_stable_and_leave_the_global_rng_alone(name, make_rows):
    assert make_rows(30, seed=3) == make_rows(30, seed=3)
    assert make_rows(30, seed=3) != make_rows(30, seed=4)
    assert make_rows(7, seed=3) == make_rows(30, seed=3)[:7]
    random.seed(123)
    expected = random.random()
    random.seed(123)
    make_rows(20, seed=0)
    assert random.random() == expected
    rows = make_rows(200, seed=1)
    assert all(set(r) == {"prompt", "answer", "info"} and r["info"]["task"] == name for r in rows)
    assert all(len(r["prompt"]) <= 20 and len(r["answer"]) <= 8 and r["prompt"].isascii() for r in rows)
    assert len({r["prompt"] for r in rows}) > 150
    assert make_rows(0, seed=0) == []
    with pytest.raises(ValueError, match="n must be"):
        make_rows(-1, seed=0)


def test_retry_and_tool_rows_are_right():
    for row in retry.make_rows(100, seed=0, ops=("+", "-", "*")):
        a, b = row["info"]["numbers"]
        assert row["answer"] == str({"+": a + b, "-": a - b, "*": a * b}[row["info"]["op"]]) and int(row["answer"]) >= 0
    for row in tools.make_rows(100, seed=0):
        a, b = row["info"]["numbers"]
        assert 100 <= a <= 999 and 10 <= b <= 99 and row["answer"] == str(a * b)
        assert row["prompt"] == f"{a}*{b}=" and row["info"]["expression"] == f"{a}*{b}"
    with pytest.raises(ValueError, match="digits"):
        tools.make_rows(1, seed=0, digits=(3,))
    with pytest.raises(ValueError, match="ops"):
        retry.make_rows(1, seed=0, ops=("/",))


def test_retrieval_rows_ask_distinct_answerable_questions(tmp_path):
    path = make_corpus(tmp_path / "facts.jsonl", 60, seed=2)
    passages = load_corpus(path)
    assert len(passages) == 60 and passages[0].text.startswith("the code of ")
    facts = {f["name"]: f["value"] for f in retrieval.corpus_facts(60, 2)}
    assert len(facts) == 60  # names are distinct
    rows = retrieval.make_rows(60, seed=9, corpus_size=60, corpus_seed=2)
    assert len({r["info"]["fact"] for r in rows}) == 60  # every fact asked once
    assert retrieval.make_rows(61, seed=9, corpus_size=60, corpus_seed=2)[60]["prompt"] == rows[0]["prompt"]
    index = BM25Index(passages)
    for row in rows:
        assert facts[row["info"]["name"]] == row["answer"]
        top = index.search(row["info"]["name"], 1)[0]
        assert top["text"] == f"the code of {row['info']['name']} is {row['answer']}"
    assert retrieval.make_rows(5, seed=2, corpus_size=60) == retrieval.make_rows(5, seed=2, corpus_size=60,
                                                                                  corpus_seed=2)
    assert len(retrieval.corpus_facts(5000, 0)[0]["name"]) == 6  # three syllables past 4900 facts
