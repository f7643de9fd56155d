# H200, session 31:
#   run(command="bash benchmarks/h200_session31.sh a", carry=[".whl"], timeout_s=600)
# after ../shared/gpu/wheels.sh.
. benchmarks/h200_common.sh
case "${1:-a}" in
  # a: where the host's time goes at 64 requests: cProfile and the torch profiler per drafter,
  # then the wrapped functions' inclusive times for draft-model and deepspark
  a) timeout 300 python3 benchmarks/h200_spec_profile.py --out "$OUT/prof" --drafters none,draft-model,deepspark \
       --top 60 2>&1 | filter > "$OUT/spec_profile.txt"
     for d in draft-model deepspark; do
       timeout 100 python3 benchmarks/h200_host_parts.py --drafter $d --batch 64 --prompts 128 \
         2>&1 | filter >> "$OUT/host_parts.txt"
     done ;;
  # b: the core's host work at 64 requests (text made when read, a running request's blocks
  # without a rebuilt table, counters once a step), against the code before it: _old/ holds the
  # three core files as they were (untracked; not in the repository), copied over a copy of
  # deepinfer/ that PYTHONPATH puts first; two turns of each at 64 requests
  b) mkdir -p /tmp/old && cp -r deepinfer /tmp/old/ && cp _old/*.py /tmp/old/deepinfer/core/
     for r in 1 2; do
       for v in new old; do
         pp=$PYTHONPATH; [ $v = old ] && pp=/tmp/old:$PYTHONPATH
         (cd /tmp && PYTHONPATH=$pp python3 -c "import deepinfer; print('== $v', deepinfer.__file__)") >> "$OUT/ab.txt"
         PYTHONPATH=$pp timeout 130 python3 benchmarks/lookup_rounds.py --device sm90 --batch 64 --prompts 64 --runs 5 \
           none draft-model on 2>&1 | filter >> "$OUT/ab.txt"
       done
     done
     timeout 100 python3 benchmarks/h200_host_parts.py --drafter draft-model --batch 64 --prompts 128 \
       2>&1 | filter >> "$OUT/host_parts.txt" ;;
  # c: the same comparison in one process, on the same engines, the versions taking turns run by
  # run (host_ab.py swaps the old classes' methods in): 64 requests, then batch 1
  c) timeout 250 python3 benchmarks/host_ab.py --old _old --device sm90 --batch 64 --prompts 64 --runs 9 \
       none draft-model deepspark 2>&1 | filter > "$OUT/host_ab.txt"
     timeout 250 python3 benchmarks/host_ab.py --old _old --device sm90 --batch 1 --prompts 8 --runs 5 \
       none draft-model deepspark 2>&1 | filter >> "$OUT/host_ab.txt" ;;
  # d: call a's profiles again, on commit aa08aed's core
  d) timeout 300 python3 benchmarks/h200_spec_profile.py --out "$OUT/prof" --drafters none,draft-model,deepspark \
       --top 60 2>&1 | filter > "$OUT/spec_profile.txt" ;;
  # e: what a graph's launch costs the host, at 64 requests and at batch 1
  e) timeout 200 python3 benchmarks/h200_replay_cost.py --drafters none,draft-model --batch 64 2>&1 | filter > "$OUT/replay.txt"
     timeout 150 python3 benchmarks/h200_replay_cost.py --drafters none,draft-model --batch 1 2>&1 | filter >> "$OUT/replay.txt" ;;
  # f: the final code: gpu-marked tests of the models, plugins and core, and issue 8's recorded command
  f) issue8_tests_and_spec spec ;;
  # g: after the review's detokenizer change: the gpu-marked tests of the models, plugins and core
  g) timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/models tests/plugins tests/core \
       > "$OUT/gpu_tests.txt" 2>&1 ;;
esac
