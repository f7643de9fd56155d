"""`deepinfer bench latency | throughput | prefill` end to end on a tiny random model (CPU): the
report, --json, --plot and the peer subset. Speed itself is never asserted here."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # each test runs deepinfer bench in a process of its own


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deepinfer.cli", "bench", *args, "--random-model", "llama-tiny",
                           "--device", "cpu", "--repeats", "1"], capture_output=True, text=True, timeout=600,
                          check=False)


def test_latency_writes_json_and_a_chart(tmp_path):
    import matplotlib.image

    png, js = tmp_path / "lat.png", tmp_path / "lat.json"
    res = _bench("latency", "--batch", "2", "--input-len", "16", "--output-len", "8", "--plot", str(png),
                 "--json", str(js))
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(js.read_text())
    assert got["results"][0]["output_tokens"] == 16
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(str(png)).shape[:2] == (480, 840)  # 7 x 4 inches at 120 dpi
    assert f"chart written to {png}" in res.stdout
    # the first token's time, and the decode rate after it: 14 tokens over the run less that time
    ttft_ms = got["results"][0]["ttft_ms_median"]
    seconds = got["results"][0]["seconds"][-1]
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("first token after"))
    assert line == (f"first token after {ttft_ms:.1f} ms (median over the requests of the last run); "
                    f"{14 / (seconds - ttft_ms / 1000):,.1f} output tok/s after it")


def test_throughput_peer_on_a_subset(tmp_path):
    js = tmp_path / "tp.json"
    res = _bench("throughput", "--num-requests", "5", "--min-len", "4", "--max-len", "12", "--peer", "hf",
                 "--peer-requests", "2", "--json", str(js))
    assert res.returncode == 0, res.stderr[-2000:]
    ours, peer = json.loads(js.read_text())["results"]
    from deepinfer.bench.workloads import uniform

    wl = uniform(5, 4, 12, 8192)
    assert ours["output_tokens"] == sum(wl.output_lens)
    # transformers' generate_batch runs each of the two requests to the longest of their lengths
    assert peer["name"].endswith("(2 requests)") and peer["output_tokens"] == 2 * max(wl.output_lens[:2])
    assert "ratio deepinfer / peer" in res.stdout


@pytest.mark.parametrize("args, message", [
    (("latency", "--gpu-idle", "--batch", "1", "--input-len", "4", "--output-len", "2"), "device events"),
])
def test_bad_requests_say_what_is_wrong(args, message):
    res = _bench(*args)
    assert res.returncode != 0 and message in res.stderr


def _spec_rows(*args: str, k: int = 5) -> str:
    """`bench spec` on the demo pair (none and draft-model at batches 1 and 2, 32 new tokens): its
    stdout, after checking the rows: one a drafter and batch; without a drafter a step makes one
    token; draft-model verifies its k drafts a round but where max_tokens leaves room for fewer
    (the last rounds of a request): at 32 tokens at least 4 rounds of 5 against at most 4 shorter
    ones (10 drafts fewer in all) with k = 5, so more than 3.5 a round on average."""
    # (the draft's steps eager: its compiled step, 9 s of every draft-model engine's start here, is
    # test_draft_compile.py's subject, not the bench's)
    if "--plugin-options" not in args:
        args = (*args, "--plugin-options", '{"draft-model": {"compile": false}}')
    res = subprocess.run([sys.executable, "-m", "deepinfer.cli", "bench", "spec", "--drafters", "none,draft-model",
                          "--batch", "1,2", "--output-len", "32", "--prompts", "2", *args],
                         capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [line.split() for line in res.stdout.splitlines() if line.split()[:1] in (["none"], ["draft-model"])]
    assert [(r[0], r[1]) for r in rows] == [("none", "1"), ("none", "2"), ("draft-model", "1"), ("draft-model", "2")]
    for name, _, _, _, ratio, per_step, verified, _ in rows:
        if name == "none":
            assert (ratio, float(per_step), float(verified)) == ("1.00x", 1.0, 0.0)
        else:
            assert k - 1.5 < float(verified) <= k and float(per_step) >= 1.0
    return res.stdout


def test_spec_each_drafter_in_a_fresh_process():
    """`bench spec --isolate`: each drafter's rows from its own process."""
    assert "each drafter in its own process" in _spec_rows("--repeats", "1", "--isolate")


def test_spec_drafters_take_turns_in_one_process():
    """`bench spec` by default builds every drafter's engine in one process and alternates them run
    by run; each row still counts its own engine's steps only (none's rows verify nothing although
    draft-model ran between its runs)."""
    assert "the drafters in turn, run by run" in _spec_rows("--repeats", "2")


def test_spec_gives_a_drafters_options_to_its_runs_only():
    """--plugin-options for draft-model reach its engine (3 drafts a step), and the runs without a
    drafter, which do not select it, are built without them (they would refuse options for a plugin
    they do not run)."""
    _spec_rows("--repeats", "1", "--plugin-options", '{"draft-model": {"num_speculative_tokens": 3, "compile": false}}',
               k=3)


def test_spec_sampled_runs_seed_each_prompt():
    """`bench spec --temperature 0.8`: sampled requests, each prompt with its own seed (the same for
    every drafter and run), and the header says so; a negative temperature is refused."""
    from deepinfer import LLM
    from deepinfer.bench.spec import Workload

    assert "sampled at temperature 0.8 (seeded)" in _spec_rows("--repeats", "1", "--temperature", "0.8")
    llm = LLM(progress=False)
    work = {"prompts": 3, "input_len": 16, "output_len": 4, "temperature": 0.8}
    wl = Workload(llm, 2, work)  # two batches of 2: four prompts
    assert [(p.temperature, p.seed) for p in wl.params] == [(0.8, 0), (0.8, 1), (0.8, 2), (0.8, 3)]
    assert all(p.temperature == 0 and p.seed is None for p in Workload(llm, 2, {**work, "temperature": 0}).params)
    res = subprocess.run([sys.executable, "-m", "deepinfer.cli", "bench", "spec", "--temperature", "-1"],
                         capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 2 and "--temperature must be 0 (greedy) or positive up to 100, got -1.0" in res.stderr


def test_spec_prompts_come_from_the_held_out_files_of_the_stdlib_given(tmp_path):
    """`bench spec --stdlib DIR`: the prompts are the beginnings of DIR's held-out files (by the
    corpus's rule), none from its training files; a directory that does not exist is refused
    before any engine is built."""
    from deepinfer import LLM
    from deepinfer.bench.spec import Workload
    from deepinfer.tools.demo_data import is_heldout

    names = [f"mod{i}.py" for i in range(400)]
    held, trained = [n for n in names if is_heldout(n)][:2], [n for n in names if not is_heldout(n)][:2]
    assert len(held) == 2
    texts = {n: "".join(f"def {n[:-3]}_{j}(x):\n    return x * {j}\n" for j in range(40)) for n in held + trained}
    for name, text in texts.items():
        (tmp_path / name).write_text(text)
    llm = LLM(progress=False)
    tok = llm.get_tokenizer()
    wl = Workload(llm, 2, {"prompts": 2, "input_len": 16, "output_len": 4, "stdlib": str(tmp_path)})
    assert wl.prompts == [tok.encode(texts[n], add_special_tokens=False)[:16] for n in sorted(held)]
    res = subprocess.run([sys.executable, "-m", "deepinfer.cli", "bench", "spec", "--stdlib", str(tmp_path / "no")],
                         capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 2 and "is not a directory: give a Python standard library's directory" in res.stderr
    assert res.stdout == ""


def test_spec_decodes_the_same_prompts_at_every_batch_size_by_default():
    """By default bench spec's batch 1 decodes, one after another, the prompts that its batch of 64
    decodes at once (before, batch 1 decoded the first 8 of them: a figure of a few files)."""
    from deepinfer import LLM
    from deepinfer.bench.spec import Workload
    from deepinfer.cli import build_parser

    args = build_parser().parse_args(["bench", "spec"])
    work = {"prompts": args.prompts, "input_len": args.input_len, "output_len": 4, "stdlib": args.stdlib}
    llm = LLM(progress=False)
    one, many = Workload(llm, 1, work), Workload(llm, 64, work)
    assert (one.groups, many.groups) == (64, 1)
    assert one.prompts == many.prompts and len(one.prompts) == 64
    assert one.tokens == many.tokens == 64 * 4


def test_spec_refuses_a_drafter_named_twice():
    res = subprocess.run([sys.executable, "-m", "deepinfer.cli", "bench", "spec", "--drafters", "none,ngram,none"],
                         capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 2 and "--drafters names 'none' twice" in res.stderr and res.stdout == ""
