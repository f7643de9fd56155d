"""Device time of GPU work from CUDA-graph replays (no host launch cost in the figure)."""
import torch


def graph_time(fn, reps: int = 1, trials: int = 20) -> float:
    """Median microseconds of one ``fn()`` call: ``reps`` calls captured in one graph (after two
    warm-up calls on the capture stream), replayed ``trials`` times."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(reps):
            fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000 / reps)
    times.sort()
    return times[len(times) // 2]
